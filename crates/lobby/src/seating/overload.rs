//! Past capacity: which requests the queue still serves (docs/TUNING.md, "Overload").
//!
//! A request is served only while it can still be answered in time. In time means within its
//! client's patience: `--request-deadline` when it is set, counted from when a trusted proxy
//! received the request (`X-Request-Start`) or else from when the lobby queued it; otherwise the
//! patience this module learns from the clients that gave up while their requests waited (the
//! median wait at which they left, once `LEARN_FROM` have within `WINDOW`).
//!
//! - A request that has waited its whole deadline is answered 503 (`Deadline`).
//! - Under `--queue-policy adaptive` (the default), a request that has waited more than half
//!   the patience when a worker would take it is answered 503 with Retry-After (`Overload`):
//!   half for the queue, half left for the application and the answer, as CoDel keeps a
//!   standing queue at a target sojourn (here set by the clients, not fixed).
//! - With no deadline set and no client seen leaving, nothing is shed: a standing queue of
//!   patient clients (S1, S4) is not overload, and is served in arrival order.
//!
//! Learned patience stays in force while requests are shed for it, and lapses `WINDOW` after
//! the last client left or request was shed for it: once the overload ends, the queue drains
//! under the target and the queue is a plain FIFO again.
//!
//! A leaf: the queue holds it and the connections report to it; it imports nothing of theirs.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How recent the clients that left must be for their patience to count, and how long learned
/// patience stays in force after the last sign of overload.
const WINDOW: Duration = Duration::from_secs(10);
/// How many clients must have left within `WINDOW` before their patience is learned: a few
/// impatient clients (a scanner, a health check with a short timeout) do not make overload.
const LEARN_FROM: usize = 5;

/// Why a request was dropped or refused instead of served, as `maitred_shed_total` labels it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShedReason {
    /// Its client left while it waited: dropped, never seated.
    Abandoned,
    /// It waited more than half its clients' patience (`--queue-policy adaptive`): 503.
    Overload,
    /// It used up `--request-deadline`: 503.
    Deadline,
    /// It waited `--queue-timeout`: 503.
    QueueTimeout,
}

impl ShedReason {
    pub const ALL: [ShedReason; 4] =
        [ShedReason::Abandoned, ShedReason::Overload, ShedReason::Deadline, ShedReason::QueueTimeout];

    pub fn label(self) -> &'static str {
        match self {
            ShedReason::Abandoned => "abandoned",
            ShedReason::Overload => "overload",
            ShedReason::Deadline => "deadline",
            ShedReason::QueueTimeout => "queue_timeout",
        }
    }
}

/// What the settings say about overload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// `--queue-policy adaptive`: shed what cannot be answered in time; `fifo`: serve all.
    pub adaptive: bool,
    /// `--request-deadline`.
    pub deadline: Option<Duration>,
}

/// A request the queue will not serve, and what to tell its client.
pub struct Verdict {
    pub reason: ShedReason,
    /// The sentence for the 503 and the log.
    pub detail: String,
    /// Retry-After, in seconds.
    pub retry_after: u64,
}

#[derive(Default)]
pub struct Overload {
    policy: Cell<Policy>,
    /// When recent clients left, and how long their requests had waited then; oldest first.
    left: RefCell<VecDeque<(Instant, Duration)>>,
    /// The patience learned from them, and until when it is in force.
    learned: Cell<Option<(Duration, Instant)>>,
    shed: [Cell<u64>; ShedReason::ALL.len()],
}

impl Overload {
    pub fn configure(&self, policy: Policy) {
        self.policy.set(policy);
    }

    /// Counts a request dropped or refused for `reason` outside `verdict` (a client that left,
    /// `--queue-timeout`).
    pub fn count(&self, reason: ShedReason) {
        let counter = &self.shed[reason as usize];
        counter.set(counter.get() + 1);
    }

    /// A client left at `now` while its request waited, after `waited` (the upstream wait
    /// included).
    pub fn left(&self, now: Instant, waited: Duration) {
        self.count(ShedReason::Abandoned);
        let mut left = self.left.borrow_mut();
        left.push_back((now, waited));
        while left.front().is_some_and(|(at, _)| now.duration_since(*at) > WINDOW) {
            left.pop_front();
        }
        if left.len() >= LEARN_FROM {
            let mut waits: Vec<Duration> = left.iter().map(|(_, waited)| *waited).collect();
            waits.sort_unstable();
            self.learned.set(Some((waits[waits.len() / 2], now + WINDOW)));
        }
    }

    /// How long clients wait for an answer now, if known: `--request-deadline`, or the
    /// patience learned from clients that left, while it is in force.
    pub fn patience(&self, now: Instant) -> Option<Duration> {
        self.policy.get().deadline.or_else(|| self.learned_patience(now))
    }

    fn learned_patience(&self, now: Instant) -> Option<Duration> {
        match self.learned.get() {
            Some((patience, until)) if now < until => Some(patience),
            _ => None,
        }
    }

    /// Whether a request that has waited `age` (the upstream wait included) is still served;
    /// the verdict on one that is not, counted.
    pub fn verdict(&self, now: Instant, age: Duration) -> Option<Verdict> {
        let policy = self.policy.get();
        if let Some(deadline) = policy.deadline.filter(|deadline| age >= *deadline) {
            self.count(ShedReason::Deadline);
            return Some(Verdict {
                reason: ShedReason::Deadline,
                detail: format!(
                    "the request had waited {:.2} s, its whole --request-deadline ({} s)",
                    age.as_secs_f64(),
                    deadline.as_secs_f64()
                ),
                retry_after: seconds_up(deadline / 2),
            });
        }
        if !policy.adaptive {
            return None;
        }
        let patience = self.patience(now)?;
        let target = patience / 2;
        if age <= target {
            return None;
        }
        self.count(ShedReason::Overload);
        let source = match policy.deadline {
            Some(_) => "--request-deadline",
            None => {
                // Shedding for learned patience keeps it in force while the overload lasts.
                self.learned.set(Some((patience, now + WINDOW)));
                "the wait at which clients gave up"
            }
        };
        Some(Verdict {
            reason: ShedReason::Overload,
            detail: format!(
                "over capacity: the request had waited {:.2} s, more than half of {:.2} s ({source}), and could no \
                 longer be answered in time",
                age.as_secs_f64(),
                patience.as_secs_f64()
            ),
            retry_after: seconds_up(target),
        })
    }

    /// Requests shed so far, by reason, in `ShedReason::ALL`'s order.
    pub fn counts(&self) -> [u64; ShedReason::ALL.len()] {
        std::array::from_fn(|index| self.shed[index].get())
    }
}

/// Whole seconds, rounded up, at least one: Retry-After's unit.
fn seconds_up(duration: Duration) -> u64 {
    duration.as_secs_f64().ceil().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adaptive(deadline: Option<Duration>) -> Overload {
        let overload = Overload::default();
        overload.configure(Policy { adaptive: true, deadline });
        overload
    }

    #[test]
    fn patient_clients_are_never_shed_however_long_they_wait() {
        let overload = adaptive(None);
        let now = Instant::now();
        assert!(overload.verdict(now, Duration::from_secs(600)).is_none());
        // A few impatient clients are not overload either.
        for _ in 0..LEARN_FROM - 1 {
            overload.left(now, Duration::from_millis(100));
        }
        assert!(overload.verdict(now, Duration::from_secs(600)).is_none());
        assert_eq!(overload.counts(), [4, 0, 0, 0]);
    }

    #[test]
    fn once_clients_give_up_the_wait_past_half_their_patience_is_shed() {
        let overload = adaptive(None);
        let start = Instant::now();
        for wait_ms in [900, 1_000, 1_000, 1_050, 1_100] {
            overload.left(start, Duration::from_millis(wait_ms));
        }
        assert_eq!(overload.patience(start), Some(Duration::from_millis(1_000)));
        assert!(overload.verdict(start, Duration::from_millis(499)).is_none());
        let shed = overload.verdict(start, Duration::from_millis(501)).unwrap();
        assert_eq!((shed.reason, shed.retry_after), (ShedReason::Overload, 1));
        assert!(shed.detail.contains("more than half of 1.00 s"), "{}", shed.detail);
        // Shedding keeps the learned patience in force; without it, it lapses.
        let later = start + WINDOW - Duration::from_secs(1);
        assert!(overload.verdict(later, Duration::from_millis(600)).is_some());
        assert_eq!(overload.patience(later + Duration::from_secs(5)), Some(Duration::from_millis(1_000)));
        assert_eq!(overload.patience(later + WINDOW + Duration::from_secs(1)), None);
        assert!(overload.verdict(later + WINDOW + Duration::from_secs(1), Duration::from_secs(5)).is_none());
        assert_eq!(overload.counts(), [5, 2, 0, 0]);
    }

    #[test]
    fn a_deadline_sheds_what_used_it_up_and_sets_the_patience() {
        let fifo = Overload::default();
        fifo.configure(Policy { adaptive: false, deadline: Some(Duration::from_secs(2)) });
        let now = Instant::now();
        assert!(fifo.verdict(now, Duration::from_millis(1_500)).is_none());
        let shed = fifo.verdict(now, Duration::from_secs(2)).unwrap();
        assert_eq!((shed.reason, shed.retry_after), (ShedReason::Deadline, 1));
        let overload = adaptive(Some(Duration::from_secs(2)));
        assert_eq!(overload.verdict(now, Duration::from_millis(1_500)).unwrap().reason, ShedReason::Overload);
        assert!(overload.verdict(now, Duration::from_millis(900)).is_none());
        assert_eq!(overload.counts(), [0, 1, 0, 0]);
        assert_eq!(fifo.counts(), [0, 0, 1, 0]);
    }

    #[test]
    fn clients_that_left_long_ago_are_forgotten() {
        let overload = adaptive(None);
        let start = Instant::now();
        for _ in 0..LEARN_FROM - 1 {
            overload.left(start, Duration::from_secs(1));
        }
        overload.left(start + WINDOW + Duration::from_secs(1), Duration::from_secs(1));
        assert_eq!(overload.patience(start + WINDOW + Duration::from_secs(1)), None);
    }
}
