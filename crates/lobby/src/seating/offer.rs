//! The requests queued at one worker, in the request slots of its shared region (crates/shm,
//! docs/PROTOCOL.md, section 3).
//!
//! Every request reaches a worker through a slot: the one seated at an idle worker, and those
//! offered ahead to a busy one, so that it takes the next as soon as it has answered, without
//! waiting for the lobby to read that answer and send another. The worker takes the queued
//! requests strictly in order, each with a compare-and-swap; the lobby takes one back with
//! one, which succeeds only while the worker has not taken it. So an idle worker can take back
//! what a busy one was offered and has not begun, "never read" is a state word, not a guess,
//! and the request answered next is always the oldest not taken back. While the worker is
//! busy, queueing costs no system call; the worker's bell (an eventfd) is rung only when it
//! has said that it sleeps.
//!
//! A request that does not fit a slot (a frame over 64 KiB, or a body in a file, whose
//! descriptor has to travel) goes on the channel, and an `ON_CHANNEL` frame takes its place in
//! a slot, so that the worker still takes requests in order from the slots alone. Only an idle
//! worker gets one, and it cannot be taken back: it is already on its way.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use maitred_shm::{Answer, Corrupt, Layout, LobbyEnd, LoopBeat, Region, PADDING_ID};
use maitred_wire::{FrameHeader, Kind};

use super::job::{Job, JobState};

/// The most requests a busy worker may hold queued. The lobby offers more only when it has read
/// an answer, and under load it reads a worker's answers in bursts, one turn of its event loop
/// apart: a worker that has answered all it holds before then sleeps, and is woken again for
/// the next, a wake that costs both sides more than a small request. At T1 (hello, 2 workers,
/// `wrk -t2 -c100`, 2 cores) 2 left the workers asleep between bursts, eventfd writes were 12% of
/// the lobby's CPU and the worker's switches 40% of its own; 8 gave 1.2x the requests a second
/// at 0.8x the server's CPU per request (docs/PERFORMANCE.md). A request held behind a slow one
/// is not stuck there: see [`STALE_AFTER`].
pub const DEPTH: usize = 8;

/// Requests of a longer typical time get fewer offers, down to this: as many as before eight,
/// enough for the next to be there when the worker has answered.
pub const MIN_DEPTH: usize = 2;

/// How much work, at the typical request's time, a worker may hold offered. Deep offers pay
/// for short requests, whose wakes cost as much as they do (T1's take 40 us as the lobby sees
/// them: 8); longer ones gain nothing from them and would wait behind each other: with 20 ms
/// requests (IO1) eight put p99 at 285 ms against 87 at two, and a 0.1 s application's queue
/// could no longer answer 503 what was offered (tests/test_overload.py).
pub const OFFER_AHEAD: Duration = Duration::from_millis(2);

/// How long a worker may be on one request, at the least, before the requests offered behind it
/// are taken back for other workers: one that looks for work takes them first, since they are
/// older than anything in the queue. Short next to a request that holds a worker for long, and
/// long next to a fast one (T1's take 30 us), so that offers rarely move when all is well.
pub const STALE_AFTER: Duration = Duration::from_millis(5);

/// ... and how many times the typical request's time (`Seating::stale_after`). Requests that
/// all take a while must not count as slow: with 20 ms requests, 8 workers and 32 clients
/// (IO1), taking offers back from every worker past 5 ms moved them over and over and put p99
/// at 285 ms, against 102 ms without.
pub const STALE_FACTOR: f64 = 4.0;

/// The request being answered, and `DEPTH` behind it; a ring whose largest answer frame (128
/// KiB less 8 bytes) holds the worker's body frames (it cuts them to fit), so that only a
/// head with more than 128 KiB of headers, or a file, goes on the channel. A worker writes
/// through the whole ring before it wraps, so each region costs the lobby and its worker some
/// 450 KiB of shared memory once warm.
const LAYOUT: Layout = Layout { slots: DEPTH as u32 + 1, slot_size: 64 << 10, ring_size: 256 << 10 };

/// The region of an ASGI worker's one channel (docs/PROTOCOL.md, section 4): its requests
/// stand in a slot only until the worker has copied them out (`RELEASED`), so the slots count
/// the requests admitted and not yet taken, at most `--worker-connections`; a slot's pages are
/// touched only when it is used, lowest first. The ring is 1 MiB: the answers of every request
/// in progress share it.
pub fn multiplexed_layout(admitted: usize) -> Layout {
    // A region has at most 1024 slots (`Layout::check`); past them, admission waits for one.
    Layout { slots: admitted.clamp(DEPTH + 1, 1024) as u32, slot_size: 64 << 10, ring_size: 1 << 20 }
}

/// A request offered in one of the worker's slots.
struct Queued {
    slot: usize,
    id: u32,
    job: Job,
}

/// The request whose answer comes next: seated at the worker idle, or the oldest offer once
/// the worker has answered the request before it. The worker may not have taken it from its
/// slot yet ([`Offers::recall_answering`]).
pub struct Taken {
    pub job: Job,
    /// Its id in the region, which a `CANCEL` names.
    pub id: u32,
    /// It went on the channel, so the worker may not have read all of it yet.
    pub on_channel: bool,
}

/// One worker's shared region, seen from the lobby, and the requests queued in it.
pub struct Offers {
    end: RefCell<LobbyEnd>,
    layout: Layout,
    /// The lobby's copy of the worker's bell.
    bell: OwnedFd,
    /// Oldest first.
    queued: RefCell<VecDeque<Queued>>,
    /// The slot of the request being answered, freed when its answer has come whole.
    answering: Cell<Option<usize>>,
    /// Since when the worker has been on it, as the lobby counts (from seating, or from the
    /// end of the answer before).
    answering_since: Cell<Option<Instant>>,
    next_id: Cell<u32>,
    next_seq: Cell<u64>,
    /// What the worker broke in its region: the lobby then gives up on it.
    broken: RefCell<Option<Corrupt>>,
}

impl Offers {
    /// A new region and bell. The region's descriptor is the worker's (the lobby's mapping
    /// does not need it), to be sent with [`Offers::bell`].
    pub fn new() -> io::Result<(Offers, OwnedFd)> {
        Offers::with_layout(LAYOUT)
    }

    /// A new region of `layout` (an ASGI worker's: `multiplexed_layout`) and bell.
    pub fn with_layout(layout: Layout) -> io::Result<(Offers, OwnedFd)> {
        let (region, file) = Region::create(layout)?;
        let offers = Offers {
            end: RefCell::new(LobbyEnd::new(region)),
            layout,
            bell: maitred_sys::bell::new()?,
            queued: RefCell::new(VecDeque::new()),
            answering: Cell::new(None),
            answering_since: Cell::new(None),
            next_id: Cell::new(0),
            next_seq: Cell::new(0),
            broken: RefCell::new(None),
        };
        Ok((offers, file))
    }

    pub fn bell(&self) -> BorrowedFd<'_> {
        self.bell.as_fd()
    }

    pub fn is_empty(&self) -> bool {
        self.queued.borrow().is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.queued.borrow().len() >= DEPTH
    }

    pub fn len(&self) -> usize {
        self.queued.borrow().len()
    }

    /// When the oldest queued request was queued: an idle worker takes back the oldest first.
    pub fn oldest_enqueued_at(&self) -> Option<Instant> {
        self.queued.borrow().front().map(|queued| queued.job.enqueued_at)
    }

    /// When the oldest queued request was queued, if the worker has been on the request before
    /// it for `stale_after` at `now`.
    pub fn stale_since(&self, now: Instant, stale_after: Duration) -> Option<Instant> {
        let since = self.answering_since.get()?;
        if now.saturating_duration_since(since) < stale_after {
            return None;
        }
        self.oldest_enqueued_at()
    }

    /// Whether the request whose state is `state` is queued here.
    pub fn holds(&self, state: &Rc<Cell<JobState>>) -> bool {
        self.queued.borrow().iter().any(|queued| Rc::ptr_eq(&queued.job.state, state))
    }

    /// What the worker broke in its region, if it has.
    pub fn broken(&self) -> Option<Corrupt> {
        self.broken.borrow().clone()
    }

    /// Whether `job` fits in a slot.
    pub fn fits(&self, job: &Job) -> bool {
        job.body_file.is_none() && job.frame.len() <= self.layout.max_request_frame()
    }

    /// Offers `job` to the busy worker, in a slot; gives it back if it cannot be: the worker
    /// holds `DEPTH` already, it does not fit a slot, or the worker broke its region.
    pub fn make(&self, job: Job) -> Result<(), Job> {
        if self.is_full() || !self.fits(&job) {
            return Err(job);
        }
        match self.queue(&job.frame) {
            Some((slot, id)) => {
                job.state.set(JobState::Offered);
                self.queued.borrow_mut().push_back(Queued { slot, id, job });
                Ok(())
            }
            None => Err(job),
        }
    }

    /// Seats `job`, which fits a slot, at the idle worker; gives it back when the worker broke
    /// its region.
    pub fn seat(&self, job: Job) -> Result<Taken, Job> {
        match self.queue(&job.frame) {
            Some((slot, id)) => Ok(self.seated(job, slot, id, false)),
            None => Err(job),
        }
    }

    /// Seats `job`, whose frame the caller has just sent on the channel, at the idle worker: its
    /// place goes in a slot. Gives it back when the worker broke its region.
    pub fn seat_on_channel(&self, job: Job) -> Result<Taken, Job> {
        match self.queue(&FrameHeader { kind: Kind::OnChannel, flags: 0, len: 0 }.encode()) {
            Some((slot, id)) => Ok(self.seated(job, slot, id, true)),
            None => Err(job),
        }
    }

    /// Queues `job` at an ASGI worker, which runs any number at once: in a slot, or, when the
    /// caller has just sent it on the channel (`on_channel`), its place. A slot the worker has
    /// copied its request out of is reused. Gives the job back when no slot is free (the
    /// worker has not taken those queued yet) or the worker broke its region.
    pub fn admit(&self, job: Job, on_channel: bool) -> Result<Taken, Job> {
        let no_slot = self.end.borrow().free_slot().is_none();
        if no_slot {
            let reclaimed = self.end.borrow_mut().reclaim_released();
            if let Err(corrupt) = reclaimed {
                self.broken.replace(Some(corrupt));
                return Err(job);
            }
        }
        let frame =
            if on_channel { &FrameHeader { kind: Kind::OnChannel, flags: 0, len: 0 }.encode()[..] } else { &job.frame };
        match self.queue(frame) {
            Some((_, id)) => {
                job.state.set(JobState::Seated);
                Ok(Taken { job, id, on_channel })
            }
            None => Err(job),
        }
    }

    /// Whether an ASGI worker's region can take one more request: a slot is free, or one the
    /// worker has copied its request out of.
    /// The worker's event-loop heartbeat, from its region's header.
    pub fn loop_beat(&self) -> LoopBeat {
        self.end.borrow().loop_beat()
    }

    pub fn has_free_slot(&self) -> bool {
        let mut end = self.end.borrow_mut();
        if end.free_slot().is_some() {
            return true;
        }
        match end.reclaim_released() {
            Ok(freed) => freed > 0,
            Err(corrupt) => {
                self.broken.replace(Some(corrupt));
                false
            }
        }
    }

    /// Takes back the ASGI worker's request `id` if it has not taken it from its slot: true
    /// when it came back, so it never ran.
    pub fn recall_id(&self, id: u32) -> bool {
        let mut end = self.end.borrow_mut();
        let Some(slot) = end.slot_of(id) else { return false };
        match end.recall(slot) {
            Ok(recalled) => recalled,
            Err(corrupt) => {
                self.broken.replace(Some(corrupt));
                false
            }
        }
    }

    /// The ASGI worker's answer to `id` has ended: its slot, if it still has one, is free, and
    /// its id no longer answers.
    pub fn finished(&self, id: u32) {
        let mut end = self.end.borrow_mut();
        if let Some(slot) = end.slot_of(id) {
            if let Err(corrupt) = end.release(slot) {
                self.broken.replace(Some(corrupt));
            }
        }
        end.finished(id);
    }

    /// `job`, queued in `slot` at the idle worker, is the one it answers next.
    fn seated(&self, job: Job, slot: usize, id: u32, on_channel: bool) -> Taken {
        debug_assert!(self.is_empty() && self.answering.get().is_none(), "a worker seated while busy");
        job.state.set(JobState::Seated);
        self.answering.set(Some(slot));
        self.answering_since.set(Some(Instant::now()));
        Taken { job, id, on_channel }
    }

    /// Writes `frame` into a free slot and rings the worker's bell if it sleeps.
    fn queue(&self, frame: &[u8]) -> Option<(usize, u32)> {
        if self.broken.borrow().is_some() {
            return None;
        }
        let mut end = self.end.borrow_mut();
        let slot = end.free_slot()?;
        let id = self.next_id.get();
        // Ids are unique among the slots in use (at most `DEPTH + 1`): a counter does, skipping
        // the one the ring reserves.
        self.next_id.set(match id.wrapping_add(1) {
            PADDING_ID => 0,
            next => next,
        });
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        if let Err(e) = end.queue(slot, id, seq, frame) {
            // The lobby sized the frame and chose the slot and id: only the worker can have made
            // this fail, by writing a slot's state.
            self.broken.replace(Some(match e {
                maitred_shm::QueueError::Corrupt(corrupt) => corrupt,
                other => panic!("the lobby queued a request its region refuses: {other}"),
            }));
            return None;
        }
        match end.wake_worker() {
            // An eventfd write fails only when its counter would overflow, which a bell rung
            // once per sleep never comes near.
            Ok(true) => drop(maitred_sys::bell::ring(self.bell.as_fd())),
            Ok(false) => {}
            Err(corrupt) => {
                self.broken.replace(Some(corrupt));
            }
        }
        Some((slot, id))
    }

    /// Copies the next answer frame out of the answer ring into `out` and frees its room,
    /// ringing the worker's bell if it sleeps waiting for room. `None`: the ring is empty.
    pub fn next_answer(&self, out: &mut BytesMut) -> Result<Option<Answer>, Corrupt> {
        let mut end = self.end.borrow_mut();
        let answer = end.next_answer(out).and_then(|answer| {
            if answer.is_some() && end.wake_worker_for_room()? {
                // As in `queue`: the write cannot fail.
                drop(maitred_sys::bell::ring(self.bell.as_fd()));
            }
            Ok(answer)
        });
        if let Err(corrupt) = &answer {
            self.broken.replace(Some(corrupt.clone()));
        }
        answer
    }

    /// Says in the region that the lobby is about to sleep until the worker answers, and looks
    /// at the ring again: true when it is still empty, so that the caller sleeps; false when an
    /// answer came meanwhile (the flag is cleared again).
    pub fn prepare_to_sleep(&self) -> bool {
        let end = self.end.borrow();
        end.prepare_to_sleep();
        if !end.has_answer() {
            return true;
        }
        // A bell the worker rang meanwhile cuts the next sleep short, for one more look.
        self.woke();
        false
    }

    /// Whether the answer ring holds anything.
    pub fn has_answer(&self) -> bool {
        self.end.borrow().has_answer()
    }

    /// The lobby woke (or did not sleep after all): its waiting flag is cleared.
    pub fn woke(&self) {
        if let Err(corrupt) = self.end.borrow().sleep_cancelled() {
            self.broken.replace(Some(corrupt));
        }
    }

    /// The oldest offer, once the worker has answered the request before it: the worker takes
    /// the queued requests in order, so its answer comes next, and it is no longer taken back.
    pub fn take_accepted(&self) -> Option<Taken> {
        let Queued { slot, id, job } = self.queued.borrow_mut().pop_front()?;
        job.state.set(JobState::Seated);
        self.answering.set(Some(slot));
        self.answering_since.set(Some(Instant::now()));
        Some(Taken { job, id, on_channel: false })
    }

    /// Takes back the request being answered if the worker has not taken it from its slot yet:
    /// true when it came back, so it never ran. Only when giving up on the worker.
    pub fn recall_answering(&self) -> bool {
        let Some(slot) = self.answering.get() else { return false };
        match self.end.borrow_mut().recall(slot) {
            Ok(recalled) => {
                if recalled {
                    self.answering.set(None);
                    self.answering_since.set(None);
                }
                recalled
            }
            Err(corrupt) => {
                self.broken.replace(Some(corrupt));
                false
            }
        }
    }

    /// The answer to the request taken last has come whole: its slot is free again.
    pub fn answered(&self) -> Result<(), Corrupt> {
        self.answering_since.set(None);
        match self.answering.take() {
            Some(slot) => self.end.borrow_mut().release(slot),
            None => Ok(()),
        }
    }

    /// Takes back the queued requests the worker has not taken, newest first, until
    /// `last(job)` says so. Returns them oldest first, queued again.
    pub fn recall_until(&self, last: impl Fn(&Job) -> bool) -> Vec<Job> {
        let mut recalled = Vec::new();
        {
            let mut end = self.end.borrow_mut();
            let mut queued = self.queued.borrow_mut();
            let mut at = queued.len();
            while at > 0 {
                at -= 1;
                match end.recall(queued[at].slot) {
                    Ok(true) => {}
                    // The worker has it: its answer comes next.
                    Ok(false) => continue,
                    Err(corrupt) => {
                        self.broken.replace(Some(corrupt));
                        break;
                    }
                }
                let job = queued.remove(at).expect("a queued request").job;
                job.state.set(JobState::Queued);
                let done = last(&job);
                recalled.push(job);
                if done {
                    break;
                }
            }
        }
        recalled.reverse();
        recalled
    }

    /// Takes back every offer the worker has not taken: the lobby gives up on the worker.
    /// Returns them oldest first, queued again.
    pub fn give_up(&self) -> Vec<Job> {
        let mut end = self.end.borrow_mut();
        let mut queued = self.queued.borrow_mut();
        let mut never_taken = Vec::new();
        let mut kept = VecDeque::new();
        for entry in queued.drain(..) {
            match end.recall(entry.slot) {
                Ok(true) => {
                    entry.job.state.set(JobState::Queued);
                    never_taken.push(entry.job);
                }
                Ok(false) => kept.push_back(entry),
                // Its state can no longer prove anything: it counts as begun.
                Err(corrupt) => {
                    self.broken.replace(Some(corrupt));
                    kept.push_back(entry);
                }
            }
        }
        *queued = kept;
        never_taken
    }

    /// Every request still queued that could not be taken back: the worker has them, or had
    /// them on the channel, when it was lost.
    pub fn drain(&self) -> Vec<Job> {
        self.queued.borrow_mut().drain(..).map(|queued| queued.job).collect()
    }
}

#[cfg(test)]
mod tests {
    use maitred_shm::WorkerEnd;

    use super::*;
    use crate::seating::job::tests::job;

    /// The worker's end of a region, from the descriptor the lobby sends it.
    fn worker(file: OwnedFd) -> WorkerEnd {
        WorkerEnd::new(Region::open(file).unwrap())
    }

    /// A request frame named `name`.
    fn request(name: &str) -> Job {
        job(name).0
    }

    fn offer(offers: &Offers, name: &str) {
        assert!(offers.make(request(name)).is_ok());
    }

    fn takes(worker: &WorkerEnd) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        worker.take_next(&mut out).unwrap().map(|_| out)
    }

    fn frames(jobs: &[Job]) -> Vec<&[u8]> {
        jobs.iter().map(|job| job.frame.as_slice()).collect()
    }

    #[test]
    fn the_worker_takes_requests_in_order_and_the_oldest_offer_is_answered_next() {
        let (offers, file) = Offers::new().unwrap();
        let worker = worker(file);
        let seated = offers.seat(request("GET /a")).ok().unwrap();
        assert_eq!((seated.job.frame.as_slice(), seated.job.state.get()), (&b"GET /a"[..], JobState::Seated));
        offer(&offers, "GET /b");
        offer(&offers, "GET /c");
        for more in 2..DEPTH {
            assert!(!offers.is_full());
            offer(&offers, &format!("GET /{more}"));
        }
        assert!(offers.is_full());
        assert_eq!(takes(&worker).unwrap(), b"GET /a");
        offers.answered().unwrap();
        let accepted = offers.take_accepted().unwrap();
        assert_eq!((accepted.job.frame.as_slice(), accepted.job.state.get()), (&b"GET /b"[..], JobState::Seated));
        assert_eq!(takes(&worker).unwrap(), b"GET /b");
        offers.answered().unwrap();
        offer(&offers, "GET /d");
        assert_eq!(takes(&worker).unwrap(), b"GET /c");
        assert_eq!(offers.take_accepted().unwrap().job.frame, b"GET /c");
    }

    #[test]
    fn a_request_not_yet_taken_comes_back_when_the_worker_is_given_up() {
        let (offers, file) = Offers::new().unwrap();
        let idle = worker(file);
        let seated = offers.seat(request("GET /a")).ok().unwrap();
        assert!(offers.recall_answering());
        assert!(takes(&idle).is_none(), "the worker must not get a request taken back");
        assert_eq!(seated.job.frame, b"GET /a");

        let (offers, file) = Offers::new().unwrap();
        let taker = worker(file);
        offers.seat(request("GET /a")).ok().unwrap();
        takes(&taker).unwrap();
        assert!(!offers.recall_answering());
    }

    #[test]
    fn requests_not_taken_are_recalled_newest_first_and_returned_oldest_first() {
        let (offers, file) = Offers::new().unwrap();
        let worker = worker(file);
        offer(&offers, "GET /a");
        offer(&offers, "GET /b");
        let recalled = offers.recall_until(|_| false);
        assert_eq!(frames(&recalled), [b"GET /a", b"GET /b"]);
        assert!(recalled.iter().all(|job| job.state.get() == JobState::Queued));
        assert!(offers.is_empty());
        assert!(takes(&worker).is_none(), "the worker must not get a recalled request");
    }

    #[test]
    fn a_recall_leaves_the_request_the_worker_took() {
        let (offers, file) = Offers::new().unwrap();
        let worker = worker(file);
        offer(&offers, "GET /a");
        offer(&offers, "GET /b");
        takes(&worker).unwrap();
        assert_eq!(frames(&offers.recall_until(|_| false)), [b"GET /b"]);
        assert_eq!(frames(&offers.drain()), [b"GET /a"]);
    }

    #[test]
    fn a_recall_can_stop_at_a_given_request() {
        let (offers, _file) = Offers::new().unwrap();
        offer(&offers, "GET /a");
        offer(&offers, "GET /b");
        assert_eq!(frames(&offers.recall_until(|job| job.frame == b"GET /b")), [b"GET /b"]);
        assert_eq!(offers.len(), 1);
    }

    #[test]
    fn no_more_than_depth_and_none_that_does_not_fit() {
        let (offers, _file) = Offers::new().unwrap();
        let big = request(&"x".repeat(LAYOUT.max_request_frame() + 1));
        assert!(!offers.fits(&big));
        assert!(offers.make(big).is_err());
        for n in 0..DEPTH {
            offer(&offers, &format!("GET /{n}"));
        }
        assert_eq!(offers.make(request("GET /over")).unwrap_err().frame, b"GET /over");
    }

    #[test]
    fn a_request_on_the_channel_keeps_its_place() {
        let (offers, file) = Offers::new().unwrap();
        let worker = worker(file);
        let seated = offers.seat_on_channel(request("GET /big")).ok().unwrap();
        assert!(seated.on_channel);
        offer(&offers, "GET /a");
        let stub = takes(&worker).unwrap();
        assert_eq!(FrameHeader::decode(stub[..8].try_into().unwrap()).unwrap().kind, Kind::OnChannel);
        assert_eq!(takes(&worker).unwrap(), b"GET /a");
    }

    #[test]
    fn the_bell_rings_only_for_a_worker_that_said_it_sleeps() {
        let (offers, file) = Offers::new().unwrap();
        let worker = worker(file);
        offer(&offers, "GET /a");
        assert!(!maitred_sys::bell::silence(offers.bell()).unwrap());
        takes(&worker).unwrap();
        worker.prepare_to_sleep(maitred_shm::Awaiting::Request);
        assert!(!worker.has_request());
        offer(&offers, "GET /b");
        assert!(maitred_sys::bell::silence(offers.bell()).unwrap());
    }

    #[test]
    fn a_worker_that_writes_a_slot_state_is_found_out() {
        let (offers, file) = Offers::new().unwrap();
        let dup = file.try_clone().unwrap();
        let _worker = worker(file);
        offer(&offers, "GET /a");
        // The first slot's state word, at the start of the slots (crates/shm's table).
        std::os::unix::fs::FileExt::write_at(&std::fs::File::from(dup), &7u32.to_le_bytes(), 4096).unwrap();
        assert!(offers.recall_until(|_| false).is_empty());
        assert!(offers.broken().is_some());
        assert!(offers.make(request("GET /b")).is_err());
    }
}
