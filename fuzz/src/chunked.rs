//! `chunked_body`: the chunked transfer coding (crates/protocol/src/chunked.rs and the
//! decoder's chunk states), reached the way a client reaches it: the fuzzer's bytes are the
//! body of a `Transfer-Encoding: chunked` request.
//!
//! Besides the decoder's own properties (whole, byte by byte and split give one outcome), the
//! body is checked against a second, deliberately plain reading of RFC 9112 §7.1 written here
//! from the grammar (with this server's 4096-byte chunk line and its `max_body`): the body
//! data, and whether the framing is complete, incomplete or refused (and for what), must
//! agree. A body that decoded is chunked again differently and must decode to the same data
//! and trailers.

use maitred_protocol::{ErrorKind, Event, Limits, MAX_CHUNK_LINE};

use crate::decoder::{decode_every_way, feed, Outcome};
use crate::Input;

/// The head every input's body follows.
const HEAD: &[u8] = b"POST /upload HTTP/1.1\r\nHost: fuzz.invalid\r\nTransfer-Encoding: chunked\r\n\r\n";

/// How the reference reading of a chunked body ended.
#[derive(Debug, PartialEq)]
enum Framing {
    /// The last chunk's line was read; the trailer section starts at this offset.
    Complete,
    /// More bytes are needed.
    Incomplete,
    /// The framing is wrong, for this reason.
    Refused(Fault),
}

#[derive(Debug, PartialEq, Clone, Copy)]
enum Fault {
    LineTooLong,
    BareLf,
    BareCr,
    BadLine,
    BodyTooLarge,
    MissingCrlf,
}

impl Fault {
    /// Whether the decoder's error says the same.
    fn matches(self, kind: &ErrorKind) -> bool {
        match self {
            Fault::LineTooLong => matches!(kind, ErrorKind::ChunkLineTooLong { .. }),
            Fault::BareLf => *kind == ErrorKind::BareLf,
            Fault::BareCr => *kind == ErrorKind::BareCr,
            Fault::BadLine => matches!(
                kind,
                ErrorKind::InvalidChunkSize | ErrorKind::InvalidChunkExtension | ErrorKind::ChunkSizeTooLarge
            ),
            Fault::BodyTooLarge => matches!(kind, ErrorKind::BodyTooLarge { .. }),
            Fault::MissingCrlf => *kind == ErrorKind::MissingChunkTerminator,
        }
    }
}

/// The errors that belong to the chunk framing rather than to the trailer section.
fn is_framing_error(kind: &ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::ChunkLineTooLong { .. }
            | ErrorKind::InvalidChunkSize
            | ErrorKind::InvalidChunkExtension
            | ErrorKind::ChunkSizeTooLarge
            | ErrorKind::BodyTooLarge { .. }
            | ErrorKind::MissingChunkTerminator
    )
}

/// Reads `body` as `*chunk last-chunk` and returns the data (as much as had arrived, chunk
/// data counting as soon as it is there) and how the framing ended. A chunk whose size takes
/// the body past `max_body` is refused before its data.
fn reference(body: &[u8], max_body: Option<u64>) -> (Vec<u8>, Framing) {
    let mut data = Vec::new();
    let mut total: u64 = 0;
    let mut pos = 0;
    loop {
        let rest = &body[pos..];
        let Some(end) = rest.iter().position(|&b| b == b'\r' || b == b'\n') else {
            let framing =
                if rest.len() > MAX_CHUNK_LINE { Framing::Refused(Fault::LineTooLong) } else { Framing::Incomplete };
            return (data, framing);
        };
        if end > MAX_CHUNK_LINE {
            return (data, Framing::Refused(Fault::LineTooLong));
        }
        if rest[end] == b'\n' {
            return (data, Framing::Refused(Fault::BareLf));
        }
        match rest.get(end + 1) {
            None => return (data, Framing::Incomplete),
            Some(b'\n') => {}
            Some(_) => return (data, Framing::Refused(Fault::BareCr)),
        }
        let Some(size) = chunk_size(&rest[..end]) else {
            return (data, Framing::Refused(Fault::BadLine));
        };
        pos += end + 2;
        if size == 0 {
            return (data, Framing::Complete);
        }
        total = total.saturating_add(size);
        if max_body.is_some_and(|limit| total > limit) {
            return (data, Framing::Refused(Fault::BodyTooLarge));
        }
        let available = (body.len() - pos) as u64;
        let taken = size.min(available) as usize;
        data.extend_from_slice(&body[pos..pos + taken]);
        pos += taken;
        if (taken as u64) < size {
            return (data, Framing::Incomplete);
        }
        match (body.get(pos), body.get(pos + 1)) {
            (None, _) | (Some(b'\r'), None) => return (data, Framing::Incomplete),
            (Some(b'\r'), Some(b'\n')) => pos += 2,
            _ => return (data, Framing::Refused(Fault::MissingCrlf)),
        }
    }
}

/// `chunk-size *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )`, where
/// `chunk-size = 1*HEXDIG` (fitting 64 bits), names are tokens and values tokens or quoted
/// strings.
fn chunk_size(line: &[u8]) -> Option<u64> {
    let mut at = 0;
    let mut size: u64 = 0;
    while let Some(digit) = line.get(at).and_then(|&b| (b as char).to_digit(16)) {
        size = size.checked_mul(16)?.checked_add(u64::from(digit))?;
        at += 1;
    }
    if at == 0 {
        return None;
    }
    let bws = |at: &mut usize| {
        while matches!(line.get(*at), Some(b' ' | b'\t')) {
            *at += 1;
        }
    };
    let token = |at: &mut usize| {
        let start = *at;
        while line.get(*at).is_some_and(|&b| is_tchar(b)) {
            *at += 1;
        }
        *at > start
    };
    while at < line.len() {
        bws(&mut at);
        if line.get(at) != Some(&b';') {
            return None;
        }
        at += 1;
        bws(&mut at);
        if !token(&mut at) {
            return None;
        }
        let before_equals = at;
        bws(&mut at);
        if line.get(at) != Some(&b'=') {
            at = before_equals;
            continue;
        }
        at += 1;
        bws(&mut at);
        if line.get(at) == Some(&b'"') {
            at += 1;
            loop {
                match *line.get(at)? {
                    b'"' => break,
                    b'\\' => {
                        let escaped = *line.get(at + 1)?;
                        if !(escaped == b'\t' || escaped == b' ' || escaped >= 0x21 && escaped != 0x7f) {
                            return None;
                        }
                        at += 2;
                    }
                    b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff => at += 1,
                    _ => return None,
                }
            }
            at += 1;
        } else if !token(&mut at) {
            return None;
        }
    }
    Some(size)
}

/// RFC 9110's `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The fuzz target: a byte choosing `max_body`, two bytes for the split point, then the body.
pub fn chunked_body(data: &[u8]) {
    let mut input = Input::new(data);
    let choice = input.byte();
    let max_body = match choice & 3 {
        0 | 1 => None,
        2 => Some(u64::from(choice >> 2)),
        _ => Some(u64::from(choice >> 2) * 4096),
    };
    let limits = Limits { max_body, ..Limits::default() };
    let at = input.u16() as usize;
    let body = input.data();
    let request = [HEAD, body].concat();
    let outcome = decode_every_way(&limits, &request, HEAD.len() + at % (body.len() + 1));
    compare_with_reference(&limits, body, &outcome);
}

fn compare_with_reference(limits: &Limits, body: &[u8], outcome: &Outcome) {
    let (expected_data, framing) = reference(body, limits.max_body);
    let Some(Event::Head(_)) = outcome.events.first() else { panic!("the fixed head did not decode: {outcome:?}") };
    // This request's events: those up to its End (a pipelined request may follow).
    let mut data = Vec::new();
    let mut trailers = None;
    for event in &outcome.events[1..] {
        match event {
            Event::Data(bytes) => data.extend_from_slice(bytes),
            Event::End { trailers: fields } => {
                trailers = Some(fields.clone());
                break;
            }
            Event::Head(_) => panic!("a head inside a chunked body"),
        }
    }
    let shown = body.escape_ascii().to_string();
    assert_eq!(data, expected_data, "body data vs the reference ({framing:?}): {shown:?}");
    let error = if trailers.is_some() { None } else { outcome.error.as_ref().map(|e| e.kind()) };
    match (&framing, error) {
        (Framing::Complete, None) => {
            if trailers.is_none() {
                assert_eq!(outcome.finish.as_ref().map_err(|e| e.kind()), Err(&ErrorKind::IncompleteBody), "{shown:?}");
            }
        }
        (Framing::Complete, Some(kind)) => {
            assert!(!is_framing_error(kind), "refused with {kind:?} after the last chunk: {shown:?}")
        }
        (Framing::Incomplete, None) => {
            assert!(trailers.is_none(), "ended where the reference wants more: {shown:?}");
            assert_eq!(outcome.finish.as_ref().map_err(|e| e.kind()), Err(&ErrorKind::IncompleteBody), "{shown:?}");
        }
        (Framing::Incomplete, Some(kind)) => panic!("refused with {kind:?} where the reference wants more: {shown:?}"),
        (Framing::Refused(fault), None) => {
            panic!("not refused ({fault:?} by the reference, ended: {}): {shown:?}", trailers.is_some())
        }
        (Framing::Refused(fault), Some(kind)) => {
            assert!(fault.matches(kind), "refused with {kind:?}, the reference says {fault:?}: {shown:?}")
        }
    }
    if let Some(trailers) = trailers {
        rechunk(limits, &data, &trailers);
    }
}

/// Chunks `data` again, in chunks of 1, 2, 3... bytes, with `trailers` written plainly, and
/// insists on decoding it to the same.
fn rechunk(limits: &Limits, data: &[u8], trailers: &[(bytes::Bytes, bytes::Bytes)]) {
    let mut request = HEAD.to_vec();
    let mut rest = data;
    let mut size = 1;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(size.min(rest.len()));
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
        rest = tail;
        size += 1;
    }
    request.extend_from_slice(b"0\r\n");
    for (name, value) in trailers {
        request.extend_from_slice(&[name.as_ref(), b":", value.as_ref(), b"\r\n"].concat());
    }
    request.extend_from_slice(b"\r\n");
    let outcome = feed(limits, &request, [request.as_slice()]);
    let mut again = Vec::new();
    for event in &outcome.events {
        if let Event::Data(bytes) = event {
            again.extend_from_slice(bytes);
        }
    }
    assert_eq!(outcome.error, None, "the body chunked again was refused: {:?}", request.escape_ascii().to_string());
    assert_eq!(again, data, "the body chunked again decodes differently");
    assert_eq!(outcome.events.last(), Some(&Event::End { trailers: trailers.to_vec() }), "the trailers chunked again");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_reads_the_grammar() {
        assert_eq!(chunk_size(b"1f"), Some(31));
        assert_eq!(chunk_size(b"5 ; a = \"q\\\"\" ;b; c=d"), Some(5));
        for bad in [&b""[..], b"5 ", b"5;", b"5;a ", b"5;a=", b"5;a=\"x", b"x", b"5;a=b c", b"10000000000000000"] {
            assert_eq!(chunk_size(bad), None, "{:?}", bad.escape_ascii().to_string());
        }
        assert_eq!(reference(b"3\r\nabc\r\n0\r\n\r\n", None), (b"abc".to_vec(), Framing::Complete));
        assert_eq!(reference(b"3\r\nab", None), (b"ab".to_vec(), Framing::Incomplete));
        assert_eq!(reference(b"3\r\nabcX", None), (b"abc".to_vec(), Framing::Refused(Fault::MissingCrlf)));
        assert_eq!(reference(b"3\r\nabc\r\n4\r\n", Some(6)), (b"abc".to_vec(), Framing::Refused(Fault::BodyTooLarge)));
    }

    #[test]
    fn a_chunked_body_agrees_with_the_reference() {
        chunked_body(b"\x00\x03\x00\x05;a=\"b\"\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n");
        chunked_body(b"\x0a\x00\x00\x05\r\nhello\r\n0\r\n\r\n");
    }
}
