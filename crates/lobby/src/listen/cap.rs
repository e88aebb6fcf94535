//! `--max-connections` and the descriptor limit: how many connections the lobby may hold, and
//! the episodes at the cap, when the lobby stops accepting and the kernel's listen queue holds
//! new connections instead.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::log::{info, warning};

/// Descriptors kept back from `--max-connections`' default for listeners, workers, logs and
/// spilled bodies.
const RESERVED_FDS: u64 = 64;

/// Descriptors the lobby holds for each worker thread: its channel and its two bells, its
/// shared region's memfd while passing it, and a file it may be passing.
const FDS_PER_THREAD: u64 = 5;

/// An episode at `--max-connections` ends once the lobby has not been at the cap for this long.
const CAP_QUIET: Duration = Duration::from_secs(1);

/// The descriptor limit, and how many connections it leaves room for.
pub(crate) struct Descriptors {
    /// The soft RLIMIT_NOFILE, after raising it.
    pub(crate) limit: u64,
    /// Kept for listeners, workers, logs and files.
    pub(crate) reserved: u64,
    pub(crate) room: usize,
}

impl Descriptors {
    /// Raises the soft descriptor limit as far as `wanted` connections need (all the way to
    /// the hard limit when none is asked for), and leaves room for everything else.
    pub(crate) fn raise(threads: usize, wanted: Option<usize>) -> Descriptors {
        let reserved = RESERVED_FDS + FDS_PER_THREAD * threads as u64;
        let (soft, hard) = maitred_sys::limits::open_files();
        let mut soft = soft.unwrap_or(u64::MAX);
        // An unlimited hard limit still stops at the kernel's fs.nr_open.
        let ceiling = hard.unwrap_or(u64::MAX).min(nr_open());
        let target = wanted.map_or(ceiling, |n| (n as u64).saturating_add(reserved).min(ceiling));
        if soft < target && maitred_sys::limits::set_open_files(target).is_ok() {
            soft = target;
        }
        let room = soft.saturating_sub(reserved).clamp(1, Semaphore::MAX_PERMITS as u64 / 2) as usize;
        Descriptors { limit: soft, reserved, room }
    }
}

/// The soft descriptor limit as it is now.
pub(super) fn fd_limit() -> u64 {
    maitred_sys::limits::open_files().0.unwrap_or(u64::MAX)
}

/// The most descriptors a process may have (`fs.nr_open`), or no bound if the kernel does not say.
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open").ok().and_then(|text| text.trim().parse().ok()).unwrap_or(u64::MAX)
}

/// The episodes at `--max-connections`, when the lobby stops accepting and the kernel's listen
/// queue holds new connections: one warning as one begins, one line as it ends.
pub(crate) struct CapWatch {
    pub(super) cap: usize,
    /// The descriptor limit, and whether it is what holds the cap down.
    fd_limit: u64,
    /// What the descriptor limit would allow.
    room: usize,
    fd_bound: bool,
    shutdown: watch::Receiver<bool>,
    /// When the current episode began.
    since: Cell<Option<Instant>>,
    /// When an accept loop was last at the cap.
    last_full: Cell<Instant>,
    /// Accept loops waiting for a connection to close.
    waiting: Cell<usize>,
}

impl CapWatch {
    pub(crate) fn new(cap: usize, descriptors: &Descriptors, shutdown: watch::Receiver<bool>) -> CapWatch {
        CapWatch {
            cap,
            fd_limit: descriptors.limit,
            room: descriptors.room,
            fd_bound: cap >= descriptors.room,
            shutdown,
            since: Cell::new(None),
            last_full: Cell::new(Instant::now()),
            waiting: Cell::new(0),
        }
    }

    /// Waits for a place under the cap; None once the semaphore is closed.
    pub(super) async fn place(self: &Rc<Self>, connections: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
        match connections.clone().try_acquire_owned() {
            Ok(permit) => return Some(permit),
            Err(TryAcquireError::Closed) => return None,
            Err(TryAcquireError::NoPermits) => {}
        }
        let now = Instant::now();
        self.last_full.set(now);
        if self.since.get().is_none() {
            self.since.set(Some(now));
            let advice = if self.fd_bound {
                format!("The descriptor limit (ulimit -n {}) allows no more: raise it to accept more", self.fd_limit)
            } else {
                format!(
                    "The descriptor limit (ulimit -n {}) would allow {}: raise --max-connections to accept more",
                    self.fd_limit, self.room
                )
            };
            warning!(
                "at --max-connections ({} connections open): not accepting until one closes; the kernel holds new \
                 connections in the --backlog until then. {advice}",
                self.cap
            );
            tokio::task::spawn_local(self.clone().watch());
        }
        self.waiting.set(self.waiting.get() + 1);
        let permit = connections.clone().acquire_owned().await;
        self.waiting.set(self.waiting.get() - 1);
        self.last_full.set(Instant::now());
        permit.ok()
    }

    /// Ends the episode once the cap has not been reached for `CAP_QUIET`.
    async fn watch(self: Rc<Self>) {
        loop {
            let quiet_at = self.last_full.get() + CAP_QUIET;
            if *self.shutdown.borrow() {
                self.since.set(None);
                return;
            }
            if self.waiting.get() == 0 && Instant::now() >= quiet_at {
                let lasted = self.last_full.get() - self.since.take().unwrap_or(self.last_full.get());
                info!(
                    "accepting again: below --max-connections ({}) after {:.1} s at it",
                    self.cap,
                    lasted.as_secs_f64()
                );
                return;
            }
            let wake = if self.waiting.get() > 0 { Instant::now() + CAP_QUIET } else { quiet_at };
            tokio::time::sleep_until(wake.into()).await;
        }
    }
}
