//! An HTTP/2 request's head as the worker gets it, the same as an HTTP/1.1 one's: method,
//! target, and header fields (names in lower case, as HTTP/2 sends them), under the same
//! limits (`--limit-request-line`, `--limit-request-fields`, `--limit-request-field-size`,
//! `--max-body` for a Content-Length) and the same rules on a target, a Host and a field value
//! (crates/protocol's `rules.rs`), so that HTTP/2 lets through nothing HTTP/1.1 refuses.
//! Sans-I/O: the h2 crate has decoded the fields and checked their framing (pseudo-headers
//! first, no connection-specific fields, names in lower case), this decides what the
//! application sees.
//!
//! - `:path` is a path or, for OPTIONS, `*` (RFC 9113 §8.3.1): never a whole URI.
//! - Host comes from `:authority` when the client sent one (RFC 9113 8.3.1 puts it in place
//!   of Host), or else from a `host` field; a `host` beside `:authority` must name the same.
//! - Several `cookie` fields, which HTTP/2 allows for better compression (RFC 9113 8.2.3),
//!   become one, joined with "; ", as HTTP/1.1 would have carried them.
//!
//! The h2 crate drops the pseudo-headers of a trailer section unseen (RFC 9113 §8.1 makes such
//! a request malformed); the trailers reach no application here, so nothing acts on them.

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use maitred_protocol::{
    check_field_value, check_host, check_host_matches_authority, target_form, ErrorKind, Limits, RequestError,
    TargetForm,
};

/// What a refused request gets: its status, and the reason for the client and the log.
pub(super) type Refusal = (u16, String);

/// A rule of crates/protocol broken: its status and reason, as HTTP/1.1 gives them.
fn broken(kind: ErrorKind) -> Refusal {
    let error = RequestError::from(kind);
    (error.status(), error.to_string())
}

/// A request head, checked.
pub(super) struct Head {
    pub(super) method: Bytes,
    /// `:path`: the path and query, or `*` for a server-wide OPTIONS.
    pub(super) target: Bytes,
    pub(super) headers: Vec<(Bytes, Bytes)>,
    /// The Content-Length the client announced, if it did.
    pub(super) content_length: Option<u64>,
}

/// Checks what the h2 crate decoded against the limits, and puts it in HTTP/1.1's shape.
pub(super) fn read(parts: &Parts, limits: &Limits) -> Result<Head, Refusal> {
    let method = Bytes::copy_from_slice(parts.method.as_str().as_bytes());
    let target = Bytes::copy_from_slice(parts.uri.path_and_query().map_or("/", |path| path.as_str()).as_bytes());
    match target_form(&method, &target).map_err(broken)? {
        TargetForm::Origin | TargetForm::Asterisk => {}
        // `:scheme` and `:authority` carry what an absolute-form target would.
        TargetForm::Absolute => return Err(broken(ErrorKind::InvalidTargetForm)),
    }
    // HTTP/1.1's request line, `METHOD SP TARGET SP HTTP/1.1`, is what the limit measures.
    let line = method.len() + 1 + target.len() + 9;
    if limits.max_request_line > 0 && line > limits.max_request_line {
        return Err((
            414,
            format!(
                "the request's :path is {} bytes, past --limit-request-line ({})",
                target.len(),
                limits.max_request_line
            ),
        ));
    }
    let mut headers = Vec::with_capacity(parts.headers.keys_len() + 1);
    let authority = parts.uri.authority().map(|authority| Bytes::copy_from_slice(authority.as_str().as_bytes()));
    if let Some(authority) = &authority {
        check_host(authority, true).map_err(broken)?;
        headers.push((Bytes::from_static(b"host"), authority.clone()));
    }
    let mut hosts = 0;
    let mut cookie: Option<BytesMut> = None;
    for (name, value) in &parts.headers {
        check_field_value(value.as_bytes()).map_err(broken)?;
        if name == http::header::HOST {
            hosts += 1;
            if hosts > 1 {
                return Err(broken(ErrorKind::RepeatedHost));
            }
            match &authority {
                Some(authority) => {
                    check_host_matches_authority(value.as_bytes(), authority).map_err(broken)?;
                    continue;
                }
                None => check_host(value.as_bytes(), true).map_err(broken)?,
            }
        }
        if name == http::header::COOKIE {
            match &mut cookie {
                Some(joined) => {
                    joined.extend_from_slice(b"; ");
                    joined.extend_from_slice(value.as_bytes());
                }
                None => cookie = Some(BytesMut::from(value.as_bytes())),
            }
            continue;
        }
        headers.push((Bytes::copy_from_slice(name.as_str().as_bytes()), Bytes::copy_from_slice(value.as_bytes())));
    }
    if let Some(cookie) = cookie {
        headers.push((Bytes::from_static(b"cookie"), cookie.freeze()));
    }
    if limits.max_headers > 0 && headers.len() > limits.max_headers {
        return Err((
            431,
            format!(
                "the request has {} header fields, past --limit-request-fields ({})",
                headers.len(),
                limits.max_headers
            ),
        ));
    }
    for (name, value) in &headers {
        // As HTTP/1.1 would carry it: `name: value` and its CRLF.
        let size = name.len() + 2 + value.len() + 2;
        if limits.max_header_size > 0 && size > limits.max_header_size {
            return Err((
                431,
                format!(
                    "the header field {} is {size} bytes, past --limit-request-field-size ({})",
                    String::from_utf8_lossy(name),
                    limits.max_header_size
                ),
            ));
        }
    }
    let content_length = content_length(&headers)?;
    if let (Some(length), Some(max)) = (content_length, limits.max_body) {
        if length > max {
            return Err((413, format!("the request body of {length} bytes is larger than --max-body ({max} bytes)")));
        }
    }
    Ok(Head { method, target, headers, content_length })
}

/// The Content-Length the client announced: one value, or several equal ones.
fn content_length(headers: &[(Bytes, Bytes)]) -> Result<Option<u64>, Refusal> {
    let mut length = None;
    for (_, value) in headers.iter().filter(|(name, _)| name.as_ref() == b"content-length") {
        let parsed = std::str::from_utf8(value)
            .ok()
            .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| (400, format!("bad Content-Length {:?}", String::from_utf8_lossy(value))))?;
        if length.is_some_and(|earlier| earlier != parsed) {
            return Err((400, "the request has two different Content-Length values".into()));
        }
        length = Some(parsed);
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(request: http::request::Builder) -> Parts {
        request.body(()).expect("a valid request").into_parts().0
    }

    fn value<'a>(head: &'a Head, name: &str) -> Vec<&'a [u8]> {
        head.headers.iter().filter(|(n, _)| n.as_ref() == name.as_bytes()).map(|(_, v)| v.as_ref()).collect()
    }

    fn refusal(request: http::request::Builder) -> Refusal {
        read(&parts(request), &Limits::default()).err().expect("refused")
    }

    #[test]
    fn authority_becomes_host_and_a_host_field_must_agree() {
        let request = http::Request::get("https://example.com:8443/a?b=1").header("host", "Example.com:8443");
        let head = read(&parts(request), &Limits::default()).unwrap();
        assert_eq!(head.target.as_ref(), b"/a?b=1");
        assert_eq!(value(&head, "host"), [b"example.com:8443".as_slice()]);
        let other = http::Request::get("https://example.com/").header("host", "other.example");
        assert_eq!(refusal(other), (400, "the host field differs from :authority".into()));
    }

    #[test]
    fn the_rules_of_http1_hold() {
        assert_eq!(refusal(http::Request::get("*")), (400, "request target '*' is only allowed with OPTIONS".into()));
        assert!(read(&parts(http::Request::options("*")), &Limits::default()).is_ok());
        assert_eq!(refusal(http::Request::get("https://evil.example@127.0.0.1/")), (400, "invalid Host header".into()));
        assert_eq!(refusal(http::Request::get("/").header("host", "a@b")).0, 400);
        assert_eq!(refusal(http::Request::get("/").header("host", "a").header("host", "a")).0, 400);
        let padded = http::Request::get("/").header("x", " value");
        assert_eq!(refusal(padded), (400, "a field value starts or ends with whitespace".into()));
        assert_eq!(refusal(http::Request::get("/").header("x", "value\t")).0, 400);
    }

    #[test]
    fn without_authority_the_host_field_stays() {
        let head = read(&parts(http::Request::get("/").header("host", "h.example")), &Limits::default()).unwrap();
        assert_eq!(value(&head, "host"), [b"h.example".as_slice()]);
    }

    #[test]
    fn cookies_are_joined_with_semicolons() {
        let request = http::Request::get("/").header("cookie", "a=1").header("x", "y").header("cookie", "b=2");
        let head = read(&parts(request), &Limits::default()).unwrap();
        assert_eq!(value(&head, "cookie"), [b"a=1; b=2".as_slice()]);
        assert_eq!(value(&head, "x"), [b"y".as_slice()]);
    }

    #[test]
    fn limits_refuse_as_http1_does() {
        let limits = Limits { max_request_line: 20, max_headers: 2, max_header_size: 30, max_body: Some(10) };
        let long_path = http::Request::get("/aaaaaaaaaaaaaaaaaaaa");
        assert_eq!(read(&parts(long_path), &limits).err().unwrap().0, 414);
        let many = http::Request::get("/").header("a", "1").header("b", "2").header("c", "3");
        assert_eq!(read(&parts(many), &limits).err().unwrap().0, 431);
        let large = http::Request::get("/").header("a", "x".repeat(40));
        assert_eq!(read(&parts(large), &limits).err().unwrap().0, 431);
        let body = http::Request::post("/").header("content-length", "11");
        assert_eq!(read(&parts(body), &limits).err().unwrap().0, 413);
        let bad = http::Request::post("/").header("content-length", "1x");
        assert_eq!(read(&parts(bad), &Limits::default()).err().unwrap().0, 400);
        assert_eq!(refusal(http::Request::connect("example.com:443")).0, 501);
    }
}
