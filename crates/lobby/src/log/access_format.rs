//! The access log's line format (`--access-logformat`): gunicorn's atoms, maitred's own
//! four, and `json`.
//!
//! This module owns the grammar. The CLI checks a format by calling
//! `maitred._native.check_access_log_format`, so a wrong one is refused at start with one
//! line; the lobby parses it again from its settings (`Config::access_log_format`), once at
//! start and once per reload, into a list of pieces. Writing a line walks the pieces into one
//! string: no parsing, no lookup by name, per request.
//!
//! The grammar is gunicorn's (Python's `%` formatting with a mapping): `%(NAME)s` is an atom,
//! `%%` a percent sign, anything else is copied. NAME is one of the letters below,
//! `{HEADER}i` (a request header), `{HEADER}o` (a response header as the application sent
//! it), `{VARIABLE}e` (the lobby's environment, read when the format is parsed), or maitred's
//! `queue_ms`, `app_ms`, `tls_version` and `tls_cipher`. The value `json` writes every atom
//! as one JSON object per line.
//! docs/LIMITS.md ("The access log's format") describes each atom.

use std::fmt::Write;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;

use super::text::{civil, clf_timestamp, escape_into};

/// A parsed format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessFormat {
    Text(Vec<Piece>),
    Json,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Literal(String),
    Atom(Atom),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Atom {
    /// `h`: the client's address.
    Peer,
    /// `l`: always `-` (no ident lookup).
    Ident,
    /// `u`: the user name of a `Basic` Authorization header.
    User,
    /// `t`: `[22/Nov/2026:05:30:00 +0000]`, when the line is written, in UTC.
    Time,
    /// `r`: the request line.
    RequestLine,
    /// `m`
    Method,
    /// `U`: the target without its query.
    Path,
    /// `q`: the query, without `?`; empty when there is none.
    Query,
    /// `H`: `HTTP/1.1`
    Protocol,
    /// `s`
    Status,
    /// `B`: body bytes sent.
    Bytes,
    /// `b`: body bytes sent, `-` for none.
    BytesOrDash,
    /// `f`: the Referer header.
    Referer,
    /// `a`: the User-Agent header.
    UserAgent,
    /// `T`, `M`, `D`, `L`: the request's time (from its head's first read to its answer's
    /// last write) in whole seconds, milliseconds, microseconds, and seconds with six decimals.
    Seconds,
    Millis,
    Micros,
    DecimalSeconds,
    /// `p`: `<pid>` of the worker that answered.
    Pid,
    /// `{name}i`, lowercase.
    RequestHeader(String),
    /// `{name}o`, lowercase.
    ResponseHeader(String),
    /// `{name}e`: the variable's value when the format was parsed (escaped), if set.
    Environment(String, Option<String>),
    /// `queue_ms`: how long the request waited for a worker, in milliseconds, the wait in front
    /// of this server included when a trusted proxy says (`X-Request-Start`).
    QueueMs,
    /// `app_ms`: how long the worker took to answer it, in milliseconds.
    AppMs,
    /// `tls_version` and `tls_cipher`: what the connection's TLS handshake settled; `-` for
    /// plain HTTP.
    TlsVersion,
    TlsCipher,
}

/// The single-letter atoms, for the error message.
const LETTERS: &str = "h l u t r m U q H s B b f a T M D L p";

impl AccessFormat {
    pub fn parse(text: &str) -> Result<AccessFormat, String> {
        if text == "json" {
            return Ok(AccessFormat::Json);
        }
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('%') {
            literal.push_str(&rest[..at]);
            rest = &rest[at + 1..];
            if let Some(after) = rest.strip_prefix('%') {
                literal.push('%');
                rest = after;
                continue;
            }
            let Some(inner) = rest.strip_prefix('(') else {
                return Err(format!(
                    "'%' must begin an atom such as %(h)s, or be doubled (%%), at {:?}",
                    abbreviated(&text[text.len() - rest.len() - 1..])
                ));
            };
            let Some(close) = inner.find(')') else {
                return Err(format!("unclosed atom at {:?}", abbreviated(&text[text.len() - rest.len() - 1..])));
            };
            let name = &inner[..close];
            let Some(after) = inner[close + 1..].strip_prefix('s') else {
                return Err(format!("the atom %({name}) must be written %({name})s"));
            };
            if !literal.is_empty() {
                pieces.push(Piece::Literal(std::mem::take(&mut literal)));
            }
            pieces.push(Piece::Atom(Atom::parse(name)?));
            rest = after;
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        Ok(AccessFormat::Text(pieces))
    }

    /// Whether a line needs the application's response headers (`{name}o`).
    pub fn uses_response_headers(&self) -> bool {
        match self {
            AccessFormat::Text(pieces) => {
                pieces.iter().any(|piece| matches!(piece, Piece::Atom(Atom::ResponseHeader(_))))
            }
            AccessFormat::Json => false,
        }
    }

    /// Appends the line for `record` (newline included) to `out`; `wall` and `now` are when
    /// it is written.
    pub fn render(&self, record: &AccessRecord<'_>, wall: SystemTime, now: Instant, out: &mut String) {
        match self {
            AccessFormat::Text(pieces) => {
                for piece in pieces {
                    match piece {
                        Piece::Literal(text) => out.push_str(text),
                        Piece::Atom(atom) => atom.render(record, wall, now, out),
                    }
                }
            }
            AccessFormat::Json => json(record, wall, now, out),
        }
        out.push('\n');
    }
}

fn abbreviated(text: &str) -> String {
    text.chars().take(20).collect()
}

impl Atom {
    fn parse(name: &str) -> Result<Atom, String> {
        if let Some(braced) = name.strip_prefix('{') {
            if let Some((inner, kind)) = braced.rsplit_once('}') {
                if inner.is_empty() {
                    return Err(format!("the atom %({name})s names nothing between its braces"));
                }
                match kind {
                    "i" => return Ok(Atom::RequestHeader(inner.to_ascii_lowercase())),
                    "o" => return Ok(Atom::ResponseHeader(inner.to_ascii_lowercase())),
                    "e" => {
                        let value = std::env::var_os(inner).map(|v| {
                            let mut text = String::new();
                            escape_into(&mut text, v.as_encoded_bytes());
                            text
                        });
                        return Ok(Atom::Environment(inner.to_string(), value));
                    }
                    _ => {}
                }
            }
        }
        Ok(match name {
            "h" => Atom::Peer,
            "l" => Atom::Ident,
            "u" => Atom::User,
            "t" => Atom::Time,
            "r" => Atom::RequestLine,
            "m" => Atom::Method,
            "U" => Atom::Path,
            "q" => Atom::Query,
            "H" => Atom::Protocol,
            "s" => Atom::Status,
            "B" => Atom::Bytes,
            "b" => Atom::BytesOrDash,
            "f" => Atom::Referer,
            "a" => Atom::UserAgent,
            "T" => Atom::Seconds,
            "M" => Atom::Millis,
            "D" => Atom::Micros,
            "L" => Atom::DecimalSeconds,
            "p" => Atom::Pid,
            "queue_ms" => Atom::QueueMs,
            "app_ms" => Atom::AppMs,
            "tls_version" => Atom::TlsVersion,
            "tls_cipher" => Atom::TlsCipher,
            _ => {
                return Err(format!(
                    "unknown atom %({name})s; the atoms are {LETTERS}, {{HEADER}}i, {{HEADER}}o, {{VARIABLE}}e, \
                     queue_ms, app_ms, tls_version and tls_cipher, or the whole format 'json'"
                ))
            }
        })
    }

    fn render(&self, record: &AccessRecord<'_>, wall: SystemTime, now: Instant, out: &mut String) {
        let elapsed = now.saturating_duration_since(record.started);
        match self {
            Atom::Peer => out.push_str(if record.peer.is_empty() { "-" } else { record.peer }),
            Atom::Ident => out.push('-'),
            Atom::User => or_dash(out, basic_user(record.request_headers).as_deref()),
            Atom::Time => {
                out.push('[');
                out.push_str(&clf_timestamp(wall));
                out.push(']');
            }
            Atom::RequestLine => request_line(record, out),
            Atom::Method => escape_into(out, record.method),
            Atom::Path => escape_into(out, record.path()),
            Atom::Query => escape_into(out, record.query()),
            Atom::Protocol => out.push_str(record.version),
            Atom::Status => push_number(out, record.status),
            Atom::Bytes => push_number(out, record.body_bytes),
            Atom::BytesOrDash if record.body_bytes == 0 => out.push('-'),
            Atom::BytesOrDash => push_number(out, record.body_bytes),
            Atom::Referer => or_dash(out, header(record.request_headers, "referer")),
            Atom::UserAgent => or_dash(out, header(record.request_headers, "user-agent")),
            Atom::Seconds => push_number(out, elapsed.as_secs()),
            Atom::Millis => push_number(out, elapsed.as_millis()),
            Atom::Micros => push_number(out, elapsed.as_micros()),
            Atom::DecimalSeconds => {
                let _ = write!(out, "{}.{:06}", elapsed.as_secs(), elapsed.subsec_micros());
            }
            Atom::Pid => match record.worker {
                Some(pid) => {
                    let _ = write!(out, "<{pid}>");
                }
                None => out.push('-'),
            },
            Atom::RequestHeader(name) => or_dash(out, header(record.request_headers, name)),
            Atom::ResponseHeader(name) => or_dash(out, header(record.response_headers, name)),
            Atom::Environment(_, value) => out.push_str(value.as_deref().unwrap_or("-")),
            Atom::QueueMs => millis_or_dash(out, record.queue_wait(now)),
            Atom::AppMs => millis_or_dash(out, record.app_time()),
            Atom::TlsVersion => out.push_str(record.tls.map_or("-", |(version, _)| version)),
            Atom::TlsCipher => out.push_str(record.tls.map_or("-", |(_, cipher)| cipher)),
        }
    }
}

/// What one access-log line is about.
pub struct AccessRecord<'a> {
    /// The client's address; empty on a Unix socket.
    pub peer: &'a str,
    pub method: &'a [u8],
    pub target: &'a [u8],
    pub version: &'a str,
    pub request_headers: &'a [(Bytes, Bytes)],
    pub status: u16,
    pub body_bytes: u64,
    /// As the application sent them; none when the lobby answered instead.
    pub response_headers: &'a [(Bytes, Bytes)],
    /// When the lobby began reading the request's head.
    pub started: Instant,
    /// When the request, read whole, joined the queue.
    pub enqueued: Instant,
    /// How long it had waited in front of this server, when a trusted proxy said
    /// (`X-Request-Start`); zero otherwise.
    pub upstream: Duration,
    /// When a worker began it, and when its answer had come whole from the worker.
    pub seated: Option<Instant>,
    pub answered: Option<Instant>,
    /// The worker that answered.
    pub worker: Option<i32>,
    /// A TLS connection's version and cipher suite; None for plain HTTP.
    pub tls: Option<(&'static str, &'static str)>,
}

impl AccessRecord<'_> {
    fn path(&self) -> &[u8] {
        self.target.split(|&b| b == b'?').next().unwrap_or_default()
    }

    fn query(&self) -> &[u8] {
        match self.target.iter().position(|&b| b == b'?') {
            Some(at) => &self.target[at + 1..],
            None => b"",
        }
    }

    /// Until a worker began it, the wait upstream included; a request never seated (a 503 from
    /// the queue) waited until it was answered.
    fn queue_wait(&self, now: Instant) -> Option<Duration> {
        Some(self.seated.unwrap_or(now).saturating_duration_since(self.enqueued) + self.upstream)
    }

    fn app_time(&self) -> Option<Duration> {
        Some(self.answered?.saturating_duration_since(self.seated?))
    }
}

fn header<'h>(headers: &'h [(Bytes, Bytes)], lowercase_name: &str) -> Option<&'h [u8]> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(lowercase_name.as_bytes())).map(|(_, v)| v.as_ref())
}

fn or_dash(out: &mut String, value: Option<&[u8]>) {
    match value {
        Some(value) if !value.is_empty() => escape_into(out, value),
        _ => out.push('-'),
    }
}

fn push_number(out: &mut String, n: impl std::fmt::Display) {
    let _ = write!(out, "{n}");
}

fn millis_or_dash(out: &mut String, duration: Option<Duration>) {
    match duration {
        Some(duration) => {
            let _ = write!(out, "{:.3}", duration.as_secs_f64() * 1e3);
        }
        None => out.push('-'),
    }
}

fn request_line(record: &AccessRecord<'_>, out: &mut String) {
    escape_into(out, record.method);
    out.push(' ');
    escape_into(out, record.target);
    out.push(' ');
    out.push_str(record.version);
}

/// The user name of an `Authorization: Basic` header, if it has one that decodes.
fn basic_user(headers: &[(Bytes, Bytes)]) -> Option<Vec<u8>> {
    let value = header(headers, "authorization")?;
    let (scheme, credentials) = value.split_at(value.iter().position(|&b| b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return None;
    }
    let decoded = base64(credentials.trim_ascii())?;
    let end = decoded.iter().position(|&b| b == b':')?;
    Some(decoded[..end].to_vec())
}

/// Standard base64, padding optional; None for anything else.
fn base64(text: &[u8]) -> Option<Vec<u8>> {
    let text = text.strip_suffix(b"==").or_else(|| text.strip_suffix(b"=")).unwrap_or(text);
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut count) = (0u32, 0);
    for &c in text {
        let sextet = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(sextet);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    Some(out)
}

/// `json`: one object, every atom under a name; null where the text form writes `-`.
fn json(record: &AccessRecord<'_>, wall: SystemTime, now: Instant, out: &mut String) {
    let elapsed = now.saturating_duration_since(record.started);
    let c = civil(wall);
    let _ = write!(
        out,
        "{{\"time\":\"{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z\",\"remote_addr\":",
        c.year, c.month, c.day, c.hour, c.minute, c.second
    );
    json_value(out, Some(record.peer.as_bytes()).filter(|p| !p.is_empty()));
    out.push_str(",\"user\":");
    json_value(out, basic_user(record.request_headers).as_deref());
    out.push_str(",\"request\":\"");
    let mut line = String::new();
    request_line(record, &mut line);
    json_escape(out, line.as_bytes());
    out.push_str("\",\"method\":");
    json_value(out, Some(record.method));
    out.push_str(",\"path\":");
    json_value(out, Some(record.path()));
    out.push_str(",\"query\":");
    json_value(out, Some(record.query()));
    out.push_str(",\"protocol\":");
    json_value(out, Some(record.version.as_bytes()));
    let _ = write!(out, ",\"status\":{},\"bytes\":{},\"referer\":", record.status, record.body_bytes);
    json_value(out, header(record.request_headers, "referer"));
    out.push_str(",\"user_agent\":");
    json_value(out, header(record.request_headers, "user-agent"));
    let _ = write!(
        out,
        ",\"request_time\":{}.{:06},\"request_time_us\":{},\"pid\":",
        elapsed.as_secs(),
        elapsed.subsec_micros(),
        elapsed.as_micros()
    );
    match record.worker {
        Some(pid) => push_number(out, pid),
        None => out.push_str("null"),
    }
    for (key, duration) in [("queue_ms", record.queue_wait(now)), ("app_ms", record.app_time())] {
        let _ = write!(out, ",\"{key}\":");
        match duration {
            Some(duration) => {
                let _ = write!(out, "{:.3}", duration.as_secs_f64() * 1e3);
            }
            None => out.push_str("null"),
        }
    }
    out.push_str(",\"tls_version\":");
    json_value(out, record.tls.map(|(version, _)| version.as_bytes()));
    out.push_str(",\"tls_cipher\":");
    json_value(out, record.tls.map(|(_, cipher)| cipher.as_bytes()));
    out.push('}');
}

fn json_value(out: &mut String, value: Option<&[u8]>) {
    match value {
        Some(value) => {
            out.push('"');
            json_escape(out, value);
            out.push('"');
        }
        None => out.push_str("null"),
    }
}

/// A JSON string's inside: bytes that are not UTF-8 become U+FFFD.
fn json_escape(out: &mut String, bytes: &[u8]) {
    for c in String::from_utf8_lossy(bytes).chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    /// gunicorn's default, and maitred's (python/maitred/config/values.py): the combined log format.
    const DEFAULT: &str = r#"%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s""#;

    fn headers(pairs: &[(&'static str, &'static str)]) -> Vec<(Bytes, Bytes)> {
        pairs.iter().map(|(n, v)| (Bytes::from_static(n.as_bytes()), Bytes::from_static(v.as_bytes()))).collect()
    }

    /// Renders `format` for one known request, 1.5 s long: 2 ms in the queue, 40 ms in a worker.
    fn line(format: &str) -> String {
        let request = headers(&[
            ("Host", "example.com"),
            ("Referer", "http://r/"),
            ("User-Agent", "curl/8 \"x\""),
            ("Authorization", "Basic YWxpY2U6c2VjcmV0"), // alice:secret
        ]);
        let response = headers(&[("Content-Type", "text/plain"), ("X-Trace", "t1")]);
        let started = Instant::now();
        let record = AccessRecord {
            peer: "10.0.0.1",
            method: b"GET",
            target: b"/a/b?x=1&y=2",
            version: "HTTP/1.1",
            request_headers: &request,
            status: 200,
            body_bytes: 1234,
            response_headers: &response,
            started,
            enqueued: started + Duration::from_millis(10),
            upstream: Duration::ZERO,
            seated: Some(started + Duration::from_millis(12)),
            answered: Some(started + Duration::from_millis(52)),
            worker: Some(4242),
            tls: Some(("TLSv1.3", "TLS13_AES_128_GCM_SHA256")),
        };
        let wall = UNIX_EPOCH + Duration::from_secs(1_795_325_400); // 2026-11-22 05:30:00 UTC
        let mut out = String::new();
        AccessFormat::parse(format).unwrap().render(
            &record,
            wall,
            started + Duration::from_micros(1_500_250),
            &mut out,
        );
        out
    }

    #[test]
    fn renders_every_atom() {
        for (atom, value) in [
            ("h", "10.0.0.1"),
            ("l", "-"),
            ("u", "alice"),
            ("t", "[22/Nov/2026:05:30:00 +0000]"),
            ("r", "GET /a/b?x=1&y=2 HTTP/1.1"),
            ("m", "GET"),
            ("U", "/a/b"),
            ("q", "x=1&y=2"),
            ("H", "HTTP/1.1"),
            ("s", "200"),
            ("B", "1234"),
            ("b", "1234"),
            ("f", "http://r/"),
            ("a", "curl/8 \\\"x\\\""),
            ("T", "1"),
            ("M", "1500"),
            ("D", "1500250"),
            ("L", "1.500250"),
            ("p", "<4242>"),
            ("{host}i", "example.com"),
            ("{X-TRACE}o", "t1"),
            ("{accept}i", "-"),
            ("{MAITRED_NO_SUCH_VARIABLE}e", "-"),
            ("{PATH}e", &std::env::var("PATH").unwrap()),
            ("queue_ms", "2.000"),
            ("app_ms", "40.000"),
        ] {
            assert_eq!(line(&format!("%({atom})s")), format!("{value}\n"), "atom {atom}");
        }
    }

    #[test]
    fn the_default_is_the_combined_log_format() {
        assert_eq!(
            line(DEFAULT),
            "10.0.0.1 - alice [22/Nov/2026:05:30:00 +0000] \"GET /a/b?x=1&y=2 HTTP/1.1\" 200 1234 \"http://r/\" \
             \"curl/8 \\\"x\\\"\"\n"
        );
    }

    #[test]
    fn copies_text_and_doubled_percent_signs() {
        assert_eq!(line("100%% of %(s)s: %(m)s%(U)s."), "100% of 200: GET/a/b.\n");
        assert_eq!(line("no atoms"), "no atoms\n");
    }

    #[test]
    fn json_has_every_atom() {
        assert_eq!(
            line("json"),
            "{\"time\":\"2026-11-22T05:30:00Z\",\"remote_addr\":\"10.0.0.1\",\"user\":\"alice\",\
             \"request\":\"GET /a/b?x=1&y=2 HTTP/1.1\",\"method\":\"GET\",\"path\":\"/a/b\",\"query\":\"x=1&y=2\",\
             \"protocol\":\"HTTP/1.1\",\"status\":200,\"bytes\":1234,\"referer\":\"http://r/\",\
             \"user_agent\":\"curl/8 \\\"x\\\"\",\"request_time\":1.500250,\"request_time_us\":1500250,\
             \"pid\":4242,\"queue_ms\":2.000,\"app_ms\":40.000,\"tls_version\":\"TLSv1.3\",\
             \"tls_cipher\":\"TLS13_AES_128_GCM_SHA256\"}\n"
        );
    }

    #[test]
    fn refuses_what_it_does_not_know_in_one_line() {
        for (format, says) in [
            ("%(x)s", "unknown atom %(x)s"),
            ("%(h)d", "must be written %(h)s"),
            ("%(h", "unclosed atom"),
            ("50% off", "'%' must begin an atom"),
            ("%({}i)s", "names nothing"),
            ("%({x}z)s", "unknown atom %({x}z)s"),
        ] {
            let error = AccessFormat::parse(format).unwrap_err();
            assert!(error.contains(says), "{format}: {error}");
            assert!(!error.contains('\n'), "{error}");
        }
        assert!(AccessFormat::parse(DEFAULT).is_ok());
    }

    #[test]
    fn decodes_only_basic_credentials() {
        assert_eq!(basic_user(&headers(&[("authorization", "basic Ym9iOg==")])), Some(b"bob".to_vec()));
        assert_eq!(basic_user(&headers(&[("authorization", "Bearer YWxpY2U6c2VjcmV0")])), None);
        assert_eq!(basic_user(&headers(&[("authorization", "Basic !!!")])), None);
    }
}
