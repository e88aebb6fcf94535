//! A plain connection's first bytes, which say the protocol it speaks (docs/HTTP2.md, "Where it
//! is spoken"): HTTP/2's preface, or an HTTP/1.x request; where only HTTP/2 is spoken, anything
//! else is an invalid preface. Without I/O: the caller reads until [`choose`] has an answer.

/// The first bytes of every HTTP/2 connection with prior knowledge (RFC 9113 3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A request line longer than this is refused by every HTTP/1.x server (gunicorn's
/// `--limit-request-line` is at most 8190), so that many bytes without a line end are no
/// HTTP/1.x client's.
const LONGEST_FIRST_LINE: usize = 8192;

/// What a plain connection speaks, from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opening {
    Http1,
    Http2,
    /// An HTTP/1.x request where only HTTP/2 is spoken: refused in HTTP/1.1 (505, which its
    /// client understands).
    Http1NotSpoken,
    /// Neither HTTP/2's preface nor an HTTP/1.x request, where only HTTP/2 is spoken.
    InvalidPreface,
}

/// The protocol the bytes read so far say, given which of the two are spoken (at least one
/// is); None while they could still be either: fewer than the preface's first four bytes that
/// agree with it, or (HTTP/2 only) a first line that has not ended.
pub fn choose(first: &[u8], http1: bool, http2: bool) -> Option<Opening> {
    if first.len() < 4 && PREFACE.starts_with(first) {
        return None;
    }
    if http2 && opens_with_preface(first) {
        return Some(Opening::Http2);
    }
    if http1 {
        return Some(Opening::Http1);
    }
    match is_http1_request_line(first)? {
        true => Some(Opening::Http1NotSpoken),
        false => Some(Opening::InvalidPreface),
    }
}

/// Whether `first` is the preface, or its beginning: at least its first four bytes, and as
/// many of the rest as have come. Four decide: "PRI " is no method an HTTP/1.1 client sends
/// (RFC 9113 3.4 reserves it), and four bytes come in one segment.
fn opens_with_preface(first: &[u8]) -> bool {
    let n = first.len().min(PREFACE.len());
    n >= 4 && first[..n] == PREFACE[..n]
}

/// Whether the first line, once it has ended, is an HTTP/1.x request's (it ends with its
/// version); None until it has ended, or `LONGEST_FIRST_LINE` bytes without its end have come.
fn is_http1_request_line(first: &[u8]) -> Option<bool> {
    let Some(end) = first.iter().position(|&byte| byte == b'\n') else {
        return (first.len() >= LONGEST_FIRST_LINE).then_some(false);
    };
    let line = first[..end].strip_suffix(b"\r").unwrap_or(&first[..end]);
    Some(line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer for the whole of `bytes`, and None for every shorter beginning of them that
    /// could still be either (fed byte by byte, the caller asks again after each).
    fn chosen_at_every_length(bytes: &[u8], http1: bool, http2: bool) -> (Option<Opening>, usize) {
        let decided = (0..=bytes.len()).find(|&n| choose(&bytes[..n], http1, http2).is_some());
        match decided {
            Some(n) => (choose(&bytes[..n], http1, http2), n),
            None => (None, bytes.len()),
        }
    }

    #[test]
    fn both_spoken_four_bytes_decide() {
        assert_eq!(chosen_at_every_length(PREFACE, true, true), (Some(Opening::Http2), 4));
        assert_eq!(chosen_at_every_length(b"GET / HTTP/1.1\r\n\r\n", true, true), (Some(Opening::Http1), 1));
        // Four bytes of the preface decide: HTTP/2's reading of the rest refuses what is not it.
        assert_eq!(chosen_at_every_length(b"PRI * HTTP/1.1\r\n", true, true), (Some(Opening::Http2), 4));
    }

    #[test]
    fn http1_only_takes_the_preface_as_http1() {
        assert_eq!(choose(PREFACE, true, false), Some(Opening::Http1));
    }

    #[test]
    fn http2_only_waits_for_the_first_line() {
        assert_eq!(chosen_at_every_length(PREFACE, false, true), (Some(Opening::Http2), 4));
        let request = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        assert_eq!(chosen_at_every_length(request, false, true), (Some(Opening::Http1NotSpoken), 16));
        assert_eq!(choose(b"GET / HTTP/1.0\n", false, true), Some(Opening::Http1NotSpoken));
        let nonsense = b"INVALID CONNECTION PREFACE\r\n\r\n";
        assert_eq!(chosen_at_every_length(nonsense, false, true), (Some(Opening::InvalidPreface), 28));
        assert_eq!(choose(b"GET / HTTP/1.1", false, true), None);
        assert_eq!(choose(&[b'x'; LONGEST_FIRST_LINE], false, true), Some(Opening::InvalidPreface));
    }
}
