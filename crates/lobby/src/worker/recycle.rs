//! Recycling a worker: retiring it, and having it replaced, after `--max-requests` requests,
//! above `--max-worker-memory`, or past `--max-worker-lifetime` (docs/TUNING.md). The worker's
//! task asks `Recycle` after each request whether its worker must go; the supervisor keeps a
//! spare worker ready while any of these is set, so that the spare takes the retiring worker's
//! place at once instead of the queue waiting for a new worker to load the application.

use std::cell::Cell;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use tokio::time::Instant;

use super::scoreboard::ExitReason;
use crate::config::Config;
use crate::log::warning;

const MIB: u64 = 1 << 20;

/// Whether any recycling setting is on: then the supervisor keeps a spare worker.
pub fn recycles(config: &Config) -> bool {
    config.max_requests > 0 || config.max_worker_memory > 0 || config.max_worker_lifetime.is_some()
}

/// One worker's limits, drawn when it starts (each worker has its own jitter).
pub struct Recycle {
    requests: Option<Requests>,
    lifetime: Option<Lifetime>,
    memory: Option<Memory>,
    /// When the worker began to serve: its lifetime counts from there, so that a spare does
    /// not age while it waits.
    serving_since: Cell<Option<Instant>>,
    /// Why it was found to retire: told once, whichever of its threads finds it first.
    found: Cell<Option<ExitReason>>,
    /// Tells the supervisor that the worker retires, and why (one line for the log).
    retiring: Box<dyn Fn(ExitReason, String)>,
}

struct Requests {
    limit: u64,
    jitter: u64,
}

struct Lifetime {
    base: Duration,
    jitter: Duration,
}

struct Memory {
    /// The worker's /proc/PID/statm, kept open: read with pread after each request, and it
    /// stays the same process's file even if the pid is reused after the worker is gone.
    statm: File,
    limit_mb: u64,
    page_size: u64,
}

impl Recycle {
    pub fn new(config: &Config, pid: i32, retiring: Box<dyn Fn(ExitReason, String)>) -> Recycle {
        let requests = (config.max_requests > 0)
            .then(|| Requests { limit: config.max_requests, jitter: random_up_to(config.max_requests_jitter) });
        let lifetime = config.max_worker_lifetime.map(|base| Lifetime {
            base,
            jitter: config.max_worker_lifetime_jitter.mul_f64(random_up_to(u32::MAX.into()) as f64 / u32::MAX as f64),
        });
        let memory = match config.max_worker_memory {
            0 => None,
            limit_mb => match File::open(format!("/proc/{pid}/statm")) {
                Ok(statm) => Some(Memory { statm, limit_mb, page_size: page_size() }),
                Err(e) => {
                    warning!("cannot watch worker {pid}'s memory (--max-worker-memory): /proc/{pid}/statm: {e}");
                    None
                }
            },
        };
        Recycle { requests, lifetime, memory, serving_since: Cell::new(None), found: Cell::new(None), retiring }
    }

    /// The worker begins to serve: its lifetime starts.
    pub fn begin(&self) {
        // Once, whichever of its threads begins first.
        if self.serving_since.get().is_none() {
            self.serving_since.set(Some(Instant::now()));
        }
    }

    /// How many more requests the worker may take after `served`.
    pub fn requests_left(&self, served: u64) -> Option<u64> {
        self.requests.as_ref().map(|requests| (requests.limit + requests.jitter).saturating_sub(served))
    }

    /// When the worker's lifetime ends, if it has one and serves.
    pub fn deadline(&self) -> Option<Instant> {
        let lifetime = self.lifetime.as_ref()?;
        Some(self.serving_since.get()? + lifetime.base + lifetime.jitter)
    }

    /// Why the worker must retire now that it has served `served` requests, if it must: its
    /// request budget or its lifetime is spent, or (`after_request`) its memory is too large.
    /// The supervisor is told once, when a reason is first found; asked again, it gives that
    /// reason without telling again (a worker's threads share its recycling).
    pub fn check(&self, served: u64, after_request: bool) -> Option<ExitReason> {
        if let Some(found) = self.found.get() {
            return Some(found);
        }
        let (reason, detail) = self
            .requests_spent(served)
            .map(|detail| (ExitReason::MaxRequests, detail))
            .or_else(|| self.lifetime_spent().map(|detail| (ExitReason::Lifetime, detail)))
            .or_else(|| {
                after_request.then(|| self.memory_exceeded()).flatten().map(|detail| (ExitReason::Memory, detail))
            })?;
        self.found.set(Some(reason));
        (self.retiring)(reason, detail);
        Some(reason)
    }

    fn requests_spent(&self, served: u64) -> Option<String> {
        let requests = self.requests.as_ref()?;
        if served < requests.limit + requests.jitter {
            return None;
        }
        let jitter = if requests.jitter > 0 { format!(" + {} jitter", requests.jitter) } else { String::new() };
        Some(format!("{served} requests served, --max-requests {}{jitter}", requests.limit))
    }

    fn lifetime_spent(&self) -> Option<String> {
        let lifetime = self.lifetime.as_ref()?;
        let age = self.serving_since.get()?.elapsed();
        if age < lifetime.base + lifetime.jitter {
            return None;
        }
        let jitter = if lifetime.jitter.is_zero() {
            String::new()
        } else {
            format!(" + {:.1} s jitter", lifetime.jitter.as_secs_f64())
        };
        Some(format!(
            "served for {:.1} s, past --max-worker-lifetime {}{jitter}",
            age.as_secs_f64(),
            lifetime.base.as_secs_f64()
        ))
    }

    fn memory_exceeded(&self) -> Option<String> {
        let memory = self.memory.as_ref()?;
        // The worker may be gone already: its channel tells the worker's task so.
        let resident = resident_bytes(&memory.statm, memory.page_size).ok()?;
        if resident <= memory.limit_mb * MIB {
            return None;
        }
        Some(format!("{} MB resident, over --max-worker-memory {}", megabytes_rounded_up(resident), memory.limit_mb))
    }
}

/// Bytes in MB to two places, rounded up: a worker a page over 100 MB reads "100.01", never the
/// "100.00" that looks like no reason to retire it.
fn megabytes_rounded_up(bytes: u64) -> String {
    format!("{:.2}", (bytes as f64 * 100.0 / MIB as f64).ceil() / 100.0)
}

/// A worker's resident bytes now, for the scoreboard; None once it has gone.
pub fn resident_of(pid: i32) -> Option<u64> {
    let statm = File::open(format!("/proc/{pid}/statm")).ok()?;
    resident_bytes(&statm, page_size()).ok()
}

/// Resident bytes, from /proc/PID/statm: "size resident shared text lib data dt", in pages.
fn resident_bytes(statm: &File, page_size: u64) -> std::io::Result<u64> {
    let mut buf = [0u8; 128];
    let read = statm.read_at(&mut buf, 0)?;
    parse_resident_pages(&buf[..read])
        .map(|pages| pages * page_size)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "unexpected /proc/PID/statm"))
}

fn parse_resident_pages(statm: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(statm).ok()?;
    text.split_ascii_whitespace().nth(1)?.parse().ok()
}

fn page_size() -> u64 {
    maitred_sys::limits::page_size()
}

/// A random whole number from 0 to `spread`, as --max-requests-jitter has always drawn it.
fn random_up_to(spread: u64) -> u64 {
    match spread {
        0 => 0,
        spread => std::collections::hash_map::RandomState::new().build_hasher().finish() % (spread + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_just_over_the_limit_reads_as_over_it() {
        assert_eq!(megabytes_rounded_up(100 * MIB + 4096), "100.01");
        assert_eq!(megabytes_rounded_up(100 * MIB), "100.00");
        assert_eq!(megabytes_rounded_up(MIB / 2), "0.50");
    }

    #[test]
    fn reads_the_resident_pages_of_statm() {
        assert_eq!(parse_resident_pages(b"4937 1203 897 1 0 410 0\n"), Some(1203));
        assert_eq!(parse_resident_pages(b"4937"), None);
        assert_eq!(parse_resident_pages(b""), None);
    }

    #[test]
    fn reads_its_own_resident_memory() {
        let statm = File::open("/proc/self/statm").unwrap();
        let resident = resident_bytes(&statm, page_size()).unwrap();
        // A test binary holds at least a megabyte and far less than a terabyte.
        assert!((MIB..(1 << 40)).contains(&resident), "{resident}");
        // pread from the start: the same file reads again.
        assert!(resident_bytes(&statm, page_size()).is_ok());
    }

    #[test]
    fn jitter_stays_within_its_spread() {
        for _ in 0..100 {
            assert!(random_up_to(3) <= 3);
        }
        assert_eq!(random_up_to(0), 0);
    }
}
