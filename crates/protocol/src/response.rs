//! Responses: heads, chunks and the server's own refusals, written into byte buffers.

use std::io::Write;

use crate::syntax::{list_members, parse_decimal};
use crate::Version;

/// What the request being answered says about its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseContext {
    /// The request was HEAD: the response has no body, whatever its headers say.
    pub head_request: bool,
    pub version: Version,
    /// The request allows the connection to stay open (and the server wants it to).
    pub keep_alive: bool,
}

/// How the body of a response is delimited, which decides what the lobby writes after the
/// head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Nothing may follow the head (HEAD, 1xx, 204, 304).
    NoBody,
    /// Exactly this many bytes follow; if the application gives fewer, the connection must
    /// be closed, since the client cannot tell where the next response starts.
    Length(u64),
    /// Chunks ([`write_chunk`]) and then [`LAST_CHUNK`].
    Chunked,
    /// The body ends when the connection closes (HTTP/1.0 and unknown length).
    UntilClose,
}

/// The interim answer to `Expect: 100-continue`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The end of a chunked body (no trailers).
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Header fields that concern one connection, not the message; the lobby decides those (and
/// HTTP/2 forbids them, RFC 9113 8.2.2).
const HOP_BY_HOP: [&[u8]; 7] =
    [b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade", b"proxy-connection"];

pub fn is_hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP.iter().any(|hop| name.eq_ignore_ascii_case(hop))
}

/// Writes a response head: `HTTP/1.1 <status> <reason>`, the application's headers minus the
/// hop-by-hop ones (Connection, Keep-Alive, Transfer-Encoding, TE, Trailer, Upgrade,
/// Proxy-Connection), `Date` (given, preformatted) and `Server: maitred` unless the
/// application set them, the framing header, `Connection` when needed, and the blank line.
/// Returns the framing of the body and whether the connection stays open after it.
///
/// `known_length` is `Some(n)` when the caller already holds the whole body (`n` bytes),
/// `None` when it will stream it.
///
/// Framing, in order:
/// - HEAD requests and status 1xx, 204 and 304 have no body. A valid Content-Length from
///   the application is kept for HEAD and 304 (it describes the representation) and dropped
///   for 1xx and 204, which must not carry one (RFC 9110 §8.6).
/// - A valid Content-Length from the application (digits; repeats allowed only if equal) is
///   used as is. An invalid one is dropped rather than sent on.
/// - Else `known_length` gives one.
/// - Else HTTP/1.1 gets chunked; HTTP/1.0 gets a body that ends with the connection.
///
/// The connection stays open if the request allows it, the application did not send
/// `Connection: close`, and the body does not end with the connection. HTTP/1.1 answers
/// that stay open carry no Connection header (persistence is the default); HTTP/1.0 answers
/// that stay open say `Connection: keep-alive`; answers that close say `Connection: close`.
///
/// The caller must have checked the application's headers (tokens for names, no CR, LF or
/// NUL in values: PEP 3333 and RFC 9110 §5.5); they are written as given. The status must be
/// three digits; an empty reason writes an empty reason phrase. Interim 100 answers are
/// [`CONTINUE`], not this.
pub fn write_response_head<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    out: &mut Vec<u8>,
    ctx: &ResponseContext,
    status: u16,
    reason: &[u8],
    headers: &[(N, V)],
    known_length: Option<u64>,
    date: &[u8],
) -> (Framing, bool) {
    let mut app_length = AppLength::Absent;
    let mut has_date = false;
    let mut has_server = false;
    let mut app_close = false;
    for (name, value) in headers {
        let (name, value) = (name.as_ref(), value.as_ref());
        if name.eq_ignore_ascii_case(b"content-length") {
            app_length = app_length.add(value);
        } else if name.eq_ignore_ascii_case(b"date") {
            has_date = true;
        } else if name.eq_ignore_ascii_case(b"server") {
            has_server = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            app_close |= list_members(value).any(|option| option.eq_ignore_ascii_case(b"close"));
        }
    }
    let app_length = match app_length {
        AppLength::Valid(n) => Some(n),
        AppLength::Absent | AppLength::Invalid => None,
    };

    let bodiless = ctx.head_request || (100..200).contains(&status) || status == 204 || status == 304;
    let (framing, length_header) = if bodiless {
        let keeps_length = ctx.head_request || status == 304;
        (Framing::NoBody, app_length.filter(|_| keeps_length))
    } else if let Some(n) = app_length.or(known_length) {
        (Framing::Length(n), Some(n))
    } else if ctx.version == Version::Http11 {
        (Framing::Chunked, None)
    } else {
        (Framing::UntilClose, None)
    };
    let keep_alive = ctx.keep_alive && !app_close && framing != Framing::UntilClose;

    let _ = write!(out, "HTTP/1.1 {status} ");
    out.extend_from_slice(reason);
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        let (name, value) = (name.as_ref(), value.as_ref());
        if is_hop_by_hop(name) || name.eq_ignore_ascii_case(b"content-length") {
            continue;
        }
        write_field(out, name, value);
    }
    if !has_date {
        write_field(out, b"Date", date);
    }
    if !has_server {
        write_field(out, b"Server", b"maitred");
    }
    if let Some(n) = length_header {
        let _ = write!(out, "Content-Length: {n}\r\n");
    }
    if framing == Framing::Chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if ctx.version == Version::Http10 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    (framing, keep_alive)
}

/// Room for a whole answer of one part: at least what `write_response_head` writes for this
/// reason, these fields and a `date`, then `body_len` bytes in any framing, and the last chunk.
/// Reserved at once, the buffer is allocated once rather than grown field by field (the
/// lobby's allocator was 5% of its time on FastAPI's fortunes, about half of it growing these).
pub fn one_part_answer_capacity<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    reason: &[u8],
    headers: &[(N, V)],
    date: &[u8],
    body_len: usize,
) -> usize {
    // The status line, and the fields the head may add: Date, Server, Content-Length (20
    // digits at most), Transfer-Encoding and Connection.
    const STATUS_LINE: usize = "HTTP/1.1 200 \r\n".len();
    const ADDED: usize = "Date: \r\n".len()
        + "Server: maitred\r\n".len()
        + "Content-Length: 18446744073709551615\r\n".len()
        + "Transfer-Encoding: chunked\r\n".len()
        + "Connection: keep-alive\r\n".len()
        + "\r\n".len();
    // A chunk's size line (16 hex digits at most) and CRLF, then the last chunk.
    const CHUNK_FRAMING: usize = "ffffffffffffffff\r\n\r\n".len() + LAST_CHUNK.len();
    let fields: usize = headers.iter().map(|(name, value)| name.as_ref().len() + value.as_ref().len() + 4).sum();
    STATUS_LINE + reason.len() + fields + ADDED + date.len() + body_len + CHUNK_FRAMING
}

/// The application's Content-Length, across however many lines it sent.
#[derive(Clone, Copy)]
enum AppLength {
    Absent,
    Valid(u64),
    Invalid,
}

impl AppLength {
    fn add(self, value: &[u8]) -> AppLength {
        match (self, parse_decimal(value)) {
            (AppLength::Absent, Some(n)) => AppLength::Valid(n),
            (AppLength::Valid(m), Some(n)) if m == n => AppLength::Valid(n),
            _ => AppLength::Invalid,
        }
    }
}

fn write_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Writes one chunk of a chunked body. Empty data writes nothing: an empty chunk would end
/// the body.
pub fn write_chunk(out: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let _ = write!(out, "{:x}\r\n", data.len());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Writes a whole answer for a request the server refuses itself: the status line, Date,
/// `Server: maitred`, `Content-Type: text/plain; charset=utf-8`, Content-Length,
/// `Connection: close` (or `keep-alive` when `keep_alive` is set, for refusals that leave a
/// healthy connection usable, such as a 503 after a queue timeout), and a one-line body
/// `<status> <Reason>: <detail>`. Control characters in `detail` become spaces, so the body
/// stays one line whatever the detail quotes. `retry_after` (seconds) adds `Retry-After`, for
/// a 503 that tells the client when the server expects to have room again.
pub fn write_error_response(
    out: &mut Vec<u8>,
    status: u16,
    detail: &str,
    date: &[u8],
    keep_alive: bool,
    retry_after: Option<u64>,
) {
    let reason = reason_phrase(status);
    let mut body = format!("{status}");
    if !reason.is_empty() {
        body.push(' ');
        body.push_str(reason);
    }
    if !detail.is_empty() {
        body.push_str(": ");
        body.extend(detail.chars().map(|c| if c.is_control() { ' ' } else { c }));
    }
    body.push('\n');
    let _ = write!(out, "HTTP/1.1 {status} {reason}\r\n");
    write_field(out, b"Date", date);
    out.extend_from_slice(b"Server: maitred\r\nContent-Type: text/plain; charset=utf-8\r\n");
    let _ = write!(out, "Content-Length: {}\r\n", body.len());
    if let Some(seconds) = retry_after {
        let _ = write!(out, "Retry-After: {seconds}\r\n");
    }
    let connection: &[u8] = if keep_alive { b"keep-alive" } else { b"close" };
    write_field(out, b"Connection", connection);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body.as_bytes());
}

/// The reason phrase registered for a status code (RFC 9110 §15 and the IANA registry);
/// `""` for codes without one.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        102 => "Processing",
        103 => "Early Hints",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        205 => "Reset Content",
        206 => "Partial Content",
        207 => "Multi-Status",
        208 => "Already Reported",
        226 => "IM Used",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        305 => "Use Proxy",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        423 => "Locked",
        424 => "Failed Dependency",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        506 => "Variant Also Negotiates",
        507 => "Insufficient Storage",
        508 => "Loop Detected",
        511 => "Network Authentication Required",
        _ => "",
    }
}
