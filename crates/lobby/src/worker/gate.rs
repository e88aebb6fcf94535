//! A WSGI worker's second thread, and any after it, given a request only while the worker has
//! CPU to spare (issue 47, item 9; docs/DEPLOY.md, "Threads or workers"). Python runs one
//! thread at a time (the GIL): while a thread's request computes, a second request seated at
//! the same worker only waits for the GIL, and makes the first wait for it in turn each time it
//! comes back from I/O. So an idle thread takes a request while its worker's other threads are
//! idle, or wait on I/O (the worker uses less than `SPARE_SHARE` of a core), or one of them is
//! on a request slow next to the typical one (then the threads share the GIL, as gunicorn's do,
//! rather than a short request waiting for a long one's end). Otherwise the request is left to
//! the other workers, or to this worker's thread that is about to finish.
//!
//! The worker's CPU time is read with one `clock_gettime` of its CPU clock (nanoseconds: the
//! clock ticks of /proc/PID/stat are 10 ms), only while a request waits and another thread of
//! the worker is busy.

use std::cell::Cell;
use std::time::{Duration, Instant};

use maitred_sys::process::CpuClock;

use super::scoreboard::Card;

/// A worker using less than this share of one core has CPU to spare: its busy threads wait on
/// I/O at least half the time, which a second request fills without taking the GIL from the
/// first for long.
pub const SPARE_SHARE: f64 = 0.5;

/// The shortest time a share is measured over: the worker's clock moves in steps of its
/// threads' scheduling, and a read taken too soon after the last says little.
const MIN_WINDOW: Duration = Duration::from_millis(1);

/// A share measured longer ago than this is not known any more: the worker's work may have
/// changed since (and a read older than this starts a new measure, so that a quiet second is
/// not taken for a share of now).
const MAX_WINDOW: Duration = Duration::from_millis(50);

/// How often an idle thread looks again at its worker's CPU while a request waits and its
/// other threads use the CPU.
pub const LOOK_AGAIN: Duration = Duration::from_millis(2);

/// What a worker's threads share of its CPU time, read as its threads ask.
pub struct CpuShare {
    /// None where the clock cannot be read: then the worker's threads take requests freely, as
    /// every thread did before this gate.
    clock: Option<CpuClock>,
    /// The CPU time read last, and when.
    read: Cell<Option<(Instant, Duration)>>,
    /// The share of one core used between the last two reads, and when it was measured.
    share: Cell<Option<(Instant, f64)>>,
}

impl CpuShare {
    pub fn new(pid: i32) -> CpuShare {
        CpuShare { clock: CpuClock::of(pid).ok(), read: Cell::new(None), share: Cell::new(None) }
    }

    /// Reads the worker's CPU time, and measures its share over the time since the last read
    /// when that is from `MIN_WINDOW` to `MAX_WINDOW` ago.
    fn read(&self, clock: &CpuClock, now: Instant) {
        let Ok(used) = clock.used() else {
            return;
        };
        if let Some((at, before)) = self.read.get() {
            let window = now.saturating_duration_since(at);
            if window < MIN_WINDOW {
                return;
            }
            if window <= MAX_WINDOW {
                let share = used.saturating_sub(before).as_secs_f64() / window.as_secs_f64();
                self.share.set(Some((now, share)));
            }
        }
        self.read.set(Some((now, used)));
    }

    /// Whether the worker leaves CPU to spare now; None while that is not known (read again
    /// after `LOOK_AGAIN`).
    fn spare(&self, now: Instant) -> Option<bool> {
        let Some(clock) = &self.clock else {
            return Some(true);
        };
        self.read(clock, now);
        let (at, share) = self.share.get()?;
        (now.saturating_duration_since(at) <= MAX_WINDOW).then_some(share < SPARE_SHARE)
    }
}

/// Whether an idle thread of the worker whose card is `card` may take a request now; None
/// while that is not known. `slow` is how long a request may run before it counts as slow next
/// to the typical one (`Seating::stale_after`).
pub fn may_take(card: &Card, cpu: &CpuShare, slow: Duration, now: Instant) -> Option<bool> {
    let Some((_, since)) = card.longest_request() else {
        // Its other threads are idle.
        return Some(true);
    };
    if now.saturating_duration_since(since) >= slow {
        return Some(true);
    }
    cpu.spare(now)
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

    /// Reads `cpu` until a share is measured (a read `MIN_WINDOW` after the first).
    fn measured(card: &Card, cpu: &CpuShare, slow: Duration) -> bool {
        let began = Instant::now();
        loop {
            if let Some(verdict) = may_take(card, cpu, slow, Instant::now()) {
                return verdict;
            }
            assert!(began.elapsed() < MAX_WINDOW, "no share measured within {MAX_WINDOW:?}");
            std::thread::sleep(MIN_WINDOW);
        }
    }

    #[test]
    fn a_thread_takes_a_request_while_its_worker_waits_on_io_and_not_while_it_computes() {
        let mut spinner = Command::new("sh").args(["-c", "while :; do :; done"]).stdout(Stdio::null()).spawn().unwrap();
        let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
        let card = card_busy_since(Instant::now());
        let slow = Duration::from_secs(60);
        // The spinner shares two cores with the test: it is measured at more than half of one
        // when it runs, so the measure is taken until it has (the scheduler may hold it back
        // for a window).
        let computing = CpuShare::new(spinner.id() as i32);
        let began = Instant::now();
        while measured(&card, &computing, slow) {
            assert!(began.elapsed() < Duration::from_secs(30), "the spinner never used half a core");
        }
        let waiting = CpuShare::new(sleeper.id() as i32);
        assert!(measured(&card, &waiting, slow), "a worker that waits has CPU to spare");
        for child in [&mut spinner, &mut sleeper] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    #[test]
    fn a_thread_takes_a_request_when_its_worker_is_idle_or_on_a_slow_one_whatever_its_cpu() {
        let cpu = CpuShare::new(std::process::id() as i32);
        let idle = Card::new(1, Phase::Serve);
        idle.set_threads(2);
        assert_eq!(may_take(&idle, &cpu, Duration::from_secs(1), Instant::now()), Some(true));
        let slow = Duration::from_millis(5);
        let long_ago = Instant::now() - slow * 2;
        let on_a_slow_one = card_busy_since(long_ago);
        assert_eq!(may_take(&on_a_slow_one, &cpu, slow, Instant::now()), Some(true));
    }

    #[test]
    fn a_share_measured_long_ago_is_not_known() {
        let cpu = CpuShare::new(std::process::id() as i32);
        let card = card_busy_since(Instant::now());
        let slow = Duration::from_secs(60);
        measured(&card, &cpu, slow);
        let later = Instant::now() + MAX_WINDOW * 2;
        assert_eq!(may_take(&card, &cpu, slow, later), None, "a share from before the window is not reused");
    }
}
