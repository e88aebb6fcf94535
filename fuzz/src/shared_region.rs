//! `shared_region`: the lobby's and the worker's ends of a shared region (crates/shm), driven
//! through any sequence of operations, with a hostile worker writing any bytes anywhere in the
//! region between them.
//!
//! The region is a real one: `Region::create` makes the memfd, `Region::open` maps it a second
//! time for the worker, and the hostile writes are `pwrite`s into the file, which both mappings
//! see, as a worker process writing into its mapping would do. So crates/shm needs no entry point
//! for tests.
//!
//! While nothing hostile has happened, both ends must do exactly what a model of the protocol
//! does: the queue's refusals, FIFO by `seq`, a recall winning only before the take, answers
//! read back whole and in order, room in the ring whenever it has drained, the waiting flags.
//! After the first hostile write (or a worker reopening the region, or answering a request it
//! does not hold), only what the lobby needs still holds: no panic, every error a `Corrupt` that
//! prints on one line, an answer handed out is one whole frame whose header agrees with its
//! length, for a request the worker had taken, and reading the ring stops after at most as many
//! answers as it has room for.
//!
//! Input: one byte choosing the layout, then operations, each an opcode byte and its arguments
//! (see [`shared_region`]); missing bytes read as 0.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use bytes::BytesMut;
use maitred_shm::{
    AnswerError, Awaiting, Corrupt, Layout, LobbyEnd, QueueError, Region, SlotState, Taken, WorkerEnd, PADDING_ID,
    REGION_HEADER_SIZE,
};
use maitred_wire::HEADER_LEN;

use crate::Input;

// Where the hostile worker aims its words: the offsets of docs/PROTOCOL.md's table (crates/shm's
// documentation), written down again here, as a worker in another language would.
const LOBBY_WAITING_AT: u64 = 64;
const WORKER_WAITING_AT: u64 = 128;
const RING_HEAD_AT: u64 = 192;
const RING_TAIL_AT: u64 = 256;
const SLOT_FIELDS: [(u64, usize); 4] = [(0, 4), (4, 4), (8, 4), (16, 8)];

/// What the model says a slot holds.
#[derive(Clone, Debug, PartialEq)]
enum ModelSlot {
    Free,
    Queued { id: u32, seq: u64, frame: Vec<u8> },
    Taken { id: u32 },
}

impl ModelSlot {
    fn id(&self) -> Option<u32> {
        match self {
            ModelSlot::Free => None,
            ModelSlot::Queued { id, .. } | ModelSlot::Taken { id } => Some(*id),
        }
    }
}

/// The protocol as the two ends should keep it, while the worker is honest.
struct Model {
    slots: Vec<ModelSlot>,
    /// Answers written and not read yet: id and frame.
    ring: VecDeque<(u32, Vec<u8>)>,
    lobby_waiting: bool,
    /// What the worker said it waits for, if it did.
    worker_waiting: Option<Awaiting>,
}

impl Model {
    /// Bytes the unread answers' records take (without padding records, which the model does not
    /// place).
    fn unread(&self) -> usize {
        self.ring.iter().map(|(_, frame)| record_len(frame.len())).sum()
    }

    fn slot_of(&self, id: u32) -> Option<usize> {
        self.slots.iter().position(|slot| slot.id() == Some(id))
    }

    fn taken(&self) -> Vec<u32> {
        self.slots.iter().filter_map(|slot| if let ModelSlot::Taken { id } = slot { Some(*id) } else { None }).collect()
    }
}

fn record_len(frame_len: usize) -> usize {
    (8 + frame_len).next_multiple_of(8)
}

/// The layout an input asks for with its first byte: 1 to 4 slots of 128 or 256 bytes, a ring
/// of 64 to 1024 bytes.
fn layout(choice: u8) -> Layout {
    Layout {
        slots: 1 + u32::from(choice & 3),
        slot_size: 128 << ((choice >> 2) & 1),
        ring_size: 64 << ((choice >> 3) % 5),
    }
}

fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![kind, flags, 0, 0];
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(payload);
    frame
}

fn one_line(error: &impl std::fmt::Display) {
    let text = error.to_string();
    assert!(!text.contains('\n'), "{text:?} prints on more than one line");
}

struct Run {
    layout: Layout,
    lobby: LobbyEnd,
    worker: WorkerEnd,
    file: File,
    model: Model,
    /// Nothing hostile has happened: both ends must agree with the model.
    honest: bool,
    answers: BytesMut,
}

impl Run {
    fn new(layout: Layout) -> Run {
        let (region, fd) = Region::create(layout).expect("a memfd region");
        let file = File::from(fd.try_clone().expect("a second descriptor"));
        let worker = WorkerEnd::new(Region::open(fd).expect("the region the lobby made"));
        let model = Model {
            slots: vec![ModelSlot::Free; layout.slots as usize],
            ring: VecDeque::new(),
            lobby_waiting: false,
            worker_waiting: None,
        };
        Run { layout, lobby: LobbyEnd::new(region), worker, file, model, honest: true, answers: BytesMut::new() }
    }

    /// A hostile write: `bytes` at `offset`, as much of them as the file holds (its size is sealed).
    fn poke(&mut self, offset: u64, bytes: &[u8]) {
        let size = self.layout.region_size();
        let offset = offset % size;
        let len = bytes.len().min((size - offset) as usize);
        self.file.write_all_at(&bytes[..len], offset).expect("a write inside the file");
        self.honest = false;
    }

    fn ring_tail(&self) -> u64 {
        let mut word = [0u8; 8];
        self.file.read_exact_at(&mut word, RING_TAIL_AT).expect("the header");
        u64::from_le_bytes(word)
    }

    fn queue(&mut self, slot: usize, id: u32, seq: u64, len: usize) {
        let frame = vec![seq as u8; len];
        let result = self.lobby.queue(slot, id, seq, &frame);
        if !self.honest {
            if let Err(error) = &result {
                one_line(error);
            }
            return;
        }
        let model = &self.model;
        let most = self.layout.max_request_frame();
        let expected = match model.slots.get(slot) {
            None => Err(QueueError::NoSuchSlot(slot)),
            Some(ModelSlot::Queued { .. } | ModelSlot::Taken { .. }) => Err(QueueError::SlotBusy(slot)),
            Some(ModelSlot::Free) if id == PADDING_ID => Err(QueueError::ReservedId),
            Some(ModelSlot::Free) if model.slot_of(id).is_some() => Err(QueueError::IdInUse(id)),
            Some(ModelSlot::Free) if len > most => Err(QueueError::TooLarge { len, most }),
            Some(ModelSlot::Free) => Ok(()),
        };
        assert_eq!(result, expected, "queue({slot}, {id}, {seq}, {len} bytes)");
        if result.is_ok() {
            self.model.slots[slot] = ModelSlot::Queued { id, seq, frame };
        }
    }

    fn recall(&mut self, slot: usize) {
        let result = self.lobby.recall(slot);
        if !self.honest {
            return check_error(&result);
        }
        let expected = matches!(self.model.slots[slot], ModelSlot::Queued { .. });
        assert_eq!(result, Ok(expected), "recall({slot})");
        if expected {
            self.model.slots[slot] = ModelSlot::Free;
        }
    }

    fn take(&mut self) {
        let has_request = self.worker.has_request();
        let mut out = vec![0xaa];
        let result = self.worker.take_next(&mut out);
        if !self.honest {
            return check_error(&result);
        }
        let lowest = self
            .model
            .slots
            .iter()
            .filter_map(|slot| if let ModelSlot::Queued { seq, .. } = slot { Some(*seq) } else { None })
            .min();
        assert_eq!(has_request, lowest.is_some());
        match result {
            Ok(Some(Taken { slot, id })) => {
                let ModelSlot::Queued { id: queued, seq, frame } = &self.model.slots[slot] else {
                    panic!("took slot {slot}, which is {:?}", self.model.slots[slot]);
                };
                assert_eq!((id, Some(*seq)), (*queued, lowest), "took slot {slot}");
                assert_eq!(out[1..], frame[..], "the frame of request {id}");
                self.model.slots[slot] = ModelSlot::Taken { id };
            }
            Ok(None) => assert_eq!(lowest, None, "nothing taken"),
            Err(error) => panic!("take_next: {error}"),
        }
    }

    fn answer(&mut self, pick: u8, payload_len: usize, flags: u8) {
        let taken = self.model.taken();
        let id = if self.honest && pick & 0x80 == 0 {
            match taken.get(usize::from(pick) % taken.len().max(1)) {
                Some(id) => *id,
                None => return,
            }
        } else {
            // An answer for a request the worker may not hold is the worker's lie.
            self.honest = false;
            match pick {
                u8::MAX => PADDING_ID,
                pick => u32::from(pick % 8),
            }
        };
        let mut frame = frame(4, flags & 1, &vec![pick; payload_len]);
        if flags & 2 != 0 {
            frame.push(0); // one byte more than its header says
        }
        let room = self.worker.room_for(frame.len());
        let result = self.worker.write_answer(id, &[&frame]);
        if !self.honest {
            if let Err(error) = &result {
                one_line(error);
            }
            return;
        }
        let most = self.layout.max_answer_frame();
        match result {
            Err(AnswerError::NotAFrame { len }) => assert!(flags & 2 != 0 && len == frame.len()),
            Err(AnswerError::TooLarge { len, most: said }) => assert!(len > most && said == most && flags & 2 == 0),
            Ok(()) => {
                assert!(flags & 2 == 0 && frame.len() <= most);
                assert_eq!(room, Ok(true), "written without room");
                assert!(self.model.unread() + record_len(frame.len()) <= self.layout.ring_size as usize);
                self.model.ring.push_back((id, frame));
            }
            Err(AnswerError::NoRoom) => {
                assert_eq!(room, Ok(false), "no room, though room_for said there was");
                assert!(!self.model.ring.is_empty(), "no room in a ring the lobby has drained");
            }
            Err(error) => panic!("write_answer: {error}"),
        }
    }

    /// One `next_answer`; whether it handed out an answer.
    fn next_answer(&mut self) -> bool {
        let before = self.answers.len();
        let has_answer = self.lobby.has_answer();
        let result = self.lobby.next_answer(&mut self.answers);
        match &result {
            Ok(Some(answer)) => {
                assert_eq!(self.answers.len(), before + answer.frame_len);
                let frame = &self.answers[before..];
                assert!(frame.len() >= HEADER_LEN);
                assert_eq!(u32::from_le_bytes(frame[4..8].try_into().unwrap()) as usize, frame.len() - HEADER_LEN);
                // This run never reclaims a slot: every answer's request holds one.
                let slot = answer.slot.expect("a slot");
                assert!(slot < self.layout.slots as usize && answer.id != PADDING_ID);
                // An honest worker answers only what it has copied out and released; a lying one
                // may answer a request it holds but has not released, which the lobby lent it all
                // the same.
                let state = self.lobby.state(slot);
                if self.honest {
                    assert_eq!(state, Ok(SlotState::Released), "answered {answer:?}");
                } else {
                    assert!(
                        matches!(state, Ok(SlotState::Taken | SlotState::Released)),
                        "answered {answer:?}: {state:?}"
                    );
                }
            }
            Ok(None) => assert_eq!(self.answers.len(), before),
            Err(error) => {
                assert_eq!(self.answers.len(), before, "bytes left by {error}");
                one_line(error);
            }
        }
        if self.honest {
            let expected = self.model.ring.pop_front();
            assert_eq!(has_answer, expected.is_some());
            match (&result, expected) {
                (Ok(Some(answer)), Some((id, frame))) => {
                    assert_eq!((answer.id, answer.slot), (id, self.model.slot_of(id)));
                    assert_eq!(self.answers[before..], frame[..], "answer for {id}");
                }
                (Ok(None), None) => {}
                (result, expected) => panic!("next_answer: {result:?}, where {expected:?} was written"),
            }
        }
        self.answers.truncate(before);
        matches!(result, Ok(Some(_)))
    }

    /// Reads the ring until it is empty or corrupt, which takes at most one answer per 16
    /// bytes of the ring: no worker can make the lobby read answers for ever.
    fn drain(&mut self) {
        let most = self.layout.ring_size as usize / 16;
        let mut read = 0;
        while self.next_answer() {
            read += 1;
            assert!(read <= most, "{read} answers out of a ring of {}", self.layout.ring_size);
        }
    }

    fn release(&mut self, slot: usize) {
        if self.honest {
            match &self.model.slots[slot] {
                // Releasing before the last answer was read, or before the take, is the lobby's
                // own mistake, which it does not make.
                ModelSlot::Taken { id } if self.model.ring.iter().any(|(answered, _)| answered == id) => return,
                ModelSlot::Queued { .. } => return,
                _ => {}
            }
        }
        let result = self.lobby.release(slot);
        if !self.honest {
            return check_error(&result);
        }
        assert_eq!(result, Ok(()), "release({slot})");
        self.model.slots[slot] = ModelSlot::Free;
    }

    fn state(&mut self, slot: usize) {
        let result = self.lobby.state(slot);
        if !self.honest {
            return check_error(&result);
        }
        let expected = match self.model.slots[slot] {
            ModelSlot::Free => SlotState::Empty,
            ModelSlot::Queued { .. } => SlotState::Queued,
            // An honest worker releases a slot as soon as it has copied the request out.
            ModelSlot::Taken { .. } => SlotState::Released,
        };
        assert_eq!(result, Ok(expected), "state({slot})");
    }

    fn flags(&mut self, which: u8) {
        let model = &mut self.model;
        match which % 8 {
            awaiting @ (0 | 6) => {
                let awaiting = if awaiting == 0 { Awaiting::Request } else { Awaiting::Room };
                self.worker.prepare_to_sleep(awaiting);
                model.worker_waiting = Some(awaiting);
            }
            1 => {
                let claimed = self.worker.sleep_cancelled();
                if self.honest {
                    assert_eq!(claimed, model.worker_waiting.is_none(), "worker's sleep_cancelled");
                }
                model.worker_waiting = None;
            }
            2 => {
                let result = self.lobby.wake_worker();
                if self.honest {
                    assert_eq!(result, Ok(model.worker_waiting.is_some()), "wake_worker");
                }
                check_error(&result);
                model.worker_waiting = None;
            }
            7 => {
                let result = self.lobby.wake_worker_for_room();
                let for_room = model.worker_waiting == Some(Awaiting::Room);
                if self.honest {
                    assert_eq!(result, Ok(for_room), "wake_worker_for_room");
                }
                check_error(&result);
                if for_room {
                    model.worker_waiting = None;
                }
            }
            3 => {
                self.lobby.prepare_to_sleep();
                model.lobby_waiting = true;
            }
            4 => {
                let result = self.lobby.sleep_cancelled();
                if self.honest {
                    assert_eq!(result, Ok(!model.lobby_waiting), "lobby's sleep_cancelled");
                }
                check_error(&result);
                model.lobby_waiting = false;
            }
            _ => {
                let was = self.worker.wake_lobby();
                if self.honest {
                    assert_eq!(was, model.lobby_waiting, "wake_lobby");
                }
                model.lobby_waiting = false;
            }
        }
    }

    /// A hostile write of one of the words the ends read: the ring's counters, the waiting flags,
    /// a slot's fields, or the header of the record at the lobby's tail.
    fn poke_word(&mut self, field: u8, slot: usize, value: u64) {
        let (at, size) = match field % 9 {
            0 => (RING_HEAD_AT, 8),
            1 => (RING_TAIL_AT, 8),
            2 => (LOBBY_WAITING_AT, 4),
            3 => (WORKER_WAITING_AT, 4),
            8 => {
                let ring_at =
                    REGION_HEADER_SIZE as u64 + u64::from(self.layout.slots) * u64::from(self.layout.slot_size);
                (ring_at + self.ring_tail() % u64::from(self.layout.ring_size), 8)
            }
            field => {
                let (field_at, size) = SLOT_FIELDS[usize::from(field - 4)];
                (REGION_HEADER_SIZE as u64 + slot as u64 * u64::from(self.layout.slot_size) + field_at, size)
            }
        };
        self.poke(at, &value.to_le_bytes()[..size]);
    }

    /// The worker maps the region again after `bytes` were written over its start: a clean
    /// refusal, or a worker end on whatever layout the header now gives.
    fn reopen(&mut self, bytes: &[u8]) {
        self.poke(0, bytes);
        let fd = self.file.try_clone().expect("a descriptor").into();
        match Region::open(fd) {
            Ok(region) => {
                assert_eq!(region.layout().region_size(), self.layout.region_size());
                self.worker = WorkerEnd::new(region);
            }
            Err(error) => {
                assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
                one_line(&error);
            }
        }
    }
}

fn check_error<T>(result: &Result<T, Corrupt>) {
    if let Err(error) = result {
        one_line(error);
    }
}

/// The fuzz target: a byte choosing the layout, then operations, each an opcode byte (modulo
/// 12) and its arguments:
///
/// | opcode | operation | arguments |
/// |---|---|---|
/// | 0 | the lobby queues a request of `len` bytes | slot (modulo slots + 1), id (255: `u32::MAX`, else modulo 8), seq, `len` (u16, modulo the slot's room + 9) |
/// | 1 | the lobby recalls a slot | slot |
/// | 2 | the worker takes the next request | |
/// | 3 | the worker answers | pick (below 128, while honest: which taken request; else a lie: 255 for `u32::MAX`, or an id modulo 8), payload length (u16, modulo the ring's most + 1), flags (1: END, 2: one byte more than the header says) |
/// | 4 | the lobby reads one answer | |
/// | 5 | the lobby releases a slot | slot |
/// | 6 | the lobby checks a slot's state | slot |
/// | 7 | a waiting flag operation | which (modulo 6) |
/// | 8 | a hostile write of bytes | offset (u16), count (modulo 16, plus 1), the bytes |
/// | 9 | a hostile write of a word the ends read | field (modulo 9), slot, value (u64) |
/// | 10 | the worker maps the region again, after a hostile write over its header | count (modulo 32), the bytes |
/// | 11 | the lobby reads the ring until it is empty or corrupt | |
pub fn shared_region(data: &[u8]) {
    let mut input = Input::new(data);
    let layout = layout(input.byte());
    let mut run = Run::new(layout);
    let slots = layout.slots as usize;
    while !input.is_empty() {
        match input.byte() % 12 {
            0 => {
                let slot = usize::from(input.byte()) % (slots + 1);
                let id = match input.byte() {
                    u8::MAX => PADDING_ID,
                    id => u32::from(id % 8),
                };
                let seq = u64::from(input.byte());
                let len = usize::from(input.u16()) % (layout.max_request_frame() + 9);
                run.queue(slot, id, seq, len);
            }
            1 => run.recall(usize::from(input.byte()) % slots),
            2 => run.take(),
            3 => {
                let pick = input.byte();
                let payload_len = usize::from(input.u16()) % (layout.max_answer_frame() + 1);
                run.answer(pick, payload_len, input.byte());
            }
            4 => {
                run.next_answer();
            }
            5 => run.release(usize::from(input.byte()) % slots),
            6 => run.state(usize::from(input.byte()) % slots),
            7 => run.flags(input.byte()),
            8 => {
                let offset = u64::from(input.u16());
                let bytes: Vec<u8> = (0..=input.byte() % 16).map(|_| input.byte()).collect();
                run.poke(offset, &bytes);
            }
            9 => {
                let field = input.byte();
                let slot = usize::from(input.byte()) % slots;
                let value = u64::from_le_bytes(std::array::from_fn(|_| input.byte()));
                run.poke_word(field, slot, value);
            }
            10 => {
                let bytes: Vec<u8> = (0..input.byte() % 32).map(|_| input.byte()).collect();
                run.reopen(&bytes);
            }
            _ => run.drain(),
        }
    }
    run.drain();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An honest exchange: queue two, take both in seq order, answer, read back, release.
    #[test]
    fn an_honest_exchange_passes() {
        let ops: &[&[u8]] = &[
            &[0x01],                         // 2 slots of 128 bytes, a 64-byte ring
            &[0, 0, 3, 9, 20, 0],            // queue slot 0, id 3, seq 9, 20 bytes
            &[0, 1, 4, 2, 5, 0],             // queue slot 1, id 4, seq 2, 5 bytes
            &[2, 2],                         // take (id 4), take (id 3)
            &[3, 0, 10, 0, 0],               // answer the first taken (id 3), 10 bytes
            &[3, 1, 16, 0, 1],               // answer id 4, 16 bytes, END
            &[3, 1, 16, 0, 1],               // no room now
            &[4, 4, 4],                      // read both, then nothing
            &[5, 0, 5, 1, 6, 0, 6, 1],       // release both, both empty
            &[7, 0, 7, 2, 7, 2, 7, 3, 7, 5], // the flags
        ];
        shared_region(&ops.concat());
    }

    #[test]
    fn hostile_writes_pass() {
        let ops: &[&[u8]] = &[
            &[0x00],
            &[0, 0, 1, 0, 8, 0, 2],                                // queue and take request 1
            &[9, 0, 0, 0xf0, 0, 0, 0, 0, 0, 0, 0],                 // ring head 240: beyond the ring
            &[11],                                                 // read: corrupt
            &[9, 0, 0, 24, 0, 0, 0, 0, 0, 0, 0],                   // ring head 24
            &[9, 8, 0, 24, 0, 0, 0, 1, 0, 0, 0],                   // a record of 24 bytes for request 1
            &[11],                                                 // read: its frame header says 0 bytes
            &[10, 8, b'M', b'A', b'I', b'T', b'R', b'E', b'D', 2], // reopen: wrong magic
            &[10, 8, b'M', b'A', b'I', b'T', b'R', b'E', b'D', 1], // reopen: a worker end again
            &[2],
        ];
        shared_region(&ops.concat());
    }
}
