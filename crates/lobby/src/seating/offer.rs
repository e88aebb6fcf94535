//! The requests queued at one worker, in the request slots of its shared region (crates/shm,
//! docs/PROTOCOL.md, section 3).
//!
//! Every request reaches a worker through a slot: the one seated at an idle worker, and those
//! offered ahead to a busy one, so that it takes the next as soon as it has answered, without
//! waiting for the lobby to read that answer and send another. The worker takes the oldest
//! queued slot with a compare-and-swap; the lobby takes a slot back with one, which succeeds
//! only while the worker has not taken it. So an idle worker can take back what a busy one
//! was offered and has not begun, and "never read" is a state word, not a guess. While the
//! worker is busy, queueing costs no system call; the worker's bell (an eventfd) is rung only
//! when it has said that it sleeps.
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
use std::time::Instant;

use maitred_shm::{Corrupt, Layout, LobbyEnd, Region, SlotState, PADDING_ID};
use maitred_wire::{FrameHeader, Kind};
use tokio::sync::Notify;

use super::job::{Job, JobState};

/// How many requests a busy worker may hold queued. One would do if the lobby always read a
/// worker's answer before the worker had finished the request after it; under load it often
/// has not, and a second keeps the worker from sleeping meanwhile.
pub const DEPTH: usize = 2;

/// The request being answered, and `DEPTH` behind it. Answers still come on the channel, so
/// the ring is the smallest a region may have.
const LAYOUT: Layout = Layout { slots: DEPTH as u32 + 1, slot_size: 64 << 10, ring_size: 64 };

/// A request in one of the worker's slots, not yet known to be taken.
struct Queued {
    slot: usize,
    id: u32,
    job: Job,
    /// False for a request that went on the channel: only its place is in the slot.
    recallable: bool,
}

/// The request a worker took from its slots: the one whose answer comes next.
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
    /// The lobby's copy of the worker's bell.
    bell: OwnedFd,
    /// Oldest first.
    queued: RefCell<VecDeque<Queued>>,
    /// The slot of the request being answered, freed when its answer has come whole.
    answering: Cell<Option<usize>>,
    next_id: Cell<u32>,
    next_seq: Cell<u64>,
    /// Told when queued requests are taken back, so that a worker's task waiting for the
    /// worker to take one notices when none is left.
    recalled: Notify,
    /// What the worker broke in its region: the lobby then gives up on it.
    broken: RefCell<Option<Corrupt>>,
}

impl Offers {
    /// A new region and bell. The region's descriptor is the worker's (the lobby's mapping
    /// does not need it), to be sent with [`Offers::bell`].
    pub fn new() -> io::Result<(Offers, OwnedFd)> {
        let (region, file) = Region::create(LAYOUT)?;
        let offers = Offers {
            end: RefCell::new(LobbyEnd::new(region)),
            bell: maitred_sys::bell::new()?,
            queued: RefCell::new(VecDeque::new()),
            answering: Cell::new(None),
            next_id: Cell::new(0),
            next_seq: Cell::new(0),
            recalled: Notify::new(),
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
        self.queued.borrow().iter().find(|queued| queued.recallable).map(|queued| queued.job.enqueued_at)
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
        job.body_file.is_none() && job.frame.len() <= LAYOUT.max_request_frame()
    }

    /// Queues `job` in a slot of the worker; gives it back if it cannot be: the worker holds
    /// `DEPTH` already, it does not fit a slot, or the worker broke its region.
    pub fn make(&self, job: Job) -> Result<(), Job> {
        if self.is_full() || !self.fits(&job) {
            return Err(job);
        }
        match self.queue(&job.frame) {
            Some((slot, id)) => {
                job.state.set(JobState::Offered);
                self.queued.borrow_mut().push_back(Queued { slot, id, job, recallable: true });
                Ok(())
            }
            None => Err(job),
        }
    }

    /// Queues the place of `job`, whose frame the caller has just sent on the channel; gives
    /// it back when the worker broke its region.
    pub fn make_on_channel(&self, job: Job) -> Result<(), Job> {
        let stub = FrameHeader { kind: Kind::OnChannel, flags: 0, len: 0 }.encode();
        match self.queue(&stub) {
            Some((slot, id)) => {
                job.state.set(JobState::Seated);
                self.queued.borrow_mut().push_back(Queued { slot, id, job, recallable: false });
                Ok(())
            }
            None => Err(job),
        }
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

    /// The queued request the worker has taken, if it has taken one: its answer is the next to
    /// come. Its slot stays the worker's until [`Offers::answered`].
    pub fn take_taken(&self) -> Result<Option<Taken>, Corrupt> {
        let end = self.end.borrow();
        let mut queued = self.queued.borrow_mut();
        for at in 0..queued.len() {
            if end.state(queued[at].slot)? == SlotState::Taken {
                let Queued { slot, id, job, recallable } = queued.remove(at).expect("a queued request");
                job.state.set(JobState::Seated);
                self.answering.set(Some(slot));
                return Ok(Some(Taken { job, id, on_channel: !recallable }));
            }
        }
        Ok(None)
    }

    /// The answer to the request taken last has come whole: its slot is free again.
    pub fn answered(&self) -> Result<(), Corrupt> {
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
                if !queued[at].recallable {
                    continue;
                }
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
        if !recalled.is_empty() {
            self.recalled.notify_one();
        }
        recalled.reverse();
        recalled
    }

    /// Takes back everything queued that the worker has not taken, a request on the channel
    /// included: the lobby gives up on the worker, which will read nothing more. Returns them
    /// oldest first, queued again.
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

    /// Waits until queued requests are taken back ([`Offers::recall_until`]).
    pub async fn recall(&self) {
        self.recalled.notified().await
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
    fn the_worker_takes_requests_in_order_and_the_lobby_sees_which() {
        let (offers, file) = Offers::new().unwrap();
        let worker = worker(file);
        offer(&offers, "GET /a");
        offer(&offers, "GET /b");
        assert!(offers.is_full());
        assert!(offers.take_taken().unwrap().is_none());
        assert_eq!(takes(&worker).unwrap(), b"GET /a");
        let taken = offers.take_taken().unwrap().unwrap();
        assert_eq!((taken.job.frame.as_slice(), taken.job.state.get()), (&b"GET /a"[..], JobState::Seated));
        assert!(!taken.on_channel);
        offers.answered().unwrap();
        offer(&offers, "GET /c");
        assert_eq!(takes(&worker).unwrap(), b"GET /b");
        assert_eq!(offers.take_taken().unwrap().unwrap().job.frame, b"GET /b");
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
        assert_eq!(offers.take_taken().unwrap().unwrap().job.frame, b"GET /a");
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
        offer(&offers, "GET /a");
        offer(&offers, "GET /b");
        assert_eq!(offers.make(request("GET /c")).unwrap_err().frame, b"GET /c");
    }

    #[test]
    fn a_request_on_the_channel_keeps_its_place_and_is_never_recalled() {
        let (offers, file) = Offers::new().unwrap();
        let worker = worker(file);
        assert!(offers.make_on_channel(request("GET /big")).is_ok());
        offer(&offers, "GET /a");
        assert_eq!(frames(&offers.recall_until(|_| false)), [b"GET /a"]);
        let stub = takes(&worker).unwrap();
        assert_eq!(FrameHeader::decode(stub[..8].try_into().unwrap()).unwrap().kind, Kind::OnChannel);
        let taken = offers.take_taken().unwrap().unwrap();
        assert!(taken.on_channel);
        assert_eq!(taken.job.frame, b"GET /big");
    }

    #[test]
    fn the_bell_rings_only_for_a_worker_that_said_it_sleeps() {
        let (offers, file) = Offers::new().unwrap();
        let worker = worker(file);
        offer(&offers, "GET /a");
        assert!(!maitred_sys::bell::silence(offers.bell()).unwrap());
        takes(&worker).unwrap();
        worker.prepare_to_sleep();
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
        assert!(offers.take_taken().is_err());
        assert!(offers.recall_until(|_| false).is_empty());
        assert!(offers.broken().is_some());
        assert!(offers.make(request("GET /b")).is_err());
    }
}
