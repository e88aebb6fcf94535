//! One request's response as the worker builds it: what `start_response` accepts (PEP 3333 and
//! RFC 9110), where the response stands, and how its head is encoded for the lobby.
//!
//! Imports no module of this crate.

use std::borrow::Cow;
use std::mem;
use std::sync::atomic::{AtomicBool, Ordering};

use maitred_wire::{FrameHeader, Kind, WireError, Writer, HEADER_LEN};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

/// Where the current response stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The request was received; `start_response` has not been called.
    AwaitingStart,
    /// `start_response` was called; its head waits for the first body bytes (PEP 3333 defers
    /// the head until the application produces a non-empty chunk or calls `write`).
    HeadPending,
    /// The head went to the lobby; body frames may follow.
    HeadSent,
    /// The head went out, then the lobby sent `CANCEL`: the client has gone. Every body write
    /// fails with `ClientDisconnected` until the worker ends the response with
    /// `RESPONSE_ABORT`.
    Cancelled,
    /// The frame with `END` (or a `RESPONSE_ABORT`) was sent, or no request is in progress.
    Complete,
}

/// The hop-by-hop header `name` stands for, if it is one: a header that describes one
/// connection, which is the lobby's (PEP 3333, "Other HTTP Features", after RFC 2616 section
/// 13.5.1; RFC 9110 section 7.6.1 adds Proxy-Connection). The application's are dropped, as
/// gunicorn, uvicorn and granian do not refuse them: the lobby frames every answer itself.
///
/// By length first: a header of another length, most of them, costs one comparison.
fn hop_by_hop(name: &[u8]) -> Option<&'static str> {
    let candidates: &[&'static str] = match name.len() {
        2 => &["te"],
        7 => &["trailer", "upgrade"],
        10 => &["connection", "keep-alive"],
        16 => &["proxy-connection"],
        17 => &["transfer-encoding"],
        18 => &["proxy-authenticate"],
        19 => &["proxy-authorization"],
        _ => return None,
    };
    candidates.iter().copied().find(|hop| name.eq_ignore_ascii_case(hop.as_bytes()))
}

/// Whether this worker has said that it drops the application's hop-by-hop headers: it says so
/// once, at the first.
static HOP_BY_HOP_SAID: AtomicBool = AtomicBool::new(false);

/// Where a header list goes: a response's head, or a WebSocket's `101` (`WS_ACCEPT`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum HeadersFor {
    /// `Connection` goes on to the lobby, which closes the connection after the answer when it
    /// lists `close`, and drops it (crates/protocol's `write_response_head`); the other
    /// hop-by-hop headers are dropped here.
    Response,
    /// Every hop-by-hop header is dropped: the lobby's `101` has its own `Connection`.
    WebSocketAccept,
}

/// RFC 9110's field-name characters.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A field value or reason phrase may hold any latin-1 byte but the control characters
/// (tab excepted): CR and LF would split the head, NUL and the rest confuse clients.
fn is_text_byte(b: u8) -> bool {
    b == b'\t' || (b >= 0x20 && b != 0x7f)
}

/// A response body piece from the application, which must be `bytes`.
pub fn bytes_arg<'a>(data: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    match data.cast::<PyBytes>() {
        Ok(bytes) => Ok(bytes.as_bytes()),
        Err(_) => {
            let kind = data.get_type().name()?;
            Err(PyTypeError::new_err(format!("the response body must be bytes, and the application gave {kind}")))
        }
    }
}

/// The latin-1 bytes of a `str`, or None if it holds a code point above U+00FF.
pub fn latin1_bytes<'a>(text: &'a Bound<'_, PyString>) -> PyResult<Option<Cow<'a, [u8]>>> {
    let utf8 = text.to_str()?;
    if utf8.is_ascii() {
        return Ok(Some(Cow::Borrowed(utf8.as_bytes())));
    }
    Ok(utf8.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect::<Option<Vec<u8>>>().map(Cow::Owned))
}

/// How the application writes header names and values: WSGI's native strings (PEP 3333), or
/// ASGI's byte strings.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum HeaderText {
    Str,
    Bytes,
}

/// A header name or value as latin-1 bytes: a `str` (each code point at most U+00FF), or with
/// `HeaderText::Bytes` a `bytes` taken as it is.
fn header_bytes<'a>(
    value: &'a Bound<'_, PyAny>,
    text: HeaderText,
    what: &dyn Fn() -> String,
) -> PyResult<Option<Cow<'a, [u8]>>> {
    if text == HeaderText::Bytes {
        return match value.cast::<PyBytes>() {
            Ok(bytes) => Ok(Some(Cow::Borrowed(bytes.as_bytes()))),
            Err(_) => {
                let kind = value.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".to_owned());
                Err(PyTypeError::new_err(format!("{} must be bytes, not {kind}", what())))
            }
        };
    }
    latin1_bytes(text_arg(value, what)?)
}

fn text_arg<'a, 'py>(value: &'a Bound<'py, PyAny>, what: &dyn Fn() -> String) -> PyResult<&'a Bound<'py, PyString>> {
    value.cast::<PyString>().map_err(|_| {
        let kind = value.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".to_owned());
        PyTypeError::new_err(format!("{} must be a str, not {kind}", what()))
    })
}

/// The response of the request in progress.
pub struct Response {
    pub phase: Phase,
    /// The request's method is HEAD: the head goes out, body bytes do not.
    head_request: bool,
    status: u16,
    reason: Vec<u8>,
    /// The validated headers, already encoded as the frame carries them.
    headers: Vec<u8>,
    header_count: u16,
    declared_length: Option<u64>,
    /// The first hop-by-hop header of the current head, which the worker dropped (`Connection`
    /// it passes on to the lobby, which drops it after it has read it).
    pub hop_by_hop: Option<&'static str>,
    /// Body bytes the application produced so far (sent, or dropped for a body-less response).
    produced: u64,
    /// Where `start_response` validates a new head before it replaces the current one.
    scratch: Vec<u8>,
}

impl Response {
    pub fn new() -> Response {
        Response {
            phase: Phase::Complete,
            head_request: false,
            status: 0,
            reason: Vec::new(),
            headers: Vec::new(),
            header_count: 0,
            declared_length: None,
            hop_by_hop: None,
            produced: 0,
            scratch: Vec::new(),
        }
    }

    /// Resets for a new request.
    pub fn begin(&mut self, head_request: bool) {
        self.phase = Phase::AwaitingStart;
        self.head_request = head_request;
        self.declared_length = None;
        self.produced = 0;
    }

    /// The status code and reason of the head that went out, or is to go out.
    pub fn status(&self) -> (u16, &[u8]) {
        (self.status, &self.reason)
    }

    pub fn head_sent(&self) -> bool {
        matches!(self.phase, Phase::HeadSent | Phase::Cancelled | Phase::Complete)
    }

    /// HEAD responses and 204 and 304 have no body: what the application yields is dropped.
    pub fn has_body(&self) -> bool {
        !(self.head_request || self.status == 204 || self.status == 304)
    }

    /// The Content-Length the application declared, when the body must match it.
    pub fn length_to_match(&self) -> Option<u64> {
        self.declared_length.filter(|_| self.has_body())
    }

    pub fn produced(&self) -> u64 {
        self.produced
    }

    pub fn add_produced(&mut self, count: u64) {
        self.produced += count;
    }

    /// The Content-Length header the worker adds when the whole body of `total` bytes goes out
    /// with the head: only when the application gave none, the status allows one, and (for
    /// HEAD) the application actually produced the body whose length it would be.
    pub fn added_length(&self, total: u64) -> Option<u64> {
        let add = self.declared_length.is_none()
            && self.status != 204
            && self.status != 304
            && !(self.head_request && total == 0);
        add.then_some(total)
    }

    /// Validates `start_response`'s status and headers and makes them the pending head. On an
    /// error the response is left as it was.
    pub fn start(&mut self, status: &Bound<'_, PyAny>, headers: &Bound<'_, PyAny>, text: HeaderText) -> PyResult<()> {
        let (code, status_bytes, reason_start) = parse_status(status)?;
        let mut encoded = mem::take(&mut self.scratch);
        encoded.clear();
        let result = encode_headers(headers, text, HeadersFor::Response, &mut encoded);
        match result {
            Ok(Encoded { count, declared_length, hop_by_hop }) => {
                self.status = code;
                self.reason.clear();
                self.reason.extend_from_slice(&status_bytes[reason_start..]);
                self.scratch = mem::replace(&mut self.headers, encoded);
                self.header_count = count;
                self.declared_length = declared_length;
                self.hop_by_hop = hop_by_hop;
                self.phase = Phase::HeadPending;
                Ok(())
            }
            Err(error) => {
                self.scratch = encoded;
                Err(error)
            }
        }
    }

    /// The first time a head of this worker's carries a hop-by-hop header, says in the log that
    /// it is dropped, naming the request (`method`, `target`); later ones cost the check of an
    /// `Option`.
    pub fn say_hop_by_hop_dropped(&self, py: Python<'_>, method: &[u8], target: &[u8]) -> PyResult<()> {
        let Some(name) = self.hop_by_hop else { return Ok(()) };
        if HOP_BY_HOP_SAID.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        let message = format!(
            "worker {}: the response to {} {} carries the hop-by-hop header \"{name}\", which maitred drops, as it \
             drops every such header: the framing of each answer is its own, and a \"connection: close\" still \
             closes the connection after the answer (said once per worker)",
            std::process::id(),
            String::from_utf8_lossy(method),
            String::from_utf8_lossy(target),
        );
        py.import(intern!(py, "maitred.log"))?.call_method1(intern!(py, "log"), (intern!(py, "info"), message))?;
        Ok(())
    }

    /// Replaces whatever head the application chose with the worker's own `status`, whose body
    /// will be `body`.
    pub fn set_own_head(&mut self, status: u16, reason: &[u8], body: &[u8]) {
        self.status = status;
        self.reason.clear();
        self.reason.extend_from_slice(reason);
        self.headers.clear();
        let length = body.len().to_string();
        let fields: [(&[u8], &[u8]); 2] =
            [(b"Content-Type", b"text/plain; charset=utf-8"), (b"Content-Length", length.as_bytes())];
        let mut w = Writer::new(&mut self.headers);
        for (name, value) in fields {
            w.str16("header name", name).expect("a short constant name");
            w.bytes32("header value", value).expect("a short constant value");
        }
        self.header_count = fields.len() as u16;
        self.declared_length = Some(body.len() as u64);
        self.phase = Phase::HeadPending;
    }

    /// Encodes the `RESPONSE_HEAD` frame into `out`, all but its body bytes, of which there
    /// will be `body_len`.
    pub fn encode_head(
        &self,
        out: &mut Vec<u8>,
        flags: u8,
        added_length: Option<u64>,
        body_len: usize,
    ) -> Result<(), WireError> {
        out.clear();
        out.extend_from_slice(&[0; HEADER_LEN]);
        let mut w = Writer::new(out);
        w.u16(self.status);
        w.str16("reason", &self.reason)?;
        // start_response leaves room for this one header (see encode_headers).
        w.u16(self.header_count + u16::from(added_length.is_some()));
        w.raw(&self.headers);
        if let Some(length) = added_length {
            w.str16("header name", b"Content-Length")?;
            w.bytes32("header value", length.to_string().as_bytes())?;
        }
        let header = FrameHeader::new(Kind::ResponseHead, flags, out.len() - HEADER_LEN + body_len)?;
        out[..HEADER_LEN].copy_from_slice(&header.encode());
        Ok(())
    }
}

/// `"200 OK"` into 200 and the status's latin-1 bytes, of which the reason phrase starts at
/// the returned offset. A status without a reason (`"200"`) is accepted; the code must be
/// that of a final response, 200 to 599.
fn parse_status<'a>(status: &'a Bound<'_, PyAny>) -> PyResult<(u16, Cow<'a, [u8]>, usize)> {
    let text = text_arg(status, &|| "the status".to_owned())?;
    let invalid = |why: &str| PyValueError::new_err(format!("invalid status {:?}: {why}", text.to_string_lossy()));
    let bytes = latin1_bytes(text)?.ok_or_else(|| invalid("it is not latin-1"))?;
    let reason_start = match bytes.len() {
        3 => 3,
        n if n > 3 && bytes[3] == b' ' => 4,
        _ => return Err(invalid("it must be a three-digit code, then a space and a reason phrase")),
    };
    if !bytes[..3].iter().all(u8::is_ascii_digit) {
        return Err(invalid("it must start with a three-digit code"));
    }
    let code = bytes[..3].iter().fold(0u16, |code, d| code * 10 + u16::from(d - b'0'));
    if !(200..=599).contains(&code) {
        return Err(invalid("the code of a final response is 200 to 599"));
    }
    if !bytes[reason_start..].iter().all(|&b| is_text_byte(b)) {
        return Err(invalid("the reason phrase holds a control character"));
    }
    if bytes.len() - reason_start > usize::from(u16::MAX) {
        return Err(invalid("the reason phrase is longer than 65535 bytes"));
    }
    Ok((code, bytes, reason_start))
}

/// A WebSocket's extra `101` headers (ASGI's pairs of bytes), checked as a response's are,
/// encoded as the wire carries headers: a `u16` count, then each name and value.
pub fn encode_asgi_headers(headers: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> PyResult<()> {
    let count_at = out.len();
    out.extend_from_slice(&[0, 0]);
    let mut items = Vec::new();
    let Encoded { count, .. } = encode_headers(headers, HeaderText::Bytes, HeadersFor::WebSocketAccept, &mut items)?;
    out[count_at..count_at + 2].copy_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&items);
    Ok(())
}

/// What `encode_headers` wrote: how many headers, the Content-Length the application declared,
/// and the first hop-by-hop header it sent.
struct Encoded {
    count: u16,
    declared_length: Option<u64>,
    hop_by_hop: Option<&'static str>,
}

/// Checks the application's header list and appends each `(name, value)` but the hop-by-hop
/// ones to `out` in the frame's encoding.
fn encode_headers(
    headers: &Bound<'_, PyAny>,
    text: HeaderText,
    used: HeadersFor,
    out: &mut Vec<u8>,
) -> PyResult<Encoded> {
    if let Ok(list) = headers.cast::<PyList>() {
        encode_header_items(list.len(), list.iter(), text, used, out)
    } else if let Ok(tuple) = headers.cast::<PyTuple>() {
        encode_header_items(tuple.len(), tuple.iter(), text, used, out)
    } else {
        let kind = headers.get_type().name()?;
        Err(PyTypeError::new_err(format!("the response headers must be a list of (name, value) tuples, not {kind}")))
    }
}

fn encode_header_items<'py>(
    len: usize,
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    text: HeaderText,
    used: HeadersFor,
    out: &mut Vec<u8>,
) -> PyResult<Encoded> {
    // One place stays free for the Content-Length the worker may add.
    if u16::try_from(len).ok().is_none_or(|count| count == u16::MAX) {
        return Err(PyValueError::new_err(format!("{len} response headers are too many")));
    }
    let mut count = 0;
    let mut declared_length = None;
    let mut first_hop_by_hop = None;
    let mut w = Writer::new(out);
    for (index, item) in items.enumerate() {
        // ASGI's headers are two-item iterables, lists as often as tuples.
        let pair = match text {
            HeaderText::Str => item.cast::<PyTuple>().ok().map(|pair| pair.as_any().clone()),
            HeaderText::Bytes => {
                Some(item.clone()).filter(|pair| pair.is_instance_of::<PyTuple>() || pair.is_instance_of::<PyList>())
            }
        }
        .filter(|pair| pair.len().is_ok_and(|len| len == 2))
        .ok_or_else(|| PyTypeError::new_err(format!("response header {index} is not a (name, value) tuple")))?;
        let name = pair.get_item(0)?;
        let value = pair.get_item(1)?;
        let name = header_bytes(&name, text, &|| format!("the name of response header {index}"))?
            .filter(|name| !name.is_empty() && name.iter().all(|&b| is_token_byte(b)))
            .ok_or_else(|| {
                let shown = name.str().map(|text| text.to_string()).unwrap_or_default();
                PyValueError::new_err(format!("invalid response header name {shown:?}"))
            })?;
        // Token bytes are ASCII.
        let name_text = std::str::from_utf8(&name).expect("token bytes");
        let hop = hop_by_hop(&name);
        first_hop_by_hop = first_hop_by_hop.or(hop);
        let bytes = header_bytes(&value, text, &|| format!("the value of response header {name_text:?}"))?.ok_or_else(
            || PyValueError::new_err(format!("the value of response header {name_text:?} is not latin-1")),
        )?;
        if !bytes.iter().all(|&b| is_text_byte(b)) {
            return Err(PyValueError::new_err(format!(
                "the value of response header {name_text:?} holds a control character (CR, LF or another)"
            )));
        }
        if name_text.eq_ignore_ascii_case("content-length") {
            if declared_length.is_some() {
                return Err(PyValueError::new_err("the response has two Content-Length headers"));
            }
            declared_length = Some(parse_length(&bytes).ok_or_else(|| {
                PyValueError::new_err(format!("invalid Content-Length {:?}", String::from_utf8_lossy(&bytes)))
            })?);
        }
        if hop.is_some_and(|hop| !(hop == "connection" && used == HeadersFor::Response)) {
            continue;
        }
        let too_long = |e: WireError| PyValueError::new_err(format!("response header {name_text:?}: {e}"));
        w.str16("header name", name_text.as_bytes()).map_err(too_long)?;
        w.bytes32("header value", &bytes).map_err(too_long)?;
        count += 1;
    }
    Ok(Encoded { count, declared_length, hop_by_hop: first_hop_by_hop })
}

/// A Content-Length value: decimal digits only.
fn parse_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_values() {
        assert_eq!(parse_length(b"0"), Some(0));
        assert_eq!(parse_length(b"18446744073709551615"), Some(u64::MAX));
        for bad in [&b""[..], b"-1", b"+1", b" 1", b"1 ", b"1e3", b"18446744073709551616"] {
            assert_eq!(parse_length(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn hop_by_hop_headers_are_told_by_name_in_any_case() {
        for name in [
            "Connection",
            "KEEP-ALIVE",
            "proxy-authenticate",
            "Proxy-Authorization",
            "proxy-connection",
            "TE",
            "Trailer",
            "transfer-encoding",
            "Upgrade",
        ] {
            assert_eq!(hop_by_hop(name.as_bytes()), Some(name.to_ascii_lowercase()).as_deref(), "{name}");
        }
        for name in ["set-cookie", "content-type", "t", "tea", "trailers", "connections", "x-upgrade"] {
            assert_eq!(hop_by_hop(name.as_bytes()), None, "{name}");
        }
    }

    #[test]
    fn text_bytes() {
        assert!(b"a b\tc\x80\xff".iter().all(|&b| is_text_byte(b)));
        assert!(b"\r\n\0\x7f\x1b".iter().all(|&b| !is_text_byte(b)));
    }
}
