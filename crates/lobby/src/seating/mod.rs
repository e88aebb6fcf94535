//! The one FIFO queue of complete requests, and the idle workers waiting for them.
//!
//! A request is only queued once it is complete, so a worker that takes one never waits on a
//! client (docs/SCENARIOS.md, S1). Busy workers never cause a request to be dropped or its
//! connection to be closed: it waits here, in arrival order (S4). A request offered ahead to a
//! busy worker (`offer.rs`) still counts as waiting: a worker that goes idle takes it back.
//!
//! Here the FIFO and the idle seats; a request is a `Job` (`job.rs`), what was offered comes
//! back from its worker in `recall.rs`, and its answer through the spool (`spool.rs`). This is
//! where client connections and workers meet: it imports neither, only the logs.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use crate::log::info_limited;

use job::{Job, JobState};
use offer::Offers;
use overload::{Overload, Policy};
use spool::ResponsePart;

pub(crate) mod body_files;
pub(crate) mod job;
pub(crate) mod offer;
pub(crate) mod overload;
mod recall;
pub(crate) mod spool;
pub(crate) mod streams;
pub(crate) mod websocket;

/// The queue and the idle seats. Single-threaded: the lobby runs on one thread.
#[derive(Default)]
pub struct Seating {
    queue: RefCell<VecDeque<Job>>,
    idle: RefCell<VecDeque<IdleSeat>>,
    /// Every worker's offer socket.
    offers: RefCell<Vec<Rc<Offers>>>,
    /// Which requests are still served past capacity, and the count of those that are not.
    pub overload: Overload,
    /// How long a request holds a worker, typically: a moving average, in seconds.
    typical_service: Cell<Option<f64>>,
    /// Told when a request joins the queue: the threads that wait for their worker to have CPU
    /// to spare look again (`worker/gate.rs`).
    joined: Notify,
}

/// A seat waiting for a request.
struct IdleSeat {
    seat: oneshot::Sender<Job>,
}

/// What a worker gets when it asks for work.
pub enum Next {
    Now(Job),
    Later(oneshot::Receiver<Job>),
}

impl Seating {
    /// Takes the settings on overload (at the start, and at each reload).
    pub fn configure(&self, policy: Policy) {
        self.overload.configure(policy);
    }

    /// Seats `job` at the longest-idle worker, or queues it behind the others; a request that
    /// had already waited too long upstream is refused at once. True when an idle worker took it.
    pub fn submit(&self, job: Job) -> bool {
        let mut job = job;
        if !job.upstream.is_zero() && self.refuses(&job, Instant::now()) {
            return false;
        }
        loop {
            let seat = self.idle.borrow_mut().pop_front();
            match seat {
                Some(IdleSeat { seat }) => {
                    let at = job.enqueued_at;
                    match seat.send(job) {
                        Ok(()) => {
                            // A seat was free: the workers keep up (`overload.rs`).
                            self.overload.drained(at);
                            return true;
                        }
                        // That worker went away while idle; try the next one.
                        Err(returned) => job = returned,
                    }
                }
                None => break,
            }
        }
        self.overload.joined(job.enqueued_at);
        self.queue.borrow_mut().push_back(job);
        self.joined.notify_waiters();
        false
    }

    /// Puts back a job a worker took but never started, ahead of everything else.
    pub fn return_unstarted(&self, job: Job) {
        job.state.set(JobState::Queued);
        let idle = self.idle.borrow_mut().pop_front();
        match idle {
            Some(IdleSeat { seat }) => {
                if let Err(job) = seat.send(job) {
                    self.requeue(job);
                }
            }
            None => self.requeue(job),
        }
    }

    /// Puts a job a worker took back at the front of the queue: it joins it again, as it was
    /// counted taken (`overload.rs`).
    fn requeue(&self, job: Job) {
        self.overload.joined(job.enqueued_at);
        self.queue.borrow_mut().push_front(job);
        self.joined.notify_waiters();
    }

    /// Resolves when a request next joins the queue.
    pub async fn joined(&self) {
        self.joined.notified().await;
    }

    /// The oldest live job, or a seat to wait on. With the queue empty, the oldest request
    /// offered to a busy worker that has not taken it yet is the oldest live job. A WebSocket
    /// handshake waits in the same FIFO as any request (issue 47: an ASGI worker's WebSockets
    /// cost it no seat once accepted).
    pub fn next(&self) -> Next {
        let now = Instant::now();
        if let Some(job) = self.take_oldest(now, None).or_else(|| self.recall_oldest_offer()) {
            return Next::Now(job);
        }
        self.overload.drained(now);
        let (seat, wait) = oneshot::channel();
        self.idle.borrow_mut().push_back(IdleSeat { seat });
        Next::Later(wait)
    }

    /// A worker has answered a request it was on for `took`.
    pub fn answered_in(&self, took: Duration) {
        // Weighs the last sixteen or so: it follows a change of load within a second at T1's
        // rate, and one slow request moves it little.
        let took = took.as_secs_f64();
        let typical = self.typical_service.get().map_or(took, |typical| typical + (took - typical) / 16.0);
        self.typical_service.set(Some(typical));
    }

    /// For a worker that looks for work, idle or to be offered more (`taker`, whose own offers
    /// are never taken back for it): the oldest request offered to another worker that has been
    /// on one request for `stale_after` (offers are older than anything in the queue), else the
    /// queue's oldest.
    fn take_oldest(&self, now: Instant, taker: Option<&Offers>) -> Option<Job> {
        self.recall_stale_offers(now, taker).or_else(|| self.take_queued(now))
    }

    /// Offers the busy worker `taker` the oldest waiting requests, as many as `offer_depth`
    /// calls for and no more than the `left` requests it will still take (--max-requests);
    /// `waited` hears how long each had waited. One pass, judged at one instant, `now`, and of
    /// at most `offer_depth` takes: it ends whatever the clock does meanwhile.
    ///
    /// Issue 46: the pass read the clock anew at each take and could take back the taker's own
    /// offers, since its request had begun more than `stale_after` ago by then (the lobby's
    /// thread preempted for 5 ms, on two cores shared with CPU hogs). It then took back one,
    /// offered it again and took it back, for ever: the lobby answered nothing more.
    pub fn offer_to(&self, taker: &Offers, now: Instant, left: Option<u64>, mut waited: impl FnMut(Duration)) {
        let depth = self.offer_depth();
        let room = |held: usize| held < depth && left.is_none_or(|left| (held as u64) < left);
        for _ in 0..depth {
            if !room(taker.len()) {
                return;
            }
            let Some(next) = self.take_oldest(now, Some(taker)) else { return };
            // Its wait ends here: the worker takes it as soon as it has answered.
            let wait = now.saturating_duration_since(next.enqueued_at);
            if let Err(next) = taker.make(next) {
                self.return_unstarted(next);
                return;
            }
            waited(wait);
        }
    }

    /// The oldest live job in the queue that can still be answered in time, if any; those
    /// before it that cannot are answered 503 (`overload.rs`).
    fn take_queued(&self, now: Instant) -> Option<Job> {
        loop {
            let job = self.queue.borrow_mut().pop_front()?;
            if job.state.get() == JobState::Queued && !self.refuses(&job, now) {
                self.overload.taken(now);
                return Some(job);
            }
        }
    }

    /// Refuses `job` with 503 and Retry-After if it can no longer be answered in time.
    fn refuses(&self, job: &Job, now: Instant) -> bool {
        let Some(verdict) = self.overload.verdict(now, job.age(now)) else { return false };
        job.state.set(JobState::Cancelled);
        info_limited!("503 for {} ({}): {}", job.summary, verdict.reason.label(), verdict.detail);
        // Parts without body bytes are never spilled: this send cannot fail.
        let _ = job.respond.send(ResponsePart::Refused {
            status: 503,
            detail: verdict.detail,
            retry_after: Some(verdict.retry_after),
        });
        true
    }

    pub fn add_offers(&self, offers: Rc<Offers>) {
        self.offers.borrow_mut().push(offers);
    }

    pub fn remove_offers(&self, offers: &Rc<Offers>) {
        self.offers.borrow_mut().retain(|other| !Rc::ptr_eq(other, offers));
    }

    /// Requests waiting for a worker (cancelled ones not yet swept included).
    pub fn queued(&self) -> usize {
        self.queue.borrow().len()
    }

    /// WebSocket handshakes waiting for a seat under their cap (cancelled ones not yet swept
    /// included).
    pub fn websockets_queued(&self) -> usize {
        self.queue.borrow().iter().filter(|job| job.websocket.is_some() && job.state.get() == JobState::Queued).count()
    }

    /// Workers serving (each registers its offer sockets while it does), for the status line.
    pub fn workers(&self) -> usize {
        self.offers.borrow().len()
    }

    /// Requests waiting for a worker, those offered to a busy one and not taken yet included,
    /// for the status line.
    pub fn waiting(&self) -> usize {
        self.queued() + self.offers.borrow().iter().map(|offers| offers.len()).sum::<usize>()
    }

    /// How many requests a busy worker may hold offered: as many as take `offer::OFFER_AHEAD`
    /// at the typical request's time, from `offer::MIN_DEPTH` to `offer::DEPTH`. Offers save
    /// wakes, which only short requests notice; a request offered behind long ones waits there,
    /// out of the queue's reach (its overload policy no longer sees it).
    pub fn offer_depth(&self) -> usize {
        let typical = self.typical_service.get().unwrap_or(0.0);
        let ahead = offer::OFFER_AHEAD.as_secs_f64();
        if typical * offer::DEPTH as f64 <= ahead {
            return offer::DEPTH;
        }
        ((ahead / typical) as usize).clamp(offer::MIN_DEPTH, offer::DEPTH)
    }

    /// When the request waiting longest came: in the queue, or offered to a busy worker.
    pub fn oldest_waiting(&self) -> Option<Instant> {
        let queued =
            self.queue.borrow().iter().find(|job| job.state.get() == JobState::Queued).map(|job| job.enqueued_at);
        let offered = self.offers.borrow().iter().filter_map(|offers| offers.oldest_enqueued_at()).min();
        queued.into_iter().chain(offered).min()
    }

    /// Whether a request queued now would be taken by a worker within the next round of
    /// seats: a worker is idle, or fewer requests wait than there are workers. A fast upload
    /// streams only then (`client/body.rs`): its client is held back by TCP while it waits,
    /// and the lobby holds at most its pipe and socket buffers for it, never a file.
    pub fn seats_soon(&self) -> bool {
        self.idle() > 0 || self.waiting() < self.workers()
    }

    /// Workers waiting for a request, for the status line.
    pub fn idle(&self) -> usize {
        self.idle.borrow().iter().filter(|idle| !idle.seat.is_closed()).count()
    }

    /// Drops every waiting job; their connections see their response channel close.
    pub fn clear(&self) {
        self.queue.borrow_mut().clear();
        self.idle.borrow_mut().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::job::tests::job;
    use super::spool::AnswerReceiver;
    use super::*;
    use maitred_shm::{Region, WorkerEnd};

    pub(super) fn take_now(seating: &Seating) -> Job {
        match seating.next() {
            Next::Now(job) => job,
            Next::Later(_) => panic!("expected a queued job"),
        }
    }

    #[test]
    fn jobs_are_served_in_arrival_order() {
        let seating = Seating::default();
        let (a, _ra) = job("a");
        let (b, _rb) = job("b");
        seating.submit(a);
        seating.submit(b);
        assert_eq!(seating.queued(), 2);
        assert_eq!(take_now(&seating).frame, b"a");
        assert_eq!(take_now(&seating).frame, b"b");
    }

    #[test]
    fn an_idle_worker_gets_the_next_job_directly() {
        let seating = Seating::default();
        let Next::Later(mut wait) = seating.next() else { panic!("queue should be empty") };
        let (a, _ra) = job("a");
        seating.submit(a);
        assert_eq!(wait.try_recv().unwrap().frame, b"a");
        assert_eq!(seating.queued(), 0);
    }

    #[test]
    fn a_vanished_idle_worker_does_not_lose_the_job() {
        let seating = Seating::default();
        let Next::Later(gone) = seating.next() else { panic!() };
        drop(gone);
        let Next::Later(mut alive) = seating.next() else { panic!() };
        let (a, _ra) = job("a");
        seating.submit(a);
        assert_eq!(alive.try_recv().unwrap().frame, b"a");
    }

    fn websocket_job(name: &str) -> (Job, AnswerReceiver) {
        let (mut job, receiver) = job(name);
        job.websocket = Some(Box::new(websocket::link().1));
        (job, receiver)
    }

    #[test]
    fn a_websocket_handshake_waits_in_the_one_fifo_in_its_turn() {
        let seating = Seating::default();
        let (http, _rh) = job("http");
        let (ws, _rw) = websocket_job("ws");
        let (later, _rl) = job("later");
        assert!(!seating.submit(http));
        assert!(!seating.submit(ws));
        assert!(!seating.submit(later));
        assert_eq!(seating.websockets_queued(), 1);
        let order: Vec<Vec<u8>> = (0..3)
            .map(|_| match seating.next() {
                Next::Now(job) => job.frame,
                Next::Later(_) => panic!("expected a job"),
            })
            .collect();
        assert_eq!(order, [b"http".to_vec(), b"ws".to_vec(), b"later".to_vec()]);
        assert_eq!(seating.websockets_queued(), 0);
    }

    #[test]
    fn cancelled_jobs_are_skipped() {
        let seating = Seating::default();
        let (a, _ra) = job("a");
        let (b, _rb) = job("b");
        a.state.set(JobState::Cancelled);
        seating.submit(a);
        seating.submit(b);
        assert_eq!(take_now(&seating).frame, b"b");
    }

    /// A worker's offers, registered, and the worker's end of its region.
    pub(super) fn offers_of(seating: &Seating) -> (Rc<Offers>, WorkerEnd) {
        let (offers, file) = Offers::new().unwrap();
        let offers = Rc::new(offers);
        seating.add_offers(offers.clone());
        (offers, WorkerEnd::new(Region::open(file).unwrap()))
    }

    #[test]
    fn counts_workers_idle_seats_and_waiting_requests_offers_included() {
        let seating = Seating::default();
        let (busy, _) = offers_of(&seating);
        let _idle = offers_of(&seating);
        let Next::Later(seat) = seating.next() else { panic!("queue should be empty") };
        let Next::Later(gone) = seating.next() else { panic!("queue should be empty") };
        drop(gone);
        assert_eq!((seating.workers(), seating.idle(), seating.waiting()), (2, 1, 0));
        let (a, _ra) = job("a");
        let (b, _rb) = job("b");
        let (c, _rc) = job("c");
        seating.submit(a);
        assert!(busy.make(b).is_ok());
        seating.submit(c);
        assert_eq!((seating.idle(), seating.queued(), seating.waiting()), (0, 1, 2));
        drop(seat);
    }

    #[test]
    fn queued_jobs_come_before_offers() {
        let seating = Seating::default();
        let (offers, _) = offers_of(&seating);
        let (a, _ra) = job("a");
        let (b, _rb) = job("b");
        assert!(offers.make(a).is_ok());
        seating.submit(b);
        assert_eq!(take_now(&seating).frame, b"b");
        assert!(!offers.is_empty());
    }

    /// `offers`' worker is on `running`, and holds `held` queued behind it.
    pub(super) fn busy_with(offers: &Offers, running: &str, held: &[&str]) -> Vec<spool::AnswerReceiver> {
        let (current, answer) = job(running);
        assert!(offers.seat(current).is_ok());
        let mut answers = vec![answer];
        for name in held {
            let (offered, answer) = job(name);
            assert!(offers.make(offered).is_ok());
            answers.push(answer);
        }
        answers
    }

    #[test]
    fn short_requests_get_deep_offers_and_long_ones_few() {
        let seating = Seating::default();
        assert_eq!(seating.offer_depth(), offer::DEPTH);
        for _ in 0..100 {
            seating.answered_in(Duration::from_micros(40));
        }
        assert_eq!(seating.offer_depth(), offer::DEPTH);
        for _ in 0..100 {
            seating.answered_in(Duration::from_micros(500));
        }
        assert_eq!(seating.offer_depth(), 4);
        for _ in 0..100 {
            seating.answered_in(Duration::from_millis(20));
        }
        assert_eq!(seating.offer_depth(), offer::MIN_DEPTH);
    }

    /// Issue 46's hang: the offering pass took back the taker's own offer, found stale because
    /// the pass came more than `stale_after` after its request began, offered it again, and
    /// so on for ever (a loop that ended only when the worker had `offer_depth` offers).
    #[test]
    fn a_worker_offered_more_keeps_its_own_offers_however_late_the_pass() {
        let seating = Seating::default();
        let (busy, _worker) = offers_of(&seating);
        let _answers = busy_with(&busy, "running", &["a"]);
        let (b, _rb) = job("b");
        seating.submit(b);
        let late = Instant::now() + seating.stale_after() * 10;
        let mut waits = 0;
        seating.offer_to(&busy, late, None, |_| waits += 1);
        assert_eq!(waits, 1);
        assert_eq!(seating.queued(), 0);
        let held: Vec<Vec<u8>> = busy.recall_until(|_| false).into_iter().map(|job| job.frame).collect();
        assert_eq!(held, [b"a".to_vec(), b"b".to_vec()]);
    }

    #[test]
    fn an_offering_pass_stops_at_the_depth_and_at_the_requests_left() {
        let seating = Seating::default();
        let (busy, _worker) = offers_of(&seating);
        let _answers = busy_with(&busy, "running", &[]);
        let mut receivers = Vec::new();
        for name in ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"] {
            let (queued, answer) = job(name);
            seating.submit(queued);
            receivers.push(answer);
        }
        seating.offer_to(&busy, Instant::now(), Some(3), |_| {});
        assert_eq!((busy.len(), seating.queued()), (3, 7));
        seating.offer_to(&busy, Instant::now(), None, |_| {});
        assert_eq!((busy.len(), seating.queued()), (offer::DEPTH, 10 - offer::DEPTH));
    }

    #[test]
    fn an_unstarted_job_goes_back_to_the_front() {
        let seating = Seating::default();
        let (a, _ra) = job("a");
        let (b, _rb) = job("b");
        seating.submit(b);
        a.state.set(JobState::Seated);
        seating.return_unstarted(a);
        assert_eq!(take_now(&seating).frame, b"a");
    }
}
