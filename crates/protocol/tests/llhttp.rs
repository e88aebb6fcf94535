//! llhttp's request tests (test/request/*.md), strict ones only (meta type exactly
//! "request"): a case whose log ends in "message complete" must decode as many complete
//! requests, with the same method, target, version, fields and body; a case whose log ends
//! in an error must be refused (after as many complete requests); a case whose log ends
//! elsewhere (the input stops mid-request) must decode its complete requests and wait.
//!
//! llhttp's "Data after `Connection: close`" error means the parser was handed bytes after a
//! request that closes the connection; maitred's decoder ignores such bytes instead (the
//! lobby never reads them), which is what the test checks for those cases.
//!
//! llhttp does not require Host in HTTP/1.1 requests; RFC 9112 §3.2 does, and so does
//! maitred. A case refused only for that is decoded again with a Host field added to the
//! request that lacked it (see `support::decode_adding_hosts`), and judged on that.
//!
//! Where maitred deliberately differs, the case is allowlisted below with the reason (and in
//! docs/CONFORMANCE.md); an allowlisted case that starts to pass fails the test.

mod support;

use std::fs;

use maitred_protocol::{Limits, Version};
use support::{corpus, decode_adding_hosts, is_added_host, show, Decoded, Run};

/// Strict llhttp cases maitred decodes differently, and why. Keys are "file: title".
const DIFFERENCES: &[(&str, &str)] = &[
    ("connection.md: Setting a flag and pausing", "Upgrade is ignored (RFC 9110 §7.8 allows it; WSGI cannot switch protocols): the request is served as plain HTTP, where llhttp stops for the switch"),
    ("connection.md: Emitting part of body and pausing", "Upgrade is ignored (RFC 9110 §7.8 allows it; WSGI cannot switch protocols): the bytes after the body are read as the next request, where llhttp stops for the switch"),
    ("content-length.md: Content-Length reset when no body is received", "skipBody is an llhttp callback feature (skipping the body of a response to HEAD); a server always reads a request's body"),
    ("invalid.md: HTTP protocol and ANNOUNCE method", "any token is a method (RFC 9110 §9.1); llhttp knows a fixed list per protocol"),
    ("invalid.md: Invalid method", "any token is a method (RFC 9110 §9.1), MKCOLA included; llhttp knows a fixed list"),
    ("invalid.md: Invalid HTTP version", "the input stops right after 'HTTP/5.6' with no line end: maitred waits for the line end before telling 505 (well-formed) from 400, so the verdict does not depend on how the bytes are split"),
    ("method.md: CONNECT request", "CONNECT (tunnels) is refused with 501; llhttp completes the head and hands the connection over"),
    ("method.md: CONNECT request with CAPS", "CONNECT (tunnels) is refused with 501; llhttp completes the head and hands the connection over"),
    ("method.md: CONNECT with body", "CONNECT (tunnels) is refused with 501; llhttp completes the head and hands the connection over"),
    ("method.md: M-SEARCH request", "'*' is only a target for OPTIONS (RFC 9112 §3.2.4); M-SEARCH * is SSDP over UDP, not HTTP"),
    ("method.md: SOURCE request with ICE", "only HTTP/1.x is spoken, not ICE"),
    ("method.md: OPTIONS request with RTSP", "only HTTP/1.x is spoken, not RTSP"),
    ("method.md: ANNOUNCE request with RTSP", "only HTTP/1.x is spoken, not RTSP"),
    ("sample.md: No HTTP version", "HTTP/0.9 requests (no version) are refused with 400"),
    ("transfer-encoding.md: POST with `chunked` as last transfer-encoding", "transfer codings other than chunked (deflate) are not supported: 501"),
    ("transfer-encoding.md: POST with `chunked` as last transfer-encoding (multiple headers)", "transfer codings other than chunked (deflate) are not supported: 501"),
    ("uri.md: Underscore in hostname", "CONNECT (tunnels) is refused with 501; llhttp completes the head and hands the connection over"),
];

struct Case {
    key: String,
    input: Vec<u8>,
    log: Vec<String>,
}

/// The corpus's strict cases.
fn cases() -> Vec<Case> {
    let dir = corpus("llhttp").join("test/request");
    let mut files: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .md files in {}", dir.display());
    let mut cases = Vec::new();
    for path in files {
        let file = path.file_name().expect("a file name").to_string_lossy().into_owned();
        let text = fs::read_to_string(&path).expect("read .md");
        cases.extend(parse_md(&file, &text));
    }
    cases
}

/// The strict cases of one file: a heading, a meta comment, an `http` block and a `log` block.
fn parse_md(file: &str, text: &str) -> Vec<Case> {
    let lines: Vec<&str> = text.lines().collect();
    let mut cases = Vec::new();
    let mut title = "";
    let mut meta_type: Option<String> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if line.starts_with('#') {
            title = line.trim_start_matches('#').trim();
        } else if let Some(meta) = line.strip_prefix("<!-- meta=") {
            meta_type = Some(meta_type_of(meta).unwrap_or_else(|| panic!("{file}: {title}: meta {meta}")));
        } else if line == "```http" {
            let (input, after) = block(&lines, i + 1);
            let log_start = (after..lines.len()).find(|&j| lines[j] == "```log").expect("a log block");
            let (log, after_log) = block(&lines, log_start + 1);
            if meta_type.take().as_deref() == Some("request") {
                cases.push(Case {
                    key: format!("{file}: {title}"),
                    input: decode_input(&input.join("\n")),
                    log: log.iter().map(|s| s.to_string()).collect(),
                });
            }
            i = after_log;
            continue;
        }
        i += 1;
    }
    cases
}

fn meta_type_of(meta: &str) -> Option<String> {
    let after_key = &meta[meta.find("\"type\"")? + "\"type\"".len()..];
    let value = after_key.trim_start().strip_prefix(':')?.trim_start().strip_prefix('"')?;
    Some(value[..value.find('"')?].to_string())
}

/// The lines of a fenced block starting at `start`, and the index after its closing fence.
fn block<'a>(lines: &[&'a str], start: usize) -> (Vec<&'a str>, usize) {
    let end = (start..lines.len()).find(|&j| lines[j] == "```").expect("a closing fence");
    (lines[start..end].to_vec(), end + 1)
}

/// llhttp's input encoding: a backslash at the end of a line joins it to the next, every
/// line break is CRLF, and `\r`, `\n`, `\t`, `\f`, `\xHH` and `\NNN` (octal) stand for their
/// bytes. Other backslashes are literal.
fn decode_input(text: &str) -> Vec<u8> {
    let joined = text.replace("\\\n", "").replace('\n', "\r\n");
    let bytes = joined.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            if let Some((byte, len)) = escape(&bytes[i + 1..]) {
                out.push(byte);
                i += 1 + len;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// The byte an escape stands for and its length after the backslash.
fn escape(rest: &[u8]) -> Option<(u8, usize)> {
    match rest.first()? {
        b'r' => Some((b'\r', 1)),
        b'n' => Some((b'\n', 1)),
        b't' => Some((b'\t', 1)),
        b'f' => Some((0x0c, 1)),
        b'x' => {
            let hex = std::str::from_utf8(rest.get(1..3)?).ok()?;
            Some((u8::from_str_radix(hex, 16).ok()?, 3))
        }
        b'0'..=b'7' => {
            let len = rest.iter().take(3).take_while(|b| (b'0'..=b'7').contains(b)).count();
            let octal = std::str::from_utf8(&rest[..len]).ok()?;
            Some((u8::from_str_radix(octal, 8).ok()?, len))
        }
        _ => None,
    }
}

/// What llhttp's log says about one message.
#[derive(Default, Debug)]
struct Logged {
    method: String,
    url: String,
    version: String,
    headers: Vec<(String, String)>,
    body: String,
    headers_complete: bool,
    complete: bool,
}

struct Expectation {
    messages: Vec<Logged>,
    /// The reason of the error the log ends with, if it does.
    error: Option<String>,
}

fn read_log(log: &[String]) -> Expectation {
    let mut messages: Vec<Logged> = Vec::new();
    let mut error = None;
    let mut last_span = "";
    for line in log {
        let event = line.split_once(' ').map_or("", |(_, rest)| rest);
        if event == "message begin" {
            messages.push(Logged::default());
            last_span = "";
        } else if event.starts_with("headers complete") {
            messages.last_mut().expect("a message").headers_complete = true;
        } else if event == "message complete" {
            messages.last_mut().expect("a message").complete = true;
        } else if let Some(rest) = event.strip_prefix("error ") {
            let reason = rest.split_once("reason=\"").map_or("", |(_, r)| r.trim_end_matches('"'));
            error = Some(reason.to_string());
        } else if let Some((kind, value)) = span(event) {
            let message = messages.last_mut().expect("a message");
            match kind {
                "method" => message.method += &value,
                "url" => message.url += &value,
                "version" => message.version += &value,
                "header_field" if last_span == "header_field" => {
                    message.headers.last_mut().expect("a field").0 += &value
                }
                "header_field" => message.headers.push((value, String::new())),
                "header_value" => message.headers.last_mut().expect("a field").1 += &value,
                "body" => message.body += &value,
                _ => {}
            }
            last_span = kind;
        }
    }
    Expectation { messages, error }
}

/// `len=N span[kind]="value"`, with the log's escapes for control characters undone.
fn span(event: &str) -> Option<(&str, String)> {
    let rest = event.split_once(" span[")?.1;
    let (kind, quoted) = rest.split_once("]=\"")?;
    let raw = quoted.strip_suffix('"')?;
    let mut value = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let unescaped = match chars.peek() {
                Some('t') => Some('\t'),
                Some('f') => Some('\x0c'),
                Some('r') => Some('\r'),
                Some('n') => Some('\n'),
                _ => None,
            };
            if let Some(u) = unescaped {
                chars.next();
                value.push(u);
                continue;
            }
        }
        value.push(c);
    }
    Some((kind, value))
}

/// Whether decoded bytes are the text llhttp's log shows (which renders bytes as UTF-8
/// where they are, and as Latin-1 characters otherwise).
fn same_text(ours: &[u8], logged: &str) -> bool {
    std::str::from_utf8(ours).is_ok_and(|s| s == logged) || ours.iter().map(|&b| b as char).eq(logged.chars())
}

fn trim_ows(s: &str) -> &str {
    s.trim_matches(|c| c == ' ' || c == '\t')
}

fn check(case: &Case) -> Result<String, String> {
    let expectation = read_log(&case.log);
    let decoding = decode_adding_hosts(&Limits::default(), &case.input)?;
    let run = &decoding.run;
    let logged_complete = expectation.messages.iter().filter(|m| m.complete).count();
    let logged_heads = expectation.messages.iter().filter(|m| m.headers_complete).count();
    let given_host = if decoding.hosts_added > 0 { " (once given a Host)" } else { "" };
    let summary = |run: &Run| match &run.error {
        Some(e) => format!("{} complete, then {} {e}{given_host}", run.complete_requests(), e.status()),
        None => format!("{} complete, {} heads{given_host}", run.complete_requests(), run.requests.len()),
    };
    match expectation.error.as_deref() {
        Some("Data after `Connection: close`") => {
            let closed = run.requests.last().is_some_and(|r| r.complete && !r.head.keep_alive);
            if run.error.is_some() || run.complete_requests() != logged_complete || !closed || run.leftover == 0 {
                return Err(format!("expected {logged_complete} complete and the rest ignored; got {}", summary(run)));
            }
        }
        Some(reason) => {
            if run.error.is_none() || run.complete_requests() != logged_complete {
                return Err(format!(
                    "expected {logged_complete} complete, then an error ({reason}); got {}",
                    summary(run)
                ));
            }
        }
        None => {
            if run.error.is_some() || run.complete_requests() != logged_complete || run.requests.len() != logged_heads {
                return Err(format!("expected {logged_complete} complete, {logged_heads} heads; got {}", summary(run)));
            }
        }
    }
    for (i, (ours, logged)) in run.requests.iter().zip(&expectation.messages).enumerate() {
        if logged.complete {
            compare(ours, logged).map_err(|e| format!("request {i}: {e}"))?;
        }
    }
    Ok(summary(run))
}

fn compare(ours: &Decoded, logged: &Logged) -> Result<(), String> {
    if !same_text(&ours.head.method, &logged.method) {
        return Err(format!("method {}", show(&ours.head.method)));
    }
    if !same_text(&ours.head.target, &logged.url) {
        return Err(format!("target {}", show(&ours.head.target)));
    }
    let version = match ours.head.version {
        Version::Http10 => "1.0",
        Version::Http11 => "1.1",
    };
    if version != logged.version {
        return Err(format!("version {version}, logged {}", logged.version));
    }
    // llhttp logs trailer fields like header fields, after them.
    let our_headers: Vec<_> =
        ours.head.headers.iter().chain(&ours.trailers).filter(|(name, value)| !is_added_host(name, value)).collect();
    let headers_match = our_headers.len() == logged.headers.len()
        && our_headers.iter().zip(&logged.headers).all(|((name, value), (logged_name, logged_value))| {
            same_text(name, logged_name) && same_text(value, trim_ows(logged_value))
        });
    if !headers_match {
        return Err(format!("headers {our_headers:?}, logged {:?}", logged.headers));
    }
    if !same_text(&ours.body, &logged.body) {
        return Err(format!("body {}", show(&ours.body)));
    }
    Ok(())
}

#[test]
fn llhttp_corpus_strict_request_cases() {
    let cases = cases();
    let mut problems = Vec::new();
    let mut passed = 0;
    let mut documented = 0;
    let mut report = Vec::new();
    for case in &cases {
        let result = check(case);
        let listed = DIFFERENCES.iter().find(|(key, _)| *key == case.key);
        match (&result, listed) {
            (Ok(_), None) => passed += 1,
            (Err(_), Some(_)) => documented += 1,
            (Ok(note), Some((_, reason))) => {
                problems.push(format!("{}: passes now ({note}) but is allowlisted: {reason}", case.key))
            }
            (Err(e), None) => problems.push(format!("{}: {e}", case.key)),
        }
        report.push(match &result {
            Ok(note) => format!("  {}: {note}", case.key),
            Err(e) => format!("  {}: differs: {}", case.key, e.lines().next().unwrap_or("")),
        });
    }
    for (key, _) in DIFFERENCES {
        if !cases.iter().any(|case| case.key == *key) {
            problems.push(format!("{key}: allowlisted but not in the corpus"));
        }
    }
    let with_host =
        report.iter().filter(|line| line.ends_with("(once given a Host)") && !line.contains("differs")).count();
    println!(
        "llhttp strict: {passed}/{} as expected ({with_host} of them once given the Host field RFC 9112 requires), \
         {documented} documented differences",
        cases.len()
    );
    println!("{}", report.join("\n"));
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn input_encoding() {
    assert_eq!(decode_input("GET / HTTP/1.1\nA: \\x41\\t\\001\\q\\\nB\n"), b"GET / HTTP/1.1\r\nA: A\t\x01\\qB\r\n");
    assert_eq!(span("len=6 span[header_value]=\"close\\t\""), Some(("header_value", "close\t".to_string())));
}
