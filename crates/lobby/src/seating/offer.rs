//! Requests sent ahead to busy workers (docs/PROTOCOL.md, section 3).
//!
//! A worker that finishes a request while others wait would otherwise sleep until the lobby has
//! read its answer and sent it the next one: two wake-ups across CPUs per request, with the
//! worker idle in between. Instead, while the queue is not empty, a busy worker is offered the
//! next queued requests at once, each as one datagram on a socket of its own. The worker takes
//! an offer when it finishes; if another worker goes idle first, the lobby takes the offers
//! back and seats them there, so a request never waits behind a slow one while a worker is
//! free. Both sides receive from the same socket, so the kernel decides who gets a datagram:
//! exactly one of them does.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::Instant;

use maitred_wire::OFFER_MAX;
use socket2::{Domain, Socket, Type};

use super::job::{Job, JobState};

/// How many requests a busy worker may hold offered. One would do if the lobby always read a
/// worker's answer before the worker had finished the request after it; under load it often
/// has not, and a second keeps the worker from sleeping meanwhile.
pub const DEPTH: usize = 2;

/// Offer sockets per worker: one per offer it may hold, and one more for an offer the lobby
/// counts as accepted (the worker has finished the request before it) that the worker has
/// not received yet.
pub const SOCKETS: usize = DEPTH + 1;

/// One worker's offer sockets, and the requests offered on them, oldest first.
///
/// Offers go to the sockets in turn, and the worker reads them in the same turn. A socket
/// never holds more than one datagram, so a recall takes exactly the offer it means; the
/// lobby recalls newest first, so the offers left are always the next ones in the worker's
/// turn.
pub struct Offers {
    sockets: Vec<OfferSocket>,
    /// The socket of the oldest offer, or of the next one when there is none: it moves on with
    /// each accepted offer, as the worker's reading does, and not with a recalled one.
    turn: Cell<usize>,
    jobs: RefCell<VecDeque<Job>>,
}

struct OfferSocket {
    /// The lobby's end: offers are sent here.
    sender: OwnedFd,
    /// The worker's end (the worker holds a copy): the lobby receives from it to take an
    /// offer back.
    receiver: OwnedFd,
}

impl OfferSocket {
    fn new() -> io::Result<OfferSocket> {
        let (sender, receiver) = Socket::pair(Domain::UNIX, Type::SEQPACKET.nonblocking(), None)?;
        Ok(OfferSocket { sender: sender.into(), receiver: receiver.into() })
    }
}

impl Offers {
    /// New, empty offer sockets. The worker's ends are `receivers()`, to be passed to it in
    /// this order.
    pub fn new() -> io::Result<Offers> {
        Ok(Offers {
            sockets: (0..SOCKETS).map(|_| OfferSocket::new()).collect::<io::Result<_>>()?,
            turn: Cell::new(0),
            jobs: RefCell::new(VecDeque::new()),
        })
    }

    pub fn receivers(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.sockets.iter().map(|socket| socket.receiver.as_fd())
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.borrow().is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.jobs.borrow().len() >= DEPTH
    }

    pub fn len(&self) -> usize {
        self.jobs.borrow().len()
    }

    /// When the oldest offered request was queued: an idle worker takes back the oldest first.
    pub fn oldest_enqueued_at(&self) -> Option<Instant> {
        self.jobs.borrow().front().map(|job| job.enqueued_at)
    }

    /// Whether the request whose state is `state` is offered here.
    pub fn holds(&self, state: &Rc<Cell<JobState>>) -> bool {
        self.jobs.borrow().iter().any(|job| Rc::ptr_eq(&job.state, state))
    }

    fn socket(&self, position: usize) -> &OfferSocket {
        &self.sockets[(self.turn.get() + position) % SOCKETS]
    }

    /// Offers `job` to the worker; gives it back if it cannot be offered: the worker holds
    /// `DEPTH` offers already, or it is too large for one datagram.
    pub fn make(&self, job: Job) -> Result<(), Job> {
        if job.frame.len() > OFFER_MAX || self.is_full() {
            return Err(job);
        }
        let bufs = [IoSlice::new(&job.frame)];
        let fd = self.socket(self.len()).sender.as_raw_fd();
        let sent = match &job.body_file {
            Some(file) => maitred_sys::fdpass::send_with_fd(fd, &bufs, file.as_raw_fd(), libc::MSG_DONTWAIT),
            None => maitred_sys::fdpass::send(fd, &bufs, libc::MSG_DONTWAIT),
        };
        match sent {
            Ok(n) if n == job.frame.len() => {
                job.state.set(JobState::Offered);
                self.jobs.borrow_mut().push_back(job);
                Ok(())
            }
            _ => Err(job),
        }
    }

    /// Takes offers back, newest first, until `last(job)` says so or the worker turns out to
    /// have received the next one. Returns them oldest first, queued again.
    pub fn recall_until(&self, last: impl Fn(&Job) -> bool) -> Vec<Job> {
        let mut recalled = Vec::new();
        while !self.is_empty() {
            if !take_back(self.socket(self.len() - 1).receiver.as_raw_fd()) {
                break;
            }
            let Some(job) = self.jobs.borrow_mut().pop_back() else { break };
            job.state.set(JobState::Queued);
            let done = last(&job);
            recalled.push(job);
            if done {
                break;
            }
        }
        recalled.reverse();
        recalled
    }

    /// Takes back the offer `take_accepted` gave last, if it is still on its socket: the
    /// worker was counted as taking it when it finished the request before, but left before it
    /// received it (it exited after that answer). True if it came back: the worker never had
    /// it. Only for the offer being answered, before any other is accepted.
    pub fn recall_accepted(&self) -> bool {
        // `take_accepted` moved the turn past that offer's socket, which no newer offer uses:
        // those take the sockets from the turn on, and there is one socket more than offers.
        take_back(self.sockets[(self.turn.get() + SOCKETS - 1) % SOCKETS].receiver.as_raw_fd())
    }

    /// The oldest offered job, once the worker has finished the request before it: from
    /// then on the worker is taking it (or has), and it can no longer be recalled.
    pub fn take_accepted(&self) -> Option<Job> {
        let job = self.jobs.borrow_mut().pop_front()?;
        job.state.set(JobState::Seated);
        self.turn.set((self.turn.get() + 1) % SOCKETS);
        Some(job)
    }
}

/// Reads the offer waiting on `receiver`, if the worker has not: true if one was there. A
/// one-byte buffer: the rest of the datagram is discarded with it, and a descriptor that came
/// along is closed; the job still holds its own.
fn take_back(receiver: RawFd) -> bool {
    let mut byte = [MaybeUninit::<u8>::uninit(); 1];
    let mut fds = VecDeque::new();
    matches!(maitred_sys::fdpass::recv_with_fds(receiver, &mut byte, &mut fds, libc::MSG_DONTWAIT), Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seating::job::tests::job;

    /// What the worker receives on its socket `which`, if anything is there.
    fn worker_receives(offers: &Offers, which: usize) -> Option<Vec<u8>> {
        let mut buf = bytes::BytesMut::with_capacity(OFFER_MAX);
        let mut fds = VecDeque::new();
        let fd = offers.receivers().nth(which).unwrap().as_raw_fd();
        match maitred_sys::fdpass::recv_into(fd, &mut buf, &mut fds, libc::MSG_DONTWAIT) {
            Ok(_) => Some(buf.to_vec()),
            Err(_) => None,
        }
    }

    fn offer(offers: &Offers, name: &str) {
        let (job, _) = job(name);
        assert!(offers.make(job).is_ok());
    }

    fn frames(jobs: &[Job]) -> Vec<&[u8]> {
        jobs.iter().map(|job| job.frame.as_slice()).collect()
    }

    #[test]
    fn offers_reach_the_worker_as_one_datagram_each_in_turn() {
        let offers = Offers::new().unwrap();
        offer(&offers, "GET /a");
        offer(&offers, "GET /b");
        assert!(offers.is_full());
        assert_eq!(worker_receives(&offers, 0).unwrap(), b"GET /a");
        assert_eq!(worker_receives(&offers, 1).unwrap(), b"GET /b");
        let accepted = offers.take_accepted().unwrap();
        assert_eq!((accepted.frame.as_slice(), accepted.state.get()), (&b"GET /a"[..], JobState::Seated));
        offer(&offers, "GET /c");
        assert_eq!(worker_receives(&offers, 2).unwrap(), b"GET /c");
    }

    #[test]
    fn offers_not_yet_received_are_recalled_newest_first_and_returned_oldest_first() {
        let offers = Offers::new().unwrap();
        offer(&offers, "GET /a");
        offer(&offers, "GET /b");
        let recalled = offers.recall_until(|_| false);
        assert_eq!(frames(&recalled), [b"GET /a", b"GET /b"]);
        assert!(recalled.iter().all(|job| job.state.get() == JobState::Queued));
        assert!(offers.is_empty());
        assert!(worker_receives(&offers, 0).is_none(), "the worker must not get a recalled offer");
        assert!(worker_receives(&offers, 1).is_none());
    }

    #[test]
    fn a_recall_stops_at_an_offer_the_worker_received() {
        let offers = Offers::new().unwrap();
        offer(&offers, "GET /a");
        offer(&offers, "GET /b");
        worker_receives(&offers, 0).unwrap();
        assert_eq!(frames(&offers.recall_until(|_| false)), [b"GET /b"]);
        assert_eq!(offers.take_accepted().unwrap().frame, b"GET /a");
    }

    #[test]
    fn a_recall_can_stop_at_a_given_offer() {
        let offers = Offers::new().unwrap();
        offer(&offers, "GET /a");
        offer(&offers, "GET /b");
        assert_eq!(frames(&offers.recall_until(|job| job.frame == b"GET /b")), [b"GET /b"]);
        assert_eq!(offers.len(), 1);
    }

    #[test]
    fn no_more_than_depth_offers_and_none_too_large() {
        let offers = Offers::new().unwrap();
        let (big, _rbig) = job(&"x".repeat(OFFER_MAX + 1));
        assert!(offers.make(big).is_err());
        for name in ["GET /a", "GET /b"] {
            offer(&offers, name);
        }
        let (c, _rc) = job("GET /c");
        assert_eq!(offers.make(c).unwrap_err().frame, b"GET /c");
    }

    #[test]
    fn a_recall_never_takes_an_offer_accepted_but_not_yet_received() {
        let offers = Offers::new().unwrap();
        offer(&offers, "GET /a");
        offer(&offers, "GET /b");
        // The worker has finished the request before /a but not yet received /a.
        offers.take_accepted().unwrap();
        offer(&offers, "GET /c");
        assert_eq!(frames(&offers.recall_until(|_| false)), [b"GET /b", b"GET /c"]);
        // The turn did not move with the recall: the next offers go where the worker looks
        // after /a.
        offer(&offers, "GET /d");
        assert_eq!(worker_receives(&offers, 0).unwrap(), b"GET /a");
        assert_eq!(worker_receives(&offers, 1).unwrap(), b"GET /d");
    }

    #[test]
    fn an_accepted_offer_comes_back_only_if_the_worker_never_received_it() {
        let offers = Offers::new().unwrap();
        offer(&offers, "GET /a");
        offer(&offers, "GET /b");
        offers.take_accepted().unwrap();
        offer(&offers, "GET /c");
        // The worker left before it received /a: /a comes back, and the newer offers with a
        // recall, as they did before.
        assert_eq!(frames(&offers.recall_until(|_| false)), [b"GET /b", b"GET /c"]);
        assert!(offers.recall_accepted());
        assert!(!offers.recall_accepted());

        let offers = Offers::new().unwrap();
        offer(&offers, "GET /a");
        offers.take_accepted().unwrap();
        assert_eq!(worker_receives(&offers, 0).unwrap(), b"GET /a");
        assert!(!offers.recall_accepted());
    }
}
