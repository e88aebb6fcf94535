//! Shared by the corpus tests: where the corpora are, and how a case is fed to the decoder.

#![allow(dead_code)] // Each test crate uses its own part of this module.

use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use maitred_protocol::{ErrorKind, Event, Limits, RequestDecoder, RequestError, RequestHead};

/// The root of the corpus `name` (gunicorn, llhttp), from `$MAITRED_CORPUS_<NAME>`, which
/// tests/corpora.py sets (`make test` runs it: it finds each corpus in ../shared or fetches it).
/// A test that reads a corpus has `<name>_corpus` in its name: when the corpus cannot be had,
/// tests/corpora.py says why and `make test` passes cargo `--skip <name>_corpus`, so the test is
/// reported as filtered out. Run without either, it fails here: a corpus test that checked
/// nothing must not count as passed.
pub fn corpus(name: &str) -> PathBuf {
    let variable = format!("MAITRED_CORPUS_{}", name.to_uppercase());
    match std::env::var_os(&variable) {
        Some(root) => PathBuf::from(root),
        None => panic!(
            "{variable} is unset, so this test has no {name} corpus to check: `make test` sets it (tests/corpora.py \
             finds the corpus, or says why not and skips this test); by hand, set {variable} to the corpus's \
             directory, or leave the test out with `cargo test -- --skip {name}_corpus`"
        ),
    }
}

/// One request as decoded: the head, the body with chunking removed, the trailers, and
/// whether `End` was reached.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    pub head: RequestHead,
    pub body: Vec<u8>,
    pub trailers: Vec<(Bytes, Bytes)>,
    pub complete: bool,
}

/// Everything the decoder said about one input.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    pub requests: Vec<Decoded>,
    /// The error `decode` returned, if any; feeding stops there.
    pub error: Option<RequestError>,
    /// Bytes left in the buffer at the end (those after a request that closes the
    /// connection; meaningless after an error).
    pub leftover: usize,
    pub idle: bool,
}

impl Run {
    /// `finish()` at the end of input, as when the peer closes: the first error of the run.
    pub fn error_at_eof(&self, decoder_finish: &Result<(), RequestError>) -> Option<RequestError> {
        self.error.clone().or_else(|| decoder_finish.clone().err())
    }

    pub fn complete_requests(&self) -> usize {
        self.requests.iter().filter(|r| r.complete).count()
    }
}

/// Feeds `pieces` one after another, decoding after each until the decoder needs more.
/// Returns the run and what `finish()` says at the end.
pub fn run<'a>(limits: &Limits, pieces: impl IntoIterator<Item = &'a [u8]>) -> (Run, Result<(), RequestError>) {
    let mut decoder = RequestDecoder::new(limits.clone());
    let mut buf = BytesMut::new();
    let mut requests: Vec<Decoded> = Vec::new();
    let mut error = None;
    'feed: for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match decoder.decode(&mut buf) {
                Ok(None) => break,
                Ok(Some(Event::Head(head))) => {
                    requests.push(Decoded { head, body: Vec::new(), trailers: Vec::new(), complete: false })
                }
                Ok(Some(Event::Data(data))) => {
                    assert!(!data.is_empty(), "the decoder yielded empty data");
                    requests.last_mut().expect("data after a head").body.extend_from_slice(&data);
                }
                Ok(Some(Event::End { trailers })) => {
                    let request = requests.last_mut().expect("end after a head");
                    request.trailers = trailers;
                    request.complete = true;
                }
                Err(e) => {
                    // The decoder must keep refusing.
                    assert_eq!(decoder.decode(&mut buf), Err(e.clone()));
                    error = Some(e);
                    break 'feed;
                }
            }
        }
    }
    let finish = decoder.finish();
    let leftover = if error.is_some() { 0 } else { buf.len() };
    (Run { requests, error, leftover, idle: decoder.is_idle() }, finish)
}

/// Runs `input` whole, one byte at a time, and (when it is short enough) split in two at
/// every offset, and checks that every way gives the same run. Returns that run.
pub fn run_every_way(
    limits: &Limits,
    input: &[u8],
    split_everywhere: bool,
) -> Result<(Run, Result<(), RequestError>), String> {
    let whole = run(limits, [input]);
    let bytewise = run(limits, input.chunks(1));
    if bytewise != whole {
        return Err(format!("fed byte by byte: {:?}\nfed whole: {:?}", bytewise, whole));
    }
    if split_everywhere && input.len() <= 2048 {
        for at in 1..input.len() {
            let split = run(limits, [&input[..at], &input[at..]]);
            if split != whole {
                return Err(format!("split at {at}: {:?}\nfed whole: {:?}", split, whole));
            }
        }
    }
    Ok(whole)
}

pub fn show(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

/// The Host field added to requests that lack the one RFC 9112 §3.2 requires.
pub const ADDED_HOST: &[u8] = b"Host: maitred-corpus.invalid\r\n";

/// Whether a decoded field is the added Host.
pub fn is_added_host(name: &[u8], value: &[u8]) -> bool {
    name == b"Host" && value == b"maitred-corpus.invalid"
}

/// A corpus input decoded every way (see `run_every_way`). An input refused only for lacking
/// the Host field RFC 9112 requires (the corpora come from parsers that do not) is decoded
/// again with one added to the request that lacked it, until it decodes or is refused for
/// something else.
pub struct Decoding {
    pub run: Run,
    pub finish: Result<(), RequestError>,
    pub hosts_added: usize,
}

pub fn decode_adding_hosts(limits: &Limits, input: &[u8]) -> Result<Decoding, String> {
    let mut input = input.to_vec();
    let mut hosts_added = 0;
    loop {
        let (run, finish) = run_every_way(limits, &input, true)?;
        if matches!(run.error.as_ref().map(|e| e.kind()), Some(ErrorKind::MissingHost)) {
            input = add_host(limits, &input);
            hosts_added += 1;
            continue;
        }
        return Ok(Decoding { run, finish, hosts_added });
    }
}

/// Adds a Host field after the request line of the request refused for lacking one: the
/// first request after the last complete one.
fn add_host(limits: &Limits, input: &[u8]) -> Vec<u8> {
    let mut decoder = RequestDecoder::new(limits.clone());
    let mut buf = BytesMut::from(input);
    let mut start = 0;
    while let Ok(Some(event)) = decoder.decode(&mut buf) {
        if matches!(event, Event::End { .. }) {
            start = input.len() - buf.len();
        }
    }
    while input[start..].starts_with(b"\r\n") {
        start += 2;
    }
    let line_end = start + input[start..].windows(2).position(|w| w == b"\r\n").expect("a request line") + 2;
    [&input[..line_end], ADDED_HOST, &input[line_end..]].concat()
}
