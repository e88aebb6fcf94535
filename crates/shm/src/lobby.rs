//! The lobby's end of a region: it queues requests into slots, takes back those not yet taken,
//! and copies answers out of the ring, checking everything the worker could have written.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;

use crate::layout::{record_len, Layout, FRAME_HEADER_SIZE, PADDING_ID, RECORD_HEADER_SIZE};
use crate::region::{copy_in, copy_out, Region};
use crate::{ticket, waiting, Awaiting, Corrupt, SlotState};

/// One answer frame [`LobbyEnd::next_answer`] copied out: for request `id`, which `slot` holds
/// (None once the lobby reclaimed its slot: [`LobbyEnd::reclaim_released`]), `frame_len` bytes
/// (header included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub id: u32,
    pub slot: Option<usize>,
    pub frame_len: usize,
}

/// Why [`LobbyEnd::queue`] did not queue a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueError {
    NoSuchSlot(usize),
    /// The slot still holds a request, queued or taken.
    SlotBusy(usize),
    /// Another slot holds a request with this id: answers name requests by id.
    IdInUse(u32),
    /// `u32::MAX` marks padding in the answer ring.
    ReservedId,
    /// The frame is longer than a slot holds.
    TooLarge {
        len: usize,
        most: usize,
    },
    Corrupt(Corrupt),
}

impl fmt::Display for QueueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueError::NoSuchSlot(slot) => write!(f, "no slot {slot}"),
            QueueError::SlotBusy(slot) => write!(f, "slot {slot} holds a request"),
            QueueError::IdInUse(id) => write!(f, "a slot holds request {id} already"),
            QueueError::ReservedId => write!(f, "request id {PADDING_ID} is reserved"),
            QueueError::TooLarge { len, most } => write!(f, "a frame of {len} bytes, where a slot holds {most}"),
            QueueError::Corrupt(corrupt) => corrupt.fmt(f),
        }
    }
}

impl std::error::Error for QueueError {}

/// What the lobby put in a slot: the request's id, and the ticket its state word carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lent {
    id: u32,
    ticket: u32,
}

/// What [`LobbyEnd::loop_beat`] read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoopBeat {
    /// Beats counted since the worker started: 0 from a worker that publishes none (WSGI).
    pub beats: u64,
    /// How late the last beat was.
    pub lag: Duration,
}

/// The lobby's end of one worker's region. Its own record of which slot holds which request, and
/// of how far it has read the ring, is what it trusts; the region is only checked against it.
pub struct LobbyEnd {
    region: Region,
    /// The request each slot holds, queued or taken; `None`: the slot is empty.
    lent: Vec<Option<Lent>>,
    /// Bytes of the ring consumed: the `ring_tail` this end last stored.
    tail: u64,
    /// The requests the worker took whose slots were reclaimed (`RELEASED`) and whose answers
    /// have not ended: their answers are still the worker's to write.
    unslotted: HashSet<u32>,
}

impl LobbyEnd {
    /// The end of a region the lobby has just created ([`Region::create`]).
    pub fn new(region: Region) -> LobbyEnd {
        LobbyEnd { lent: vec![None; region.layout().slots as usize], region, tail: 0, unslotted: HashSet::new() }
    }

    pub fn layout(&self) -> Layout {
        self.region.layout()
    }

    /// The slot that holds request `id`, queued or taken, if it still has one.
    pub fn slot_of(&self, id: u32) -> Option<usize> {
        self.lent.iter().position(|lent| lent.is_some_and(|lent| lent.id == id))
    }

    /// A slot that holds no request, if there is one.
    pub fn free_slot(&self) -> Option<usize> {
        self.lent.iter().position(Option::is_none)
    }

    /// Writes `frame` (one whole `REQUEST` frame) into `slot`, which must be empty, and marks it
    /// queued: the worker takes the queued slot of the lowest `seq` first. Then
    /// [`LobbyEnd::wake_worker`].
    pub fn queue(&mut self, slot: usize, id: u32, seq: u64, frame: &[u8]) -> Result<(), QueueError> {
        match self.lent.get(slot) {
            None => return Err(QueueError::NoSuchSlot(slot)),
            Some(Some(_)) => return Err(QueueError::SlotBusy(slot)),
            Some(None) => {}
        }
        if id == PADDING_ID {
            return Err(QueueError::ReservedId);
        }
        if self.unslotted.contains(&id) || self.lent.iter().flatten().any(|lent| lent.id == id) {
            return Err(QueueError::IdInUse(id));
        }
        let most = self.layout().max_request_frame();
        if frame.len() > most {
            return Err(QueueError::TooLarge { len: frame.len(), most });
        }
        let state = self.region.slot_state(slot).load(Ordering::Acquire);
        if SlotState::from_word(state) != Some(SlotState::Empty) {
            return Err(QueueError::Corrupt(Corrupt::SlotState { slot, state }));
        }
        // Fits in u32: a slot is at most 16 MiB.
        self.region.slot_len(slot).store(frame.len() as u32, Ordering::Relaxed);
        self.region.slot_id(slot).store(id, Ordering::Relaxed);
        self.region.slot_seq(slot).store(seq, Ordering::Relaxed);
        copy_in(self.region.slot_frame(slot, frame.len()), frame);
        // Releases the fields above to the worker's acquiring compare-and-swap; sequentially
        // consistent for the wake protocol (the crate's documentation).
        let ticket = ticket(seq);
        self.region.slot_state(slot).store(ticket | SlotState::QUEUED, Ordering::SeqCst);
        self.lent[slot] = Some(Lent { id, ticket });
        Ok(())
    }

    /// Takes back the request queued in `slot`, if the worker has not taken it: true when it
    /// came back (the slot is empty again and no answer for it will come), false when the worker
    /// took it first (its answer will come) or the slot held no request.
    ///
    /// # Panics
    ///
    /// When there is no slot `slot`.
    pub fn recall(&mut self, slot: usize) -> Result<bool, Corrupt> {
        let Some(Lent { ticket, .. }) = self.lent[slot] else {
            return Ok(false);
        };
        let state = self.region.slot_state(slot);
        match state.compare_exchange(
            ticket | SlotState::QUEUED,
            ticket | SlotState::EMPTY,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.lent[slot] = None;
                Ok(true)
            }
            Err(word) if word == ticket | SlotState::TAKEN || word == ticket | SlotState::RELEASED => Ok(false),
            Err(state) => Err(Corrupt::SlotState { slot, state }),
        }
    }

    /// The state of `slot` as the region has it, once checked against what this end did: an
    /// empty slot must read `EMPTY`, one holding a request `QUEUED`, `TAKEN` or `RELEASED`.
    ///
    /// # Panics
    ///
    /// When there is no slot `slot`.
    pub fn state(&self, slot: usize) -> Result<SlotState, Corrupt> {
        let word = self.region.slot_state(slot).load(Ordering::Acquire);
        match (self.lent[slot], SlotState::from_word(word)) {
            (None, Some(SlotState::Empty)) => Ok(SlotState::Empty),
            (Some(Lent { ticket, .. }), Some(state @ (SlotState::Queued | SlotState::Taken | SlotState::Released)))
                if word & !SlotState::MASK == ticket =>
            {
                Ok(state)
            }
            _ => Err(Corrupt::SlotState { slot, state: word }),
        }
    }

    /// Empties `slot`, whose request the worker took and whose last answer frame this end has
    /// read. A slot that holds no request is left as it is.
    ///
    /// # Panics
    ///
    /// When there is no slot `slot`.
    pub fn release(&mut self, slot: usize) -> Result<(), Corrupt> {
        let Some(Lent { ticket, .. }) = self.lent[slot] else {
            return Ok(());
        };
        let state = self.region.slot_state(slot);
        for from in [SlotState::RELEASED, SlotState::TAKEN] {
            match state.compare_exchange(ticket | from, ticket | SlotState::EMPTY, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.lent[slot] = None;
                    return Ok(());
                }
                // The worker may store RELEASED between the two tries.
                Err(word) if word == ticket | SlotState::TAKEN || word == ticket | SlotState::RELEASED => {}
                Err(state) => return Err(Corrupt::SlotState { slot, state }),
            }
        }
        Err(Corrupt::SlotState { slot, state: state.load(Ordering::Acquire) })
    }

    /// Empties every slot whose request the worker has copied out (`RELEASED`), so that it
    /// takes another request; those requests answer without a slot until
    /// [`LobbyEnd::finished`]. Returns how many slots it freed.
    pub fn reclaim_released(&mut self) -> Result<usize, Corrupt> {
        let mut freed = 0;
        for slot in 0..self.lent.len() {
            let Some(Lent { id, ticket }) = self.lent[slot] else { continue };
            let state = self.region.slot_state(slot);
            match state.compare_exchange(
                ticket | SlotState::RELEASED,
                ticket | SlotState::EMPTY,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.lent[slot] = None;
                    self.unslotted.insert(id);
                    freed += 1;
                }
                Err(word) if word == ticket | SlotState::QUEUED || word == ticket | SlotState::TAKEN => {}
                Err(state) => return Err(Corrupt::SlotState { slot, state }),
            }
        }
        Ok(freed)
    }

    /// The answer to request `id`, whose slot was reclaimed, has ended (or the lobby gave up
    /// on it): an answer naming it again is the worker's breach.
    pub fn finished(&mut self, id: u32) {
        self.unslotted.remove(&id);
    }

    /// Copies the next answer frame out of the ring, appending it to `out`, and frees its room
    /// (then [`LobbyEnd::wake_worker_for_room`]: the worker may wait for room). `None`: the ring is empty.
    ///
    /// Nothing of the region is trusted: the head is checked against the tail this end keeps,
    /// the record's length against the ring, the published bytes and the frame header it
    /// carries, its id against the requests the worker has taken. On an error `out` is as it
    /// was and the tail has not moved.
    pub fn next_answer(&mut self, out: &mut BytesMut) -> Result<Option<Answer>, Corrupt> {
        let ring = u64::from(self.layout().ring_size);
        let head = self.region.ring_head().load(Ordering::Acquire);
        // At most twice round: after a padding record the tail is at the ring's start, where no
        // padding record can stand.
        loop {
            if head == self.tail {
                return Ok(None);
            }
            if head < self.tail || head - self.tail > ring || !head.is_multiple_of(8) {
                return Err(Corrupt::RingIndices { head, tail: self.tail });
            }
            let at = (self.tail % ring) as usize;
            let word = self.region.ring_words(at, 1)[0].load(Ordering::Relaxed);
            let (len, id) = (word as u32, (word >> 32) as u32);
            let bad = |problem| Err(Corrupt::Record { at: self.tail, len, problem });
            let to_end = ring as usize - at;
            let published = (head - self.tail) as usize;
            if id == PADDING_ID {
                if at == 0 || len as usize != to_end {
                    return bad("padding that does not end at the ring's end");
                }
                if len as usize > published {
                    return bad("longer than the worker published");
                }
                self.consume(len);
                continue;
            }
            let len = len as usize;
            if !len.is_multiple_of(8) || len < RECORD_HEADER_SIZE + FRAME_HEADER_SIZE {
                return bad("not a whole number of words holding a frame header");
            }
            if len > ring as usize / 2 {
                return bad("longer than half the ring");
            }
            if len > to_end {
                return bad("runs past the ring's end");
            }
            if len > published {
                return bad("longer than the worker published");
            }
            let slot = if self.unslotted.contains(&id) { None } else { Some(self.slot_answered(id)?) };
            // The frame's length is read from this end's copy, not from the region, so that the
            // frame handed on agrees with itself whatever the worker writes meanwhile.
            let start = out.len();
            out.resize(start + len - RECORD_HEADER_SIZE, 0);
            copy_out(
                self.region.ring_words(at + RECORD_HEADER_SIZE, (len - RECORD_HEADER_SIZE) / 8),
                &mut out[start..],
            );
            let payload_len = u32::from_le_bytes(out[start + 4..start + 8].try_into().expect("4 bytes"));
            let frame_len = FRAME_HEADER_SIZE + payload_len as usize;
            if record_len(frame_len) != len {
                out.truncate(start);
                return bad("its frame's length makes another record length");
            }
            out.truncate(start + frame_len);
            self.consume(len as u32);
            return Ok(Some(Answer { id, slot, frame_len }));
        }
    }

    /// Whether the ring holds anything: the recheck after [`LobbyEnd::prepare_to_sleep`].
    /// [`LobbyEnd::next_answer`] judges what it holds.
    pub fn has_answer(&self) -> bool {
        self.region.ring_head().load(Ordering::SeqCst) != self.tail
    }

    /// After queueing a request: clears the worker's waiting flag and says whether it was set
    /// (for a request or for room), so that the caller sends the worker a wake. The worker can
    /// set the flag at will; the caller sends wakes without blocking, and one pending is enough.
    pub fn wake_worker(&self) -> Result<bool, Corrupt> {
        match self.region.worker_waiting().swap(0, Ordering::SeqCst) {
            0 => Ok(false),
            1 | 2 => Ok(true),
            value => Err(Corrupt::WaitingFlag { value }),
        }
    }

    /// After consuming answers: clears the worker's waiting flag only when it waits for room in
    /// the ring, and says so, so that the caller sends it a wake. A worker waiting for a request
    /// is left asleep: the room is no news to it.
    pub fn wake_worker_for_room(&self) -> Result<bool, Corrupt> {
        let room = Awaiting::Room as u32;
        match self.region.worker_waiting().compare_exchange(room, 0, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => Ok(true),
            Err(0 | 1) => Ok(false),
            Err(value) => Err(Corrupt::WaitingFlag { value }),
        }
    }

    /// The worker's event-loop heartbeat: its beats so far and the last one's lag. Written by
    /// the worker alone, and trusted for nothing but admission: a worker that lies about it
    /// only gets more or fewer requests.
    pub fn loop_beat(&self) -> LoopBeat {
        let beats = self.region.loop_beats().load(Ordering::Acquire);
        let lag = Duration::from_micros(self.region.loop_lag().load(Ordering::Relaxed));
        LoopBeat { beats, lag }
    }

    /// Says that the lobby is about to sleep until this worker answers; then it looks again with
    /// [`LobbyEnd::has_answer`], and sleeps only when there is still nothing.
    pub fn prepare_to_sleep(&self) {
        self.region.lobby_waiting().store(1, Ordering::SeqCst);
    }

    /// Takes back [`LobbyEnd::prepare_to_sleep`] when the recheck found work. True when the
    /// worker had already claimed the flag: its wake is on its way, to be read and ignored.
    pub fn sleep_cancelled(&self) -> Result<bool, Corrupt> {
        waiting(self.region.lobby_waiting().swap(0, Ordering::SeqCst)).map(|still_set| !still_set)
    }

    /// Frees `len` bytes of the ring for the worker.
    fn consume(&mut self, len: u32) {
        self.tail += u64::from(len);
        // Releases this end's reads of the record before the worker may overwrite it;
        // sequentially consistent for the wake protocol.
        self.region.ring_tail().store(self.tail, Ordering::SeqCst);
    }

    /// The slot holding request `id`, which the worker must have taken to answer it.
    fn slot_answered(&self, id: u32) -> Result<usize, Corrupt> {
        let slot =
            self.lent.iter().position(|lent| lent.is_some_and(|lent| lent.id == id)).ok_or(Corrupt::AnswerId { id })?;
        let ticket = self.lent[slot].expect("the slot holding the request").ticket;
        match self.region.slot_state(slot).load(Ordering::Acquire) {
            word if word == ticket | SlotState::TAKEN || word == ticket | SlotState::RELEASED => Ok(slot),
            state => Err(Corrupt::AnswerNotTaken { id, slot, state }),
        }
    }
}
