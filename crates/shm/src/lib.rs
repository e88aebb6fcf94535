//! The shared-memory region between the lobby and one of its workers (issue 18).
//!
//! Requests and answers pass through memory that both processes map, so that while both sides
//! are busy, handing a request over and its answer back costs neither side a system call. A side
//! is woken, by a write to its bell (an eventfd), only after it has said that it sleeps.
//!
//! # The region
//!
//! One region per worker: a memfd the lobby creates (`MFD_CLOEXEC | MFD_ALLOW_SEALING`), sizes
//! with `ftruncate` (so it starts zero-filled) and seals with `F_SEAL_SHRINK | F_SEAL_GROW |
//! F_SEAL_SEAL`, then maps shared read-write and passes to the worker over its socket, which maps
//! it too ([`Region::create`], [`Region::open`]). The size seals are what make the mapping safe
//! to touch: a file that could shrink under a mapping would turn the lobby's next access into a
//! `SIGBUS`. [`Region::open`] refuses a file without them.
//!
//! Integers are little-endian. Each word the two sides both write to stands on its own 64-byte
//! cache line, so that one side's stores do not keep taking the other's line away.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic, `b"MAITRED\x01"` as a `u64` ([`MAGIC`]) |
//! | 8 | 4 | version, 1 ([`VERSION`]) |
//! | 12 | 4 | `slots`: how many request slots |
//! | 16 | 4 | `slot_size`: bytes of each slot, its header included (a multiple of 64) |
//! | 20 | 4 | `ring_size`: bytes of the answer ring (a power of two) |
//! | 64 | 4 | `lobby_waiting`: 1 when the lobby is about to sleep until this worker answers |
//! | 128 | 4 | `worker_waiting`: 1 when the worker is about to sleep until a request comes, 2 until the answer ring has room ([`Awaiting`]) |
//! | 192 | 8 | `ring_head`: bytes the worker has written into the answer ring, ever (monotonic) |
//! | 256 | 8 | `ring_tail`: bytes of it the lobby has consumed, ever (monotonic) |
//! | 320 | 8 | `loop_beats`: an ASGI worker's event-loop heartbeats, ever (monotonic; 0 from a WSGI worker) |
//! | 384 | 8 | `loop_lag`: how late the last heartbeat was, in microseconds |
//! | 4096 | `slots` x `slot_size` | the request slots |
//! | 4096 + `slots` x `slot_size` | `ring_size` | the answer ring |
//!
//! The worker writes `loop_lag`, then adds one to `loop_beats` with a release store
//! ([`WorkerEnd::beat`]); the lobby reads them in the other order ([`LobbyEnd::loop_beat`]) and
//! admits no new request to a worker whose loop is late (docs/ASGI.md, "Streams and
//! admission"). Both words are the worker's alone, and trusted for nothing else.
//!
//! The rest of the 4096-byte header block is zero. [`Layout::DEFAULT`] is 4 slots of 64 KiB and
//! a 1 MiB ring. A request frame longer than a slot holds, or an answer frame longer than the ring
//! takes, is refused ([`QueueError::TooLarge`], [`AnswerError::TooLarge`]): it has to travel
//! another way.
//!
//! ## Request slots (lobby -> worker)
//!
//! Each slot starts with a 64-byte header, then holds one whole `REQUEST` frame as crates/wire
//! encodes it, frame header included (at most `slot_size - 64` bytes):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | `state`: bits 0-1 `EMPTY` = 0, `QUEUED` = 1, `TAKEN` = 2, `RELEASED` = 3; bits 2-31 the ticket, the low 30 bits of `seq` |
//! | 4 | 4 | `len`: bytes of the frame |
//! | 8 | 4 | `id`: the lobby's id of the request (never `u32::MAX`) |
//! | 16 | 8 | `seq`: the order of the queue; the worker takes the `QUEUED` slot with the lowest |
//! | 64 | `len` | the frame |
//!
//! The ticket makes every compare-and-swap on the word fail when the slot holds another request
//! than the one its caller looked at: without it, a worker that chose a request, which the
//! lobby then took back and replaced by a newer one in the same slot, would take the newer one
//! out of turn.
//!
//! The state changes only so (each keeping the ticket, but the first, which writes a new one):
//!
//! - `EMPTY` -> `QUEUED`, by the lobby ([`LobbyEnd::queue`]), after it wrote `len`, `id`, `seq`
//!   and the frame: the store releases them to the worker.
//! - `QUEUED` -> `TAKEN`, by the worker ([`WorkerEnd::take_next`]), with a compare-and-swap that
//!   acquires them; only then does the worker copy the frame out.
//! - `QUEUED` -> `EMPTY`, by the lobby taking the request back ([`LobbyEnd::recall`]): also a
//!   compare-and-swap, whose success proves the worker never took the request, and whose failure
//!   (the slot is `TAKEN`) means the worker has it and its answer will come.
//! - `TAKEN` -> `RELEASED`, by the worker ([`WorkerEnd::take_next`]), once it has copied the
//!   frame out: the slot's bytes are no longer needed, and the request is the worker's until its
//!   last answer frame. A slot is thus a queue into the worker, not a hold on it: an ASGI
//!   worker runs any number of requests at once through a handful of slots.
//! - `TAKEN` or `RELEASED` -> `EMPTY`, by the lobby, once it has read that request's last answer
//!   frame ([`LobbyEnd::release`]); or `RELEASED` -> `EMPTY` as soon as it wants the slot for
//!   another request ([`LobbyEnd::reclaim_released`]), the request then answering without a
//!   slot until [`LobbyEnd::finished`].
//!
//! The worker never writes `EMPTY`, so a slot the lobby has emptied is the lobby's alone until it
//! queues into it again. The worker takes requests strictly in the order of `seq`, skipping those
//! taken back: it looks at the slots twice before it chooses ([`WorkerEnd::take_next`] says why),
//! and the ticket keeps a recalled slot's new request from being taken in the old one's turn.
//! So the lobby knows which request the worker answers next: the oldest it has not taken back.
//!
//! ## The answer ring (worker -> lobby)
//!
//! `ring_size` bytes holding records, each a multiple of 8 bytes and 8-byte aligned:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | the record's length: 8 + the frame + padding to a multiple of 8 |
//! | 4 | 4 | `id`: the request this answers; `u32::MAX` ([`PADDING_ID`]) marks a padding record |
//! | 8 | 8 + payload | one whole wire frame: its 8-byte header, whose payload length gives the frame's, then the payload |
//!
//! A record never wraps around the ring's end: when one does not fit before the end, the worker
//! first writes a padding record (id `u32::MAX`, length the bytes left to the end) and starts the
//! record at 0. So a record is at most half the ring (then it always fits once the ring has
//! drained), and the largest answer frame is `ring_size / 2 - 8` bytes
//! ([`Layout::max_answer_frame`]).
//!
//! The worker writes a record, then stores `ring_head` (a release); the lobby loads `ring_head`
//! (an acquire), copies records out, then stores `ring_tail` (a release, so that the worker
//! overwrites a record only after the lobby has read it). The worker has room for
//! `ring_size - (ring_head - ring_tail)` bytes. Both counters only grow; a record starts at the
//! counter modulo `ring_size`.
//!
//! # Waking a side that sleeps
//!
//! A side that finds nothing to do sleeps on its bell, an eventfd, and the other side rings it,
//! but only when it has said that it sleeps, so that a busy pair makes no system call.
//! The lobby sleeps until its worker answers, and the worker until a request is queued or, when
//! the answer ring is full, until the lobby has consumed some of it. The sides do this (this
//! crate provides the flag operations, the caller the sleep and the bell):
//!
//! - A side about to sleep stores 1 in its `*_waiting` flag ([`LobbyEnd::prepare_to_sleep`],
//!   [`WorkerEnd::prepare_to_sleep`]), then looks at its condition again ([`LobbyEnd::has_answer`];
//!   [`WorkerEnd::has_request`] or [`WorkerEnd::room_for`]). Only when it is still unsatisfied
//!   does it sleep; otherwise it clears the flag ([`LobbyEnd::sleep_cancelled`],
//!   [`WorkerEnd::sleep_cancelled`]) and goes on.
//! - A side that made progress the other may wait for (the lobby queued a request or consumed
//!   answers; the worker wrote an answer) swaps 0 into the other's flag ([`LobbyEnd::wake_worker`],
//!   [`WorkerEnd::wake_lobby`]) and sends a wake only when it was set. Consumed answers wake only
//!   a worker waiting for room: [`LobbyEnd::wake_worker_for_room`] swaps 2 for 0 with a
//!   compare-and-swap, and leaves a worker waiting for a request asleep. Measured before the
//!   worker's flag said what it waits for (H1-hop, one client): the lobby rang the bell twice per
//!   request, once for the request and once for the answer it had just read, and the worker woke
//!   twice, `poll` and `read` 2.0 each per request.
//!
//! No wake-up is lost. Every access in this protocol is sequentially consistent: the sleeper's
//! store of its flag (F) and its recheck (R), the waker's publication (P: the store of a slot's
//! `QUEUED`, of `ring_head` or of `ring_tail`) and its swap of the flag (W). These four take
//! places in one total order that agrees with each thread's own order, F before R and P before W.
//! Suppose the sleeper's recheck missed the progress and the waker's swap missed the flag: then R
//! came before P (it read an older value), and W before F (it read the flag from before F), so
//! the order would hold F < R < P < W < F, a cycle. So at least one of them sees the other: the
//! sleeper does not sleep, or the waker sends the wake. When both see each other, the wake
//! arrives while the sleeper is awake: a stale ring, which costs one extra recheck later;
//! `sleep_cancelled` says when the other side has claimed the flag, so that the caller knows such a
//! ring is on its way. The flag counts what was promised, never what the queue holds: NGINX
//! Unit's `nxt_port_queue` learned to track its `notified` flag explicitly rather than infer it
//! from the queue's length, which loses a wake when the two race.
//!
//! The waker clears the flag itself, so one sleep gets at most one ring, and the sleeper finds its
//! flag already 0 when it wakes.
//!
//! # Trust
//!
//! A worker runs the application and is not trusted: it may write anything anywhere in the region
//! at any time. So the lobby keeps its own copies of what it decides (which slot holds which
//! request, the ring's tail), reads each value from the region once, checks every index, length,
//! state and id it reads before it uses it, and copies an answer's bytes out of shared memory
//! before anyone looks at them ([`LobbyEnd::next_answer`] never hands out a reference into the
//! region). A bad value is a [`Corrupt`] error naming what was wrong, never a panic, an access
//! outside the region or an endless loop; the lobby then gives up on that worker. The worker
//! trusts the lobby, but checks what it reads the same way, so that a stale or corrupt region is
//! an error and not undefined behaviour.
//!
//! Every access to the region is atomic (bytes are copied as relaxed 8-byte words), and no Rust
//! reference to its plain bytes is ever made: memory another process may change at any moment
//! can only be read as atomics without undefined behaviour.
//!
//! # Fuzzing
//!
//! The fuzz target `shared_region` (fuzz/src/shared_region.rs, docs/FUZZING.md) drives a real
//! region, as a hostile worker would: it writes arbitrary bytes into the memfd with `pwrite`
//! between operations of both ends. So this crate has no entry point for tests only.

#![forbid(unsafe_code)]

mod layout;
mod lobby;
mod region;
mod worker;

pub use layout::{Layout, MAGIC, PADDING_ID, REGION_HEADER_SIZE, SLOT_HEADER_SIZE, VERSION};
pub use lobby::{Answer, LobbyEnd, LoopBeat, QueueError};
pub use region::Region;
pub use worker::{AnswerError, Awaiting, Taken, WorkerEnd};

use std::fmt;
use std::io;

/// The state of a request slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    Empty,
    Queued,
    Taken,
    /// The worker has copied the request out; the slot may be reused.
    Released,
}

impl SlotState {
    const EMPTY: u32 = 0;
    const QUEUED: u32 = 1;
    const TAKEN: u32 = 2;
    const RELEASED: u32 = 3;
    /// The bits of a state word that hold the state; the others hold the slot's ticket.
    const MASK: u32 = 3;

    /// The state a word holds, whatever its ticket.
    fn from_word(word: u32) -> Option<SlotState> {
        match word & SlotState::MASK {
            SlotState::EMPTY => Some(SlotState::Empty),
            SlotState::QUEUED => Some(SlotState::Queued),
            SlotState::TAKEN => Some(SlotState::Taken),
            SlotState::RELEASED => Some(SlotState::Released),
            _ => None,
        }
    }
}

/// The ticket of the request with sequence number `seq`: the low 30 bits of `seq`, in the state
/// word above the state, so that a compare-and-swap on the word fails when the slot holds
/// another request than the one its caller looked at.
fn ticket(seq: u64) -> u32 {
    (seq as u32) << 2
}

/// A value read from the region that the protocol does not allow: the other side broke it (or
/// the region is not the one it should be).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Corrupt {
    /// A slot's state word is no state, or one the slot cannot be in now.
    SlotState { slot: usize, state: u32 },
    /// A queued request says it is longer than its slot holds.
    SlotLength { slot: usize, len: u32 },
    /// The ring's head and tail: the head behind the tail, ahead of it by more than the ring, or
    /// not a multiple of 8.
    RingIndices { head: u64, tail: u64 },
    /// The answer record at ring offset `at` (the monotonic count) cannot be one.
    Record { at: u64, len: u32, problem: &'static str },
    /// An answer for a request that no slot lent to the worker holds.
    AnswerId { id: u32 },
    /// A slot holds a request the worker answered, but says the worker has not taken it.
    AnswerNotTaken { id: u32, slot: usize, state: u32 },
    /// A waiting flag holds neither 0 nor 1.
    WaitingFlag { value: u32 },
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("shared region: ")?;
        match self {
            Corrupt::SlotState { slot, state } => write!(f, "slot {slot} has state {state}, which it cannot have now"),
            Corrupt::SlotLength { slot, len } => {
                write!(f, "slot {slot} holds a request of {len} bytes, more than fits")
            }
            Corrupt::RingIndices { head, tail } => write!(f, "answer ring head {head} with tail {tail}"),
            Corrupt::Record { at, len, problem } => write!(f, "answer record of {len} bytes at {at}: {problem}"),
            Corrupt::AnswerId { id } => write!(f, "an answer for request {id}, which the worker does not hold"),
            Corrupt::AnswerNotTaken { id, slot, state } => {
                write!(f, "an answer for request {id}, whose slot {slot} has state {state}, not taken")
            }
            Corrupt::WaitingFlag { value } => write!(f, "a waiting flag holds {value}"),
        }
    }
}

impl std::error::Error for Corrupt {}

impl From<Corrupt> for io::Error {
    fn from(corrupt: Corrupt) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, corrupt)
    }
}

/// A waiting flag's old value as "was waiting": 0 or 1, anything else is corrupt.
fn waiting(value: u32) -> Result<bool, Corrupt> {
    match value {
        0 => Ok(false),
        1 => Ok(true),
        value => Err(Corrupt::WaitingFlag { value }),
    }
}

#[cfg(test)]
mod tests;
