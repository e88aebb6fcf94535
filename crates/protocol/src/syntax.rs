//! Character classes and small grammar pieces of RFC 9110 / RFC 9112 / RFC 3986.

use std::ops::Range;

/// `tchar` (RFC 9110 §5.6.2): the characters of a token such as a method or a field name.
pub(crate) fn is_tchar(b: u8) -> bool {
    matches!(b,
        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9'
        | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+'
        | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~')
}

pub(crate) fn is_token(s: &[u8]) -> bool {
    !s.is_empty() && s.iter().all(|&b| is_tchar(b))
}

/// `VCHAR`: visible US-ASCII.
pub(crate) fn is_vchar(b: u8) -> bool {
    (0x21..=0x7e).contains(&b)
}

/// `field-vchar / SP / HTAB` (RFC 9110 §5.5): what a field value may contain.
pub(crate) fn is_field_value_byte(b: u8) -> bool {
    b == b'\t' || (0x20..=0x7e).contains(&b) || b >= 0x80
}

pub(crate) fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// The range of `s[range]` without leading and trailing optional whitespace.
pub(crate) fn trim_ows_range(s: &[u8], range: Range<usize>) -> Range<usize> {
    let mut start = range.start;
    let mut end = range.end;
    while start < end && is_ows(s[start]) {
        start += 1;
    }
    while end > start && is_ows(s[end - 1]) {
        end -= 1;
    }
    start..end
}

pub(crate) fn trim_ows(s: &[u8]) -> &[u8] {
    &s[trim_ows_range(s, 0..s.len())]
}

/// The non-empty members of a comma-separated list (RFC 9110 §5.6.1), OWS trimmed.
/// Empty members are skipped, as the RFC asks recipients to do.
pub(crate) fn list_members(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(trim_ows).filter(|member| !member.is_empty())
}

/// `1*DIGIT` as a u64; `None` for anything else, including values beyond `u64::MAX`.
pub(crate) fn parse_decimal(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(
        0u64,
        |n, &b| {
            if b.is_ascii_digit() {
                n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
            } else {
                None
            }
        },
    )
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn is_sub_delim(b: u8) -> bool {
    matches!(b, b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=')
}

/// Whether `s` is made of `unreserved / pct-encoded / sub-delims` plus the bytes in `extra`,
/// with every `%` followed by two hex digits.
fn is_uri_text(s: &[u8], extra: &[u8]) -> bool {
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        if b == b'%' {
            if i + 2 >= s.len() || !(s[i + 1].is_ascii_hexdigit() && s[i + 2].is_ascii_hexdigit()) {
                return false;
            }
            i += 3;
            continue;
        }
        if !(is_unreserved(b) || is_sub_delim(b) || extra.contains(&b)) {
            return false;
        }
        i += 1;
    }
    true
}

/// `host [ ":" port ]` as in RFC 3986 §3.2.2–3.2.3, the shape of a Host field value and of the
/// end of an authority. The host may be empty only when `allow_empty_host` is set.
pub(crate) fn is_host_and_port(s: &[u8], allow_empty_host: bool) -> bool {
    let (host, port) = if s.first() == Some(&b'[') {
        // IP-literal: "[" ( IPv6address / IPvFuture ) "]"
        let Some(close) = s.iter().position(|&b| b == b']') else {
            return false;
        };
        let inside = &s[1..close];
        if inside.is_empty() || !is_uri_text(inside, b":") {
            return false;
        }
        match &s[close + 1..] {
            [] => (&s[..=close], None),
            [b':', port @ ..] => (&s[..=close], Some(port)),
            _ => return false,
        }
    } else {
        match s.iter().position(|&b| b == b':') {
            Some(colon) => (&s[..colon], Some(&s[colon + 1..])),
            None => (s, None),
        }
    };
    if host.is_empty() && !allow_empty_host {
        return false;
    }
    if host.first() != Some(&b'[') && !is_uri_text(host, b"") {
        return false;
    }
    port.is_none_or(|port| port.iter().all(u8::is_ascii_digit))
}

/// `scheme "://" authority path-abempty [ "?" query ]`: the absolute-form targets this server
/// accepts (RFC 9112 §3.2.2). Only the scheme and the authority are checked here; the rest was
/// already checked to be visible ASCII.
pub(crate) fn is_absolute_form(target: &[u8]) -> bool {
    let Some(colon) = target.iter().position(|&b| b == b':') else {
        return false;
    };
    let scheme = &target[..colon];
    let scheme_ok = scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok || !target[colon + 1..].starts_with(b"//") {
        return false;
    }
    let rest = &target[colon + 3..];
    let authority_end = rest.iter().position(|&b| matches!(b, b'/' | b'?' | b'#')).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let host_port = match authority.iter().rposition(|&b| b == b'@') {
        Some(at) => {
            if !is_uri_text(&authority[..at], b":") {
                return false;
            }
            &authority[at + 1..]
        }
        None => authority,
    };
    is_host_and_port(host_port, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"003"), Some(3));
        assert_eq!(parse_decimal(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_decimal(b"18446744073709551616"), None);
        for bad in [&b""[..], b"-1", b"+1", b"1 2", b"0x10", b"1_0", b" 1"] {
            assert_eq!(parse_decimal(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn list() {
        let members: Vec<&[u8]> = list_members(b" a ,, b\t,c ,").collect();
        assert_eq!(members, vec![&b"a"[..], b"b", b"c"]);
        assert_eq!(list_members(b" , ").count(), 0);
    }

    #[test]
    fn trimming() {
        assert_eq!(trim_ows(b" \t x y \t"), b"x y");
        assert_eq!(trim_ows(b" \t "), b"");
    }

    #[test]
    fn host_values() {
        for good in [&b"example.com"[..], b"example.com:8080", b"[::1]", b"[::1]:443", b"0.0.0.0=5000", b"a%20b", b"h:"]
        {
            assert!(is_host_and_port(good, false), "{:?}", String::from_utf8_lossy(good));
        }
        assert!(is_host_and_port(b"", true));
        for bad in [&b""[..], b"a b", b"]x", b"[::1", b"[]", b"[::1]x", b"a:b", b"a%2", b"a%zz", b"a/b", b"a@b"] {
            assert!(!is_host_and_port(bad, false), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn absolute_form() {
        for good in [
            &b"http://example.com"[..],
            b"http://example.com/foo?q=1",
            b"https://user:pass@example.com:8080/x",
            b"http://[::1]:8080/foo",
            b"http://hypnotoad.org?hail=all",
            b"http://a%12:b!&*$@hypnotoad.org:1234/toto",
        ] {
            assert!(is_absolute_form(good), "{:?}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b"example.com:443"[..],
            b"foo/bar",
            b"s://]ufd/:",
            b"http:/x",
            b"http:///path",
            b"1http://x",
            b"http://a b",
            b"://x",
        ] {
            assert!(!is_absolute_form(bad), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
