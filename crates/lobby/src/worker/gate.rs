//! A WSGI worker's second thread, and any after it, given a request only while the worker has
//! CPU to spare (issue 47, item 9; docs/DEPLOY.md, "Threads or workers"). Python runs one
//! thread at a time (the GIL): while a thread's request computes, a second request seated at
//! the same worker only waits for the GIL, and makes the first wait for it in turn each time it
//! comes back from I/O. So an idle thread takes a request while its worker's other threads are
//! idle; or while one more request like those they run would keep the worker's demand for CPU
//! under `CPU_LIMIT` of a core (they wait on I/O); or while one of them is on a request slow
//! next to the typical one (then the threads share the GIL, as gunicorn's do, rather than a
//! short request waiting for a long one's end). Otherwise the request is left to the other
//! workers, or to this worker's thread that is about to finish.
//!
//! The demand is how many of the worker's threads are runnable (state R: on a core, or waiting
//! for one), sampled from /proc/PID/task/TID/stat and smoothed over `SMOOTHING`. Not the CPU
//! time the worker used: on a machine whose cores are shared (other workers, other builds, a
//! hypervisor's other guests), a thread that computes gets a fraction of a core, and its CPU
//! time over wall time reads as spare CPU. A first cut measured that (`clock_getcpuclockid`),
//! and under CI's load 24 of 32 requests that compute were let in beside another. A thread
//! waiting for the GIL, a socket or a sleep is not runnable (S), whatever the machine's load.
//!
//! A sample is one pread(2) of each thread's stat, on descriptors opened when the threads are
//! listed (about 5 µs each: health::LOOK_AFTER_IDLE), taken only while a request waits and
//! another thread of the worker is busy, and at most once per `LOOK_AGAIN / 2`: at most 6
//! threads × 5 µs a millisecond, 3% of a core while a threaded worker is busy with a queue behind
//! it, and nothing otherwise.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use super::health::ProcStat;
use super::scoreboard::Card;

/// The demand past which a worker has no CPU to spare: near one core, its threads queue for
/// the GIL.
pub const CPU_LIMIT: f64 = 0.9;

/// The time constant of the smoothed demand: ten samples at `LOOK_AGAIN`, so that a request
/// that computes half the time reads as half a core within a few tens of milliseconds, and one
/// sample moves it little.
const SMOOTHING: Duration = Duration::from_millis(20);

/// How often an idle thread looks again at its worker's demand while a request waits and its
/// other threads are busy.
pub const LOOK_AGAIN: Duration = Duration::from_millis(2);

/// How long a list of the worker's threads is used before it is read again: an application may
/// start threads of its own (a pool, a client's background thread), and their CPU counts too.
const RELIST: Duration = Duration::from_secs(1);

/// The stat files of a worker's threads, and when they were listed.
struct Threads {
    stats: Vec<ProcStat>,
    listed: Option<Instant>,
}

/// How many of a worker's threads want a core, sampled as its threads ask.
pub struct CpuDemand {
    pid: i32,
    threads: RefCell<Threads>,
    /// When the last sample was taken.
    sampled: Cell<Option<Instant>>,
    /// The runnable threads, smoothed; None until sampled. Where /proc cannot be read no
    /// thread is seen runnable, and the worker's threads take requests freely, as every thread
    /// did before this gate.
    demand: Cell<Option<f64>>,
}

impl CpuDemand {
    pub fn new(pid: i32) -> CpuDemand {
        CpuDemand {
            pid,
            threads: RefCell::new(Threads { stats: Vec::new(), listed: None }),
            sampled: Cell::new(None),
            demand: Cell::new(None),
        }
    }

    /// How many of the worker's threads are runnable now.
    fn runnable(&self, now: Instant) -> usize {
        let mut threads = self.threads.borrow_mut();
        if threads.listed.is_none_or(|listed| now.saturating_duration_since(listed) >= RELIST) {
            let listing = std::fs::read_dir(format!("/proc/{}/task", self.pid));
            threads.stats = listing
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
                .map(|thread| ProcStat::of_thread(self.pid, thread))
                .collect();
            threads.listed = Some(now);
        }
        let states: Vec<Option<u8>> = threads.stats.iter().map(ProcStat::state).collect();
        if states.contains(&None) {
            // A thread has ended: list them again at the next sample.
            threads.listed = None;
        }
        states.iter().filter(|state| **state == Some(b'R')).count()
    }

    /// Samples the worker's runnable threads into the smoothed demand, unless the last sample
    /// is less than `LOOK_AGAIN / 2` old (threads waiting together ask at once).
    fn sample(&self, now: Instant) {
        let since = self.sampled.get().map(|at| now.saturating_duration_since(at));
        if since.is_some_and(|since| since < LOOK_AGAIN / 2) {
            return;
        }
        let runnable = self.runnable(now) as f64;
        let demand = match (self.demand.get(), since) {
            (Some(last), Some(since)) => {
                let weight = 1.0 - (-since.as_secs_f64() / SMOOTHING.as_secs_f64()).exp();
                last + (runnable - last) * weight
            }
            _ => runnable,
        };
        self.demand.set(Some(demand));
        self.sampled.set(Some(now));
    }

    /// Whether one more request, like those `busy` threads run, would keep the worker's demand
    /// under `CPU_LIMIT`.
    fn has_room(&self, busy: usize, now: Instant) -> bool {
        self.sample(now);
        let demand = self.demand.get().unwrap_or(0.0);
        demand * (busy + 1) as f64 / busy as f64 <= CPU_LIMIT
    }
}

/// Whether an idle thread of the worker whose card is `card` may take a request now. `slow` is
/// how long a request may run before it counts as slow next to the typical one
/// (`Seating::stale_after`).
pub fn may_take(card: &Card, cpu: &CpuDemand, slow: Duration, now: Instant) -> bool {
    let Some((_, since)) = card.longest_request() else {
        // Its other threads are idle.
        return true;
    };
    if now.saturating_duration_since(since) >= slow {
        return true;
    }
    cpu.has_room(card.busy_threads(), now)
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;
    use crate::worker::scoreboard::Phase;

    fn card_busy_since(since: Instant) -> Card {
        let card = Card::new(1, Phase::Serve);
        card.set_threads(2);
        card.begin(0, "GET / HTTP/1.1".into());
        card.threads.borrow_mut()[0].as_mut().expect("busy").1 = since;
        card
    }

    /// A child process killed when the test ends, passed or not.
    struct Child(std::process::Child);

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_thread_takes_a_request_while_its_worker_waits_on_io_and_not_while_it_computes() {
        let spawn = |script: &str| {
            Child(Command::new("sh").args(["-c", script]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap())
        };
        // The spinner is runnable whether or not it has a core, so the measure does not depend
        // on the load of the cores the tests share; the sleeper, once it sleeps.
        let spinner = spawn("while :; do :; done");
        let sleeper = spawn("exec sleep 30");
        let sleeping = ProcStat::open(sleeper.0.id() as i32);
        let began = Instant::now();
        while sleeping.state() != Some(b'S') {
            assert!(began.elapsed() < Duration::from_secs(30), "the sleeper never slept");
            std::thread::sleep(LOOK_AGAIN);
        }
        let card = card_busy_since(Instant::now());
        let slow = Duration::from_secs(60);
        let computing = CpuDemand::new(spinner.0.id() as i32);
        let waiting = CpuDemand::new(sleeper.0.id() as i32);
        for _ in 0..10 {
            let now = Instant::now();
            assert!(!may_take(&card, &computing, slow, now), "a worker that computes has no CPU to spare");
            assert!(may_take(&card, &waiting, slow, now), "a worker that waits has CPU to spare");
            std::thread::sleep(LOOK_AGAIN);
        }
    }

    #[test]
    fn a_thread_takes_a_request_when_its_worker_is_idle_or_on_a_slow_one_whatever_its_demand() {
        let cpu = CpuDemand::new(std::process::id() as i32);
        cpu.demand.set(Some(1.0));
        cpu.sampled.set(Some(Instant::now()));
        let idle = Card::new(1, Phase::Serve);
        idle.set_threads(2);
        assert!(may_take(&idle, &cpu, Duration::from_secs(1), Instant::now()));
        let slow = Duration::from_millis(5);
        let on_a_slow_one = card_busy_since(Instant::now() - slow * 2);
        assert!(may_take(&on_a_slow_one, &cpu, slow, Instant::now()));
    }

    #[test]
    fn one_sample_moves_the_demand_by_its_share_of_the_smoothing_time() {
        let cpu = CpuDemand::new(std::process::id() as i32);
        let now = Instant::now();
        cpu.demand.set(Some(1.0));
        cpu.sampled.set(Some(now));
        // This test's own thread is the one runnable thread of a process that waits; the other
        // tests, run beside it, may be too: the sample is from 1 to their number.
        cpu.sample(now + LOOK_AGAIN);
        let demand = cpu.demand.get().unwrap();
        assert!(demand >= 0.9, "one sample {LOOK_AGAIN:?} after the last took the demand from 1 to {demand}");
        cpu.sample(now + LOOK_AGAIN + LOOK_AGAIN / 4);
        assert_eq!(cpu.demand.get(), Some(demand), "threads that ask together share one sample");
    }

    #[test]
    fn one_more_request_is_let_in_while_it_keeps_the_worker_under_the_limit() {
        let cpu = CpuDemand::new(std::process::id() as i32);
        let now = Instant::now();
        let room = |demand: f64, busy: usize| {
            cpu.demand.set(Some(demand));
            cpu.sampled.set(Some(now));
            cpu.has_room(busy, now)
        };
        assert!(room(0.1, 1) && room(0.2, 3), "threads that wait on I/O");
        assert!(!room(0.5, 1), "one that computes half the time: a second would take the worker to a core");
        assert!(!room(0.7, 3));
    }
}
