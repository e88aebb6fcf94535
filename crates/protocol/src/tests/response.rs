//! Response heads, chunks and the server's own refusals.

use crate::{
    one_part_answer_capacity, reason_phrase, write_chunk, write_error_response, write_response_head, Framing,
    ResponseContext, Version, CONTINUE, LAST_CHUNK,
};

const DATE: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";

fn ctx(version: Version, keep_alive: bool) -> ResponseContext {
    ResponseContext { head_request: false, version, keep_alive }
}

fn head_ctx() -> ResponseContext {
    ResponseContext { head_request: true, version: Version::Http11, keep_alive: true }
}

/// Writes a head and returns it as text with what the function returned.
fn write(
    ctx: ResponseContext,
    status: u16,
    headers: &[(&str, &str)],
    known_length: Option<u64>,
) -> (String, Framing, bool) {
    let headers: Vec<(&[u8], &[u8])> = headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())).collect();
    let mut out = Vec::new();
    let (framing, keep_alive) =
        write_response_head(&mut out, &ctx, status, reason_phrase(status).as_bytes(), &headers, known_length, DATE);
    (String::from_utf8(out).expect("ASCII"), framing, keep_alive)
}

fn lines(head: &str) -> Vec<&str> {
    assert!(head.ends_with("\r\n\r\n"), "{head:?}");
    head[..head.len() - 4].split("\r\n").collect()
}

#[test]
fn a_whole_body_gets_a_content_length_and_stays_open() {
    let (head, framing, keep_alive) =
        write(ctx(Version::Http11, true), 200, &[("Content-Type", "text/plain")], Some(5));
    assert_eq!(
        head,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nServer: maitred\r\n\
Content-Length: 5\r\n\r\n"
    );
    assert_eq!((framing, keep_alive), (Framing::Length(5), true));
}

#[test]
fn http_1_0_says_keep_alive_when_it_keeps_the_connection() {
    let (head, framing, keep_alive) = write(ctx(Version::Http10, true), 200, &[], Some(0));
    assert_eq!(lines(&head).last(), Some(&"Connection: keep-alive"));
    assert_eq!((framing, keep_alive), (Framing::Length(0), true));
    let (head, _, keep_alive) = write(ctx(Version::Http10, false), 200, &[], Some(0));
    assert_eq!(lines(&head).last(), Some(&"Connection: close"));
    assert!(!keep_alive);
}

#[test]
fn a_streamed_body_is_chunked_in_http_1_1_and_ends_with_the_connection_in_http_1_0() {
    let (head, framing, keep_alive) = write(ctx(Version::Http11, true), 200, &[], None);
    assert!(lines(&head).contains(&"Transfer-Encoding: chunked"));
    assert!(!head.contains("Connection"));
    assert_eq!((framing, keep_alive), (Framing::Chunked, true));

    let (head, framing, keep_alive) = write(ctx(Version::Http10, true), 200, &[], None);
    assert!(!head.contains("Transfer-Encoding") && !head.contains("Content-Length"));
    assert!(lines(&head).contains(&"Connection: close"));
    assert_eq!((framing, keep_alive), (Framing::UntilClose, false));
}

#[test]
fn the_applications_content_length_wins_when_valid() {
    let (head, framing, _) = write(ctx(Version::Http11, true), 200, &[("content-length", "7")], Some(5));
    assert_eq!(framing, Framing::Length(7));
    assert!(lines(&head).contains(&"Content-Length: 7"));
    assert_eq!(head.matches("Content-Length").count() + head.matches("content-length").count(), 1);

    // Repeated with the same value: one header.
    let (head, framing, _) =
        write(ctx(Version::Http11, true), 200, &[("Content-Length", "7"), ("Content-Length", "7")], None);
    assert_eq!(framing, Framing::Length(7));
    assert_eq!(head.matches("Content-Length").count(), 1);

    // Invalid or conflicting: dropped, and the framing falls back.
    for bad in [
        &[("Content-Length", "7x")][..],
        &[("Content-Length", "-1")],
        &[("Content-Length", "7"), ("Content-Length", "8")],
    ] {
        let (head, framing, _) = write(ctx(Version::Http11, true), 200, bad, Some(5));
        assert_eq!(framing, Framing::Length(5), "{bad:?}");
        assert!(lines(&head).contains(&"Content-Length: 5"));
        assert_eq!(head.matches("Content-Length").count(), 1);
        let (head, framing, _) = write(ctx(Version::Http11, true), 200, bad, None);
        assert_eq!(framing, Framing::Chunked, "{bad:?}");
        assert!(!head.contains("Content-Length"));
    }
}

#[test]
fn hop_by_hop_headers_from_the_application_are_dropped() {
    let app = [
        ("Connection", "keep-alive"),
        ("keep-alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("TE", "trailers"),
        ("Trailer", "X-Sum"),
        ("Upgrade", "h2c"),
        ("Proxy-Connection", "keep-alive"),
        ("X-Kept", "yes"),
    ];
    let (head, framing, _) = write(ctx(Version::Http11, true), 200, &app, Some(2));
    assert_eq!(
        lines(&head),
        [
            "HTTP/1.1 200 OK",
            "X-Kept: yes",
            "Date: Sun, 06 Nov 1994 08:49:37 GMT",
            "Server: maitred",
            "Content-Length: 2"
        ]
    );
    assert_eq!(framing, Framing::Length(2));
}

#[test]
fn the_applications_date_and_server_are_kept() {
    let (head, _, _) =
        write(ctx(Version::Http11, true), 200, &[("date", "yesterday"), ("Server", "custom/1.0")], Some(0));
    assert_eq!(lines(&head), ["HTTP/1.1 200 OK", "date: yesterday", "Server: custom/1.0", "Content-Length: 0"]);
}

#[test]
fn the_application_can_close_the_connection() {
    let (head, _, keep_alive) = write(ctx(Version::Http11, true), 200, &[("Connection", "Close")], Some(0));
    assert!(!keep_alive);
    assert_eq!(lines(&head).last(), Some(&"Connection: close"));
    assert_eq!(head.matches("onnection").count(), 1);
    let (head, _, keep_alive) = write(ctx(Version::Http11, false), 200, &[], Some(0));
    assert!(!keep_alive);
    assert_eq!(lines(&head).last(), Some(&"Connection: close"));
}

#[test]
fn bodiless_answers() {
    // HEAD: no body, the application's Content-Length kept, none made up, no chunking.
    let (head, framing, keep_alive) = write(head_ctx(), 200, &[("Content-Length", "1234")], Some(0));
    assert_eq!((framing, keep_alive), (Framing::NoBody, true));
    assert!(lines(&head).contains(&"Content-Length: 1234"));
    let (head, framing, _) = write(head_ctx(), 200, &[], Some(0));
    assert_eq!(framing, Framing::NoBody);
    assert!(!head.contains("Content-Length") && !head.contains("Transfer-Encoding"));
    let (head, framing, _) = write(head_ctx(), 200, &[], None);
    assert_eq!(framing, Framing::NoBody);
    assert!(!head.contains("Transfer-Encoding"));

    // 304 keeps the application's Content-Length; 204 and 1xx drop it.
    let (head, framing, _) = write(ctx(Version::Http11, true), 304, &[("Content-Length", "10")], None);
    assert_eq!(framing, Framing::NoBody);
    assert!(lines(&head).contains(&"Content-Length: 10"));
    for status in [204, 103] {
        let (head, framing, keep_alive) =
            write(ctx(Version::Http11, true), status, &[("Content-Length", "10")], Some(10));
        assert_eq!((framing, keep_alive), (Framing::NoBody, true), "{status}");
        assert!(!head.contains("Content-Length") && !head.contains("Transfer-Encoding"), "{status}");
    }
    // Bodiless answers to HTTP/1.0 can keep the connection: their end is known.
    let (_, framing, keep_alive) = write(ctx(Version::Http10, true), 204, &[], None);
    assert_eq!((framing, keep_alive), (Framing::NoBody, true));
}

#[test]
fn the_reason_is_written_as_given() {
    let mut out = Vec::new();
    let no_fields: &[(&[u8], &[u8])] = &[];
    write_response_head(&mut out, &ctx(Version::Http11, true), 299, b"", no_fields, Some(0), DATE);
    assert!(out.starts_with(b"HTTP/1.1 299 \r\n"));
    out.clear();
    write_response_head(&mut out, &ctx(Version::Http11, true), 200, b"Fine Thanks", no_fields, Some(0), DATE);
    assert!(out.starts_with(b"HTTP/1.1 200 Fine Thanks\r\n"));
}

#[test]
fn chunks() {
    let mut out = Vec::new();
    write_chunk(&mut out, b"");
    assert!(out.is_empty(), "an empty chunk would end the body");
    write_chunk(&mut out, b"hello");
    write_chunk(&mut out, &[b'x'; 300]);
    out.extend_from_slice(LAST_CHUNK);
    let mut expected = b"5\r\nhello\r\n12c\r\n".to_vec();
    expected.extend_from_slice(&[b'x'; 300]);
    expected.extend_from_slice(b"\r\n0\r\n\r\n");
    assert_eq!(out, expected);
    assert_eq!(LAST_CHUNK, b"0\r\n\r\n");
    assert_eq!(CONTINUE, b"HTTP/1.1 100 Continue\r\n\r\n");
}

#[test]
fn error_responses() {
    let mut out = Vec::new();
    write_error_response(&mut out, 400, "invalid chunk size", DATE, false, None);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "HTTP/1.1 400 Bad Request\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\nServer: maitred\r\n\
Content-Type: text/plain; charset=utf-8\r\nContent-Length: 36\r\nConnection: close\r\n\r\n\
400 Bad Request: invalid chunk size\n"
    );

    let mut out = Vec::new();
    write_error_response(&mut out, 503, "no worker was free within 30 s — try later", DATE, true, Some(30));
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.ends_with("Connection: keep-alive"));
    assert_eq!(body, "503 Service Unavailable: no worker was free within 30 s — try later\n");
    assert!(head.contains(&format!("Content-Length: {}\r\n", body.len())));

    // A detail that quotes request bytes cannot break the body's single line.
    let mut out = Vec::new();
    write_error_response(&mut out, 400, "bad\r\nX-Injected: 1\0", DATE, false, None);
    let text = String::from_utf8(out).unwrap();
    assert!(text.ends_with("\r\n\r\n400 Bad Request: bad  X-Injected: 1 \n"), "{text:?}");

    let mut out = Vec::new();
    write_error_response(&mut out, 599, "", DATE, false, None);
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("HTTP/1.1 599 \r\n") && text.ends_with("\r\n\r\n599\n"), "{text:?}");
}

#[test]
fn reason_phrases() {
    assert_eq!(reason_phrase(200), "OK");
    assert_eq!(reason_phrase(413), "Content Too Large");
    assert_eq!(reason_phrase(414), "URI Too Long");
    assert_eq!(reason_phrase(417), "Expectation Failed");
    assert_eq!(reason_phrase(431), "Request Header Fields Too Large");
    assert_eq!(reason_phrase(501), "Not Implemented");
    assert_eq!(reason_phrase(505), "HTTP Version Not Supported");
    assert_eq!(reason_phrase(299), "");
}

#[test]
fn every_refusal_status_has_a_reason_phrase() {
    for status in [400, 408, 413, 414, 417, 431, 500, 501, 502, 503, 504, 505] {
        assert!(!reason_phrase(status).is_empty(), "{status}");
    }
}

#[test]
fn a_one_part_answer_fits_the_room_reserved_for_it_in_every_framing() {
    let long_value = "v".repeat(5000);
    let field_sets: [&[(&str, &str)]; 4] = [
        &[],
        &[("Content-Type", "text/html; charset=utf-8")],
        &[("Content-Length", "18446744073709551615"), ("Connection", "close"), ("X-Long", &long_value)],
        &[("Date", "Mon, 07 Nov 1994 08:49:37 GMT"), ("Server", "app"), ("Transfer-Encoding", "chunked")],
    ];
    let contexts = [ctx(Version::Http11, true), ctx(Version::Http11, false), ctx(Version::Http10, true), head_ctx()];
    for fields in field_sets {
        let headers: Vec<(&[u8], &[u8])> = fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())).collect();
        for context in &contexts {
            for status in [200, 204, 304, 404, 599] {
                for body_len in [0, 1, 1_234, 70_000] {
                    for known_length in [None, Some(body_len as u64)] {
                        let reason = reason_phrase(status).as_bytes();
                        let room = one_part_answer_capacity(reason, &headers, DATE, body_len);
                        let mut out = Vec::with_capacity(room);
                        let allocated = out.capacity();
                        let (framing, _) =
                            write_response_head(&mut out, context, status, reason, &headers, known_length, DATE);
                        let body = vec![b'b'; body_len];
                        match framing {
                            Framing::Chunked => {
                                write_chunk(&mut out, &body);
                                out.extend_from_slice(LAST_CHUNK);
                            }
                            Framing::NoBody => {}
                            Framing::Length(_) | Framing::UntilClose => out.extend_from_slice(&body),
                        }
                        assert!(out.len() <= room, "{} bytes in {room}: {fields:?}, {status}", out.len());
                        assert_eq!(out.capacity(), allocated, "the buffer grew: {fields:?}, {status}");
                    }
                }
            }
        }
    }
}
