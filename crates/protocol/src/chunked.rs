//! The chunked transfer coding's framing lines (RFC 9112 §7.1).

use crate::error::ErrorKind;
use crate::syntax::{is_ows, is_tchar};
use crate::MAX_CHUNK_LINE;

/// Finds the chunk-size line at the start of `buf`: its size and the number of bytes it
/// takes, CRLF included; `Ok(None)` while the line is incomplete. `scanned` carries how far
/// the line was searched across calls.
pub(crate) fn chunk_line(buf: &[u8], scanned: &mut usize) -> Result<Option<(u64, usize)>, ErrorKind> {
    let Some(found) = memchr::memchr2(b'\r', b'\n', &buf[*scanned..]) else {
        check_length(buf.len())?;
        *scanned = buf.len();
        return Ok(None);
    };
    let end = *scanned + found;
    check_length(end)?;
    if buf[end] == b'\n' {
        return Err(ErrorKind::BareLf);
    }
    match buf.get(end + 1) {
        None => {
            *scanned = end;
            Ok(None)
        }
        Some(b'\n') => Ok(Some((parse_chunk_line(&buf[..end])?, end + 2))),
        Some(_) => Err(ErrorKind::BareCr),
    }
}

fn check_length(content_end: usize) -> Result<(), ErrorKind> {
    if content_end > MAX_CHUNK_LINE {
        return Err(ErrorKind::ChunkLineTooLong { limit: MAX_CHUNK_LINE });
    }
    Ok(())
}

/// `chunk-size [ chunk-ext ]`, where
/// `chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )`.
///
/// Extensions are checked and dropped: none is defined that a server must understand.
/// Whitespace after the size is allowed only before a `;` (the grammar's BWS), so `0 \r\n`
/// is refused, as it is by the parsers this server may sit behind.
fn parse_chunk_line(line: &[u8]) -> Result<u64, ErrorKind> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(ErrorKind::InvalidChunkSize);
    }
    let size = line[..digits].iter().try_fold(0u64, |size, &b| {
        let digit = (b as char).to_digit(16).expect("checked to be a hex digit");
        size.checked_mul(16)?.checked_add(u64::from(digit))
    });
    let size = size.ok_or(ErrorKind::ChunkSizeTooLarge)?;
    let mut rest = &line[digits..];
    let mut after_extension = false;
    loop {
        let space = skip_ows(rest);
        rest = &rest[space..];
        match rest.first() {
            None if space == 0 => return Ok(size),
            Some(b';') => rest = &rest[1..],
            _ if after_extension => return Err(ErrorKind::InvalidChunkExtension),
            _ => return Err(ErrorKind::InvalidChunkSize),
        }
        rest = &rest[skip_ows(rest)..];
        let name_len = rest.iter().take_while(|&&b| is_tchar(b)).count();
        if name_len == 0 {
            return Err(ErrorKind::InvalidChunkExtension);
        }
        rest = &rest[name_len..];
        let space = skip_ows(rest);
        if rest.get(space) == Some(&b'=') {
            rest = &rest[space + 1..];
            rest = &rest[skip_ows(rest)..];
            rest = skip_extension_value(rest).ok_or(ErrorKind::InvalidChunkExtension)?;
        }
        after_extension = true;
    }
}

fn skip_ows(s: &[u8]) -> usize {
    s.iter().take_while(|&&b| is_ows(b)).count()
}

/// Skips `token / quoted-string`; `None` if neither is there.
fn skip_extension_value(s: &[u8]) -> Option<&[u8]> {
    if s.first() != Some(&b'"') {
        let len = s.iter().take_while(|&&b| is_tchar(b)).count();
        return (len > 0).then(|| &s[len..]);
    }
    let mut i = 1;
    loop {
        match *s.get(i)? {
            b'"' => return Some(&s[i + 1..]),
            b'\\' => {
                let escaped = *s.get(i + 1)?;
                if !(escaped == b'\t' || escaped == b' ' || (0x21..=0x7e).contains(&escaped) || escaped >= 0x80) {
                    return None;
                }
                i += 2;
            }
            b'\t' | b' ' | 0x21 | 0x23..=0x5b | 0x5d..=0x7e | 0x80..=0xff => i += 1,
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &[u8]) -> Result<u64, ErrorKind> {
        parse_chunk_line(line)
    }

    #[test]
    fn sizes() {
        assert_eq!(parse(b"0"), Ok(0));
        assert_eq!(parse(b"000"), Ok(0));
        assert_eq!(parse(b"1e"), Ok(30));
        assert_eq!(parse(b"A"), Ok(10));
        assert_eq!(parse(b"0005"), Ok(5));
        assert_eq!(parse(b"ffffffffffffffff"), Ok(u64::MAX));
        assert_eq!(parse(b"10000000000000000"), Err(ErrorKind::ChunkSizeTooLarge));
        assert_eq!(parse(b"0000000000000000000001"), Ok(1));
        for bad in [&b""[..], b" 0", b"0 ", b"-5", b"+5", b"6_0", b"0x5", b"5 5", b"g"] {
            assert_eq!(parse(bad), Err(ErrorKind::InvalidChunkSize), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn extensions() {
        for good in [
            &b"5;a"[..],
            b"5; some; parameters=stuff",
            b"5 ; a = b",
            b"5;a=\"quoted \\\"value\\\"; \\\\x\";b;c=d",
            b"5;foo=\"bar baz\"",
            b"5;a=\"\"",
        ] {
            assert_eq!(parse(good), Ok(5), "{:?}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"5;"[..],
            b"5; ",
            b"5;a ",
            b"5;=b",
            b"5;a=",
            b"5;a=\"unterminated",
            b"5;a=\"x\"y",
            b"5;a=b c",
            b"5;a=\"\x07\"",
            b"5;a;",
        ] {
            assert_eq!(parse(bad), Err(ErrorKind::InvalidChunkExtension), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn line_ends() {
        let mut scanned = 0;
        assert_eq!(chunk_line(b"5;a=b", &mut scanned), Ok(None));
        assert_eq!(scanned, 5);
        assert_eq!(chunk_line(b"5;a=b\r", &mut scanned), Ok(None));
        assert_eq!(chunk_line(b"5;a=b\r\nhello", &mut scanned), Ok(Some((5, 7))));
        assert_eq!(chunk_line(b"5\n", &mut 0), Err(ErrorKind::BareLf));
        assert_eq!(chunk_line(b"5\rx", &mut 0), Err(ErrorKind::BareCr));
        let long = vec![b'0'; MAX_CHUNK_LINE + 1];
        assert_eq!(chunk_line(&long, &mut 0), Err(ErrorKind::ChunkLineTooLong { limit: MAX_CHUNK_LINE }));
        let mut exact = vec![b'0'; MAX_CHUNK_LINE];
        exact.extend_from_slice(b"\r\n");
        assert_eq!(chunk_line(&exact, &mut 0), Ok(Some((0, MAX_CHUNK_LINE + 2))));
    }
}
