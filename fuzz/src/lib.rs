//! The bodies of maitred's fuzz targets (docs/FUZZING.md), as plain functions of the fuzzer's
//! input: each panics when the code under test breaks a property, and returns otherwise.
//!
//! The libFuzzer harness in `fuzz/harness` (not a workspace member: it needs cargo-fuzz's
//! flags) calls them; `tests/corpus.rs` feeds every file of `fuzz/corpus/<target>/` through
//! the same functions in an ordinary `cargo test`, so the saved corpora are replayed without
//! cargo-fuzz or a nightly compiler.
//!
//! Each input starts with a few bytes that choose how it is fed (limits, where to split it,
//! how to cut it into reads); [`Input`] takes them off the front.

mod chunked;
mod decoder;
mod frames;
mod proxy;
mod shared_region;

pub use chunked::chunked_body;
pub use decoder::request_decoder;
pub use frames::{lobby_frames, worker_frames};
pub use proxy::proxy_header;
pub use shared_region::shared_region;

/// A target's body: it panics on an input that breaks a property.
pub type Target = fn(&[u8]);

/// Every fuzz target: its name (that of its corpus directory and of its harness binary) and
/// its body.
pub const TARGETS: [(&str, Target); 6] = [
    ("request_decoder", request_decoder),
    ("chunked_body", chunked_body),
    ("lobby_frames", lobby_frames),
    ("worker_frames", worker_frames),
    ("proxy_header", proxy_header),
    ("shared_region", shared_region),
];

/// The fuzzer's bytes: a few choices, then the data that is fed.
struct Input<'a> {
    rest: &'a [u8],
}

impl<'a> Input<'a> {
    fn new(data: &'a [u8]) -> Input<'a> {
        Input { rest: data }
    }

    /// The next choice byte; 0 once the input is used up.
    fn byte(&mut self) -> u8 {
        match self.rest.split_first() {
            Some((&first, rest)) => {
                self.rest = rest;
                first
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// What is left: the data to feed.
    fn data(self) -> &'a [u8] {
        self.rest
    }
}

/// Cuts `data` into reads of the sizes a small generator seeded with `seed` picks: mostly
/// short ones, now and then a long one, so that a frame or a line is split everywhere.
fn pieces(data: &[u8], seed: u16) -> Vec<&[u8]> {
    let mut state = u32::from(seed) << 8 | 0x5a;
    let mut next = move || {
        // xorshift32: any generator does, as long as the seed decides the cuts.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let roll = next();
        let len = if roll % 8 == 0 { 1 + (roll >> 3) as usize % 4096 } else { 1 + (roll >> 3) as usize % 24 };
        let (piece, tail) = rest.split_at(len.min(rest.len()));
        out.push(piece);
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_data_in_order() {
        let data: Vec<u8> = (0..=255).cycle().take(10_000).collect();
        for seed in [0, 1, 2, 0xffff] {
            let cut = pieces(&data, seed);
            assert!(cut.iter().all(|piece| !piece.is_empty()));
            assert_eq!(cut.concat(), data);
        }
        assert!(pieces(b"", 7).is_empty());
    }

    #[test]
    fn a_short_input_reads_as_zero_choices() {
        let mut input = Input::new(b"\x05");
        assert_eq!(input.byte(), 5);
        assert_eq!(input.u16(), 0);
        assert_eq!(input.data(), b"");
    }
}
