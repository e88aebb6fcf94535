//! Every fuzz target's body (`maitred_fuzz::TARGETS`) on a few thousand generated inputs, under
//! `cargo test`: a protocol change that breaks one of the targets' invariants fails CI, not a
//! later fuzz run (docs/FUZZING.md).
//!
//! Random bytes would mostly stop at a target's first check (a bad frame kind, a request line
//! that is not one), so the generators build plausible inputs: frames made by crates/wire's own
//! encoders, headers announcing any length their kind allows, requests from HTTP's grammar,
//! chunked bodies, PROXY headers of both versions, honest operations on a shared region. Then
//! a quarter of them are damaged a little (a byte changed, inserted or cut), so that the paths
//! that refuse are taken too. Each input starts with the choice bytes its target reads first.
//!
//! The seeds are random: a failure prints the smallest input proptest shrank it to, which
//! belongs in `fuzz/corpus/<target>/` once fixed (`corpus.rs` replays it from then on).

use std::net::{Ipv4Addr, Ipv6Addr};

use maitred_fuzz::{Target, TARGETS};
use maitred_protocol::V2_SIGNATURE;
use maitred_wire::{
    build_frame, cancel_frame, FileRange, FrameHeader, Kind, Request, ResponseHead, WsAccept, WsClosing, WsData,
    WsOpcode, FLAG_END, FLAG_FD, FLAG_WEBSOCKET,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::Config;

/// Inputs per target: enough that each kind of frame, request and operation comes up many
/// times, few enough that the six tests take seconds in a debug build.
const CASES: u32 = 3000;

fn config() -> Config {
    // A failing input goes into the saved corpus, not into a file proptest keeps beside this one.
    Config { cases: CASES, failure_persistence: None, ..Config::default() }
}

fn target(name: &str) -> Target {
    TARGETS.iter().find(|(target, _)| *target == name).unwrap_or_else(|| panic!("no fuzz target {name}")).1
}

/// The targets the tests below cover, by name.
const TESTED: [&str; 6] =
    ["request_decoder", "chunked_body", "lobby_frames", "worker_frames", "proxy_header", "shared_region"];

#[test]
fn every_fuzz_target_has_a_property_test() {
    let mut targets: Vec<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
    let mut tested = TESTED.to_vec();
    targets.sort_unstable();
    tested.sort_unstable();
    assert_eq!(targets, tested);
}

/// A small change to an input.
#[derive(Clone, Debug)]
enum Damage {
    Set(Index, u8),
    Insert(Index, u8),
    Cut(Index),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Damage::Set(at, byte)),
        (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Damage::Insert(at, byte)),
        any::<Index>().prop_map(Damage::Cut),
    ]
}

/// `input` whole three times in four, else with one to three small changes.
fn sometimes_damaged(input: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (input, prop_oneof![3 => Just(Vec::new()), 1 => vec(damage(), 1..4)]).prop_map(|(mut bytes, damages)| {
        for damage in damages {
            match damage {
                Damage::Insert(at, byte) => bytes.insert(at.index(bytes.len() + 1), byte),
                Damage::Set(at, byte) if !bytes.is_empty() => {
                    let at = at.index(bytes.len());
                    bytes[at] = byte;
                }
                Damage::Cut(at) if !bytes.is_empty() => {
                    bytes.truncate(at.index(bytes.len()));
                }
                Damage::Set(..) | Damage::Cut(_) => {}
            }
        }
        bytes
    })
}

/// The choice bytes a target reads first, then its data.
fn with_choices(choices: &[u8], data: &[u8]) -> Vec<u8> {
    [choices, data].concat()
}

fn bytes(most: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..=most)
}

fn words(choices: &[&'static str]) -> impl Strategy<Value = Vec<u8>> {
    select(choices.to_vec()).prop_map(|word| word.as_bytes().to_vec())
}

// The frames of the worker channel (docs/PROTOCOL.md, section 2).

/// The frame kinds' bytes, and a few that name none.
const KIND_BYTES: [u8; 20] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 19, 20, 21, 22, 23, 24, 0, 18, 255];

/// A frame header of any kind, announcing any length up to one past its kind's limit, then
/// some of its payload: what a reader has before the rest of a frame arrives.
fn announcing_header() -> impl Strategy<Value = Vec<u8>> {
    select(KIND_BYTES.to_vec())
        .prop_flat_map(|kind| {
            let most =
                FrameHeader::decode(&[kind, 0, 0, 0, 0, 0, 0, 0]).map_or(u32::MAX as usize, |h| h.kind.max_payload());
            let len = prop_oneof![0..=64usize, 0..=most + 1];
            (Just(kind), any::<u8>(), len, bytes(64))
        })
        .prop_map(|(kind, flags, len, payload)| {
            let mut frame = vec![kind, flags, 0, 0];
            frame.extend_from_slice(&(len as u32).to_le_bytes());
            frame.extend_from_slice(&payload[..payload.len().min(len)]);
            frame
        })
}

fn frame_of(kind: Kind, flags: u8, payload: &[u8]) -> Vec<u8> {
    build_frame(kind, flags, |out| {
        out.extend_from_slice(payload);
        Ok(())
    })
    .expect("a payload within the frame limit")
}

fn header_pairs() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
    let name = prop_oneof![words(&["Content-Type", "Set-Cookie", "X-Empty", "content-length", ""]), bytes(12)];
    vec((name, bytes(24)), 0..4)
}

fn borrowed(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<(&[u8], &[u8])> {
    pairs.iter().map(|(name, value)| (name.as_slice(), value.as_slice())).collect()
}

fn end_flag() -> impl Strategy<Value = u8> {
    prop_oneof![Just(0), Just(FLAG_END), any::<u8>()]
}

/// A frame a worker sends the lobby.
fn worker_sent_frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => (any::<u32>(), prop_oneof![Just(Vec::new()), bytes(2)]).prop_map(|(pid, flags)| {
            frame_of(Kind::Ready, 0, &[pid.to_le_bytes().as_slice(), &flags].concat())
        }),
        1 => bytes(40).prop_map(|text| frame_of(Kind::BootFailed, 0, &text)),
        1 => (prop_oneof![100..600u16, any::<u16>()], bytes(16), header_pairs(), bytes(64), end_flag()).prop_map(
            |(status, reason, headers, body, flags)| {
                build_frame(Kind::ResponseHead, flags, |out| {
                    ResponseHead { status, reason: &reason, headers: borrowed(&headers) }.encode_payload(out)?;
                    out.extend_from_slice(&body);
                    Ok(())
                })
                .expect("a small head")
            }
        ),
        1 => (bytes(200), end_flag()).prop_map(|(data, flags)| frame_of(Kind::ResponseBody, flags, &data)),
        1 => (any::<u64>(), any::<u64>(), prop_oneof![Just(FLAG_FD), Just(FLAG_FD | FLAG_END), any::<u8>()])
            .prop_map(|(offset, count, flags)| {
                frame_of(Kind::ResponseFile, flags, &FileRange { offset, count }.encode_payload())
            }),
        1 => Just(frame_of(Kind::ResponseAbort, FLAG_END, b"")),
        1 => (bytes(8), header_pairs()).prop_map(|(subprotocol, headers)| {
            build_frame(Kind::WsAccept, 0, |out| {
                WsAccept { subprotocol: &subprotocol, headers: borrowed(&headers) }.encode_payload(out)
            })
            .expect("a small accept")
        }),
        1 => websocket_frame(Kind::WsSend, Kind::WsClose),
        3 => announcing_header(),
        1 => bytes(24),
    ]
}

/// A WebSocket message of kind `data`, or a closing of kind `closing`.
fn websocket_frame(data: Kind, closing: Kind) -> impl Strategy<Value = Vec<u8>> {
    let message = (any::<bool>(), bytes(40), "[a-zé✓ ]{0,12}").prop_map(move |(text, binary, string)| {
        let (opcode, bytes) = if text { (WsOpcode::Text, string.into_bytes()) } else { (WsOpcode::Binary, binary) };
        build_frame(data, 0, |out| {
            WsData { opcode, data: &bytes }.encode_payload(out);
            Ok(())
        })
        .expect("a small message")
    });
    let close = (end_flag(), any::<u16>(), "[a-z ]{0,12}").prop_map(move |(flags, code, reason)| {
        build_frame(closing, flags, |out| {
            WsClosing { code, reason: &reason }.encode_payload(out);
            Ok(())
        })
        .expect("a small close")
    });
    prop_oneof![message, close]
}

fn stream(
    first: impl Strategy<Value = Vec<u8>>,
    frame: impl Strategy<Value = Vec<u8>>,
) -> impl Strategy<Value = Vec<u8>> {
    (first, vec(frame, 0..6)).prop_map(|(first, frames)| [first, frames.concat()].concat())
}

/// What a worker's `REQUEST` frame may be: any field values, the body inline (of the length it
/// announces, mostly) or in a file, now and then a WebSocket's.
fn request_frame() -> impl Strategy<Value = Vec<u8>> {
    let line = (
        prop_oneof![4 => 0..=2u8, 1 => any::<u8>()],
        words(&["GET", "POST", "HEAD", "", "M-SEARCH"]),
        prop_oneof![words(&["/", "/a%20b?x=1", "*"]), bytes(24)],
    );
    let peers = (words(&["127.0.0.1", "::1", ""]), any::<u16>(), words(&["localhost", "example.org"]), any::<u16>());
    let tls = (any::<bool>(), prop::option::of(words(&["CN=alice,O=Example", ""])));
    let body = prop_oneof![
        bytes(64).prop_map(|body| (body.len() as u64, body, false)),
        (any::<u64>(), bytes(8)).prop_map(|(len, body)| (len, body, false)),
        any::<u64>().prop_map(|len| (len, Vec::new(), true)),
    ];
    let flags = prop_oneof![3 => Just(0), 1 => Just(FLAG_WEBSOCKET), 1 => any::<u8>()];
    (line, peers, tls, header_pairs(), body, flags).prop_map(
        |(
            (http_version, method, target),
            (peer_addr, peer_port, server_name, server_port),
            (https, client_subject),
            headers,
            (body_len, inline_body, in_file),
            flags,
        )| {
            let request = Request {
                http_version,
                method: &method,
                target: &target,
                peer_addr: &peer_addr,
                peer_port,
                server_name: &server_name,
                server_port,
                https,
                client_subject: client_subject.as_deref(),
                headers: borrowed(&headers),
                body_len,
                inline_body: &inline_body,
            };
            let flags = if in_file { flags | FLAG_FD } else { flags & !FLAG_FD };
            build_frame(Kind::Request, flags, |out| request.encode_payload(out)).expect("a small request")
        },
    )
}

/// A frame the lobby sends a worker.
fn lobby_sent_frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => request_frame(),
        1 => any::<u32>().prop_map(|id| cancel_frame(id % 4).to_vec()),
        1 => (select(vec![Kind::Region, Kind::Bell, Kind::LobbyBell]), prop_oneof![4 => Just(FLAG_FD), 1 => any::<u8>()])
            .prop_map(|(kind, flags)| frame_of(kind, flags, b"")),
        1 => Just(frame_of(Kind::OnChannel, 0, b"")),
        1 => websocket_frame(Kind::WsMessage, Kind::WsClosed),
        3 => announcing_header(),
        1 => bytes(24),
    ]
}

/// The lobby's setup of a worker: its region and bells, each with its descriptor.
fn setup_frames() -> Vec<u8> {
    [Kind::Region, Kind::Bell, Kind::LobbyBell].into_iter().flat_map(|kind| frame_of(kind, FLAG_FD, b"")).collect()
}

fn ready_frame() -> Vec<u8> {
    frame_of(Kind::Ready, 0, &4242u32.to_le_bytes())
}

// HTTP/1.1 requests (RFC 9112).

fn chunk_line(len: usize, style: u8, extension: &[u8]) -> Vec<u8> {
    let size = match style % 3 {
        0 => format!("{len:x}"),
        1 => format!("{len:X}"),
        _ => format!("{len:04x}"),
    };
    [size.as_bytes(), extension, b"\r\n"].concat()
}

/// A chunked body: chunks of any bytes with sizes written three ways, extensions, the last
/// chunk, trailers.
fn chunked() -> impl Strategy<Value = Vec<u8>> {
    let extension = words(&["", "", ";a=b", ";name=\"quoted value\"", "; bad", ";a=b;c"]).boxed();
    let chunk = (bytes(40), any::<u8>(), extension.clone());
    let trailers = vec(words(&["Expires: 0\r\n", "X-Checksum: abc\r\n", "Bad Trailer\r\n"]), 0..2);
    (vec(chunk, 0..4), any::<u8>(), extension, trailers).prop_map(|(chunks, style, last_extension, trailers)| {
        let mut body = Vec::new();
        for (data, style, extension) in chunks.into_iter().filter(|(data, ..)| !data.is_empty()) {
            body.extend(chunk_line(data.len(), style, &extension));
            body.extend(data);
            body.extend_from_slice(b"\r\n");
        }
        body.extend(chunk_line(0, style, &last_extension));
        body.extend(trailers.concat());
        body.extend_from_slice(b"\r\n");
        body
    })
}

/// One request: a request line, header fields, and a body with the framing its fields say.
fn http_request() -> impl Strategy<Value = Vec<u8>> {
    let line = (
        words(&["GET", "POST", "PUT", "HEAD", "OPTIONS", "CONNECT", "G@T"]),
        words(&["/", "/a/b?c=d", "*", "http://example.org/x", "example.org:443", "/%zz", "/\x7f"]),
        words(&["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "http/1.1", "HTTP/1.10"]),
    );
    let field = words(&[
        "Host: example.org",
        "Host: example.org",
        "Connection: close",
        "Connection: keep-alive",
        "Expect: 100-continue",
        "Content-Length: 3",
        "Transfer-Encoding: gzip, chunked",
        "X-Folded: a\r\n b",
        " Leading: space",
        "Bad Name: x",
        "X-Empty:",
        "X-Tab:\tvalue\t",
        "Upgrade: websocket",
    ]);
    let body = prop_oneof![
        Just((Vec::new(), Vec::new())),
        bytes(40).prop_map(|body| (format!("Content-Length: {}", body.len()).into_bytes(), body)),
        chunked().prop_map(|body| (b"Transfer-Encoding: chunked".to_vec(), body)),
    ];
    let line_end = prop_oneof![9 => Just(&b"\r\n"[..]), 1 => Just(&b"\n"[..])];
    (line, vec(field, 0..5), body, line_end).prop_map(|((method, target, version), fields, (framing, body), end)| {
        let mut request = [method.as_slice(), b" ", &target, b" ", &version, end].concat();
        for field in fields.iter().chain([&framing]).filter(|field| !field.is_empty()) {
            request.extend_from_slice(field);
            request.extend_from_slice(end);
        }
        request.extend_from_slice(end);
        request.extend(body);
        request
    })
}

// PROXY protocol headers (crates/protocol/src/proxy.rs).

fn proxy_v1() -> impl Strategy<Value = Vec<u8>> {
    let port = prop_oneof![
        any::<u16>().prop_map(|port| port.to_string()),
        select(vec!["65536", "080", "-1", ""]).prop_map(String::from),
    ];
    let addresses = prop_oneof![
        (any::<u32>(), any::<u32>()).prop_map(|(a, b)| (
            "TCP4",
            Ipv4Addr::from(a).to_string(),
            Ipv4Addr::from(b).to_string()
        )),
        (any::<u128>(), any::<u128>()).prop_map(|(a, b)| (
            "TCP6",
            Ipv6Addr::from(a).to_string(),
            Ipv6Addr::from(b).to_string()
        )),
        (any::<u32>(), any::<u128>()).prop_map(|(a, b)| (
            "TCP4",
            Ipv4Addr::from(a).to_string(),
            Ipv6Addr::from(b).to_string()
        )),
    ];
    prop_oneof![
        4 => (addresses, port.clone(), port).prop_map(|((protocol, client, server), client_port, server_port)| {
            format!("PROXY {protocol} {client} {server} {client_port} {server_port}\r\n").into_bytes()
        }),
        1 => Just(b"PROXY UNKNOWN\r\n".to_vec()),
        1 => Just(b"PROXY UNKNOWN 1.2.3.4 5.6.7.8 1 2\r\n".to_vec()),
    ]
}

fn proxy_v2() -> impl Strategy<Value = Vec<u8>> {
    let command = prop_oneof![3 => Just(0x21u8), 1 => Just(0x20), 1 => any::<u8>()];
    let family = prop_oneof![Just(0x11u8), Just(0x21), Just(0x12), Just(0x31), Just(0x00), any::<u8>()];
    // IPv4's and IPv6's, and any length up to a Unix socket's.
    let addresses = prop_oneof![vec(any::<u8>(), 12), vec(any::<u8>(), 36), bytes(216)];
    let length = prop_oneof![3 => Just(None), 1 => any::<u16>().prop_map(Some)];
    (command, family, addresses, bytes(16), length).prop_map(|(command, family, addresses, tlvs, length)| {
        let body = [addresses, tlvs].concat();
        let length = length.unwrap_or(body.len() as u16);
        [&V2_SIGNATURE[..], &[command, family], &length.to_be_bytes(), &body].concat()
    })
}

// Operations on a shared region, in fuzz/src/shared_region.rs's encoding.

fn region_operation() -> impl Strategy<Value = Vec<u8>> {
    let id = prop_oneof![8 => 0..8u8, 1 => Just(u8::MAX)];
    let honest = prop_oneof![
        4 => (any::<u8>(), id, any::<u8>(), any::<u16>()).prop_map(|(slot, id, seq, len)| {
            [&[0, slot % 5, id, seq][..], &len.to_le_bytes()].concat()
        }),
        1 => any::<u8>().prop_map(|slot| vec![1, slot]),
        4 => Just(vec![2]),
        4 => (0..128u8, any::<u16>(), 0..4u8).prop_map(|(pick, len, flags)| {
            [&[3, pick][..], &len.to_le_bytes(), &[flags]].concat()
        }),
        3 => Just(vec![4]),
        2 => any::<u8>().prop_map(|slot| vec![5, slot]),
        1 => any::<u8>().prop_map(|slot| vec![6, slot]),
        2 => any::<u8>().prop_map(|which| vec![7, which]),
        1 => Just(vec![11]),
    ];
    let hostile = prop_oneof![
        (any::<u16>(), bytes(16)).prop_map(|(offset, data)| {
            let count = data.len().max(1) - 1;
            [&[8][..], &offset.to_le_bytes(), &[count as u8], &data].concat()
        }),
        (any::<u8>(), any::<u8>(), any::<u64>())
            .prop_map(|(field, slot, value)| { [&[9, field, slot][..], &value.to_le_bytes()].concat() }),
        bytes(31).prop_map(|data| [&[10, data.len() as u8][..], &data].concat()),
        (128..=255u8, any::<u16>(), 0..4u8).prop_map(|(pick, len, flags)| [
            &[3, pick][..],
            &len.to_le_bytes(),
            &[flags]
        ]
        .concat()),
    ];
    prop_oneof![19 => honest, 1 => hostile]
}

proptest! {
    #![proptest_config(config())]

    /// Requests, one to three in a row, under any of the limits.
    #[test]
    fn request_decoder_holds_on_generated_requests(
        choices in any::<[u8; 3]>(),
        requests in sometimes_damaged(vec(http_request(), 1..3).prop_map(|requests| requests.concat())),
    ) {
        target("request_decoder")(&with_choices(&choices, &requests));
    }

    /// Chunked bodies, now and then followed by the next request.
    #[test]
    fn chunked_body_holds_on_generated_bodies(
        choices in any::<[u8; 3]>(),
        body in sometimes_damaged(chunked()),
        next in prop_oneof![3 => Just(Vec::new()), 1 => http_request()],
    ) {
        target("chunked_body")(&with_choices(&choices, &[body, next].concat()));
    }

    /// A worker's stream: mostly `READY` first, then frames of every kind it sends, and headers
    /// announcing any length.
    #[test]
    fn lobby_frames_holds_on_generated_streams(
        seed in any::<[u8; 2]>(),
        stream in sometimes_damaged(stream(prop_oneof![4 => Just(ready_frame()), 1 => worker_sent_frame()], worker_sent_frame())),
    ) {
        target("lobby_frames")(&with_choices(&seed, &stream));
    }

    /// A lobby's stream: mostly the region and the bells first, then requests and the other
    /// frames a worker receives, and headers announcing any length; a lone request is also read
    /// as a slot's.
    #[test]
    fn worker_frames_holds_on_generated_streams(
        seed in any::<[u8; 2]>(),
        stream in sometimes_damaged(stream(prop_oneof![Just(setup_frames()), Just(Vec::new()), request_frame()], lobby_sent_frame())),
    ) {
        target("worker_frames")(&with_choices(&seed, &stream));
    }

    /// PROXY headers of either version under each mode, and what follows them.
    #[test]
    fn proxy_header_holds_on_generated_headers(
        choices in any::<[u8; 3]>(),
        header in sometimes_damaged(prop_oneof![proxy_v1(), proxy_v2()]),
        after in prop_oneof![Just(b"GET / HTTP/1.1\r\n".to_vec()), bytes(8)],
    ) {
        target("proxy_header")(&with_choices(&choices, &[header, after].concat()));
    }

    /// Any layout, then operations of both ends, now and then a hostile worker's.
    #[test]
    fn shared_region_holds_on_generated_operations(
        layout in any::<u8>(),
        operations in vec(region_operation(), 0..40),
    ) {
        target("shared_region")(&with_choices(&[layout], &operations.concat()));
    }
}
