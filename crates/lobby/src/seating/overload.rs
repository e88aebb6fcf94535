//! Past capacity: which requests the queue still serves (docs/TUNING.md, "Overload").
//!
//! A request is served only while it can still be answered in time. In time means within its
//! client's patience: `--request-deadline` when it is set, counted from when a trusted proxy
//! received the request (`X-Request-Start`) or else from when the lobby queued it; otherwise the
//! patience this module learns from the clients that gave up while their requests waited.
//!
//! - A request that has waited its whole deadline is answered 503 (`Deadline`).
//! - Under `--queue-policy adaptive` (the default), a request that has waited more than half
//!   the patience when a worker would take it is answered 503 with Retry-After (`Overload`):
//!   half for the queue, half left for the application and the answer, as CoDel keeps a
//!   standing queue at a target sojourn (here set by the clients, not fixed).
//! - With no deadline set and no patience learned, nothing is shed: a standing queue of patient
//!   clients (S1, S4) is not overload, and is served in arrival order.
//!
//! Patience is learned only from clients that leave while the server is past its capacity:
//! the queue has not drained for `SUSTAINED`, and over that time, in each of its halves, more
//! requests joined it than workers took from it (by at least a tenth), so that its wait kept
//! growing. A closed-loop load (wrk, a proxy's pool) keeps a standing queue whose wait does not
//! grow: its clients leaving at the end of a run teach nothing, nor does the step its opening
//! burst makes (all its connections' first requests at once), which lies in one half only. (A
//! run of wrk started right after another, at 1,000 connections, once took its opening step,
//! with the last run's departures still being noticed, for overload: 66,380 of its 69,757
//! answers were 503s, in one run of five.) Departures closer together than half the time between two
//! arrivals are one event, counted once (their median wait): clients that give up leave at the
//! pace they came, while a program's exit, a proxy's reload or a balancer recycling its
//! connections closes many at once, with the waits their requests happened to have, which say
//! nothing of how long clients wait. The patience is the median of
//! the last `LEARN_FROM` or more such events within `WINDOW`.
//!
//! Learned patience lapses once the overload has ended: a worker found the queue empty, and
//! the queue has stayed short of overload for `SUSTAINED` since.
//!
//! A leaf: the queue holds it and the connections report to it; it imports nothing of theirs.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How recent the departures must be for their patience to count.
const WINDOW: Duration = Duration::from_secs(10);
/// How many separate departures must have happened within `WINDOW`, while overloaded, before
/// their patience is learned: a few impatient clients (a scanner, a health check with a short
/// timeout) do not make overload.
const LEARN_FROM: usize = 5;
/// How long arrivals must have outrun the workers, the queue never draining, for the server to
/// be past its capacity; and how long the queue must stay short of that, once drained, for
/// learned patience to lapse.
pub const SUSTAINED: Duration = Duration::from_secs(1);
/// The arrival record's resolution: `SUSTAINED` in ten ticks.
const TICK: Duration = Duration::from_millis(100);
const TICKS: usize = 10;
/// Departures closer to the one before than half the time between two arrivals are one event:
/// clients that give up one by one leave at the pace they came, each its patience after its
/// arrival, while a program's exit closes all its connections faster than any of them came (the
/// lobby notices them within microseconds of each other, or a few hundred on a busy machine).
/// Bounded: at least this, at thousands of arrivals a second...
const SAME_INSTANT_LEAST: Duration = Duration::from_micros(200);
/// ... and at most this, at a few a second.
const SAME_INSTANT_MOST: Duration = Duration::from_millis(100);

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

/// The patience learned, and from what: for the shed log line and status.json.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Learned {
    pub patience: Duration,
    /// Separate departures it was learned from (a burst counted once).
    pub departures: usize,
    /// The clients that left in them.
    pub clients: usize,
    /// From the first of them to the last.
    pub over: Duration,
}

/// Clients that left at one instant.
struct Departure {
    first_at: Instant,
    last_at: Instant,
    waits: Vec<Duration>,
}

impl Departure {
    fn median_wait(&self) -> Duration {
        let mut waits = self.waits.clone();
        waits.sort_unstable();
        waits[waits.len() / 2]
    }
}

/// Requests that joined the queue and that workers took from it, per `TICK`, over `SUSTAINED`.
#[derive(Default)]
struct Flow {
    origin: Option<Instant>,
    /// The tick `joined` and `taken` hold last.
    tick: u64,
    joined: [u32; TICKS],
    taken: [u32; TICKS],
}

impl Flow {
    /// The slot of `now`'s tick, the slots of ticks since the last one emptied.
    fn slot(&mut self, now: Instant) -> usize {
        let origin = *self.origin.get_or_insert(now);
        let tick = (now.saturating_duration_since(origin).as_nanos() / TICK.as_nanos()) as u64;
        if tick > self.tick {
            for skipped in (self.tick + 1..=tick).take(TICKS) {
                let slot = skipped as usize % TICKS;
                self.joined[slot] = 0;
                self.taken[slot] = 0;
            }
            self.tick = tick;
        }
        self.tick as usize % TICKS
    }

    /// Requests that joined and were taken over the last `SUSTAINED`.
    fn totals(&mut self, now: Instant) -> (u32, u32) {
        self.slot(now);
        (self.joined.iter().sum(), self.taken.iter().sum())
    }

    /// What `totals` counts, over each half of `SUSTAINED`, the older first.
    fn halves(&mut self, now: Instant) -> [(u32, u32); 2] {
        let newest = self.slot(now);
        let half = |ages: std::ops::Range<usize>| {
            ages.map(|age| (newest + TICKS - age) % TICKS)
                .fold((0, 0), |(joined, taken), slot| (joined + self.joined[slot], taken + self.taken[slot]))
        };
        [half(TICKS / 2..TICKS), half(0..TICKS / 2)]
    }
}

#[derive(Default)]
pub struct Overload {
    policy: Cell<Policy>,
    flow: RefCell<Flow>,
    /// When a worker last found the queue empty.
    drained_at: Cell<Option<Instant>>,
    /// Since when the queue has been short of overload, once drained (None: it is overloaded,
    /// or has not drained since).
    calm_since: Cell<Option<Instant>>,
    /// Recent departures while overloaded; oldest first.
    departures: RefCell<VecDeque<Departure>>,
    learned: Cell<Option<Learned>>,
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

    /// A request joined the queue at `at`: no seat was free.
    pub fn joined(&self, at: Instant) {
        let mut flow = self.flow.borrow_mut();
        let slot = flow.slot(at);
        flow.joined[slot] += 1;
    }

    /// A worker took a queued request at `now`.
    pub fn taken(&self, now: Instant) {
        let mut flow = self.flow.borrow_mut();
        let slot = flow.slot(now);
        flow.taken[slot] += 1;
    }

    /// A worker found the queue empty at `now`: whatever came, the workers kept up with it.
    pub fn drained(&self, now: Instant) {
        self.drained_at.set(Some(now));
        if self.calm_since.get().is_none() {
            self.calm_since.set(Some(now));
        }
    }

    /// Whether the server is past its capacity at `now`: the queue has not drained for
    /// `SUSTAINED`, and in each half of it more joined than workers took, by a tenth at least,
    /// so its wait kept growing.
    pub fn overloaded(&self, now: Instant) -> bool {
        let undrained = self.drained_at.get().is_some_and(|at| now.saturating_duration_since(at) >= SUSTAINED);
        if !undrained {
            return false;
        }
        let grew = |(joined, taken): (u32, u32), least: u32| {
            let excess = joined.saturating_sub(taken);
            excess >= least && excess * 10 >= joined
        };
        let [older, newer] = self.flow.borrow_mut().halves(now);
        let whole = (older.0 + newer.0, older.1 + newer.1);
        let overloaded = grew(whole, LEARN_FROM as u32) && grew(older, 1) && grew(newer, 1);
        if overloaded {
            self.calm_since.set(None);
        }
        overloaded
    }

    /// A client left at `now` while its request waited, after `waited` (the upstream wait
    /// included).
    pub fn left(&self, now: Instant, waited: Duration) {
        self.count(ShedReason::Abandoned);
        if !self.overloaded(now) {
            return;
        }
        let (joined, _) = self.flow.borrow_mut().totals(now);
        let same_instant = (SUSTAINED / joined.max(1) / 2).clamp(SAME_INSTANT_LEAST, SAME_INSTANT_MOST);
        let mut departures = self.departures.borrow_mut();
        match departures.back_mut() {
            Some(last) if now.saturating_duration_since(last.last_at) < same_instant => {
                last.last_at = now;
                last.waits.push(waited);
            }
            _ => departures.push_back(Departure { first_at: now, last_at: now, waits: vec![waited] }),
        }
        while departures.front().is_some_and(|departure| now.saturating_duration_since(departure.last_at) > WINDOW) {
            departures.pop_front();
        }
        if departures.len() >= LEARN_FROM {
            let mut waits: Vec<Duration> = departures.iter().map(Departure::median_wait).collect();
            waits.sort_unstable();
            self.learned.set(Some(Learned {
                patience: waits[waits.len() / 2],
                departures: departures.len(),
                clients: departures.iter().map(|departure| departure.waits.len()).sum(),
                over: now.saturating_duration_since(departures[0].first_at),
            }));
        }
    }

    /// How long clients wait for an answer now, if known: `--request-deadline`, or the
    /// patience learned from clients that left, while it is in force.
    pub fn patience(&self, now: Instant) -> Option<Duration> {
        self.policy.get().deadline.or_else(|| self.learned(now).map(|learned| learned.patience))
    }

    /// The patience learned, while in force: it lapses once the queue has drained and stayed
    /// short of overload for `SUSTAINED`.
    pub fn learned(&self, now: Instant) -> Option<Learned> {
        let learned = self.learned.get()?;
        let calm = self.calm_since.get().is_some_and(|since| now.saturating_duration_since(since) >= SUSTAINED);
        if calm && !self.overloaded(now) {
            self.learned.set(None);
            self.departures.borrow_mut().clear();
            return None;
        }
        Some(learned)
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
        let learned = match policy.deadline {
            Some(_) => None,
            None => Some(self.learned(now)?),
        };
        let patience = policy.deadline.or(learned.map(|learned| learned.patience))?;
        let target = patience / 2;
        if age <= target {
            return None;
        }
        let source = match learned {
            None => "--request-deadline".to_string(),
            Some(learned) => format!(
                "the median wait at which clients gave up: {} of them, in {} separate departures over {:.1} s of \
                 overload",
                learned.clients,
                learned.departures,
                learned.over.as_secs_f64()
            ),
        };
        self.count(ShedReason::Overload);
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

    const MS: Duration = Duration::from_millis(1);

    /// From `from` for `span`, every 10 ms: two requests join the queue and workers take one (an
    /// open loop at twice the capacity), or take both (`twice: false`: a closed loop).
    fn flow(overload: &Overload, from: Instant, span: Duration, twice: bool) {
        let mut at = from;
        while at < from + span {
            overload.joined(at);
            overload.joined(at);
            overload.taken(at);
            if !twice {
                overload.taken(at);
            }
            at += 10 * MS;
        }
    }

    /// A queue that drained at `start` and then ran past capacity until `start + span`.
    fn overloaded_until(span: Duration) -> (Overload, Instant) {
        let overload = adaptive(None);
        let start = Instant::now();
        overload.drained(start);
        flow(&overload, start, span, true);
        (overload, start + span)
    }

    #[test]
    fn patient_clients_are_never_shed_however_long_they_wait() {
        let (overload, now) = overloaded_until(Duration::from_secs(3));
        assert!(overload.overloaded(now));
        assert!(overload.verdict(now, Duration::from_secs(600)).is_none());
        // A few impatient clients are not overload either.
        for n in 0..LEARN_FROM as u32 - 1 {
            overload.left(now + n * 5 * MS, Duration::from_millis(100));
        }
        assert!(overload.verdict(now, Duration::from_secs(600)).is_none());
        assert_eq!(overload.counts(), [4, 0, 0, 0]);
    }

    #[test]
    fn past_capacity_spread_departures_teach_patience_and_the_wait_past_half_is_shed() {
        let (overload, now) = overloaded_until(Duration::from_secs(2));
        for (n, wait_ms) in [900, 1_000, 1_000, 1_050, 1_100].into_iter().enumerate() {
            overload.left(now + n as u32 * 3 * MS, Duration::from_millis(wait_ms));
        }
        let now = now + 20 * MS;
        let learned = overload.learned(now).unwrap();
        assert_eq!((learned.patience, learned.departures, learned.clients), (Duration::from_millis(1_000), 5, 5));
        assert_eq!(learned.over, 12 * MS);
        assert!(overload.verdict(now, Duration::from_millis(499)).is_none());
        let shed = overload.verdict(now, Duration::from_millis(501)).unwrap();
        assert_eq!((shed.reason, shed.retry_after), (ShedReason::Overload, 1));
        assert!(shed.detail.contains("more than half of 1.00 s"), "{}", shed.detail);
        assert!(shed.detail.contains("5 of them, in 5 separate departures over 0.0 s"), "{}", shed.detail);
        assert_eq!(overload.counts(), [5, 1, 0, 0]);
    }

    #[test]
    fn a_burst_of_departures_at_one_instant_is_one_departure() {
        // A load generator's exit: every connection closed within microseconds, whatever its
        // request had waited.
        let (overload, now) = overloaded_until(Duration::from_secs(2));
        for n in 0..32u32 {
            overload.left(now + n * Duration::from_micros(10), n * 10 * MS);
        }
        assert_eq!(overload.learned(now + MS), None);
        assert!(overload.verdict(now + MS, Duration::from_secs(60)).is_none());
        // Four more bursts make five departures: one sample each.
        for burst in 1..5u32 {
            for n in 0..10u32 {
                overload.left(now + burst * 50 * MS + n * Duration::from_micros(10), Duration::from_millis(300));
            }
        }
        let learned = overload.learned(now + 300 * MS).unwrap();
        assert_eq!((learned.departures, learned.clients, learned.patience), (5, 72, Duration::from_millis(300)));
    }

    #[test]
    fn departures_from_a_queue_that_does_not_grow_teach_nothing() {
        // A closed loop: as many join as workers take. Its clients leaving, one by one or at its
        // end, are not overload.
        let overload = adaptive(None);
        let start = Instant::now();
        overload.drained(start);
        let end = start + Duration::from_secs(4);
        flow(&overload, start, Duration::from_secs(4), false);
        assert!(!overload.overloaded(end));
        for n in 0..20u32 {
            overload.left(end + n * 5 * MS, Duration::from_millis(60));
        }
        assert_eq!(overload.learned(end + Duration::from_millis(100)), None);
    }

    #[test]
    fn a_closed_loops_opening_burst_is_not_overload() {
        // wrk at 1,000 connections: a thousand first requests at once, then as many join as
        // workers take; the last run's clients, leaving meanwhile, teach nothing.
        let overload = adaptive(None);
        let start = Instant::now();
        overload.drained(start - Duration::from_secs(5));
        for _ in 0..1_000 {
            overload.joined(start);
        }
        flow(&overload, start, Duration::from_secs(2), false);
        for n in 0..20u32 {
            let at = start + SUSTAINED / 2 + n * 40 * MS;
            assert!(!overload.overloaded(at), "at {:?}", at - start);
            overload.left(at, Duration::from_millis(300));
        }
        assert_eq!(overload.learned(start + Duration::from_secs(2)), None);
        // The same step, followed by arrivals that keep outrunning the workers, is overload.
        let (overload, now) = overloaded_until(Duration::from_secs(2));
        overload.joined(now - Duration::from_secs(2));
        assert!(overload.overloaded(now));
    }

    #[test]
    fn departures_from_a_queue_that_drains_between_bursts_teach_nothing() {
        let overload = adaptive(None);
        let mut at = Instant::now();
        for _ in 0..10 {
            overload.drained(at);
            flow(&overload, at, 500 * MS, true);
            at += 500 * MS;
            overload.left(at, Duration::from_millis(200));
        }
        assert_eq!(overload.learned(at), None);
    }

    #[test]
    fn learned_patience_lasts_while_overloaded_and_lapses_once_the_queue_drained_and_stayed_short() {
        let (overload, now) = overloaded_until(Duration::from_secs(2));
        for n in 0..5u32 {
            overload.left(now + n * 3 * MS, Duration::from_secs(1));
        }
        // Overloaded for another 30 s: no timer ends it.
        flow(&overload, now, Duration::from_secs(30), true);
        let later = now + Duration::from_secs(30);
        assert_eq!(overload.patience(later), Some(Duration::from_secs(1)));
        assert!(overload.verdict(later, Duration::from_millis(600)).is_some());
        // The overload ends: the queue drains, and stays short.
        overload.drained(later);
        flow(&overload, later, Duration::from_secs(2), false);
        assert_eq!(overload.patience(later + Duration::from_millis(500)), Some(Duration::from_secs(1)));
        assert_eq!(overload.patience(later + SUSTAINED + MS), None);
        assert!(overload.verdict(later + Duration::from_secs(2), Duration::from_secs(5)).is_none());
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
        let shed = overload.verdict(now, Duration::from_millis(1_500)).unwrap();
        assert_eq!(shed.reason, ShedReason::Overload);
        assert!(shed.detail.contains("(--request-deadline)"), "{}", shed.detail);
        assert!(overload.verdict(now, Duration::from_millis(900)).is_none());
        assert_eq!(overload.counts(), [0, 1, 0, 0]);
        assert_eq!(fifo.counts(), [0, 0, 1, 0]);
    }

    #[test]
    fn departures_long_ago_are_forgotten() {
        let (overload, now) = overloaded_until(Duration::from_secs(15));
        let early = now - Duration::from_secs(13);
        for n in 0..LEARN_FROM as u32 - 1 {
            overload.left(early + n * 3 * MS, Duration::from_secs(1));
        }
        overload.left(now, Duration::from_secs(1));
        assert_eq!(overload.learned(now), None);
    }
}
