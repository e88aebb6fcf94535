//! A WSGI worker's second thread, and any after it, given a request only while the worker has
//! CPU to spare (issue 47, item 9; docs/DEPLOY.md, "Threads or workers"). Python runs one
//! thread at a time (the GIL): while a thread's request computes, a second request seated at
//! the same worker only waits for the GIL, and makes the first wait for it in turn each time it
//! comes back from I/O. So an idle thread takes a request while its worker's other threads are
//! idle; or while one more request like those they run would keep the worker's demand for CPU
//! under `CPU_LIMIT` of a core (they wait on I/O) and the machine's under `CPU_LIMIT` of its
//! CPUs; or while one of them is on a request slow next to the typical one (then the threads
//! share the GIL, as gunicorn's do, rather than a short request waiting for a long one's end).
//! Otherwise the request is left to the other workers, or to this worker's thread that is about
//! to finish.
//!
//! The machine counts because what a worker waits for may be on it: a worker whose requests
//! wait on a PostgreSQL beside it reads as half a core, yet the CPUs are busy with PostgreSQL
//! and the other workers, and a second request only adds a thread that waits for the GIL. With
//! the worker's own measure alone, TechEmpower's Django application (bench/ DB-DJANGO, `-w 2`,
//! 2 cores) served 0.90 as many requests with `--threads 4` as with `--threads 1`, and its tests
//! of twenty queries a request 0.66-0.73; with the machine's too, 1.08, and 1.32-1.35
//! (bench/results/issue47).
//!
//! The demand is how many of the worker's threads are runnable (state R: on a core, or waiting
//! for one), sampled from /proc/PID/task/TID/stat and smoothed over `SMOOTHING`. Not the CPU
//! time the worker used: on a machine whose cores are shared (other workers, other builds, a
//! hypervisor's other guests), a thread that computes gets a fraction of a core, and its CPU
//! time over wall time reads as spare CPU. A first cut measured that (`clock_getcpuclockid`),
//! and under CI's load 24 of 32 requests that compute were let in beside another. A thread
//! waiting for the GIL, a socket or a sleep is not runnable (S), whatever the machine's load.
//!
//! The machine's demand is its runnable threads (the fourth field of /proc/loadavg, less the
//! lobby's own, which is running as it reads), against the CPUs this process may use (its
//! affinity and its cgroup's quota: `available_parallelism`). It is the whole machine's, other
//! containers' too: what they run takes the same cores.
//!
//! A sample is one pread(2) of each thread's stat and one of /proc/loadavg, on descriptors
//! opened beforehand (about 5 µs each: health::LOOK_AFTER_IDLE), taken only while a request
//! waits and another thread of the worker is busy, and at most once per `LOOK_AGAIN / 2`: at
//! most 7 reads × 5 µs a millisecond, 3.5% of a core while a threaded worker is busy with a queue
//! behind it, and nothing otherwise.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::rc::Rc;
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

/// A demand for CPU, smoothed over `SMOOTHING` from samples taken as threads ask, at most once
/// per `LOOK_AGAIN / 2` (threads waiting together ask at once).
#[derive(Default)]
struct Smoothed {
    /// When the last sample was taken.
    sampled: Cell<Option<Instant>>,
    /// None until sampled.
    demand: Cell<Option<f64>>,
}

impl Smoothed {
    fn sample(&self, now: Instant, read: impl FnOnce() -> f64) {
        let since = self.sampled.get().map(|at| now.saturating_duration_since(at));
        if since.is_some_and(|since| since < LOOK_AGAIN / 2) {
            return;
        }
        let runnable = read();
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

    #[cfg(test)]
    fn set(&self, demand: f64, now: Instant) {
        self.demand.set(Some(demand));
        self.sampled.set(Some(now));
    }
}

/// How many of the machine's CPUs are wanted: its runnable threads but the lobby's.
struct MachineDemand {
    /// /proc/loadavg, opened once; None without /proc: then the machine is not looked at.
    loadavg: Option<File>,
    cpus: f64,
    smoothed: Smoothed,
}

impl MachineDemand {
    fn open() -> MachineDemand {
        MachineDemand {
            loadavg: File::open("/proc/loadavg").ok(),
            cpus: std::thread::available_parallelism().map_or(1, usize::from) as f64,
            smoothed: Smoothed::default(),
        }
    }

    fn runnable(&self) -> Option<f64> {
        let mut buf = [0u8; 128];
        let n = self.loadavg.as_ref()?.read_at(&mut buf, 0).ok()?;
        runnable_but_the_reader(&buf[..n])
    }

    /// Whether `more` runnable threads would keep the machine under `CPU_LIMIT` of its CPUs.
    fn has_room(&self, more: f64, now: Instant) -> bool {
        if self.loadavg.is_none() {
            return true;
        }
        self.smoothed.sample(now, || self.runnable().unwrap_or(0.0));
        self.smoothed.demand.get().unwrap_or(0.0) + more <= CPU_LIMIT * self.cpus
    }
}

/// The runnable threads /proc/loadavg counts, less the one reading it: "0.52 0.58 0.59 3/467
/// 12345" holds 2.
fn runnable_but_the_reader(loadavg: &[u8]) -> Option<f64> {
    let field = loadavg.split(|&b| b == b' ').nth(3)?;
    let running = field.split(|&b| b == b'/').next()?;
    let running: f64 = std::str::from_utf8(running).ok()?.parse().ok()?;
    Some((running - 1.0).max(0.0))
}

thread_local! {
    /// The one machine every worker's gate looks at: the lobby runs on one thread.
    static MACHINE: Rc<MachineDemand> = Rc::new(MachineDemand::open());
}

/// How many of a worker's threads want a core, sampled as its threads ask, and the machine's
/// demand beside it.
pub struct CpuDemand {
    pid: i32,
    machine: Rc<MachineDemand>,
    threads: RefCell<Threads>,
    /// The runnable threads, smoothed. Where /proc cannot be read no thread is seen runnable,
    /// and the worker's threads take requests freely, as every thread did before this gate.
    smoothed: Smoothed,
}

impl CpuDemand {
    pub fn new(pid: i32) -> CpuDemand {
        CpuDemand::beside(pid, MACHINE.with(Rc::clone))
    }

    fn beside(pid: i32, machine: Rc<MachineDemand>) -> CpuDemand {
        CpuDemand {
            pid,
            machine,
            threads: RefCell::new(Threads { stats: Vec::new(), listed: None }),
            smoothed: Smoothed::default(),
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

    /// Whether one more request, like those `busy` threads run, would keep the worker's demand
    /// under `CPU_LIMIT`, and the machine's under `CPU_LIMIT` of its CPUs.
    fn has_room(&self, busy: usize, now: Instant) -> bool {
        self.smoothed.sample(now, || self.runnable(now) as f64);
        let demand = self.smoothed.demand.get().unwrap_or(0.0);
        let more = demand / busy as f64;
        demand + more <= CPU_LIMIT && self.machine.has_room(more, now)
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

    /// A machine of `cpus` CPUs whose demand reads `demand` for the next `LOOK_AGAIN / 2`.
    fn machine(cpus: f64, demand: f64, now: Instant) -> Rc<MachineDemand> {
        let machine = MachineDemand { cpus, ..MachineDemand::open() };
        assert!(machine.loadavg.is_some(), "the tests read /proc/loadavg");
        machine.smoothed.set(demand, now);
        Rc::new(machine)
    }

    /// A machine not looked at, as without /proc: the other tests' load is not this test's.
    fn unseen_machine() -> Rc<MachineDemand> {
        Rc::new(MachineDemand { loadavg: None, cpus: 1.0, smoothed: Smoothed::default() })
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
        let computing = CpuDemand::beside(spinner.0.id() as i32, unseen_machine());
        let waiting = CpuDemand::beside(sleeper.0.id() as i32, unseen_machine());
        for _ in 0..10 {
            let now = Instant::now();
            assert!(!may_take(&card, &computing, slow, now), "a worker that computes has no CPU to spare");
            assert!(may_take(&card, &waiting, slow, now), "a worker that waits has CPU to spare");
            std::thread::sleep(LOOK_AGAIN);
        }
    }

    #[test]
    fn a_worker_that_waits_takes_no_second_request_while_the_machine_is_busy() {
        let now = Instant::now();
        let card = card_busy_since(now);
        let slow = Duration::from_secs(60);
        let waiting = |machine: Rc<MachineDemand>| {
            let cpu = CpuDemand::beside(std::process::id() as i32, machine);
            cpu.smoothed.set(0.2, now);
            may_take(&card, &cpu, slow, now)
        };
        // Two CPUs: room while one more request's 0.2 keeps the machine at 1.8 at most.
        assert!(waiting(machine(2.0, 1.0, now)), "a machine half idle has CPU to spare");
        assert!(waiting(machine(2.0, 1.6, now)));
        assert!(!waiting(machine(2.0, 1.7, now)), "one more request would take the machine past 90%");
        assert!(!waiting(machine(2.0, 3.0, now)), "threads queue for the machine's cores");
    }

    #[test]
    fn the_machine_demand_is_its_runnable_threads_but_the_reader() {
        assert_eq!(runnable_but_the_reader(b"0.52 0.58 0.59 3/467 12345\n"), Some(2.0));
        assert_eq!(runnable_but_the_reader(b"0.00 0.00 0.00 1/90 7\n"), Some(0.0));
        assert_eq!(runnable_but_the_reader(b"0.00 0.00 0.00"), None);
        // This test's thread is running as it reads: the sample counts it out, and counts what
        // the other tests run.
        let machine = MachineDemand::open();
        assert!(machine.runnable().is_some_and(|runnable| runnable >= 0.0), "/proc/loadavg reads");
    }

    #[test]
    fn a_thread_takes_a_request_when_its_worker_is_idle_or_on_a_slow_one_whatever_its_demand() {
        let now = Instant::now();
        let cpu = CpuDemand::beside(std::process::id() as i32, machine(1.0, 1.0, now));
        cpu.smoothed.set(1.0, now);
        let idle = Card::new(1, Phase::Serve);
        idle.set_threads(2);
        assert!(may_take(&idle, &cpu, Duration::from_secs(1), Instant::now()));
        let slow = Duration::from_millis(5);
        let on_a_slow_one = card_busy_since(Instant::now() - slow * 2);
        assert!(may_take(&on_a_slow_one, &cpu, slow, Instant::now()));
    }

    #[test]
    fn one_sample_moves_the_demand_by_its_share_of_the_smoothing_time() {
        let cpu = CpuDemand::beside(std::process::id() as i32, unseen_machine());
        let now = Instant::now();
        cpu.smoothed.set(1.0, now);
        // This test's own thread is the one runnable thread of a process that waits; the other
        // tests, run beside it, may be too: the sample is from 1 to their number.
        cpu.smoothed.sample(now + LOOK_AGAIN, || cpu.runnable(now) as f64);
        let demand = cpu.smoothed.demand.get().unwrap();
        assert!(demand >= 0.9, "one sample {LOOK_AGAIN:?} after the last took the demand from 1 to {demand}");
        cpu.smoothed.sample(now + LOOK_AGAIN + LOOK_AGAIN / 4, || unreachable!("sampled already"));
        assert_eq!(cpu.smoothed.demand.get(), Some(demand), "threads that ask together share one sample");
    }

    #[test]
    fn one_more_request_is_let_in_while_it_keeps_the_worker_under_the_limit() {
        let cpu = CpuDemand::beside(std::process::id() as i32, unseen_machine());
        let now = Instant::now();
        let room = |demand: f64, busy: usize| {
            cpu.smoothed.set(demand, now);
            cpu.has_room(busy, now)
        };
        assert!(room(0.1, 1) && room(0.2, 3), "threads that wait on I/O");
        assert!(!room(0.5, 1), "one that computes half the time: a second would take the worker to a core");
        assert!(!room(0.7, 3));
    }
}
