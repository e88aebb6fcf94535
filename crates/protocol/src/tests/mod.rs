//! Unit tests of the decoder's states and errors and of the response writers.
//!
//! Every decoder test goes through [`decode_every_way`], which feeds the input whole, one
//! byte at a time and split in two at every offset, and insists on the same events (body
//! data joined) and the same error each way.

mod decoder;
mod errors;
mod response;

use bytes::{Bytes, BytesMut};

use crate::{Event, Limits, RequestDecoder, RequestError, RequestHead};

/// What decoding an input produced, with consecutive `Data` events joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub events: Vec<Event>,
    pub error: Option<RequestError>,
    /// Bytes the decoder left in the buffer (meaningless after an error).
    pub leftover: usize,
    pub idle: bool,
    pub finish: Result<(), RequestError>,
}

impl Outcome {
    pub fn heads(&self) -> Vec<&RequestHead> {
        self.events
            .iter()
            .filter_map(|event| match event {
                Event::Head(head) => Some(head),
                _ => None,
            })
            .collect()
    }

    pub fn head(&self) -> &RequestHead {
        let heads = self.heads();
        assert_eq!(heads.len(), 1, "expected one head in {self:?}");
        heads[0]
    }

    /// The bodies of the requests, in order.
    pub fn bodies(&self) -> Vec<Vec<u8>> {
        let mut bodies = Vec::new();
        for event in &self.events {
            match event {
                Event::Head(_) => bodies.push(Vec::new()),
                Event::Data(data) => bodies.last_mut().expect("data after a head").extend_from_slice(data),
                Event::End { .. } => {}
            }
        }
        bodies
    }

    pub fn ends(&self) -> usize {
        self.events.iter().filter(|event| matches!(event, Event::End { .. })).count()
    }

    pub fn error(&self) -> &RequestError {
        self.error.as_ref().unwrap_or_else(|| panic!("expected an error in {self:?}"))
    }
}

fn feed<'a>(limits: &Limits, pieces: impl IntoIterator<Item = &'a [u8]>) -> Outcome {
    let mut decoder = RequestDecoder::new(limits.clone());
    let mut buf = BytesMut::new();
    let mut events: Vec<Event> = Vec::new();
    let mut error = None;
    'feed: for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(None) => break,
                Ok(Some(Event::Data(data))) => {
                    assert!(!data.is_empty(), "empty Data event");
                    if let Some(Event::Data(previous)) = events.last_mut() {
                        *previous = Bytes::from([previous.as_ref(), data.as_ref()].concat());
                    } else {
                        events.push(Event::Data(data));
                    }
                }
                Ok(Some(event)) => events.push(event),
                Err(e) => {
                    assert_eq!(decoder.decode(&mut buf), Err(e.clone()), "the decoder must keep refusing");
                    assert_eq!(decoder.finish(), Err(e.clone()));
                    assert!(!decoder.is_idle());
                    error = Some(e);
                    break 'feed;
                }
            }
        }
    }
    let leftover = if error.is_some() { 0 } else { buf.len() };
    Outcome { events, error, leftover, idle: decoder.is_idle(), finish: decoder.finish() }
}

pub(crate) fn decode_with(limits: &Limits, input: &[u8]) -> Outcome {
    let whole = feed(limits, [input]);
    let bytewise = feed(limits, input.chunks(1));
    assert_eq!(bytewise, whole, "fed byte by byte vs whole: {:?}", input.escape_ascii().to_string());
    // Every offset for short inputs; for long ones (limit tests), both ends and a sample.
    let offsets: Vec<usize> = if input.len() <= 2048 {
        (1..input.len()).collect()
    } else {
        let step = input.len() / 61;
        (1..32).chain((32..input.len() - 32).step_by(step)).chain(input.len() - 32..input.len()).collect()
    };
    for at in offsets {
        let split = feed(limits, [&input[..at], &input[at..]]);
        assert_eq!(split, whole, "split at {at} vs whole: {:?}", input.escape_ascii().to_string());
    }
    whole
}

/// Decodes with the default limits, every way.
pub(crate) fn decode_every_way(input: &[u8]) -> Outcome {
    decode_with(&Limits::default(), input)
}

/// Decodes `input` every way and returns the error it must end in.
pub(crate) fn refuse_with(limits: &Limits, input: &[u8]) -> RequestError {
    decode_with(limits, input).error().clone()
}
