//! What a request must be, whatever protocol brought it: the rules on its target, its Host and
//! its field values that HTTP/1.1's head (`head.rs`) and HTTP/2's (the lobby's
//! `client/h2/head.rs`) both apply, written once, so that neither lets through what the other
//! refuses. Each refusal is an [`ErrorKind`], which a [`crate::RequestError`] gives its one
//! status.
//!
//! Where the protocols differ it is by their wire format, and said at the rule: an HTTP/2
//! `:path` never carries an authority (RFC 9113 §8.3.1), and an HTTP/2 field value has no
//! surrounding whitespace to trim, so one that has some is malformed (§8.2.1), where HTTP/1.1's
//! is optional whitespace (RFC 9112 §5.1).

use crate::error::ErrorKind;
use crate::syntax::{is_absolute_form, is_field_value_byte, is_host_and_port, is_ows};

/// The form of a request target (RFC 9112 §3.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetForm {
    /// A path, with its query: `/a?b`.
    Origin,
    /// A whole URI, with its authority: `http://example.com/a`; HTTP/1.1 only.
    Absolute,
    /// `*`, for a server-wide OPTIONS.
    Asterisk,
}

/// What the method and target say together (RFC 9112 §3.2, RFC 9113 §8.3.1): CONNECT is
/// refused before its target is looked at; `*` goes only with OPTIONS; any other target is a
/// path or an absolute URI with an authority. A fragment (`#...`) is passed on as part of the
/// target: RFC 9112 does not allow one, but clients send them and they cannot change framing.
pub fn target_form(method: &[u8], target: &[u8]) -> Result<TargetForm, ErrorKind> {
    if method == b"CONNECT" {
        return Err(ErrorKind::ConnectNotSupported);
    }
    if target == b"*" {
        return if method == b"OPTIONS" {
            Ok(TargetForm::Asterisk)
        } else {
            Err(ErrorKind::AsteriskFormWithoutOptions)
        };
    }
    if target.starts_with(b"/") {
        Ok(TargetForm::Origin)
    } else if is_absolute_form(target) {
        Ok(TargetForm::Absolute)
    } else {
        Err(ErrorKind::InvalidTargetForm)
    }
}

/// A Host field value, or HTTP/2's `:authority`: `uri-host [ ":" port ]` (RFC 9110 §7.2), so
/// no userinfo (RFC 9113 §8.3.1: `:authority` MUST NOT carry one). `host_is_authority`: the
/// value names the target URI's authority (beside a path or `*`), so its host may not be
/// empty (RFC 9110 §4.2.1); beside an absolute-form target, HTTP/1.1 ignores Host (RFC 9112
/// §3.2.2), and an empty one is allowed.
pub fn check_host(value: &[u8], host_is_authority: bool) -> Result<(), ErrorKind> {
    if !is_host_and_port(value, true) {
        return Err(ErrorKind::InvalidHost);
    }
    let empty_host = value.is_empty() || value.starts_with(b":");
    if empty_host && host_is_authority {
        return Err(ErrorKind::EmptyHost);
    }
    Ok(())
}

/// HTTP/2's `:authority` beside a `host` field: the same authority, or the request is
/// malformed (RFC 9113 §8.3.1), as two Host lines are in HTTP/1.1: which one the application
/// routes by must not depend on which one a proxy in front read.
pub fn check_host_matches_authority(host: &[u8], authority: &[u8]) -> Result<(), ErrorKind> {
    if host.eq_ignore_ascii_case(authority) {
        Ok(())
    } else {
        Err(ErrorKind::HostDiffersFromAuthority)
    }
}

/// An HTTP/2 field value (RFC 9113 §8.2.1): no NUL, CR, LF or other control character but
/// HTAB, and no whitespace at its start or end. HTTP/1.1's field scanner applies the same
/// bytes (`is_field_value_byte`) and trims that whitespace as the syntax's optional
/// whitespace; HTTP/2 carries the value alone, so whitespace around it is the value's own.
pub fn check_field_value(value: &[u8]) -> Result<(), ErrorKind> {
    if let Some(&byte) = value.iter().find(|&&b| !is_field_value_byte(b)) {
        return Err(ErrorKind::InvalidFieldValue { byte });
    }
    if value.first().is_some_and(|&b| is_ows(b)) || value.last().is_some_and(|&b| is_ows(b)) {
        return Err(ErrorKind::FieldValueWhitespace);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind<T: std::fmt::Debug>(result: Result<T, ErrorKind>) -> ErrorKind {
        result.expect_err("refused")
    }

    #[test]
    fn targets_by_method() {
        assert_eq!(target_form(b"GET", b"/a?b").unwrap(), TargetForm::Origin);
        assert_eq!(target_form(b"GET", b"http://example.com/").unwrap(), TargetForm::Absolute);
        assert_eq!(target_form(b"OPTIONS", b"*").unwrap(), TargetForm::Asterisk);
        assert_eq!(kind(target_form(b"GET", b"*")), ErrorKind::AsteriskFormWithoutOptions);
        assert_eq!(kind(target_form(b"GET", b"a/b")), ErrorKind::InvalidTargetForm);
        assert_eq!(kind(target_form(b"CONNECT", b"example.com:443")), ErrorKind::ConnectNotSupported);
    }

    #[test]
    fn hosts() {
        for good in [&b"example.com"[..], b"example.com:8080", b"[::1]:80", b"127.0.0.1"] {
            assert!(check_host(good, true).is_ok(), "{:?}", String::from_utf8_lossy(good));
        }
        for bad in [&b"evil.example@127.0.0.1"[..], b"a b", b"example.com:x", b"[::1"] {
            assert_eq!(kind(check_host(bad, true)), ErrorKind::InvalidHost, "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(kind(check_host(b"", true)), ErrorKind::EmptyHost);
        assert_eq!(kind(check_host(b":80", true)), ErrorKind::EmptyHost);
        assert!(check_host(b"", false).is_ok());
        assert!(check_host_matches_authority(b"Example.com", b"example.com").is_ok());
        assert_eq!(kind(check_host_matches_authority(b"other", b"example.com")), ErrorKind::HostDiffersFromAuthority);
    }

    #[test]
    fn field_values() {
        for good in [&b""[..], b"a", b"a b", b"a\tb", b"\x80\xff"] {
            assert!(check_field_value(good).is_ok(), "{good:?}");
        }
        for bad in [&b" a"[..], b"a ", b"\ta", b"a\t", b" "] {
            assert_eq!(kind(check_field_value(bad)), ErrorKind::FieldValueWhitespace, "{bad:?}");
        }
        for (bad, byte) in [(&b"a\rb"[..], b'\r'), (b"a\nb", b'\n'), (b"a\0b", 0), (b"a\x7fb", 0x7f)] {
            assert_eq!(kind(check_field_value(bad)), ErrorKind::InvalidFieldValue { byte }, "{bad:?}");
        }
    }
}
