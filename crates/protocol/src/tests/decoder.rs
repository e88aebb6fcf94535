//! The decoder's states, what a head says, pipelining and zero-copy.

use bytes::{Bytes, BytesMut};

use super::{decode_every_way, decode_with};
use crate::{BodyLength, ErrorKind, Event, Limits, RequestDecoder, Version};

fn pairs(fields: &[(Bytes, Bytes)]) -> Vec<(&[u8], &[u8])> {
    fields.iter().map(|(name, value)| (name.as_ref(), value.as_ref())).collect()
}

#[test]
fn a_simple_request() {
    let outcome = decode_every_way(b"GET /index.html?q=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n");
    let head = outcome.head();
    assert_eq!(head.method, "GET");
    assert_eq!(head.target, "/index.html?q=1");
    assert_eq!(head.version, Version::Http11);
    assert_eq!(pairs(&head.headers), [(&b"Host"[..], &b"example.com"[..]), (b"Accept", b"*/*")]);
    assert_eq!(head.body, BodyLength::Empty);
    assert!(head.keep_alive);
    assert!(!head.expect_continue);
    assert_eq!(outcome.events.last(), Some(&Event::End { trailers: vec![] }));
    assert_eq!(outcome.ends(), 1);
    assert!(outcome.idle);
    assert_eq!(outcome.leftover, 0);
    assert_eq!(outcome.finish, Ok(()));
}

#[test]
fn fields_keep_their_names_and_lose_surrounding_whitespace() {
    let input = b"GET / HTTP/1.1\r\nhOsT:example.com\r\nX-Empty:\r\nX-Blank: \t \r\nX-Pad: \t a  b \t\r\n\
X-Obs: caf\xc3\xa9\xff\r\nX-Quote: \"x\"\r\nX.Custom|Pipe: ok\r\nX-Dup: 1\r\nX-Dup: 2\r\n\r\n";
    let outcome = decode_every_way(input);
    assert_eq!(
        pairs(&outcome.head().headers),
        [
            (&b"hOsT"[..], &b"example.com"[..]),
            (b"X-Empty", b""),
            (b"X-Blank", b""),
            (b"X-Pad", b"a  b"),
            (b"X-Obs", b"caf\xc3\xa9\xff"),
            (b"X-Quote", b"\"x\""),
            (b"X.Custom|Pipe", b"ok"),
            (b"X-Dup", b"1"),
            (b"X-Dup", b"2"),
        ]
    );
}

#[test]
fn the_head_is_sliced_not_copied() {
    let input: &[u8] = b"POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc";
    let mut buf = BytesMut::from(input);
    let mut decoder = RequestDecoder::new(Limits::default());
    let Ok(Some(Event::Head(head))) = decoder.decode(&mut buf) else { panic!("a head") };
    // Every part sits at its offset from the method, as in the input: one buffer, sliced.
    let base = head.method.as_ptr() as usize;
    let offset_of = |part: &Bytes| part.as_ptr() as usize - base;
    let position = |needle: &[u8]| input.windows(needle.len()).position(|w| w == needle).unwrap();
    assert_eq!(offset_of(&head.target), position(b"/p"));
    assert_eq!(offset_of(&head.headers[0].0), position(b"Host"));
    assert_eq!(offset_of(&head.headers[1].1), position(b"3\r\n"));
    assert_eq!(buf.as_ref(), b"abc");
}

#[test]
fn empty_lines_before_a_request_are_skipped_and_leave_the_decoder_idle() {
    let mut decoder = RequestDecoder::new(Limits::default());
    let mut buf = BytesMut::from(&b"\r\n\r\n\r"[..]);
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    assert!(decoder.is_idle());
    assert_eq!(buf.as_ref(), b"\r", "a lone CR waits for the next byte");
    buf.extend_from_slice(b"\nG");
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    assert!(!decoder.is_idle(), "the first byte of a request was seen");
    assert_eq!(decoder.finish().unwrap_err().kind(), &ErrorKind::IncompleteHead);
    let outcome = decode_every_way(b"\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(outcome.head().target, "/");
}

#[test]
fn a_content_length_body_arrives_as_data_then_end() {
    let input = b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world";
    let outcome = decode_every_way(input);
    assert_eq!(outcome.head().body, BodyLength::Length(11));
    assert_eq!(outcome.bodies(), [b"hello world".to_vec()]);
    assert_eq!(outcome.ends(), 1);

    // Step by step: data as it comes, nothing beyond the length, End with no bytes needed.
    let mut decoder = RequestDecoder::new(Limits::default());
    let mut buf = BytesMut::from(&input[..input.len() - 6]);
    assert!(matches!(decoder.decode(&mut buf), Ok(Some(Event::Head(_)))));
    assert_eq!(decoder.decode(&mut buf), Ok(Some(Event::Data(Bytes::from_static(b"hello")))));
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    assert!(!decoder.is_idle());
    assert_eq!(decoder.finish().unwrap_err().kind(), &ErrorKind::IncompleteBody);
    buf.extend_from_slice(b" worldGET");
    assert_eq!(decoder.decode(&mut buf), Ok(Some(Event::Data(Bytes::from_static(b" world")))));
    // The whole body is in: the peer may close now.
    assert_eq!(decoder.finish(), Ok(()));
    assert_eq!(decoder.decode(&mut buf), Ok(Some(Event::End { trailers: vec![] })));
    assert!(decoder.is_idle());
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    assert_eq!(buf.as_ref(), b"GET");
    assert!(!decoder.is_idle());
}

#[test]
fn body_bytes_moved_past_the_decoder_are_counted_and_then_the_body_ends() {
    let mut decoder = RequestDecoder::new(Limits::default());
    let mut buf = BytesMut::from(&b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhe"[..]);
    assert!(matches!(decoder.decode(&mut buf), Ok(Some(Event::Head(_)))));
    // Body bytes still in the buffer are the decoder's to hand out first.
    assert_eq!(decoder.body_left(&buf), None);
    assert_eq!(decoder.decode(&mut buf), Ok(Some(Event::Data(Bytes::from_static(b"he")))));
    assert_eq!(decoder.body_left(&buf), Some(9));
    decoder.body_moved(4);
    assert_eq!(decoder.body_left(&buf), Some(5));
    buf.extend_from_slice(b"worldGET");
    assert_eq!(decoder.decode(&mut buf), Ok(Some(Event::Data(Bytes::from_static(b"world")))));
    assert_eq!(decoder.decode(&mut buf), Ok(Some(Event::End { trailers: vec![] })));
    assert_eq!(buf.as_ref(), b"GET");
    let mut moved_whole = RequestDecoder::new(Limits::default());
    let mut buf = BytesMut::from(&b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n"[..]);
    assert!(matches!(moved_whole.decode(&mut buf), Ok(Some(Event::Head(_)))));
    moved_whole.body_moved(3);
    assert_eq!(moved_whole.body_left(&buf), None);
    assert_eq!(moved_whole.decode(&mut buf), Ok(Some(Event::End { trailers: vec![] })));
    // A chunked body's framing is the decoder's; only a chunk's bytes are moved past it.
    let mut chunked = RequestDecoder::new(Limits::default());
    let mut buf = BytesMut::from(&b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"[..]);
    assert!(matches!(chunked.decode(&mut buf), Ok(Some(Event::Head(_)))));
    assert_eq!(chunked.body_left(&buf), None);
    buf.extend_from_slice(b"b\r\nhe");
    assert_eq!(chunked.decode(&mut buf), Ok(Some(Event::Data(Bytes::from_static(b"he")))));
    assert_eq!(chunked.body_left(&buf), Some(9));
    chunked.body_moved(4);
    assert_eq!(chunked.body_left(&buf), Some(5));
    chunked.body_moved(5);
    // Between chunks: the next one's size is the decoder's to read.
    assert_eq!(chunked.body_left(&buf), None);
    buf.extend_from_slice(b"\r\n3\r\n");
    assert_eq!(chunked.decode(&mut buf), Ok(None));
    assert_eq!(chunked.body_left(&buf), Some(3));
    chunked.body_moved(3);
    buf.extend_from_slice(b"\r\n0\r\n\r\nGET");
    assert_eq!(chunked.decode(&mut buf), Ok(Some(Event::End { trailers: vec![] })));
    assert_eq!(buf.as_ref(), b"GET");
}

#[test]
fn content_length_zero_and_no_framing_mean_no_body() {
    for fields in ["Content-Length: 0\r\n", "Content-Length: 000\r\n", ""] {
        let input = format!("POST / HTTP/1.1\r\nHost: x\r\n{fields}\r\n");
        let outcome = decode_every_way(input.as_bytes());
        assert_eq!(outcome.head().body, BodyLength::Empty, "{fields}");
        assert_eq!(outcome.ends(), 1);
    }
    let outcome = decode_every_way(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 003\r\n\r\nabc");
    assert_eq!(outcome.head().body, BodyLength::Length(3));
}

#[test]
fn a_chunked_body_loses_its_chunking() {
    let input = b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
5\r\nhello\r\n6;name=value;flag;q=\"a \\\"b\\\"\"\r\n world\r\n0000\r\n\r\n";
    let outcome = decode_every_way(input);
    assert_eq!(outcome.head().body, BodyLength::Chunked);
    assert_eq!(outcome.bodies(), [b"hello world".to_vec()]);
    assert_eq!(outcome.events.last(), Some(&Event::End { trailers: vec![] }));
    assert_eq!(outcome.leftover, 0);
    assert!(outcome.idle);
}

#[test]
fn transfer_coding_names_are_case_insensitive_lists() {
    for value in ["chunked", "Chunked", "CHUNKED", " chunked ", ", chunked,"] {
        let input = format!("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {value}\r\n\r\n0\r\n\r\n");
        assert_eq!(decode_every_way(input.as_bytes()).head().body, BodyLength::Chunked, "{value}");
    }
}

#[test]
fn trailers_are_handed_over_apart_from_the_head() {
    let input = b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
5\r\nhello\r\n0\r\nVary: *\r\nContent-Type: text/plain\r\nX-Checksum:  abc \r\n\r\nGET";
    let outcome = decode_every_way(input);
    assert_eq!(pairs(&outcome.head().headers).len(), 2);
    let Some(Event::End { trailers }) = outcome.events.last() else { panic!("{outcome:?}") };
    assert_eq!(pairs(trailers), [(&b"Vary"[..], &b"*"[..]), (b"Content-Type", b"text/plain"), (b"X-Checksum", b"abc")]);
    assert_eq!(outcome.leftover, 3, "the next request stays in the buffer");
}

#[test]
fn pipelined_requests_come_out_in_order() {
    let input = b"POST /1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc\
GET /2 HTTP/1.1\r\nHost: x\r\n\r\n\
\r\n\
POST /3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nde\r\n0\r\n\r\n\
GET /4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n\
GET /5 HTTP/1.1\r\nHost: x\r\n\r\n";
    let outcome = decode_every_way(input);
    let targets: Vec<&[u8]> = outcome.heads().iter().map(|head| head.target.as_ref()).collect();
    assert_eq!(targets, [&b"/1"[..], b"/2", b"/3", b"/4"]);
    assert_eq!(outcome.bodies(), [b"abc".to_vec(), vec![], b"de".to_vec(), vec![]]);
    assert_eq!(outcome.ends(), 4);
    // The fifth request follows Connection: close and is never read.
    assert_eq!(outcome.leftover, b"GET /5 HTTP/1.1\r\nHost: x\r\n\r\n".len());
    assert!(outcome.idle);
    assert_eq!(outcome.finish, Ok(()));
}

#[test]
fn a_body_that_looks_like_a_request_is_a_body() {
    let outcome =
        decode_every_way(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 24\r\n\r\nGET /second HTTP/1.1\r\n\r\n");
    assert_eq!(outcome.heads().len(), 1);
    assert_eq!(outcome.bodies(), [b"GET /second HTTP/1.1\r\n\r\n".to_vec()]);
}

#[test]
fn after_a_request_that_closes_nothing_more_is_read() {
    let mut decoder = RequestDecoder::new(Limits::default());
    let mut buf = BytesMut::from(&b"GET / HTTP/1.0\r\n\r\n\x16\x03garbage"[..]);
    let Ok(Some(Event::Head(head))) = decoder.decode(&mut buf) else { panic!("a head") };
    assert!(!head.keep_alive);
    assert_eq!(decoder.decode(&mut buf), Ok(Some(Event::End { trailers: vec![] })));
    for _ in 0..2 {
        assert_eq!(decoder.decode(&mut buf), Ok(None));
    }
    assert_eq!(buf.as_ref(), b"\x16\x03garbage", "left alone");
    assert!(decoder.is_idle());
    assert_eq!(decoder.finish(), Ok(()));
}

#[test]
fn after_an_error_the_decoder_keeps_refusing() {
    let mut decoder = RequestDecoder::new(Limits::default());
    let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n"[..]);
    let error = decoder.decode(&mut buf).unwrap_err();
    assert_eq!(error.kind(), &ErrorKind::InvalidFieldName { byte: b' ' });
    buf.clear();
    buf.extend_from_slice(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(decoder.decode(&mut buf), Err(error.clone()));
    assert_eq!(decoder.finish(), Err(error));
    assert!(!decoder.is_idle());
}

#[test]
fn persistence_follows_the_version_and_connection_options() {
    let cases = [
        ("HTTP/1.1", "", true),
        ("HTTP/1.1", "Connection: close\r\n", false),
        ("HTTP/1.1", "Connection: Close\r\n", false),
        ("HTTP/1.1", "Connection: upgrade, CLOSE\r\n", false),
        ("HTTP/1.1", "Connection: keep-alive\r\nConnection: close\r\n", false),
        ("HTTP/1.1", "Connection: closed\r\n", true),
        ("HTTP/1.1", "Connection: keep-alive\r\n", true),
        ("HTTP/1.0", "", false),
        ("HTTP/1.0", "Connection: keep-alive\r\n", true),
        ("HTTP/1.0", "Connection: Keep-Alive\r\n", true),
        ("HTTP/1.0", "Connection: foo, keep-alive\r\n", true),
        ("HTTP/1.0", "Connection: keep-alive, close\r\n", false),
        ("HTTP/1.0", "Keep-Alive: 300\r\n", false),
    ];
    for (version, fields, keep_alive) in cases {
        let input = format!("GET / {version}\r\nHost: x\r\n{fields}\r\n");
        assert_eq!(decode_every_way(input.as_bytes()).head().keep_alive, keep_alive, "{version} {fields}");
    }
}

#[test]
fn expect_continue_is_reported_only_where_a_client_waits() {
    let cases = [
        ("HTTP/1.1", "Expect: 100-continue\r\nContent-Length: 1\r\n", "x", true),
        ("HTTP/1.1", "Expect: 100-Continue\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n", true),
        // Nothing to wait for without a body.
        ("HTTP/1.1", "Expect: 100-continue\r\n", "", false),
        ("HTTP/1.1", "Expect: 100-continue\r\nContent-Length: 0\r\n", "", false),
        // HTTP/1.0 expectations are ignored, including unknown ones.
        ("HTTP/1.0", "Expect: 100-continue\r\nContent-Length: 1\r\n", "x", false),
        ("HTTP/1.0", "Expect: something-else\r\nContent-Length: 1\r\n", "x", false),
        ("HTTP/1.1", "Content-Length: 1\r\n", "x", false),
    ];
    for (version, fields, body, expect_continue) in cases {
        let input = format!("POST / {version}\r\nHost: x\r\n{fields}\r\n{body}");
        let outcome = decode_every_way(input.as_bytes());
        assert_eq!(outcome.head().expect_continue, expect_continue, "{version} {fields}");
        assert_eq!(outcome.ends(), 1);
    }
}

#[test]
fn versions() {
    for (version, expected) in [
        ("HTTP/1.0", Version::Http10),
        ("HTTP/1.1", Version::Http11),
        ("HTTP/1.2", Version::Http11),
        ("HTTP/1.9", Version::Http11),
    ] {
        let input = format!("GET / {version}\r\nHost: x\r\n\r\n");
        assert_eq!(decode_every_way(input.as_bytes()).head().version, expected, "{version}");
    }
    assert_eq!(Version::Http10.as_str(), "HTTP/1.0");
    assert_eq!(Version::Http11.as_str(), "HTTP/1.1");
    // HTTP/1.0 needs no Host.
    assert_eq!(decode_every_way(b"GET / HTTP/1.0\r\n\r\n").ends(), 1);
}

#[test]
fn targets() {
    let accepted = [
        ("GET", "/"),
        ("GET", "///keeping//slashes"),
        ("GET", "/with_\"quotes\"?foo=\"bar\"|x{y}"),
        ("GET", "/forums/1/topics/2375?page=1#posts-17408"),
        ("GET", "http://example.com"),
        ("GET", "https://user:pass@example.com:8080/foo?q=1"),
        ("GET", "http://[::1]:8080/foo"),
        ("OPTIONS", "*"),
        ("OPTIONS", "/"),
    ];
    for (method, target) in accepted {
        let input = format!("{method} {target} HTTP/1.1\r\nHost: x\r\n\r\n");
        let outcome = decode_every_way(input.as_bytes());
        assert_eq!(outcome.head().target, target.as_bytes(), "{method} {target}");
    }
}

#[test]
fn methods_are_any_token_case_preserved() {
    for method in ["GET", "get", "-BLARGH", "M-SEARCH", "PROPFIND", "Q!#$%&'*+.^_`|~1"] {
        let input = format!("{method} / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(decode_every_way(input.as_bytes()).head().method, method.as_bytes());
    }
    // Only the exact (case-sensitive) CONNECT asks for a tunnel.
    assert_eq!(decode_every_way(b"connect / HTTP/1.1\r\nHost: x\r\n\r\n").head().method, "connect");
}

#[test]
fn host_values() {
    for host in ["example.com", "example.com:8080", "[::1]:443", "0.0.0.0=5000", "h:", "h:0"] {
        let input = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
        assert_eq!(decode_every_way(input.as_bytes()).ends(), 1, "{host:?}");
    }
    // Beside an absolute-form target Host is ignored (RFC 9112 §3.2.2), so an empty one,
    // though no client should send it there, is not refused.
    for host in ["", ":80"] {
        let input = format!("GET http://example.com/p HTTP/1.1\r\nHost: {host}\r\n\r\n");
        assert_eq!(decode_every_way(input.as_bytes()).ends(), 1, "{host:?}");
    }
    // HTTP/1.0 without Host is served; with an empty one it is not (see errors.rs).
    assert_eq!(decode_every_way(b"GET / HTTP/1.0\r\n\r\n").ends(), 1);
}

#[test]
fn request_lines_of_8000_octets_are_within_the_default_limit() {
    // RFC 9112 §3 recommends supporting request lines of at least 8000 octets.
    let line = |target_len: usize| format!("GET /{} HTTP/1.1", "a".repeat(target_len - 1));
    let request = |line: &str| format!("{line}\r\nHost: x\r\n\r\n").into_bytes();
    // The external probe's case: a 7,900-byte path.
    assert_eq!(decode_every_way(&request(&line(7901))).head().target.len(), 7901);
    // Exactly the limit, then one byte more: a long target is a 414.
    let longest = line(8190 - "GET  HTTP/1.1".len());
    assert_eq!(longest.len(), 8190);
    assert_eq!(decode_every_way(&request(&longest)).ends(), 1);
    let over = line(8191 - "GET  HTTP/1.1".len());
    let error = decode_every_way(&request(&over)).error().clone();
    assert_eq!((error.kind(), error.status()), (&ErrorKind::RequestLineTooLong { limit: 8190 }, 414));
    assert_eq!(error.to_string(), "request line longer than 8190 bytes");
}

#[test]
fn a_method_too_long_for_the_line_is_a_400_a_target_a_414() {
    let limits = Limits { max_request_line: 14, ..Limits::default() };
    // The method ends just inside the limit: what crosses it is the target.
    let error = decode_with(&limits, b"GETGETGETGETG /a HTTP/1.1\r\n").error().clone();
    assert_eq!((error.kind(), error.status()), (&ErrorKind::RequestLineTooLong { limit: 14 }, 414));
    // The method reaches the limit: no target fits after it.
    for method in ["GETGETGETGETGE", "GETGETGETGETGET"] {
        let input = format!("{method} / HTTP/1.1\r\n");
        let error = decode_with(&limits, input.as_bytes()).error().clone();
        assert_eq!((error.kind(), error.status()), (&ErrorKind::MethodTooLong { limit: 14 }, 400), "{method}");
        assert_eq!(error.to_string(), "request method too long for the 14-byte request line limit");
    }
    // Nothing else limits a method: any token that leaves room for the rest is one.
    let method = "M".repeat(8000);
    let input = format!("{method} / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(decode_every_way(input.as_bytes()).head().method.len(), 8000);
}

#[test]
fn upgrade_is_ignored() {
    let outcome =
        decode_every_way(b"GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n");
    assert!(outcome.head().keep_alive);
    assert_eq!(outcome.ends(), 1);
}

#[test]
fn unlimited_limits_still_stop_at_the_ceiling() {
    let unlimited = Limits { max_request_line: 0, max_headers: 0, max_header_size: 0, max_body: None };
    let many: String = (0..3000).map(|i| format!("X-{i}: {i}\r\n")).collect();
    let outcome = decode_with(&unlimited, format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes());
    assert_eq!(outcome.head().headers.len(), 3001);
    let outcome = decode_with(&Limits::default(), format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes());
    assert_eq!(outcome.error().status(), 431);
}

#[test]
fn default_limits_are_gunicorns_but_a_longer_request_line() {
    // gunicorn allows a request line 4094 bytes; RFC 9112 §3 recommends at least 8000.
    assert_eq!(
        Limits::default(),
        Limits { max_request_line: 8190, max_headers: 100, max_header_size: 8190, max_body: None }
    );
}

#[test]
fn large_bodies_stream_without_limits() {
    let body = vec![b'z'; 300_000];
    let mut input = b"PUT /big HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\n".to_vec();
    input.extend_from_slice(&body);
    let mut decoder = RequestDecoder::new(Limits::default());
    let mut buf = BytesMut::new();
    let mut received = 0;
    let mut ended = false;
    for piece in input.chunks(16 * 1024) {
        buf.extend_from_slice(piece);
        while let Some(event) = decoder.decode(&mut buf).unwrap() {
            match event {
                Event::Data(data) => received += data.len(),
                Event::End { .. } => ended = true,
                Event::Head(_) => {}
            }
        }
        // Body bytes are handed out as they come, never held back.
        assert!(buf.is_empty());
    }
    assert_eq!(received, body.len());
    assert!(ended);
}
