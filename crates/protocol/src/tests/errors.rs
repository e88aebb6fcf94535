//! Every error the decoder can report: what triggers it, its status and its reason.

use std::collections::BTreeSet;

use super::{decode_every_way, decode_with, refuse_with};
use crate::error::{ErrorKind, RequestError, Section};
use crate::{Limits, MAX_CHUNK_LINE, MAX_HEAD_SIZE};

/// The name of every kind. The match is exhaustive, so a new kind cannot be added without
/// naming it here, and `every_error_kind_is_tested` then asks for a test of it.
fn name(kind: &ErrorKind) -> &'static str {
    use ErrorKind::*;
    match kind {
        InvalidMethod { .. } => "InvalidMethod",
        MalformedRequestLine => "MalformedRequestLine",
        InvalidTarget { .. } => "InvalidTarget",
        InvalidTargetForm => "InvalidTargetForm",
        AsteriskFormWithoutOptions => "AsteriskFormWithoutOptions",
        MissingVersion => "MissingVersion",
        InvalidVersion => "InvalidVersion",
        UnsupportedVersion { .. } => "UnsupportedVersion",
        ConnectNotSupported => "ConnectNotSupported",
        MethodTooLong { .. } => "MethodTooLong",
        RequestLineTooLong { .. } => "RequestLineTooLong",
        BareLf => "BareLf",
        BareCr => "BareCr",
        WhitespaceAfterRequestLine => "WhitespaceAfterRequestLine",
        ObsoleteLineFolding => "ObsoleteLineFolding",
        MissingColon => "MissingColon",
        WhitespaceBeforeColon => "WhitespaceBeforeColon",
        InvalidFieldName { .. } => "InvalidFieldName",
        InvalidFieldValue { .. } => "InvalidFieldValue",
        FieldValueWhitespace => "FieldValueWhitespace",
        FieldTooLong { .. } => "FieldTooLong",
        TooManyFields { .. } => "TooManyFields",
        SectionTooLarge { .. } => "SectionTooLarge",
        InvalidContentLength => "InvalidContentLength",
        RepeatedContentLength => "RepeatedContentLength",
        ContentLengthWithTransferEncoding => "ContentLengthWithTransferEncoding",
        TransferEncodingInHttp10 => "TransferEncodingInHttp10",
        InvalidTransferEncoding => "InvalidTransferEncoding",
        ChunkedNotLast => "ChunkedNotLast",
        ChunkedRepeated => "ChunkedRepeated",
        UnsupportedTransferCoding { .. } => "UnsupportedTransferCoding",
        MissingHost => "MissingHost",
        RepeatedHost => "RepeatedHost",
        InvalidHost => "InvalidHost",
        HostDiffersFromAuthority => "HostDiffersFromAuthority",
        EmptyHost => "EmptyHost",
        RepeatedContentType => "RepeatedContentType",
        UnsupportedExpectation => "UnsupportedExpectation",
        BodyTooLarge { .. } => "BodyTooLarge",
        InvalidChunkSize => "InvalidChunkSize",
        ChunkSizeTooLarge => "ChunkSizeTooLarge",
        InvalidChunkExtension => "InvalidChunkExtension",
        ChunkLineTooLong { .. } => "ChunkLineTooLong",
        MissingChunkTerminator => "MissingChunkTerminator",
        ForbiddenTrailer { .. } => "ForbiddenTrailer",
        IncompleteHead => "IncompleteHead",
        IncompleteBody => "IncompleteBody",
    }
}

const KIND_COUNT: usize = 47;

/// A request with a Host, the given extra field lines and a body.
fn post(fields: &str, body: &str) -> Vec<u8> {
    format!("POST /p HTTP/1.1\r\nHost: example.com\r\n{fields}\r\n{body}").into_bytes()
}

fn chunked(body: &str) -> Vec<u8> {
    post("Transfer-Encoding: chunked\r\n", body)
}

fn limits(adjust: impl FnOnce(&mut Limits)) -> Limits {
    let mut limits = Limits::default();
    adjust(&mut limits);
    limits
}

/// (input, limits, expected kind, expected status)
fn refusals() -> Vec<(Vec<u8>, Limits, ErrorKind, u16)> {
    use ErrorKind::*;
    let d = Limits::default;
    let b = |s: &str| s.as_bytes().to_vec();
    let huge_field = format!("X: {}\r\n", "a".repeat(MAX_HEAD_SIZE));
    let unlimited = limits(|l| {
        l.max_header_size = 0;
        l.max_headers = 0;
        l.max_request_line = 0;
    });
    vec![
        // ---- request line ----
        (b("G@T / HTTP/1.1\r\n\r\n"), d(), InvalidMethod { byte: b'@' }, 400),
        // A TLS handshake on a plain port is refused at its first byte.
        (vec![0x16], d(), InvalidMethod { byte: 0x16 }, 400),
        (b("GET\0 / HTTP/1.1\r\n"), d(), InvalidMethod { byte: 0 }, 400),
        (b(" GET / HTTP/1.1\r\n"), d(), MalformedRequestLine, 400),
        (b("GET\r\n\r\n"), d(), MalformedRequestLine, 400),
        (b("GET  / HTTP/1.1\r\n"), d(), MalformedRequestLine, 400),
        (b("GET /a\x7fb HTTP/1.1\r\n"), d(), InvalidTarget { byte: 0x7f }, 400),
        (b("GET /\t HTTP/1.1\r\n"), d(), InvalidTarget { byte: b'\t' }, 400),
        (b"GET /caf\xc3\xa9 HTTP/1.1\r\n".to_vec(), d(), InvalidTarget { byte: 0xc3 }, 400),
        (b("GET foo/bar HTTP/1.1\r\nHost: x\r\n\r\n"), d(), InvalidTargetForm, 400),
        (b("GET example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n"), d(), InvalidTargetForm, 400),
        (b("GET http:///p HTTP/1.1\r\nHost: x\r\n\r\n"), d(), InvalidTargetForm, 400),
        (b("GET * HTTP/1.1\r\nHost: x\r\n\r\n"), d(), AsteriskFormWithoutOptions, 400),
        (b("GET /\r\n\r\n"), d(), MissingVersion, 400),
        (b("GET / HTTP/1.1 \r\n"), d(), InvalidVersion, 400),
        (b("GET / http/1.1\r\n"), d(), InvalidVersion, 400),
        (b("GET / HTTP/1.10\r\n"), d(), InvalidVersion, 400),
        (b("GET / HTTP/11\r\n"), d(), InvalidVersion, 400),
        (b("GET / HTTP/1\r\n"), d(), InvalidVersion, 400),
        (b("GET / HTTP/2.0\r\n\r\n"), d(), UnsupportedVersion { major: 2 }, 505),
        (b("GET / HTTP/0.9\r\n\r\n"), d(), UnsupportedVersion { major: 0 }, 505),
        (b("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), d(), UnsupportedVersion { major: 2 }, 505),
        (b("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"), d(), ConnectNotSupported, 501),
        // Refused as soon as the limit is crossed, before the line ends.
        (b("GET /0123456789"), limits(|l| l.max_request_line = 14), RequestLineTooLong { limit: 14 }, 414),
        // A method that reaches the limit is a bad request, not a long URI: 400, not 414.
        (b("GETGETGETGETGETGET"), limits(|l| l.max_request_line = 14), MethodTooLong { limit: 14 }, 400),
        (b("GETGETGETGETGE / HTTP/1.1\r\n"), limits(|l| l.max_request_line = 14), MethodTooLong { limit: 14 }, 400),
        // The external probe's case: a 100 KB method, with the default limit.
        (
            format!("{} / HTTP/1.1\r\nHost: x\r\n\r\n", "A".repeat(100_000)).into_bytes(),
            d(),
            MethodTooLong { limit: 8190 },
            400,
        ),
        (
            format!("{} / HTTP/1.1\r\n", "A".repeat(MAX_HEAD_SIZE)).into_bytes(),
            unlimited.clone(),
            MethodTooLong { limit: MAX_HEAD_SIZE },
            400,
        ),
        (
            format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_HEAD_SIZE)).into_bytes(),
            unlimited.clone(),
            RequestLineTooLong { limit: MAX_HEAD_SIZE },
            414,
        ),
        // ---- line structure ----
        (b("\n"), d(), BareLf, 400),
        (b("\r\n\nGET / HTTP/1.1\r\n"), d(), BareLf, 400),
        (b("GET / HTTP/1.1\n\n"), d(), BareLf, 400),
        (b("GET / HTTP/1.1\r\nHost: x\n\r\n"), d(), BareLf, 400),
        (b("\rX"), d(), BareCr, 400),
        (b("GET / HTTP/1.1\rX"), d(), BareCr, 400),
        (b("GET / HTTP/1.1\r\nA: b\rc\r\n"), d(), BareCr, 400),
        (b("GET / HTTP/1.1\r\nHost: x\r\n\rX"), d(), BareCr, 400),
        (b("GET / HTTP/1.1\r\n Host: x\r\n\r\n"), d(), WhitespaceAfterRequestLine, 400),
        (b("GET / HTTP/1.1\r\nHost: x\r\nA: b\r\n c\r\n\r\n"), d(), ObsoleteLineFolding, 400),
        (b("GET / HTTP/1.1\r\nHost: x\r\nA: b\r\n\tc\r\n\r\n"), d(), ObsoleteLineFolding, 400),
        // ---- field lines ----
        (b("GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n"), d(), MissingColon, 400),
        (b("GET / HTTP/1.1\r\nHost : x\r\n\r\n"), d(), WhitespaceBeforeColon, 400),
        (b("GET / HTTP/1.1\r\nHost\t: x\r\n\r\n"), d(), WhitespaceBeforeColon, 400),
        (b("GET / HTTP/1.1\r\nA@b: c\r\n\r\n"), d(), InvalidFieldName { byte: b'@' }, 400),
        (b("GET / HTTP/1.1\r\n: c\r\n\r\n"), d(), InvalidFieldName { byte: b':' }, 400),
        (b("GET / HTTP/1.1\r\nA b: c\r\n\r\n"), d(), InvalidFieldName { byte: b' ' }, 400),
        (b"GET / HTTP/1.1\r\nHost\xc3\x9f: x\r\n\r\n".to_vec(), d(), InvalidFieldName { byte: 0xc3 }, 400),
        (b("GET / HTTP/1.1\r\nA: b\0c\r\n\r\n"), d(), InvalidFieldValue { byte: 0 }, 400),
        (b("GET / HTTP/1.1\r\nA: b\x07c\r\n\r\n"), d(), InvalidFieldValue { byte: 7 }, 400),
        (b("GET / HTTP/1.1\r\nA: b\x7fc\r\n\r\n"), d(), InvalidFieldValue { byte: 0x7f }, 400),
        // The limit counts the CRLF: "Host: x\r\n" is 9 bytes.
        (
            b("GET / HTTP/1.1\r\nHost: xy\r\n"),
            limits(|l| l.max_header_size = 9),
            FieldTooLong { section: Section::Head, limit: 9 },
            431,
        ),
        (
            b("GET / HTTP/1.1\r\nHost: xyz"),
            limits(|l| l.max_header_size = 9),
            FieldTooLong { section: Section::Head, limit: 9 },
            431,
        ),
        (
            // "Transfer-Encoding: chunked\r\n" is 28 bytes, the trailer 33.
            chunked("0\r\nA: 1234567890123456789012345678\r\n\r\n"),
            limits(|l| l.max_header_size = 30),
            FieldTooLong { section: Section::Trailers, limit: 30 },
            431,
        ),
        (
            b("GET / HTTP/1.1\r\nHost: x\r\nA: 1\r\nB: 2\r\n\r\n"),
            limits(|l| l.max_headers = 2),
            TooManyFields { section: Section::Head, limit: 2 },
            431,
        ),
        (
            chunked("0\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n"),
            limits(|l| l.max_headers = 2),
            TooManyFields { section: Section::Trailers, limit: 2 },
            431,
        ),
        (
            format!("GET / HTTP/1.1\r\n{huge_field}").into_bytes(),
            unlimited.clone(),
            SectionTooLarge { section: Section::Head, limit: MAX_HEAD_SIZE },
            431,
        ),
        (
            chunked(&format!("0\r\n{huge_field}")),
            unlimited.clone(),
            SectionTooLarge { section: Section::Trailers, limit: MAX_HEAD_SIZE },
            431,
        ),
        // ---- header semantics ----
        (post("Content-Length: abc\r\n", ""), d(), InvalidContentLength, 400),
        (post("Content-Length: +1\r\n", "x"), d(), InvalidContentLength, 400),
        (post("Content-Length: -1\r\n", ""), d(), InvalidContentLength, 400),
        (post("Content-Length: 1 2\r\n", ""), d(), InvalidContentLength, 400),
        (post("Content-Length: 0x10\r\n", ""), d(), InvalidContentLength, 400),
        (post("Content-Length:\r\n", ""), d(), InvalidContentLength, 400),
        (post("Content-Length: 18446744073709551616\r\n", ""), d(), InvalidContentLength, 400),
        (post("Content-Length: 1\r\nContent-Length: 1\r\n", "x"), d(), RepeatedContentLength, 400),
        (post("Content-Length: 5, 5\r\n", "hello"), d(), RepeatedContentLength, 400),
        (
            post("Content-Length: 3\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"),
            d(),
            ContentLengthWithTransferEncoding,
            400,
        ),
        (post("Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", ""), d(), ContentLengthWithTransferEncoding, 400),
        (post("Transfer-Encoding:\r\nContent-Length: 3\r\n", ""), d(), ContentLengthWithTransferEncoding, 400),
        (b("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), d(), TransferEncodingInHttp10, 400),
        (post("Transfer-Encoding:\r\n", ""), d(), InvalidTransferEncoding, 400),
        (post("Transfer-Encoding: ,\r\n", ""), d(), InvalidTransferEncoding, 400),
        (post("Transfer-Encoding: chunked;x=1\r\n", ""), d(), InvalidTransferEncoding, 400),
        (post("Transfer-Encoding: chunked, gzip\r\n", ""), d(), ChunkedNotLast, 400),
        (post("Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", ""), d(), ChunkedNotLast, 400),
        (post("Transfer-Encoding: gzip\r\n", ""), d(), ChunkedNotLast, 400),
        (post("Transfer-Encoding: chunkedchunked\r\n", ""), d(), ChunkedNotLast, 400),
        (post("Transfer-Encoding: chunked, chunked\r\n", ""), d(), ChunkedRepeated, 400),
        (post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", ""), d(), ChunkedRepeated, 400),
        (
            post("Transfer-Encoding: gzip, chunked\r\n", ""),
            d(),
            UnsupportedTransferCoding { coding: "gzip".into() },
            501,
        ),
        (
            post("Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n", ""),
            d(),
            UnsupportedTransferCoding { coding: "identity".into() },
            501,
        ),
        (b("GET / HTTP/1.1\r\nAccept: */*\r\n\r\n"), d(), MissingHost, 400),
        (b("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), d(), RepeatedHost, 400),
        (b("GET / HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n"), d(), RepeatedHost, 400),
        (b("GET / HTTP/1.1\r\nHost: a b\r\n\r\n"), d(), InvalidHost, 400),
        (b("GET / HTTP/1.1\r\nHost: [::1\r\n\r\n"), d(), InvalidHost, 400),
        (b("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n"), d(), InvalidHost, 400),
        // A path or '*' takes its authority from Host, and an http URI's host is never empty.
        (b("GET / HTTP/1.1\r\nHost: \r\n\r\n"), d(), EmptyHost, 400),
        (b("GET / HTTP/1.1\r\nHost:\r\n\r\n"), d(), EmptyHost, 400),
        (b("GET / HTTP/1.1\r\nHost: \t \r\n\r\n"), d(), EmptyHost, 400),
        (b("GET /p?q HTTP/1.1\r\nHost: :8080\r\n\r\n"), d(), EmptyHost, 400),
        (b("GET / HTTP/1.0\r\nHost:\r\n\r\n"), d(), EmptyHost, 400),
        (b("OPTIONS * HTTP/1.1\r\nHost:\r\n\r\n"), d(), EmptyHost, 400),
        // Refused at its own line: the fields after it are not waited for.
        (b("GET / HTTP/1.1\r\nHost:\r\nAccept: */*"), d(), EmptyHost, 400),
        (post("Content-Type: text/plain\r\nContent-Type: text/html\r\n", ""), d(), RepeatedContentType, 400),
        (post("Expect: 200-ok\r\nContent-Length: 1\r\n", "x"), d(), UnsupportedExpectation, 417),
        (post("Expect: 100-continue, x\r\n", ""), d(), UnsupportedExpectation, 417),
        (
            post("Content-Length: 11\r\n", "hello world"),
            limits(|l| l.max_body = Some(10)),
            BodyTooLarge { limit: 10 },
            413,
        ),
        // Refused at the chunk size that crosses the limit, before its data arrives.
        (chunked("5\r\nhello\r\n6\r\n"), limits(|l| l.max_body = Some(10)), BodyTooLarge { limit: 10 }, 413),
        // ---- chunked body ----
        (chunked("\r\nhello\r\n0\r\n\r\n"), d(), InvalidChunkSize, 400),
        (chunked("6_0\r\n"), d(), InvalidChunkSize, 400),
        (chunked("-5\r\n"), d(), InvalidChunkSize, 400),
        (chunked("0 \r\n\r\n"), d(), InvalidChunkSize, 400),
        (chunked("3\r\nfoo\r\n\r\n"), d(), InvalidChunkSize, 400),
        (chunked("10000000000000000\r\n"), d(), ChunkSizeTooLarge, 400),
        (chunked("5;\r\n"), d(), InvalidChunkExtension, 400),
        (chunked("5;a=\"b\r\n"), d(), InvalidChunkExtension, 400),
        (chunked(&format!("5;a={}", "b".repeat(MAX_CHUNK_LINE))), d(), ChunkLineTooLong { limit: MAX_CHUNK_LINE }, 400),
        (chunked("5\r\nhelloX"), d(), MissingChunkTerminator, 400),
        (chunked("5\r\nhello\rX"), d(), MissingChunkTerminator, 400),
        (chunked("5\r\nhello\r\r\n"), d(), MissingChunkTerminator, 400),
        (
            chunked("5\r\nhello\r\n0\r\nContent-Length: 5\r\n\r\n"),
            d(),
            ForbiddenTrailer { name: "Content-Length".into() },
            400,
        ),
        (chunked("0\r\nhost: evil\r\n\r\n"), d(), ForbiddenTrailer { name: "host".into() }, 400),
        (
            chunked("0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            d(),
            ForbiddenTrailer { name: "Transfer-Encoding".into() },
            400,
        ),
        (chunked("0\r\nA: 1\r\n B\r\n\r\n"), d(), ObsoleteLineFolding, 400),
        (chunked("0\r\n B\r\n\r\n"), d(), ObsoleteLineFolding, 400),
        (chunked("0\r\nA: 1\n\r\n"), d(), BareLf, 400),
    ]
}

#[test]
fn every_refusal_has_its_kind_status_and_a_short_reason() {
    for (input, limits, kind, status) in refusals() {
        let shown = input.escape_ascii().to_string();
        let error = refuse_with(&limits, &input);
        assert_eq!(error.kind(), &kind, "{shown}");
        assert_eq!(error.status(), status, "{shown}");
        let reason = error.to_string();
        assert!(!reason.is_empty() && reason.len() < 80 && !reason.contains('\n'), "{reason:?}");
    }
}

#[test]
fn the_peer_closing_mid_request_is_an_error_between_requests_it_is_not() {
    let cases: [(&[u8], Result<(), ErrorKind>); 11] = [
        (b"", Ok(())),
        (b"\r\n\r\n", Ok(())),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", Ok(())),
        (b"G", Err(ErrorKind::IncompleteHead)),
        (b"GET / HTTP/1.1\r\nHost: x\r\n", Err(ErrorKind::IncompleteHead)),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhel", Err(ErrorKind::IncompleteBody)),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", Err(ErrorKind::IncompleteBody)),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhe", Err(ErrorKind::IncompleteBody)),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello", Err(ErrorKind::IncompleteBody)),
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nA: b\r\n",
            Err(ErrorKind::IncompleteBody),
        ),
        // Closed after a request that closes the connection, whatever follows it.
        (b"GET / HTTP/1.0\r\n\r\nGET / HT", Ok(())),
    ];
    for (input, expected) in cases {
        let outcome = decode_every_way(input);
        assert_eq!(outcome.error, None);
        assert_eq!(outcome.finish.map_err(|e| e.kind().clone()), expected, "{}", input.escape_ascii());
    }
    let error = decode_every_way(b"GET /").finish.unwrap_err();
    assert_eq!((error.status(), error.to_string().as_str()), (400, "connection closed inside the request head"));
}

#[test]
fn every_error_kind_is_tested() {
    let mut tested: BTreeSet<&str> = refusals().iter().map(|(_, _, kind, _)| name(kind)).collect();
    tested.insert(name(&ErrorKind::IncompleteHead));
    tested.insert(name(&ErrorKind::IncompleteBody));
    // HTTP/2's alone, which HTTP/1.1's decoder cannot meet (it trims a value's whitespace, and
    // has no :authority): rules.rs tests them.
    tested.insert(name(&ErrorKind::FieldValueWhitespace));
    tested.insert(name(&ErrorKind::HostDiffersFromAuthority));
    assert_eq!(tested.len(), KIND_COUNT, "tested: {tested:?}");
}

#[test]
fn the_listed_statuses_are_those_the_errors_have() {
    let statuses: BTreeSet<u16> = refusals().iter().map(|(_, _, _, status)| *status).collect();
    assert_eq!(statuses, BTreeSet::from(RequestError::STATUSES));
}

#[test]
fn reasons_quote_request_bytes_safely() {
    let error = refuse_with(&Limits::default(), b"GET / HTTP/1.1\r\nA: b\x1bc\r\n\r\n");
    assert_eq!(error.to_string(), "invalid character 0x1B in a field value");
    let error = refuse_with(&Limits::default(), b"G@T / HTTP/1.1\r\n");
    assert_eq!(error.to_string(), "invalid character '@' in the request method");
    let long = "x".repeat(100);
    let input = post(&format!("Transfer-Encoding: {long}, chunked\r\n"), "");
    let error = refuse_with(&Limits::default(), &input);
    assert_eq!(error.to_string(), format!("unsupported transfer coding '{}...'", "x".repeat(40)));
}

#[test]
fn limits_at_their_exact_edge_are_accepted() {
    // A request line of exactly 14 bytes, fields of exactly 9 bytes with their CRLF, 2 fields.
    let tight = limits(|l| {
        l.max_request_line = 14;
        l.max_header_size = 9;
        l.max_headers = 2;
    });
    let outcome = decode_with(&tight, b"GET / HTTP/1.1\r\nHost: x\r\nA: bcd\r\n\r\n");
    assert_eq!(outcome.error, None);
    assert_eq!(outcome.ends(), 1);
    // A head of exactly the ceiling, then one byte more.
    let unlimited = limits(|l| {
        l.max_header_size = 0;
        l.max_headers = 0;
    });
    let start = "GET / HTTP/1.1\r\nHost: x\r\nX: ";
    let filler = "a".repeat(MAX_HEAD_SIZE - start.len());
    let outcome = decode_with(&unlimited, format!("{start}{filler}\r\n\r\n").as_bytes());
    assert_eq!(outcome.error, None, "{:?}", outcome.error);
    let outcome = decode_with(&unlimited, format!("{start}{filler}a\r\n\r\n").as_bytes());
    assert_eq!(outcome.error().kind(), &ErrorKind::SectionTooLarge { section: Section::Head, limit: MAX_HEAD_SIZE });
    // A body of exactly max_body, chunked and not.
    let small_body = limits(|l| l.max_body = Some(10));
    assert_eq!(decode_with(&small_body, &post("Content-Length: 10\r\n", "0123456789")).ends(), 1);
    assert_eq!(decode_with(&small_body, &chunked("5\r\n01234\r\n5\r\n56789\r\n0\r\n\r\n")).ends(), 1);
}
