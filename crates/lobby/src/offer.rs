//! Requests sent ahead to busy workers (docs/PROTOCOL.md, section 3).
//!
//! A worker that finishes a request while others wait would otherwise sleep until the lobby has
//! read its answer and sent it the next one: two wake-ups across CPUs per request, with the
//! worker idle in between. Instead, when a worker takes a request while the queue is not
//! empty, the next queued request is offered to it at once, as one datagram on a socket of
//! its own. The worker takes the offer when it finishes; if another worker goes idle first,
//! the lobby takes the offer back and seats it there, so a request never waits behind a slow
//! one while a worker is free. Both sides receive from the same socket, so the kernel decides
//! who gets the datagram: exactly one of them does.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::time::Instant;

use maitred_wire::OFFER_MAX;

use crate::seating::{Job, JobState};

/// One worker's pair of offer sockets, and the request offered, if any.
///
/// Offers alternate between the two sockets. The worker may not yet have received an offer the
/// lobby counts as accepted (the worker has finished the request before it) when the lobby
/// offers the next one; on a socket of its own, that next one is the only datagram there, so a
/// recall takes exactly the offer it means.
pub struct Offer {
    sockets: [OfferSocket; 2],
    /// Which socket the next offer goes to: they alternate with each accepted offer, as the
    /// worker's reading does, so that a recalled offer does not move the turn.
    turn: Cell<usize>,
    job: RefCell<Option<Job>>,
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
        let mut ends = [0; 2];
        // SAFETY: socketpair writes two descriptors into `ends` on success.
        let made = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
                ends.as_mut_ptr(),
            )
        };
        if made < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (sender, receiver) = unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        Ok(OfferSocket { sender, receiver })
    }
}

impl Offer {
    /// New, empty offer sockets. The worker's ends are `receivers()`, to be passed to it in
    /// this order.
    pub fn new() -> io::Result<Offer> {
        Ok(Offer {
            sockets: [OfferSocket::new()?, OfferSocket::new()?],
            turn: Cell::new(0),
            job: RefCell::new(None),
        })
    }

    pub fn receivers(&self) -> [BorrowedFd<'_>; 2] {
        [self.sockets[0].receiver.as_fd(), self.sockets[1].receiver.as_fd()]
    }

    pub fn is_empty(&self) -> bool {
        self.job.borrow().is_none()
    }

    /// Whether the offered request is the one whose state is `state`.
    pub fn holds(&self, state: &Rc<Cell<JobState>>) -> bool {
        self.job.borrow().as_ref().is_some_and(|job| Rc::ptr_eq(&job.state, state))
    }

    /// When the offered request, if any, was queued: the oldest is recalled first.
    pub fn enqueued_at(&self) -> Option<Instant> {
        self.job.borrow().as_ref().map(|job| job.enqueued_at)
    }

    /// Offers `job` to the worker; gives it back if it cannot be offered: one is already, or
    /// it is too large for one datagram.
    pub fn make(&self, job: Job) -> Result<(), Job> {
        if job.frame.len() > OFFER_MAX || !self.is_empty() {
            return Err(job);
        }
        let bufs = [IoSlice::new(&job.frame)];
        let fd = self.sockets[self.turn.get()].sender.as_raw_fd();
        let sent = match &job.body_file {
            Some(file) => maitred_fdpass::send_with_fd(fd, &bufs, file.as_raw_fd(), libc::MSG_DONTWAIT),
            None => maitred_fdpass::send(fd, &bufs, libc::MSG_DONTWAIT),
        };
        match sent {
            Ok(n) if n == job.frame.len() => {
                job.state.set(JobState::Offered);
                *self.job.borrow_mut() = Some(job);
                Ok(())
            }
            _ => Err(job),
        }
    }

    /// Takes the offer back, unless the worker has already received it. The job is queued
    /// again, to be seated like any other.
    pub fn recall(&self) -> Option<Job> {
        if self.is_empty() {
            return None;
        }
        // A one-byte buffer: the rest of the datagram is discarded with it, and a descriptor
        // that came along is closed; the job still holds its own.
        let mut byte = [MaybeUninit::<u8>::uninit(); 1];
        let mut fds = VecDeque::new();
        let receiver = self.sockets[self.turn.get()].receiver.as_raw_fd();
        match maitred_fdpass::recv_with_fds(receiver, &mut byte, &mut fds, libc::MSG_DONTWAIT) {
            Ok(n) if n > 0 => {
                let job = self.job.borrow_mut().take()?;
                job.state.set(JobState::Queued);
                Some(job)
            }
            _ => None,
        }
    }

    /// The offered job, once the worker has finished the request before it: from then on
    /// the worker is taking it (or has), and it can no longer be recalled.
    pub fn take_accepted(&self) -> Option<Job> {
        let job = self.job.borrow_mut().take()?;
        job.state.set(JobState::Seated);
        self.turn.set(1 - self.turn.get());
        Some(job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seating::tests::job;

    /// What the worker receives on its socket `which`, if anything is there.
    fn worker_receives(offer: &Offer, which: usize) -> Option<Vec<u8>> {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); OFFER_MAX];
        let mut fds = VecDeque::new();
        let fd = offer.receivers()[which].as_raw_fd();
        match maitred_fdpass::recv_with_fds(fd, &mut buf, &mut fds, libc::MSG_DONTWAIT) {
            // SAFETY: the kernel wrote the first n bytes.
            Ok(n) => Some(buf[..n].iter().map(|b| unsafe { b.assume_init() }).collect()),
            Err(_) => None,
        }
    }

    #[test]
    fn an_offer_reaches_the_worker_as_one_datagram() {
        let offer = Offer::new().unwrap();
        let (a, _ra) = job("GET /a");
        assert!(offer.make(a).is_ok());
        assert!(!offer.is_empty());
        assert_eq!(worker_receives(&offer, 0).unwrap(), b"GET /a");
        let accepted = offer.take_accepted().unwrap();
        assert_eq!((accepted.frame.as_slice(), accepted.state.get()), (&b"GET /a"[..], JobState::Seated));
    }

    #[test]
    fn an_offer_not_yet_received_can_be_recalled_once() {
        let offer = Offer::new().unwrap();
        let (a, _ra) = job("GET /a");
        offer.make(a).map_err(|_| ()).unwrap();
        let recalled = offer.recall().unwrap();
        assert_eq!(recalled.frame, b"GET /a");
        assert_eq!(recalled.state.get(), JobState::Queued);
        assert!(offer.recall().is_none());
        assert!(worker_receives(&offer, 0).is_none(), "the worker must not get a recalled offer");
    }

    #[test]
    fn an_offer_the_worker_received_cannot_be_recalled() {
        let offer = Offer::new().unwrap();
        let (a, _ra) = job("GET /a");
        offer.make(a).map_err(|_| ()).unwrap();
        worker_receives(&offer, 0).unwrap();
        assert!(offer.recall().is_none());
        assert!(offer.take_accepted().is_some());
    }

    #[test]
    fn one_offer_at_a_time_and_none_too_large() {
        let offer = Offer::new().unwrap();
        let (a, _ra) = job("GET /a");
        let (b, _rb) = job("GET /b");
        offer.make(a).map_err(|_| ()).unwrap();
        assert_eq!(offer.make(b).unwrap_err().frame, b"GET /b");
        offer.recall().unwrap();
        let (big, _rbig) = job(&"x".repeat(OFFER_MAX + 1));
        assert!(offer.make(big).is_err());
        assert!(offer.is_empty());
    }

    #[test]
    fn offers_alternate_sockets_so_a_recall_never_takes_one_accepted_before() {
        let offer = Offer::new().unwrap();
        let (a, _ra) = job("GET /a");
        let (b, _rb) = job("GET /b");
        let (c, _rc) = job("GET /c");
        offer.make(a).map_err(|_| ()).unwrap();
        offer.take_accepted().unwrap();
        // The worker has not received /a yet when /b is offered, and /b is recalled.
        offer.make(b).map_err(|_| ()).unwrap();
        assert_eq!(offer.recall().unwrap().frame, b"GET /b");
        // A recall does not move the turn: /c goes where the worker looks after /a.
        offer.make(c).map_err(|_| ()).unwrap();
        assert_eq!(worker_receives(&offer, 0).unwrap(), b"GET /a");
        assert_eq!(worker_receives(&offer, 1).unwrap(), b"GET /c");
    }
}
