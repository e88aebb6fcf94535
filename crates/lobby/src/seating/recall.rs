//! Taking back what was offered to a busy worker (`offer.rs`) and has not been taken: the
//! oldest offer for a worker that goes idle, every offer behind a request held for
//! `stale_after` for the next worker that looks, and one offer for a connection whose client
//! left. What comes back with them is offered to its worker again or goes to the front of
//! the queue, oldest first.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::job::{Job, JobState};
use super::offer::{self, Offers};
use super::Seating;
use crate::log::debug;

impl Seating {
    /// How long a worker may be on one request before what it was offered goes to other
    /// workers: `offer::STALE_AFTER`, or `offer::STALE_FACTOR` times the typical request's time
    /// when that is longer.
    pub fn stale_after(&self) -> Duration {
        let typical = self.typical_service.get().unwrap_or(0.0);
        offer::STALE_AFTER.max(Duration::from_secs_f64(typical * offer::STALE_FACTOR))
    }

    /// Takes back the oldest offer, from the busy worker holding it. Offers come back newest
    /// first, so the newer ones that come back with it are offered to that worker again: it
    /// stays as busy as it was.
    pub(super) fn recall_oldest_offer(&self) -> Option<Job> {
        let mut holders: Vec<(Instant, Rc<Offers>)> = Vec::new();
        for offers in self.offers.borrow().iter() {
            if let Some(enqueued_at) = offers.oldest_enqueued_at() {
                holders.push((enqueued_at, offers.clone()));
            }
        }
        holders.sort_by_key(|(enqueued_at, _)| *enqueued_at);
        for (_, offers) in holders {
            let mut recalled = offers.recall_until(|_| false);
            if !recalled.is_empty() {
                let oldest = recalled.remove(0);
                self.offer_again(&offers, recalled);
                debug!("{} was offered to a busy worker; an idle one takes it back", oldest.summary);
                return Some(oldest);
            }
        }
        None
    }

    /// Takes back every offer from the worker that holds the oldest one behind a request it has
    /// been on for `stale_after`. The oldest is returned; the rest go to the front of the
    /// queue, for the next worker that looks, rather than back behind the slow request.
    pub(super) fn recall_stale_offers(&self, now: Instant, taker: Option<&Offers>) -> Option<Job> {
        let stale_after = self.stale_after();
        let holder = self
            .offers
            .borrow()
            .iter()
            .filter(|offers| taker.is_none_or(|taker| !std::ptr::eq(Rc::as_ptr(offers), taker)))
            .filter_map(|offers| offers.stale_since(now, stale_after).map(|enqueued_at| (enqueued_at, offers.clone())))
            .min_by_key(|(enqueued_at, _)| *enqueued_at)
            .map(|(_, offers)| offers)?;
        let mut recalled = holder.recall_until(|_| false);
        if recalled.is_empty() {
            // The worker took them all meanwhile: it is not stuck after all.
            return None;
        }
        let oldest = recalled.remove(0);
        debug!("{} was offered to a busy worker on a slow request; another worker takes it", oldest.summary);
        self.requeue_front(recalled);
        Some(oldest)
    }

    /// Takes back the offer of the job whose state is `state`, unless its worker has taken
    /// it; the job is dropped, cancelled, and newer offers that came back with it are offered
    /// again. Returns whether it came back.
    pub fn withdraw_offer(&self, state: &Rc<Cell<JobState>>) -> bool {
        let holder = self.offers.borrow().iter().find(|offers| offers.holds(state)).cloned();
        let Some(offers) = holder else {
            return false;
        };
        let (withdrawn, others): (Vec<Job>, Vec<Job>) = offers
            .recall_until(|job| Rc::ptr_eq(&job.state, state))
            .into_iter()
            .partition(|job| Rc::ptr_eq(&job.state, state));
        self.offer_again(&offers, others);
        for job in &withdrawn {
            job.state.set(JobState::Cancelled);
        }
        !withdrawn.is_empty()
    }

    /// Offers recalled jobs to the same worker again, oldest first; any it cannot take go back
    /// to the front of the queue.
    fn offer_again(&self, offers: &Offers, jobs: Vec<Job>) {
        let mut refused = Vec::new();
        for job in jobs {
            if let Err(job) = offers.make(job) {
                refused.push(job);
            }
        }
        self.requeue_front(refused);
    }

    /// Puts recalled jobs back at the front of the queue, oldest first.
    pub fn requeue_front(&self, jobs: Vec<Job>) {
        for job in jobs.into_iter().rev() {
            self.return_unstarted(job);
        }
    }
}

#[cfg(test)]
mod tests {
    use maitred_shm::WorkerEnd;

    use super::super::job::tests::job;
    use super::super::tests::{busy_with, offers_of, take_now};
    use super::super::Next;
    use super::*;

    /// The worker, done with the request before, takes its next one; the lobby counts the
    /// oldest offer as that one.
    fn worker_takes(offers: &Offers, worker: &WorkerEnd) -> Job {
        worker.take_next(&mut Vec::new()).unwrap().unwrap();
        offers.take_accepted().unwrap().job
    }

    #[test]
    fn an_idle_worker_takes_back_the_oldest_offer_and_the_busy_one_keeps_the_rest() {
        let seating = Seating::default();
        let (newer, _) = offers_of(&seating);
        let (older, _) = offers_of(&seating);
        let (a, _ra) = job("a");
        std::thread::sleep(std::time::Duration::from_millis(1));
        let (b, _rb) = job("b");
        let (c, _rc) = job("c");
        assert!(older.make(a).is_ok());
        assert!(older.make(b).is_ok());
        assert!(newer.make(c).is_ok());
        assert_eq!(take_now(&seating).frame, b"a");
        assert_eq!(older.len(), 1, "b is offered to its worker again");
        assert_eq!(seating.queued(), 0);
        assert_eq!(take_now(&seating).frame, b"b");
        assert_eq!(take_now(&seating).frame, b"c");
        assert!(matches!(seating.next(), Next::Later(_)));
    }

    #[test]
    fn a_connection_withdraws_its_offer_unless_the_worker_took_it() {
        let seating = Seating::default();
        let (offers, worker) = offers_of(&seating);
        let (a, _ra) = job("a");
        let (b, _rb) = job("b");
        let (state_a, state_b) = (a.state.clone(), b.state.clone());
        assert!(offers.make(a).is_ok());
        assert!(offers.make(b).is_ok());
        assert_eq!(state_a.get(), JobState::Offered);
        // Withdrawing the older takes the newer back on the way: it is offered again.
        assert!(seating.withdraw_offer(&state_a));
        assert_eq!((state_a.get(), state_b.get()), (JobState::Cancelled, JobState::Offered));
        assert_eq!(offers.len(), 1);
        assert_eq!(worker_takes(&offers, &worker).frame, b"b");
        offers.answered().unwrap();

        let (c, _rc) = job("c");
        let state_c = c.state.clone();
        assert!(offers.make(c).is_ok());
        worker_takes(&offers, &worker);
        assert!(!seating.withdraw_offer(&state_c));
        assert_eq!(state_c.get(), JobState::Seated);
    }

    #[test]
    fn offers_behind_a_request_held_for_stale_after_go_to_the_next_worker_that_looks() {
        let seating = Seating::default();
        let (slow, _worker) = offers_of(&seating);
        let _answers = busy_with(&slow, "slow", &["a", "b"]);
        let (c, _rc) = job("c");
        seating.submit(c);
        let later = Instant::now() + seating.stale_after();
        // Looking for work, the next worker takes the oldest offer; the other comes back to the
        // front of the queue, ahead of what came after it, rather than behind the slow request.
        assert_eq!(seating.take_oldest(later, None).unwrap().frame, b"a");
        assert!(slow.is_empty());
        assert_eq!(seating.take_oldest(later, None).unwrap().frame, b"b");
        assert_eq!(seating.take_oldest(later, None).unwrap().frame, b"c");
    }

    #[test]
    fn a_request_is_slow_next_to_the_typical_one() {
        let seating = Seating::default();
        assert_eq!(seating.stale_after(), offer::STALE_AFTER);
        seating.answered_in(Duration::from_micros(30));
        assert_eq!(seating.stale_after(), offer::STALE_AFTER, "no shorter than the floor");
        for _ in 0..100 {
            seating.answered_in(Duration::from_millis(20));
        }
        let stale_after = seating.stale_after().as_secs_f64();
        assert!((0.079..=0.080).contains(&stale_after), "{stale_after}");
        // One slow request moves it by a sixteenth of the difference.
        seating.answered_in(Duration::from_secs(2));
        assert!(seating.stale_after() < Duration::from_millis(600));
    }

    #[test]
    fn offers_behind_a_fast_request_stay_with_their_worker() {
        let seating = Seating::default();
        let (busy, _worker) = offers_of(&seating);
        let _answers = busy_with(&busy, "fast", &["a"]);
        let (b, _rb) = job("b");
        seating.submit(b);
        assert_eq!(seating.take_oldest(Instant::now(), None).unwrap().frame, b"b");
        assert_eq!(busy.len(), 1);
    }
}
