//! The WSGI environ of one request (PEP 3333), built from a decoded `REQUEST` frame.
//!
//! The lobby has already checked the request strictly, so this module only translates: every
//! byte string becomes a latin-1 `str`, as PEP 3333 asks of "native strings".
//!
//! Imports no module of this crate.

use std::borrow::Cow;

use maitred_wire::Request;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use pyo3::{ffi, intern};

/// The parts of a request-target that the environ needs, still percent-encoded.
#[derive(Debug, PartialEq, Eq)]
pub struct TargetParts<'a> {
    pub path: &'a [u8],
    pub query: &'a [u8],
    /// The host of an absolute-form target (`http://host:port/path`), which takes the place of
    /// the Host header (RFC 9112, section 3.2.2).
    pub authority: Option<&'a [u8]>,
}

/// Splits a request-target in any of its forms: origin (`/a?b`), absolute (`http://h/a?b`),
/// asterisk (`*`, whose path is `*`) and authority (`host:port`, which has no path). A
/// fragment (`#f`, which clients should not send) belongs to neither path nor query.
pub fn split_target(target: &[u8]) -> TargetParts<'_> {
    let target = match target.iter().position(|&b| b == b'#') {
        Some(at) => &target[..at],
        None => target,
    };
    let (authority, rest) = match absolute_form_rest(target) {
        Some((authority, rest)) => (Some(authority), rest),
        None if target.first() == Some(&b'/') || target == b"*" => (None, target),
        None => return TargetParts { path: b"", query: b"", authority: None },
    };
    let (path, query) = match rest.iter().position(|&b| b == b'?') {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &b""[..]),
    };
    // An absolute-form target with nothing after its authority asks for the root.
    let path = if authority.is_some() && path.is_empty() { b"/" } else { path };
    TargetParts { path, query, authority }
}

/// For `scheme://authority/rest`, the authority (without user information) and `/rest`.
fn absolute_form_rest(target: &[u8]) -> Option<(&[u8], &[u8])> {
    let scheme_end = target.iter().position(|&b| b == b':')?;
    let scheme = &target[..scheme_end];
    let scheme_ok = scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    let after = target[scheme_end + 1..].strip_prefix(b"//")?;
    if !scheme_ok {
        return None;
    }
    let authority_end = after.iter().position(|&b| b == b'/' || b == b'?').unwrap_or(after.len());
    let authority = &after[..authority_end];
    let host = match authority.iter().rposition(|&b| b == b'@') {
        Some(at) => &authority[at + 1..],
        None => authority,
    };
    Some((host, &after[authority_end..]))
}

/// Decodes `%XX` escapes; a `%` not followed by two hex digits stays as it is.
pub fn percent_decode(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.contains(&b'%') {
        return Cow::Borrowed(raw);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(high), Some(low)) = (hex_value(raw[i + 1]), hex_value(raw[i + 2])) {
                out.push(high << 4 | low);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    Cow::Owned(out)
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// The path below the mount point: `/app/x` under `/app` is `/x`. The prefix must end at a
/// segment boundary, so `/application` is not under `/app`.
pub fn strip_script_name<'a>(path: &'a [u8], script_name: &[u8]) -> &'a [u8] {
    match path.strip_prefix(script_name) {
        Some(rest) if !script_name.is_empty() && (rest.is_empty() || rest[0] == b'/') => rest,
        _ => path,
    }
}

/// Bytes as the latin-1 `str` PEP 3333 calls a native string: one code point per byte.
///
/// CPython's own decoder, which PyO3 offers no safe wrapper for: the one `unsafe` block of this
/// crate, and no system call (those are `maitred_sys`'s). Going through a `bytes` object or a
/// UTF-8 `String` instead would copy every header value once more, per request.
#[allow(unsafe_code)]
pub fn latin1<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyString>> {
    // SAFETY: the pointer and length describe a live slice; the result is a new reference.
    unsafe {
        let ptr = ffi::PyUnicode_DecodeLatin1(bytes.as_ptr().cast(), bytes.len() as ffi::Py_ssize_t, std::ptr::null());
        Ok(Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked())
    }
}

fn method_str<'py>(py: Python<'py>, method: &[u8]) -> PyResult<Bound<'py, PyString>> {
    let common = match method {
        b"GET" => intern!(py, "GET"),
        b"POST" => intern!(py, "POST"),
        b"HEAD" => intern!(py, "HEAD"),
        b"PUT" => intern!(py, "PUT"),
        b"DELETE" => intern!(py, "DELETE"),
        b"PATCH" => intern!(py, "PATCH"),
        b"OPTIONS" => intern!(py, "OPTIONS"),
        _ => return latin1(py, method),
    };
    Ok(common.clone())
}

/// Fills `environ` (a copy of the base environ) with the request's CGI variables. The caller
/// adds `wsgi.input`. `in_records`: the body is chunked and streams as it arrives, so its
/// length is not known, and there is no `CONTENT_LENGTH` (`wsgi.input_terminated` says to read
/// it to its end: docs/PROXIES.md).
pub fn fill<'py>(
    environ: &Bound<'py, PyDict>,
    script_name: &[u8],
    request: &Request<'_>,
    in_records: bool,
) -> PyResult<()> {
    let py = environ.py();
    let target = split_target(request.target);
    let path = percent_decode(target.path);
    environ.set_item(intern!(py, "REQUEST_METHOD"), method_str(py, request.method)?)?;
    environ.set_item(intern!(py, "PATH_INFO"), latin1(py, strip_script_name(&path, script_name))?)?;
    environ.set_item(intern!(py, "QUERY_STRING"), latin1(py, target.query)?)?;
    environ.set_item(intern!(py, "RAW_URI"), latin1(py, request.target)?)?;
    let protocol = match request.http_version {
        maitred_wire::HTTP_1_0 => intern!(py, "HTTP/1.0"),
        maitred_wire::HTTP_1_1 => intern!(py, "HTTP/1.1"),
        _ => intern!(py, "HTTP/2"),
    };
    environ.set_item(intern!(py, "SERVER_PROTOCOL"), protocol)?;
    environ.set_item(intern!(py, "SERVER_NAME"), latin1(py, request.server_name)?)?;
    environ.set_item(intern!(py, "SERVER_PORT"), request.server_port.to_string())?;
    environ.set_item(intern!(py, "REMOTE_ADDR"), latin1(py, request.peer_addr)?)?;
    // A Unix-socket peer has no address and no port; an address a proxy forwarded often comes
    // without its port (0 on the wire).
    if !request.peer_addr.is_empty() && request.peer_port != 0 {
        environ.set_item(intern!(py, "REMOTE_PORT"), request.peer_port.to_string())?;
    }
    // The base environ says http.
    if request.https {
        environ.set_item(intern!(py, "wsgi.url_scheme"), intern!(py, "https"))?;
    }
    // The client certificate the lobby verified (docs/TLS.md), named as Apache and nginx do.
    if let Some(subject) = request.client_subject {
        environ.set_item(intern!(py, "SSL_CLIENT_S_DN"), latin1(py, subject)?)?;
    }

    // Whether the request announced a body, by Content-Length or Transfer-Encoding.
    let mut body_framed = false;
    let mut key_bytes = Vec::with_capacity(64);
    for &(name, value) in &request.headers {
        // CGI turns '-' into '_', so a client could pass "X_User" for a trusted proxy's
        // "X-User"; names with '_' are dropped to make that impossible.
        if name.contains(&b'_') {
            continue;
        }
        let key = if name.eq_ignore_ascii_case(b"content-type") {
            intern!(py, "CONTENT_TYPE").clone()
        } else if name.eq_ignore_ascii_case(b"content-length") || name.eq_ignore_ascii_case(b"transfer-encoding") {
            // The lobby de-chunks the body: the application sees its length, as behind nginx
            // (unless it streams in records), and no coding it would have to undo.
            body_framed = true;
            continue;
        } else {
            key_bytes.clear();
            key_bytes.extend_from_slice(b"HTTP_");
            key_bytes.extend(name.iter().map(|&b| if b == b'-' { b'_' } else { b.to_ascii_uppercase() }));
            latin1(py, &key_bytes)?
        };
        let value = latin1(py, value)?;
        match environ.get_item(&key)? {
            Some(earlier) => environ.set_item(&key, earlier.add(intern!(py, ", "))?.add(value)?)?,
            None => environ.set_item(&key, value)?,
        }
    }
    if let Some(authority) = target.authority {
        environ.set_item(intern!(py, "HTTP_HOST"), latin1(py, authority)?)?;
    }
    if !in_records && (request.body_len > 0 || body_framed) {
        environ.set_item(intern!(py, "CONTENT_LENGTH"), request.body_len.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts<'a>(path: &'a [u8], query: &'a [u8], authority: Option<&'a [u8]>) -> TargetParts<'a> {
        TargetParts { path, query, authority }
    }

    #[test]
    fn origin_form() {
        assert_eq!(split_target(b"/a/b?x=1&y"), parts(b"/a/b", b"x=1&y", None));
        assert_eq!(split_target(b"/"), parts(b"/", b"", None));
        assert_eq!(split_target(b"/?"), parts(b"/", b"", None));
        assert_eq!(split_target(b"/a?b?c"), parts(b"/a", b"b?c", None));
        // A colon and slashes later in an origin-form path are not a scheme.
        assert_eq!(split_target(b"//x:y//z"), parts(b"//x:y//z", b"", None));
        assert_eq!(split_target(b"/p:q//r"), parts(b"/p:q//r", b"", None));
    }

    #[test]
    fn absolute_form() {
        assert_eq!(split_target(b"http://example.org:8080/a?b"), parts(b"/a", b"b", Some(b"example.org:8080")));
        assert_eq!(split_target(b"https://example.org"), parts(b"/", b"", Some(b"example.org")));
        assert_eq!(split_target(b"http://h?q"), parts(b"/", b"q", Some(b"h")));
        assert_eq!(split_target(b"http://user:pw@h/x"), parts(b"/x", b"", Some(b"h")));
    }

    #[test]
    fn fragments_are_dropped() {
        assert_eq!(split_target(b"/a?page=1#posts"), parts(b"/a", b"page=1", None));
        assert_eq!(split_target(b"/a#b?c"), parts(b"/a", b"", None));
        assert_eq!(split_target(b"http://h#x"), parts(b"/", b"", Some(b"h")));
    }

    #[test]
    fn asterisk_and_authority_forms() {
        assert_eq!(split_target(b"*"), parts(b"*", b"", None));
        assert_eq!(split_target(b"example.org:443"), parts(b"", b"", None));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(&*percent_decode(b"/plain"), b"/plain");
        assert!(matches!(percent_decode(b"/plain"), Cow::Borrowed(_)));
        assert_eq!(&*percent_decode(b"/a%20b%2F%c3%A9"), b"/a b/\xc3\xa9");
        assert_eq!(&*percent_decode(b"%zz%4%"), b"%zz%4%");
        assert_eq!(&*percent_decode(b"%41%"), b"A%");
        assert_eq!(&*percent_decode(b"+"), b"+");
    }

    #[test]
    fn script_name_is_stripped_at_segment_boundaries() {
        assert_eq!(strip_script_name(b"/app/x", b"/app"), b"/x");
        assert_eq!(strip_script_name(b"/app", b"/app"), b"");
        assert_eq!(strip_script_name(b"/application", b"/app"), b"/application");
        assert_eq!(strip_script_name(b"/other", b"/app"), b"/other");
        assert_eq!(strip_script_name(b"/x", b""), b"/x");
    }
}
