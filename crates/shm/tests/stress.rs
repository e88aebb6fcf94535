//! A lobby thread and a worker thread over two mappings of one region, passing 100,000 requests
//! and their answers, each side sleeping on a socketpair when it has nothing to do and woken only
//! as the crate's wake protocol says. A lost wake-up leaves a side asleep: its read times out
//! and the test fails, so the timeout bounds it instead of any fixed sleep. A side that spins
//! instead of sleeping, or rings a bell nobody asked for, would still pass every check of what
//! arrived: so the test also counts each side's sleeps, wakes and recalls, and checks them.

use std::collections::{HashSet, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use maitred_shm::{AnswerError, Awaiting, Layout, LobbyEnd, Region, WorkerEnd};
use maitred_wire::{build_frame, FrameHeader, Kind, FLAG_END, HEADER_LEN};

const REQUESTS: u32 = 100_000;
/// Far longer than any wait of a side whose wake was sent: a read that waits this long has
/// missed one.
const LOST_WAKE: Duration = Duration::from_secs(10);
const WHOLE_TEST: Duration = Duration::from_secs(120);

/// Small slots and a small ring, so that the worker often waits for room and records often wrap.
const LAYOUT: Layout = Layout { slots: 4, slot_size: 256, ring_size: 512 };

/// How many answer frames request `id` gets, and frame `index`'s payload.
fn answer_count(id: u32) -> u32 {
    1 + id % 3
}

fn answer_payload(id: u32, index: u32) -> Vec<u8> {
    let len = (id as usize * 7 + index as usize * 13) % (LAYOUT.ring_size as usize / 2 - 24);
    [id.to_le_bytes().as_slice(), &vec![(id + index) as u8; len]].concat()
}

fn request(id: u32) -> Vec<u8> {
    build_frame(Kind::Request, 0, |out| {
        out.extend_from_slice(&id.to_le_bytes());
        out.resize(out.len() + id as usize % 150, b'r');
        Ok(())
    })
    .unwrap()
}

/// Sleeps until the other side sends a wake, taking every byte already there (stale wakes
/// included); false when the other side has gone.
fn sleep(socket: &mut UnixStream, who: &str) -> bool {
    let mut bytes = [0u8; 64];
    match socket.read(&mut bytes) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            panic!("the {who} slept {LOST_WAKE:?}: a wake-up was lost")
        }
        Err(e) => panic!("the {who}'s socket: {e}"),
    }
}

fn wake(socket: &mut UnixStream) {
    socket.write_all(b"w").unwrap();
}

#[derive(Debug, Default)]
struct Counts {
    /// `prepare_to_sleep`s: each sets the flag one wake of the other side's may clear.
    flags_set: u64,
    /// `prepare_to_sleep`s taken back because the recheck found work.
    sleeps_cancelled: u64,
    /// Sleeps a wake ended, waiting for work: a request (the worker), an answer (the lobby).
    woken_for_work: u64,
    /// The worker's sleeps a wake ended, waiting for room in the ring.
    woken_for_room: u64,
    /// Wakes sent after queueing requests (the lobby) or writing an answer (the worker).
    wakes_for_work: u64,
    /// The lobby's wakes after it consumed answers, to a worker waiting for room.
    wakes_for_room: u64,
}

impl Counts {
    fn wakes_sent(&self) -> u64 {
        self.wakes_for_work + self.wakes_for_room
    }
}

/// The worker: takes requests, answers each with its frames, waits for requests or room.
fn worker(mut end: WorkerEnd, mut socket: UnixStream) -> (Vec<u32>, Counts) {
    let mut taken_ids = Vec::new();
    let mut counts = Counts::default();
    let mut frame = Vec::new();
    loop {
        frame.clear();
        let Some(taken) = end.take_next(&mut frame).unwrap() else {
            end.prepare_to_sleep(Awaiting::Request);
            counts.flags_set += 1;
            if end.has_request() {
                end.sleep_cancelled();
                counts.sleeps_cancelled += 1;
                continue;
            }
            if !sleep(&mut socket, "worker") {
                return (taken_ids, counts);
            }
            counts.woken_for_work += 1;
            continue;
        };
        assert_eq!(&frame[HEADER_LEN..HEADER_LEN + 4], taken.id.to_le_bytes(), "request {taken:?}");
        assert_eq!(frame, request(taken.id));
        taken_ids.push(taken.id);
        let count = answer_count(taken.id);
        for index in 0..count {
            let flags = if index + 1 == count { FLAG_END } else { 0 };
            let answer = build_frame(Kind::ResponseBody, flags, |out| {
                out.extend_from_slice(&answer_payload(taken.id, index));
                Ok(())
            })
            .unwrap();
            loop {
                match end.write_answer(taken.id, &[&answer]) {
                    Ok(()) => break,
                    Err(AnswerError::NoRoom) => {
                        end.prepare_to_sleep(Awaiting::Room);
                        counts.flags_set += 1;
                        if end.room_for(answer.len()).unwrap() {
                            end.sleep_cancelled();
                            counts.sleeps_cancelled += 1;
                            continue;
                        }
                        assert!(sleep(&mut socket, "worker"), "the lobby left while answers were due");
                        counts.woken_for_room += 1;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            if end.wake_lobby() {
                wake(&mut socket);
                counts.wakes_for_work += 1;
            }
        }
    }
}

#[test]
fn no_request_answer_or_wake_up_is_lost() {
    let (region, file) = Region::create(LAYOUT).unwrap();
    let mut lobby = LobbyEnd::new(region);
    let worker_end = WorkerEnd::new(Region::open(file).unwrap());
    let (mut socket, worker_socket) = UnixStream::pair().unwrap();
    socket.set_read_timeout(Some(LOST_WAKE)).unwrap();
    worker_socket.set_read_timeout(Some(LOST_WAKE)).unwrap();
    let worker = thread::spawn(move || worker(worker_end, worker_socket));

    let started = Instant::now();
    let mut counts = Counts::default();
    let mut next_id = 0;
    let mut seq = 0;
    // Requests taken back before the worker had them, to be queued again.
    let mut recalled = VecDeque::new();
    let mut recalled_once = HashSet::new();
    let mut taken_back = 0;
    // The index of the next answer frame each request in a slot expects.
    let mut next_frame = vec![0u32; REQUESTS as usize];
    let mut finished = 0;
    let mut answer = BytesMut::new();
    while finished < REQUESTS {
        assert!(started.elapsed() < WHOLE_TEST, "{finished} of {REQUESTS} answered in {WHOLE_TEST:?}");
        let mut progress = false;
        while let Some(slot) = lobby.free_slot() {
            let id = match recalled.pop_front() {
                Some(id) => id,
                None if next_id < REQUESTS => {
                    next_id += 1;
                    next_id - 1
                }
                None => break,
            };
            lobby.queue(slot, id, seq, &request(id)).unwrap();
            seq += 1;
            progress = true;
            // Every seventh request is taken back once, if the worker has not taken it yet.
            if id % 7 == 0 && recalled_once.insert(id) && lobby.recall(slot).unwrap() {
                recalled.push_back(id);
                taken_back += 1;
            }
        }
        if progress && lobby.wake_worker().unwrap() {
            wake(&mut socket);
            counts.wakes_for_work += 1;
        }
        let mut consumed = false;
        while let Some(got) = lobby.next_answer(&mut answer).unwrap() {
            consumed = true;
            let header = FrameHeader::decode(answer[..HEADER_LEN].try_into().unwrap()).unwrap();
            let index = next_frame[got.id as usize];
            assert!(index < answer_count(got.id), "request {} got a frame too many", got.id);
            assert_eq!(&answer[HEADER_LEN..], answer_payload(got.id, index), "request {} frame {index}", got.id);
            assert_eq!(header.is_end(), index + 1 == answer_count(got.id));
            next_frame[got.id as usize] += 1;
            if header.is_end() {
                lobby.release(got.slot.expect("a slot: nothing is reclaimed here")).unwrap();
                finished += 1;
            }
            answer.clear();
        }
        if consumed && lobby.wake_worker_for_room().unwrap() {
            wake(&mut socket);
            counts.wakes_for_room += 1;
        }
        if progress || consumed {
            continue;
        }
        lobby.prepare_to_sleep();
        counts.flags_set += 1;
        if lobby.has_answer() {
            lobby.sleep_cancelled().unwrap();
            counts.sleeps_cancelled += 1;
            continue;
        }
        assert!(sleep(&mut socket, "lobby"), "the worker left");
        counts.woken_for_work += 1;
    }
    drop(socket);
    let (mut taken, worker_counts) = worker.join().unwrap();

    taken.sort_unstable();
    assert_eq!(taken, (0..REQUESTS).collect::<Vec<_>>(), "every request taken once");
    assert!(next_frame.iter().enumerate().all(|(id, &count)| count == answer_count(id as u32)));
    let summary = format!(
        "{REQUESTS} requests in {:?}; {taken_back} taken back and queued again; lobby {counts:?}; worker {worker_counts:?}",
        started.elapsed(),
    );
    eprintln!("{summary}");
    // Each side slept until the other rang: for work, and the worker for room in the small ring.
    assert!(counts.woken_for_work > 0, "the lobby never slept: {summary}");
    assert!(worker_counts.woken_for_work > 0, "the worker never slept for a request: {summary}");
    assert!(worker_counts.woken_for_room > 0, "the worker never slept for room: {summary}");
    // Every seventh request is recalled as soon as it is queued, before the lobby rings: unless
    // the worker was awake to take it in between, it comes back.
    assert!(taken_back > 0, "no request was taken back: {summary}");
    // A wake clears a flag that a `prepare_to_sleep` set: neither side rings unasked.
    assert!(counts.wakes_sent() <= worker_counts.flags_set, "the lobby rang unasked: {summary}");
    assert!(worker_counts.wakes_sent() <= counts.flags_set, "the worker rang unasked: {summary}");
}
