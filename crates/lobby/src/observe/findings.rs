//! The diagnoses in force: each finding, since when it lasts, and the log lines that say so;
//! and what they are read from that the lobby keeps (the listeners' queues, the kernel's
//! counters). A leaf: what is observed (`Observed`) holds the `Diagnoses`; `diagnosis.rs` makes
//! the findings.

use std::cell::{Cell, RefCell};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::client::states::TICK;
use crate::listen::bind::Listener;
use crate::log::{info, warning};
use crate::seating::overload::ShedReason;

/// How often a lasting finding is logged again.
const REPEAT: Duration = Duration::from_secs(30);

/// How long a finding must have been absent to end.
const HOLD: Duration = Duration::from_secs(5);

/// The kernel's counters of connections lost before accept(2).
pub const KERNEL_COUNTERS: [&str; 2] = ["ListenOverflows", "ListenDrops"];

/// One diagnosis, as the log and `/status.json` give it.
#[derive(Clone)]
pub struct Finding {
    /// A stable name: `listen_queue`, `listen_overflows`, `workers_saturated`,
    /// `long_request`, `frequent_recycling`, `frequent_failures`, `slow_clients`, `overload`.
    pub name: &'static str,
    /// The failure of docs/SCENARIOS.md it is, or what kind of trouble.
    pub scenario: &'static str,
    /// What it is about, when there can be several at once: a listener, a worker.
    pub subject: String,
    pub message: String,
    pub fix: String,
}

struct Active {
    finding: Finding,
    since: Instant,
    last_seen: Instant,
    last_logged: Instant,
}

/// A listener whose queue is read: a copy of its socket, so that a descriptor number used
/// again after it closes is never read for it.
pub struct Watched {
    pub name: String,
    socket: socket2::Socket,
    pub backlog: u32,
    pub(super) backlog_requested: u32,
    is_tcp: bool,
}

impl Watched {
    /// Connections waiting in its accept queue now; None for a Unix socket or when unknown.
    pub fn queue(&self) -> Option<u32> {
        self.is_tcp.then(|| maitred_sys::socket::listen_queue_depth(self.socket.as_fd()).ok()).flatten()
    }
}

#[derive(Default)]
pub struct Diagnoses {
    active: RefCell<Vec<Active>>,
    listeners: RefCell<Vec<Watched>>,
    /// The kernel's counters when the lobby started, and as last read.
    kernel_start: Cell<Option<[u64; 2]>>,
    pub(super) kernel_seen: Cell<Option<[u64; 2]>>,
    /// Since when every worker has been busy with requests waiting.
    pub(super) saturated_since: Cell<Option<Instant>>,
    /// The queue's counts of requests not served, as of the last look.
    pub(super) shed_seen: Cell<[u64; ShedReason::ALL.len()]>,
}

impl Diagnoses {
    pub fn new() -> Diagnoses {
        let kernel = kernel_counters();
        Diagnoses { kernel_start: Cell::new(kernel), kernel_seen: Cell::new(kernel), ..Default::default() }
    }

    /// The application's listeners, whose queues are looked at.
    pub fn watch_listeners(&self, listeners: &[Listener]) {
        let watched = listeners
            .iter()
            .filter_map(|listener| {
                let socket = listener.socket.try_clone().ok()?;
                let is_tcp = socket.local_addr().ok()?.as_socket().is_some();
                Some(Watched {
                    name: listener.display.clone(),
                    socket,
                    backlog: listener.backlog_granted,
                    backlog_requested: listener.backlog_requested,
                    is_tcp,
                })
            })
            .collect();
        *self.listeners.borrow_mut() = watched;
    }

    /// Closes the copies of the listen sockets: at shutdown, a listener must close with them.
    pub fn stop_watching(&self) {
        self.listeners.borrow_mut().clear();
    }

    pub fn listeners(&self) -> std::cell::Ref<'_, Vec<Watched>> {
        self.listeners.borrow()
    }

    /// ListenOverflows and ListenDrops moved since the lobby started (machine-wide).
    pub fn kernel_overflows(&self) -> [u64; 2] {
        match (self.kernel_start.get(), self.kernel_seen.get()) {
            (Some(start), Some(seen)) => [seen[0].saturating_sub(start[0]), seen[1].saturating_sub(start[1])],
            _ => [0, 0],
        }
    }

    /// The findings in force (seen at the last look, not only waiting out `HOLD`), each with
    /// how long it has lasted.
    pub fn current(&self) -> Vec<(Finding, Duration)> {
        self.active
            .borrow()
            .iter()
            .filter(|active| active.last_seen.elapsed() <= 2 * TICK)
            .map(|active| (active.finding.clone(), active.since.elapsed()))
            .collect()
    }

    /// Takes this tick's findings: logs those that start, last past `REPEAT`, or end.
    pub(super) fn update(&self, findings: Vec<Finding>) {
        let now = Instant::now();
        let mut active = self.active.borrow_mut();
        for finding in findings {
            let known =
                active.iter_mut().find(|a| a.finding.name == finding.name && a.finding.subject == finding.subject);
            match known {
                Some(known) => {
                    known.last_seen = now;
                    known.finding = finding;
                    if now.duration_since(known.last_logged) >= REPEAT {
                        known.last_logged = now;
                        let lasted = now.duration_since(known.since).as_secs_f64();
                        log_finding(&known.finding, &format!(" (for {lasted:.0} s now)"));
                    }
                }
                None => {
                    log_finding(&finding, "");
                    active.push(Active { finding, since: now, last_seen: now, last_logged: now });
                }
            }
        }
        active.retain(|a| {
            let over = now.duration_since(a.last_seen) >= HOLD;
            if over {
                info!(
                    "diagnosis {} ({}) is over; it lasted {:.1} s",
                    a.finding.scenario,
                    a.finding.name,
                    a.last_seen.duration_since(a.since).as_secs_f64()
                );
            }
            !over
        });
    }
}

pub(super) fn log_finding(finding: &Finding, lasting: &str) {
    warning!("diagnosis {} ({}): {}{lasting}; fix: {}", finding.scenario, finding.name, finding.message, finding.fix);
}

/// ListenOverflows and ListenDrops from /proc/net/netstat (this network namespace).
pub fn kernel_counters() -> Option<[u64; 2]> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let pairs: Vec<(&str, &str)> = names.split_whitespace().zip(values.split_whitespace()).collect();
        let find = |name: &str| pairs.iter().find(|(n, _)| *n == name).and_then(|(_, v)| v.parse().ok());
        return Some([find(KERNEL_COUNTERS[0])?, find(KERNEL_COUNTERS[1])?]);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_listen_counters() {
        // Every Linux since 2.6 has both in TcpExt.
        assert!(kernel_counters().is_some());
    }
}
