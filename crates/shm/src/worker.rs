//! The worker's end of a region: it takes queued requests in order and writes answer records
//! into the ring.

use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::layout::{record_len, Layout, FRAME_HEADER_SIZE, PADDING_ID, RECORD_HEADER_SIZE};
use crate::region::{copy_in_parts, copy_out, Region};
use crate::{Corrupt, SlotState};

/// What a worker about to sleep waits for, in its waiting flag: the lobby wakes it for a queued
/// request whatever it waits for, and for consumed answers only when it waits for room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Awaiting {
    Request = 1,
    Room = 2,
}

/// A request [`WorkerEnd::take_next`] took: its slot and the lobby's id for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    pub slot: usize,
    pub id: u32,
}

/// Why [`WorkerEnd::write_answer`] did not write an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnswerError {
    /// The ring lacks room now: the caller prepares to sleep, rechecks with
    /// [`WorkerEnd::room_for`], and waits for the lobby's wake.
    NoRoom,
    /// The frame is longer than the ring ever takes ([`Layout::max_answer_frame`]).
    TooLarge {
        len: usize,
        most: usize,
    },
    /// The bytes are not one whole frame: shorter than a frame header, or of another length
    /// than their header says.
    NotAFrame {
        len: usize,
    },
    /// `u32::MAX` marks padding; the lobby gives no request that id.
    ReservedId,
    Corrupt(Corrupt),
}

impl fmt::Display for AnswerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnswerError::NoRoom => f.write_str("no room in the answer ring now"),
            AnswerError::TooLarge { len, most } => {
                write!(f, "an answer frame of {len} bytes, where the ring takes {most}")
            }
            AnswerError::NotAFrame { len } => write!(f, "{len} bytes that are not one whole frame"),
            AnswerError::ReservedId => write!(f, "request id {PADDING_ID} is reserved"),
            AnswerError::Corrupt(corrupt) => corrupt.fmt(f),
        }
    }
}

impl std::error::Error for AnswerError {}

/// The worker's end of its region.
pub struct WorkerEnd {
    region: Region,
    /// Bytes written into the ring: the `ring_head` this end last stored. A region serves one
    /// worker from its creation, so it starts at 0.
    head: u64,
}

impl WorkerEnd {
    /// The end of the region the lobby passed ([`Region::open`]).
    pub fn new(region: Region) -> WorkerEnd {
        WorkerEnd { region, head: 0 }
    }

    pub fn layout(&self) -> Layout {
        self.region.layout()
    }

    /// Takes the queued request of the lowest `seq`, appending its frame to `out`. `None`:
    /// nothing is queued.
    ///
    /// It looks at the slots twice before it chooses. One look can miss a slot queued while it
    /// looked, and then take a newer request first. But a request the first look saw was queued
    /// (its state stored with release, loaded here with acquire) after every older one, so the
    /// second look sees all of those. The compare-and-swap is on the whole state word, ticket
    /// included, so it fails if the lobby took the chosen request back and queued another in its
    /// slot meanwhile.
    pub fn take_next(&self, out: &mut Vec<u8>) -> Result<Option<Taken>, Corrupt> {
        // Round again only when the lobby took the chosen request back meanwhile: each round
        // follows a recall of the lobby's.
        loop {
            if self.lowest_queued()?.is_none() {
                return Ok(None);
            }
            let Some((slot, word)) = self.lowest_queued()? else { continue };
            let state = self.region.slot_state(slot);
            // Acquires what the lobby wrote before it stored QUEUED.
            let taken = (word & !SlotState::MASK) | SlotState::TAKEN;
            if state.compare_exchange(word, taken, Ordering::AcqRel, Ordering::Relaxed).is_err() {
                continue;
            }
            let len = self.region.slot_len(slot).load(Ordering::Relaxed);
            if len as usize > self.layout().max_request_frame() {
                return Err(Corrupt::SlotLength { slot, len });
            }
            let id = self.region.slot_id(slot).load(Ordering::Relaxed);
            let start = out.len();
            out.resize(start + len as usize, 0);
            copy_out(self.region.slot_frame(slot, len as usize), &mut out[start..]);
            // The copy is made: the slot is the lobby's to reuse. Releases the reads above
            // before the lobby may write the slot again.
            state.store((word & !SlotState::MASK) | SlotState::RELEASED, Ordering::Release);
            return Ok(Some(Taken { slot, id }));
        }
    }

    /// The queued slot of the lowest `seq` in one look, with its state word.
    fn lowest_queued(&self) -> Result<Option<(usize, u32)>, Corrupt> {
        let mut lowest: Option<(usize, u32, u64)> = None;
        for slot in 0..self.layout().slots as usize {
            let word = self.region.slot_state(slot).load(Ordering::Acquire);
            match SlotState::from_word(word) {
                Some(SlotState::Queued) => {
                    let seq = self.region.slot_seq(slot).load(Ordering::Relaxed);
                    if lowest.is_none_or(|(_, _, first)| seq < first) {
                        lowest = Some((slot, word, seq));
                    }
                }
                Some(SlotState::Empty | SlotState::Taken | SlotState::Released) => {}
                None => return Err(Corrupt::SlotState { slot, state: word }),
            }
        }
        Ok(lowest.map(|(slot, word, _)| (slot, word)))
    }

    /// Whether a request is queued: the recheck after [`WorkerEnd::prepare_to_sleep`] when the
    /// worker waits for one.
    pub fn has_request(&self) -> bool {
        (0..self.layout().slots as usize).any(|slot| {
            SlotState::from_word(self.region.slot_state(slot).load(Ordering::SeqCst)) == Some(SlotState::Queued)
        })
    }

    /// Writes one whole wire frame, the bytes of `parts` one after the other (a header and a
    /// payload need not be joined first), as the answer (or part of the answer) to request
    /// `id`, then [`WorkerEnd::wake_lobby`].
    pub fn write_answer(&mut self, id: u32, parts: &[&[u8]]) -> Result<(), AnswerError> {
        if id == PADDING_ID {
            return Err(AnswerError::ReservedId);
        }
        let frame_len: usize = parts.iter().map(|part| part.len()).sum();
        let mut header = [0u8; FRAME_HEADER_SIZE];
        let mut gathered = 0;
        for part in parts {
            let take = part.len().min(FRAME_HEADER_SIZE - gathered);
            header[gathered..gathered + take].copy_from_slice(&part[..take]);
            gathered += take;
        }
        let announced = u32::from_le_bytes(header[4..].try_into().expect("4 bytes")) as usize;
        if gathered < FRAME_HEADER_SIZE || FRAME_HEADER_SIZE + announced != frame_len {
            return Err(AnswerError::NotAFrame { len: frame_len });
        }
        let most = self.layout().max_answer_frame();
        if frame_len > most {
            return Err(AnswerError::TooLarge { len: frame_len, most });
        }
        let len = record_len(frame_len);
        let padding = self.placement(len).map_err(AnswerError::Corrupt)?.ok_or(AnswerError::NoRoom)?;
        if padding > 0 {
            self.write_record(padding, PADDING_ID, &[]);
        }
        self.write_record(len, id, parts);
        // Releases the records to the lobby's acquiring load; sequentially consistent for the
        // wake protocol.
        self.region.ring_head().store(self.head, Ordering::SeqCst);
        Ok(())
    }

    /// Whether an answer frame of `frame_len` bytes fits in the ring now: the recheck after
    /// [`WorkerEnd::prepare_to_sleep`] when the worker waits for room.
    pub fn room_for(&self, frame_len: usize) -> Result<bool, Corrupt> {
        Ok(self.placement(record_len(frame_len))?.is_some())
    }

    /// Whether the lobby has read every record written: it was awake for them, so a ring put off
    /// since they were written is not needed (the lobby looks at the ring before it sleeps).
    pub fn all_read(&self) -> bool {
        self.region.ring_tail().load(Ordering::SeqCst) == self.head
    }

    /// After writing an answer: clears the lobby's waiting flag and says whether it was set, so
    /// that the caller sends the lobby a wake.
    pub fn wake_lobby(&self) -> bool {
        self.region.lobby_waiting().swap(0, Ordering::SeqCst) != 0
    }

    /// The worker's event loop has beaten, `lag` late (the heartbeat's timer fired that long
    /// after it was due): counts the beat and publishes the lag, for the lobby's admission.
    pub fn beat(&self, lag: Duration) {
        let micros = u64::try_from(lag.as_micros()).unwrap_or(u64::MAX);
        self.region.loop_lag().store(micros, Ordering::Relaxed);
        // Releases the lag with the count, so that a lobby that sees the beat sees its lag.
        self.region.loop_beats().fetch_add(1, Ordering::Release);
    }

    /// Says that the worker is about to sleep until a request comes or the ring has room; then
    /// it looks again with [`WorkerEnd::has_request`] or [`WorkerEnd::room_for`], and sleeps
    /// only when it still has to wait.
    pub fn prepare_to_sleep(&self, awaiting: Awaiting) {
        self.region.worker_waiting().store(awaiting as u32, Ordering::SeqCst);
    }

    /// Takes back [`WorkerEnd::prepare_to_sleep`] when the recheck found work. True when the
    /// lobby had already claimed the flag: its wake is on its way, to be read and ignored.
    pub fn sleep_cancelled(&self) -> bool {
        self.region.worker_waiting().swap(0, Ordering::SeqCst) == 0
    }

    /// Where a record of `len` bytes goes next: `Some(padding)`, the bytes of padding record to
    /// write before it (0 when it fits before the ring's end), or `None` when the ring lacks room.
    fn placement(&self, len: usize) -> Result<Option<usize>, Corrupt> {
        let ring = u64::from(self.layout().ring_size);
        // Acquires the lobby's reads of what it consumed, before this end overwrites it.
        let tail = self.region.ring_tail().load(Ordering::SeqCst);
        if tail > self.head || self.head - tail > ring || !tail.is_multiple_of(8) {
            return Err(Corrupt::RingIndices { head: self.head, tail });
        }
        let to_end = (ring - self.head % ring) as usize;
        let padding = if len <= to_end { 0 } else { to_end };
        let room = (ring - (self.head - tail)) as usize;
        Ok((padding + len <= room).then_some(padding))
    }

    /// Writes one record at the head, which has room for it, and moves the head past it.
    fn write_record(&mut self, len: usize, id: u32, frame: &[&[u8]]) {
        let at = (self.head % u64::from(self.layout().ring_size)) as usize;
        let header = u64::from(len as u32) | u64::from(id) << 32;
        self.region.ring_words(at, 1)[0].store(header, Ordering::Relaxed);
        let frame_len: usize = frame.iter().map(|part| part.len()).sum();
        copy_in_parts(self.region.ring_words(at + RECORD_HEADER_SIZE, frame_len.div_ceil(8)), frame);
        self.head += len as u64;
    }
}
