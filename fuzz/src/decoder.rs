//! `request_decoder`: `RequestDecoder::decode` on any bytes.
//!
//! The property is the one every decoder test checks (crates/protocol/src/tests/mod.rs):
//! the input fed whole, one byte at a time, and split in two at one point gives the same
//! events (consecutive body data joined), the same error, the same bytes left over, the same
//! `is_idle` and the same `finish`. On top of that: no panic, no empty `Data`, an error is
//! returned again on every later call, every request that ended got exactly the body its
//! head announced, and what stays in the buffer is the end of the input.

use bytes::{Bytes, BytesMut};
use maitred_protocol::{BodyLength, Event, Limits, RequestDecoder, RequestError};

use crate::Input;

/// What decoding an input produced, with consecutive `Data` events joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub events: Vec<Event>,
    pub error: Option<RequestError>,
    /// The bytes the decoder left in the buffer (none counted after an error).
    pub leftover: usize,
    pub idle: bool,
    pub finish: Result<(), RequestError>,
}

/// The limits an input asks for with its first byte: the defaults, none at all, tight ones
/// that every field and body trips, and 1-byte ones.
pub(crate) fn limits(choice: u8) -> Limits {
    match choice & 3 {
        0 => Limits::default(),
        1 => Limits { max_request_line: 0, max_headers: 0, max_header_size: 0, max_body: None },
        2 => Limits { max_request_line: 40, max_headers: 4, max_header_size: 40, max_body: Some(32) },
        _ => Limits { max_request_line: 1, max_headers: 1, max_header_size: 1, max_body: Some(0) },
    }
}

/// Feeds `pieces` in turn, decoding after each until the decoder wants more, as the lobby
/// does; stops at the first error.
pub(crate) fn feed<'a>(limits: &Limits, input: &[u8], pieces: impl IntoIterator<Item = &'a [u8]>) -> Outcome {
    let mut decoder = RequestDecoder::new(limits.clone());
    let mut buf = BytesMut::new();
    let mut events: Vec<Event> = Vec::new();
    let mut error = None;
    let mut fed = 0;
    'feed: for piece in pieces {
        buf.extend_from_slice(piece);
        fed += piece.len();
        loop {
            match decoder.decode(&mut buf) {
                Ok(None) => break,
                Ok(Some(Event::Data(data))) => {
                    assert!(!data.is_empty(), "an empty Data event");
                    if let Some(Event::Data(previous)) = events.last_mut() {
                        *previous = Bytes::from([previous.as_ref(), data.as_ref()].concat());
                    } else {
                        events.push(Event::Data(data));
                    }
                }
                Ok(Some(event)) => events.push(event),
                Err(e) => {
                    assert_eq!(decoder.decode(&mut buf), Err(e.clone()), "the decoder must keep refusing");
                    assert_eq!(decoder.finish(), Err(e.clone()), "finish() after an error");
                    assert!(!decoder.is_idle(), "idle after an error");
                    check_error(&e);
                    error = Some(e);
                    break 'feed;
                }
            }
        }
    }
    if error.is_none() {
        // The decoder only ever takes bytes off the front.
        assert_eq!(buf.as_ref(), &input[fed - buf.len()..fed], "the buffer is not what is left of the input");
    }
    let leftover = if error.is_some() { 0 } else { buf.len() };
    Outcome { events, error, leftover, idle: decoder.is_idle(), finish: decoder.finish() }
}

/// An error names a status the server can send and a reason it can print.
fn check_error(error: &RequestError) {
    assert!(matches!(error.status(), 400 | 413 | 414 | 417 | 431 | 501 | 505), "status {}", error.status());
    let reason = error.to_string();
    assert!(!reason.is_empty() && !reason.contains(['\r', '\n']), "reason {reason:?}");
}

/// Decodes `input` whole, byte by byte and split at `at`, insists on one outcome, and
/// returns it.
pub(crate) fn decode_every_way(limits: &Limits, input: &[u8], at: usize) -> Outcome {
    let whole = feed(limits, input, [input]);
    let bytewise = feed(limits, input, input.chunks(1));
    assert_eq!(bytewise, whole, "fed byte by byte vs whole: {:?}", input.escape_ascii().to_string());
    let (first, second) = input.split_at(at);
    let split = feed(limits, input, [first, second]);
    assert_eq!(split, whole, "split at {at} vs whole: {:?}", input.escape_ascii().to_string());
    check_requests(&whole);
    whole
}

/// Each request that ended carried the body its head announced.
fn check_requests(outcome: &Outcome) {
    let mut current: Option<(BodyLength, u64)> = None;
    for event in &outcome.events {
        match event {
            Event::Head(head) => {
                assert!(current.is_none(), "a head inside a request");
                assert!(!head.method.is_empty() && !head.target.is_empty(), "{head:?}");
                for (name, value) in &head.headers {
                    assert!(!name.is_empty(), "an empty field name");
                    assert!(!value.contains(&b'\r') && !value.contains(&b'\n'), "a line break in a value");
                }
                current = Some((head.body, 0));
            }
            Event::Data(data) => match &mut current {
                Some((BodyLength::Empty, _)) | None => panic!("data where no body was announced"),
                Some((_, received)) => *received += data.len() as u64,
            },
            Event::End { trailers } => {
                match current.take() {
                    Some((BodyLength::Empty, received)) => assert_eq!(received, 0),
                    Some((BodyLength::Length(n), received)) => assert_eq!(received, n, "Content-Length {n}"),
                    Some((BodyLength::Chunked, _)) => {}
                    None => panic!("End without a head"),
                }
                assert!(trailers.iter().all(|(name, _)| !name.is_empty()));
            }
        }
    }
}

/// The fuzz target: one limits byte, two bytes for the split point, then the request bytes.
pub fn request_decoder(data: &[u8]) {
    let mut input = Input::new(data);
    let limits = limits(input.byte());
    let at = input.u16() as usize;
    let bytes = input.data();
    decode_every_way(&limits, bytes, at % (bytes.len() + 1));
}
