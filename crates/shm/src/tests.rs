//! Both ends over two mappings of one memfd, as the lobby and a worker have them; the worker's
//! hostile writes go through the file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use bytes::BytesMut;
use maitred_wire::{build_frame, Kind, FLAG_END, HEADER_LEN};

use crate::layout::*;
use crate::*;

struct Pair {
    lobby: LobbyEnd,
    worker: WorkerEnd,
    file: File,
}

impl Pair {
    fn new(layout: Layout) -> Pair {
        let (region, fd) = Region::create(layout).unwrap();
        let file = File::from(fd.try_clone().unwrap());
        Pair { lobby: LobbyEnd::new(region), worker: WorkerEnd::new(Region::open(fd).unwrap()), file }
    }

    /// Two slots of 128 bytes, a ring of 64: the smallest, where records wrap soon.
    fn small() -> Pair {
        Pair::new(Layout { slots: 2, slot_size: 128, ring_size: 64 })
    }

    /// What a hostile worker does: writes `bytes` anywhere.
    fn poke(&self, offset: usize, bytes: &[u8]) {
        self.file.write_all_at(bytes, offset as u64).unwrap();
    }

    fn poke_slot(&self, slot: usize, field_at: usize, value: u32) {
        self.poke(self.lobby.layout().slot_at(slot) + field_at, &value.to_le_bytes());
    }

    fn poke_record(&self, ring_at: usize, len: u32, id: u32, frame: &[u8]) {
        let at = self.lobby.layout().ring_at() + ring_at;
        self.poke(at, &[len.to_le_bytes(), id.to_le_bytes()].concat());
        self.poke(at + 8, frame);
    }

    fn poke_head(&self, head: u64) {
        self.poke(RING_HEAD_AT, &head.to_le_bytes());
    }

    /// Queues request `id` in `slot` and has the worker take it.
    fn lend(&mut self, slot: usize, id: u32) {
        self.lobby.queue(slot, id, u64::from(id), &request(b"x")).unwrap();
        let taken = self.worker.take_next(&mut Vec::new()).unwrap();
        assert_eq!(taken, Some(Taken { slot, id }));
    }

    fn next_answer(&mut self) -> Result<Option<(Answer, Vec<u8>)>, Corrupt> {
        let mut out = BytesMut::from(&b"kept"[..]);
        let answer = self.lobby.next_answer(&mut out);
        assert_eq!(&out[..4], b"kept", "what was in the buffer before");
        if answer.is_err() || answer == Ok(None) {
            assert_eq!(out.len(), 4, "bytes appended with {answer:?}");
        }
        Ok(answer?.map(|answer| (answer, out[4..].to_vec())))
    }
}

fn request(target: &[u8]) -> Vec<u8> {
    build_frame(Kind::Request, 0, |out| {
        out.extend_from_slice(target);
        Ok(())
    })
    .unwrap()
}

fn body(bytes: &[u8], end: bool) -> Vec<u8> {
    build_frame(Kind::ResponseBody, if end { FLAG_END } else { 0 }, |out| {
        out.extend_from_slice(bytes);
        Ok(())
    })
    .unwrap()
}

#[test]
fn the_frame_header_is_the_wires() {
    assert_eq!(FRAME_HEADER_SIZE, HEADER_LEN);
}

#[test]
fn a_request_goes_over_and_its_answers_come_back() {
    let mut pair = Pair::new(Layout::DEFAULT);
    let frame = request(&[7u8; 1000]);
    pair.lobby.queue(2, 41, 0, &frame).unwrap();
    assert_eq!(pair.lobby.state(2), Ok(SlotState::Queued));
    assert!(pair.worker.has_request());
    let mut taken = b"old".to_vec();
    assert_eq!(pair.worker.take_next(&mut taken).unwrap(), Some(Taken { slot: 2, id: 41 }));
    assert_eq!(&taken[3..], &frame[..]);
    assert_eq!(pair.lobby.state(2), Ok(SlotState::Released));
    assert!(!pair.worker.has_request());
    assert_eq!(pair.worker.take_next(&mut Vec::new()).unwrap(), None);

    assert!(!pair.lobby.has_answer());
    pair.worker.write_answer(41, &[&body(b"hello", false)]).unwrap();
    pair.worker.write_answer(41, &[&body(b"", true)]).unwrap();
    assert!(pair.lobby.has_answer());
    assert!(!pair.worker.all_read());
    let (answer, bytes) = pair.next_answer().unwrap().unwrap();
    assert!(!pair.worker.all_read(), "one record of two read");
    assert_eq!(answer, Answer { id: 41, slot: Some(2), frame_len: HEADER_LEN + 5 });
    assert_eq!(bytes, body(b"hello", false));
    assert_eq!(pair.next_answer().unwrap().unwrap().1, body(b"", true));
    assert_eq!(pair.next_answer().unwrap(), None);
    assert!(!pair.lobby.has_answer());
    assert!(pair.worker.all_read(), "a ring put off until now is not needed");

    pair.lobby.release(2).unwrap();
    assert_eq!(pair.lobby.state(2), Ok(SlotState::Empty));
    assert_eq!(pair.lobby.free_slot(), Some(0));
    pair.lobby.queue(2, 42, 1, &request(b"again")).unwrap();
}

#[test]
fn a_released_slot_takes_another_request_while_the_first_is_still_answered() {
    let mut pair = Pair::new(Layout { slots: 1, ..Layout::DEFAULT });
    pair.lobby.queue(0, 7, 0, &request(b"stream")).unwrap();
    // Not taken yet: nothing to reclaim, and the slot is busy.
    assert_eq!(pair.lobby.reclaim_released(), Ok(0));
    assert_eq!(pair.lobby.free_slot(), None);
    assert_eq!(pair.worker.take_next(&mut Vec::new()).unwrap(), Some(Taken { slot: 0, id: 7 }));
    assert_eq!(pair.lobby.reclaim_released(), Ok(1));
    assert_eq!(pair.lobby.state(0), Ok(SlotState::Empty));
    // The id stays in use while its answer runs; the slot holds the next request.
    assert_eq!(pair.lobby.queue(0, 7, 1, &request(b"again")), Err(QueueError::IdInUse(7)));
    pair.lobby.queue(0, 8, 1, &request(b"short")).unwrap();
    pair.worker.write_answer(7, &[&body(b"event", false)]).unwrap();
    let (answer, _) = pair.next_answer().unwrap().unwrap();
    assert_eq!(answer, Answer { id: 7, slot: None, frame_len: HEADER_LEN + 5 });
    pair.lobby.finished(7);
    pair.worker.write_answer(7, &[&body(b"late", true)]).unwrap();
    assert_eq!(pair.next_answer(), Err(Corrupt::AnswerId { id: 7 }));
}

#[test]
fn the_worker_takes_the_lowest_seq_first() {
    let mut pair = Pair::new(Layout { slots: 4, ..Layout::DEFAULT });
    for (slot, seq) in [(0, 5), (1, 2), (2, 9), (3, 3)] {
        pair.lobby.queue(slot, 100 + seq as u32, seq, &request(&[seq as u8])).unwrap();
    }
    let mut order = Vec::new();
    let mut frame = Vec::new();
    while let Some(taken) = pair.worker.take_next(&mut frame).unwrap() {
        assert_eq!(frame, request(&[(taken.id - 100) as u8]));
        frame.clear();
        order.push(taken.id - 100);
    }
    assert_eq!(order, [2, 3, 5, 9]);
}

#[test]
fn a_recall_and_a_take_cannot_both_win() {
    let mut pair = Pair::small();
    // Recalled first: the worker finds nothing.
    pair.lobby.queue(0, 1, 0, &request(b"a")).unwrap();
    assert_eq!(pair.lobby.recall(0), Ok(true));
    assert_eq!(pair.lobby.state(0), Ok(SlotState::Empty));
    assert!(!pair.worker.has_request());
    assert_eq!(pair.worker.take_next(&mut Vec::new()).unwrap(), None);
    // Taken first: the recall fails, and the request stays lent.
    pair.lend(0, 2);
    assert_eq!(pair.lobby.recall(0), Ok(false));
    assert_eq!(pair.lobby.state(0), Ok(SlotState::Released));
    assert_eq!(pair.lobby.queue(0, 3, 0, &request(b"b")), Err(QueueError::SlotBusy(0)));
    // A free slot has nothing to recall.
    assert_eq!(pair.lobby.recall(1), Ok(false));
}

#[test]
fn a_recalled_request_cannot_be_answered() {
    let mut pair = Pair::small();
    pair.lobby.queue(0, 1, 0, &request(b"a")).unwrap();
    assert_eq!(pair.lobby.recall(0), Ok(true));
    pair.worker.write_answer(1, &[&body(b"late", true)]).unwrap();
    assert_eq!(pair.next_answer(), Err(Corrupt::AnswerId { id: 1 }));
}

#[test]
fn queue_refuses_what_it_cannot_queue() {
    let mut pair = Pair::small();
    let fits = vec![0u8; 64];
    assert_eq!(pair.lobby.queue(2, 1, 0, &fits), Err(QueueError::NoSuchSlot(2)));
    assert_eq!(pair.lobby.queue(0, u32::MAX, 0, &fits), Err(QueueError::ReservedId));
    assert_eq!(pair.lobby.queue(0, 1, 0, &[0u8; 65]), Err(QueueError::TooLarge { len: 65, most: 64 }));
    pair.lobby.queue(0, 1, 0, &fits).unwrap();
    assert_eq!(pair.lobby.queue(1, 1, 0, &fits), Err(QueueError::IdInUse(1)));
    assert_eq!(pair.lobby.queue(0, 2, 0, &fits), Err(QueueError::SlotBusy(0)));
    assert_eq!(pair.lobby.free_slot(), Some(1));
}

#[test]
fn records_that_do_not_fit_before_the_end_start_again_at_zero() {
    let mut pair = Pair::small();
    pair.lend(0, 9);
    // Records of 24 and 32 bytes in a 64-byte ring: the padding falls at 24, 48, 16 ... over
    // the rounds, and every frame comes back whole.
    for round in 0..50u8 {
        let short = body(&[round; 5], false);
        let long = body(&[round; 16], round % 2 == 1);
        pair.worker.write_answer(9, &[&short]).unwrap();
        pair.worker.write_answer(9, &[&long]).unwrap();
        assert_eq!(pair.next_answer().unwrap().unwrap().1, short);
        assert_eq!(pair.next_answer().unwrap().unwrap().1, long);
        assert_eq!(pair.next_answer().unwrap(), None);
    }
}

#[test]
fn the_worker_writes_only_into_room_the_lobby_has_freed() {
    let mut pair = Pair::small();
    pair.lend(0, 9);
    let frame = body(&[1; 8], false); // a 24-byte record
    assert_eq!(pair.lobby.layout().max_answer_frame(), 24);
    pair.worker.write_answer(9, &[&frame]).unwrap();
    pair.worker.write_answer(9, &[&frame]).unwrap();
    // 48 of 64 bytes used: 16 left, too few for a 24-byte record.
    assert_eq!(pair.worker.room_for(frame.len()), Ok(false));
    assert_eq!(pair.worker.room_for(8), Ok(true));
    assert_eq!(pair.worker.write_answer(9, &[&frame]), Err(AnswerError::NoRoom));
    pair.worker.write_answer(9, &[&body(b"", false)]).unwrap(); // 16 bytes: the ring is full
    assert_eq!(pair.worker.room_for(0), Ok(false));
    pair.next_answer().unwrap().unwrap();
    // 24 bytes free, but at the ring's start, and the record at the end would need padding.
    assert_eq!(pair.worker.room_for(frame.len()), Ok(true));
    pair.worker.write_answer(9, &[&frame]).unwrap();
    let mut count = 0;
    while pair.next_answer().unwrap().is_some() {
        count += 1;
    }
    assert_eq!(count, 3);
}

#[test]
fn an_answer_needing_padding_waits_for_room_for_both() {
    let mut pair = Pair::small();
    pair.lend(0, 9);
    for _ in 0..3 {
        pair.worker.write_answer(9, &[&body(b"", false)]).unwrap(); // 16 bytes each: 0..48
    }
    pair.next_answer().unwrap().unwrap();
    // 32 bytes free, enough for a 24-byte record; but at 48 it needs 16 of padding and then 24
    // at 0, where the unread record at 16 still stands.
    assert_eq!(pair.worker.room_for(16), Ok(false));
    pair.next_answer().unwrap().unwrap();
    assert_eq!(pair.worker.room_for(16), Ok(true));
}

#[test]
fn write_answer_refuses_what_is_not_one_frame_that_fits() {
    let mut pair = Pair::small();
    let frame = body(b"x", true);
    assert_eq!(pair.worker.write_answer(u32::MAX, &[&frame]), Err(AnswerError::ReservedId));
    assert_eq!(pair.worker.write_answer(1, &[&frame[..7]]), Err(AnswerError::NotAFrame { len: 7 }));
    assert_eq!(pair.worker.write_answer(1, &[&[&frame[..], b"!"].concat()]), Err(AnswerError::NotAFrame { len: 10 }));
    assert_eq!(pair.worker.write_answer(1, &[&body(&[0; 17], true)]), Err(AnswerError::TooLarge { len: 25, most: 24 }));
}

#[test]
fn a_side_is_woken_only_after_it_said_it_sleeps() {
    let pair = Pair::small();
    assert_eq!(pair.lobby.wake_worker(), Ok(false));
    pair.worker.prepare_to_sleep(Awaiting::Request);
    assert_eq!(pair.lobby.wake_worker(), Ok(true));
    assert_eq!(pair.lobby.wake_worker(), Ok(false), "one sleep, one wake");
    assert!(pair.worker.sleep_cancelled(), "the lobby claimed the flag: its wake is coming");
    pair.worker.prepare_to_sleep(Awaiting::Request);
    assert!(!pair.worker.sleep_cancelled(), "no wake is coming");
    assert_eq!(pair.lobby.wake_worker(), Ok(false));

    // Consumed answers wake a worker waiting for room, and only such a worker; a queued
    // request wakes it too.
    pair.worker.prepare_to_sleep(Awaiting::Request);
    assert_eq!(pair.lobby.wake_worker_for_room(), Ok(false));
    assert!(!pair.worker.sleep_cancelled(), "still its own flag");
    pair.worker.prepare_to_sleep(Awaiting::Room);
    assert_eq!(pair.lobby.wake_worker_for_room(), Ok(true));
    assert_eq!(pair.lobby.wake_worker_for_room(), Ok(false), "one sleep, one wake");
    assert!(pair.worker.sleep_cancelled());
    pair.worker.prepare_to_sleep(Awaiting::Room);
    assert_eq!(pair.lobby.wake_worker(), Ok(true));

    assert!(!pair.worker.wake_lobby());
    pair.lobby.prepare_to_sleep();
    assert!(pair.worker.wake_lobby());
    assert_eq!(pair.lobby.sleep_cancelled(), Ok(true));
    pair.lobby.prepare_to_sleep();
    assert_eq!(pair.lobby.sleep_cancelled(), Ok(false));
}

#[test]
fn a_waiting_flag_of_no_meaning_is_corrupt() {
    let pair = Pair::small();
    pair.poke(WORKER_WAITING_AT, &5u32.to_le_bytes());
    assert_eq!(pair.lobby.wake_worker_for_room(), Err(Corrupt::WaitingFlag { value: 5 }));
    assert_eq!(pair.lobby.wake_worker(), Err(Corrupt::WaitingFlag { value: 5 }));
    pair.poke(LOBBY_WAITING_AT, &2u32.to_le_bytes());
    assert_eq!(pair.lobby.sleep_cancelled(), Err(Corrupt::WaitingFlag { value: 2 }));
    pair.poke(LOBBY_WAITING_AT, &7u32.to_le_bytes());
    assert_eq!(pair.lobby.sleep_cancelled(), Err(Corrupt::WaitingFlag { value: 7 }));
}

#[test]
fn slot_states_the_lobby_did_not_make_are_corrupt() {
    let mut pair = Pair::small();
    // A free slot the worker marked taken, or filled with no state at all.
    pair.poke_slot(1, SLOT_STATE_AT, SlotState::TAKEN);
    assert_eq!(pair.lobby.state(1), Err(Corrupt::SlotState { slot: 1, state: 2 }));
    assert_eq!(pair.lobby.queue(1, 1, 0, b""), Err(QueueError::Corrupt(Corrupt::SlotState { slot: 1, state: 2 })));
    pair.poke_slot(1, SLOT_STATE_AT, 3);
    assert_eq!(pair.lobby.state(1), Err(Corrupt::SlotState { slot: 1, state: 3 }));
    // A lent slot the worker emptied, which only the lobby may do.
    pair.lobby.queue(0, 1, 0, b"").unwrap();
    pair.poke_slot(0, SLOT_STATE_AT, SlotState::EMPTY);
    assert_eq!(pair.lobby.state(0), Err(Corrupt::SlotState { slot: 0, state: 0 }));
    assert_eq!(pair.lobby.recall(0), Err(Corrupt::SlotState { slot: 0, state: 0 }));
    assert_eq!(pair.lobby.release(0), Err(Corrupt::SlotState { slot: 0, state: 0 }));
    pair.poke_slot(0, SLOT_STATE_AT, u32::MAX);
    assert_eq!(pair.lobby.recall(0), Err(Corrupt::SlotState { slot: 0, state: u32::MAX }));
}

#[test]
fn ring_indices_that_cannot_be_are_corrupt() {
    let mut pair = Pair::small();
    pair.lend(0, 9);
    pair.worker.write_answer(9, &[&body(b"abc", false)]).unwrap();
    pair.next_answer().unwrap().unwrap();
    // An 11-byte frame: a 24-byte record.
    for head in [8, 24 + 64 + 8, 28, u64::MAX] {
        pair.poke_head(head);
        assert_eq!(pair.next_answer(), Err(Corrupt::RingIndices { head, tail: 24 }), "head {head}");
    }
}

#[test]
fn records_that_cannot_be_are_corrupt_and_leave_the_tail() {
    let frame = body(b"abcdefgh", false); // 16 bytes: a 24-byte record
    let longer = body(b"abcdefghijklmnop", false);
    let huge = [4u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
    // The record's length and id, the bytes after them, the ring's head, what the error says.
    let cases = [
        (0, 9, &frame[..], 24, "frame header"),
        (20, 9, &frame, 24, "frame header"),
        (8, 9, &frame, 24, "frame header"),
        (40, 9, &frame, 40, "half the ring"),
        (32, 9, &frame, 24, "published"),
        (64, PADDING_ID, b"", 64, "padding"),
        (24, 9, &longer, 24, "another record length"),
        (24, 9, &huge, 24, "another record length"),
    ];
    for (len, id, bytes, head, says) in cases {
        let mut pair = Pair::small();
        pair.lend(0, 9);
        pair.poke_record(0, len, id, bytes);
        pair.poke_head(head);
        let error = pair.next_answer().unwrap_err();
        assert!(matches!(error, Corrupt::Record { at: 0, len: said, .. } if said == len), "{error:?}");
        assert!(error.to_string().contains(says), "{error}");
        assert_eq!(pair.next_answer().unwrap_err(), error, "the same again: nothing moved");
    }
}

#[test]
fn records_must_stop_at_the_rings_end_and_padding_reach_it() {
    let mut pair = Pair::small();
    pair.lend(0, 9);
    pair.worker.write_answer(9, &[&body(b"abcdefgh", false)]).unwrap(); // 0..24
    pair.worker.write_answer(9, &[&body(b"abcdefgh", false)]).unwrap(); // 24..48
    pair.next_answer().unwrap().unwrap();
    pair.next_answer().unwrap().unwrap();
    // At 48: a 24-byte record would cross the end; padding of 8 would not reach it.
    pair.poke_record(48, 24, 9, &body(b"abcdefgh", false)[..8]); // the file ends after 8 bytes
    pair.poke_head(48 + 24);
    assert!(pair.next_answer().unwrap_err().to_string().contains("runs past the ring's end"));
    pair.poke_record(48, 8, PADDING_ID, b"");
    assert!(pair.next_answer().unwrap_err().to_string().contains("padding"));
    // Padding that does reach it, but nothing published behind it yet: not an error.
    pair.poke_record(48, 16, PADDING_ID, b"");
    pair.poke_head(48 + 16);
    assert_eq!(pair.next_answer(), Ok(None));
}

#[test]
fn an_answer_for_a_request_not_taken_is_corrupt() {
    let mut pair = Pair::small();
    pair.lobby.queue(1, 4, 0, &request(b"a")).unwrap();
    pair.worker.write_answer(4, &[&body(b"too soon", true)]).unwrap();
    assert_eq!(pair.next_answer(), Err(Corrupt::AnswerNotTaken { id: 4, slot: 1, state: 1 }));
}

#[test]
fn the_worker_refuses_a_region_that_makes_no_sense() {
    let mut pair = Pair::small();
    // Every two-bit state is one (RELEASED is 3): a length past the slot is what a worker
    // checks.
    pair.poke_slot(0, SLOT_STATE_AT, SlotState::QUEUED);
    pair.poke_slot(0, SLOT_LEN_AT, 65);
    assert_eq!(pair.worker.take_next(&mut Vec::new()), Err(Corrupt::SlotLength { slot: 0, len: 65 }));
    pair.poke(RING_TAIL_AT, &8u64.to_le_bytes());
    let tail_ahead = Corrupt::RingIndices { head: 0, tail: 8 };
    assert_eq!(pair.worker.write_answer(1, &[&body(b"", true)]), Err(AnswerError::Corrupt(tail_ahead.clone())));
    assert_eq!(pair.worker.room_for(0), Err(tail_ahead));
}

#[test]
fn an_answer_written_in_parts_is_read_as_one_frame() {
    let mut pair = Pair::small();
    pair.lend(0, 9);
    let frame = body(b"split", true);
    pair.worker.write_answer(9, &[&frame[..3], &frame[3..10], &frame[10..]]).unwrap();
    assert_eq!(pair.next_answer().unwrap().unwrap().1, frame);
}

#[test]
fn the_loop_heartbeat_reaches_the_lobby_with_its_lag() {
    let pair = Pair::small();
    assert_eq!(pair.lobby.loop_beat(), LoopBeat { beats: 0, lag: Duration::ZERO }, "no beat yet");
    pair.worker.beat(Duration::from_millis(3));
    pair.worker.beat(Duration::from_micros(120_500));
    assert_eq!(pair.lobby.loop_beat(), LoopBeat { beats: 2, lag: Duration::from_micros(120_500) });
    // On lines of their own, clear of the ring's indices and of the slots.
    let words = [crate::layout::LOOP_BEATS_AT, crate::layout::LOOP_LAG_AT];
    assert!(words.iter().all(|at| at % 64 == 0 && *at > crate::layout::RING_TAIL_AT && *at < REGION_HEADER_SIZE));
}
