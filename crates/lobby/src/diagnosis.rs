//! Diagnoses: the lobby looks at itself every `TICK` and names, in one log line with the
//! operator's fix, each failure of docs/SCENARIOS.md that is happening (and a few cousins),
//! within a second of its start. `/status.json` lists those in force (docs/METRICS.md).
//!
//! A finding is logged when it starts, again every `REPEAT` while it lasts (with the figures
//! of the moment), and once more when it has been gone for `HOLD`: a queue that fills in bursts
//! makes one episode, not a line per burst.

use std::cell::{Cell, RefCell};
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::connection_states::{ConnectionState, OLD_AFTER, TICK};
use crate::listen::{self, Listener};
use crate::log::{info, warning};
use crate::scoreboard::{ExitReason, WorkerState};
use crate::Lobby;

/// How often a lasting finding is logged again.
const REPEAT: Duration = Duration::from_secs(30);
/// How long a finding must have been absent to end.
const HOLD: Duration = Duration::from_secs(5);
/// Every worker busy, with requests waiting, for this long: S4/S5.
const SATURATED_AFTER: Duration = Duration::from_secs(1);
/// A listen queue at least this full (in quarters of its backlog): S1/S2.
const FILLING_QUARTERS: u64 = 3;
/// Connections slow to send or to read, held for over `OLD_AFTER`, that make "many".
const SLOW_CLIENTS: u32 = 10;
/// Worker failures (crashes, timeouts) in a minute that make "frequent".
const FREQUENT_FAILURES: usize = 2;
/// Recycles in a minute that make "frequent": at least this many, and at least one per worker.
const FREQUENT_RECYCLES: usize = 3;
/// The kernel's counters of connections lost before accept(2).
pub const KERNEL_COUNTERS: [&str; 2] = ["ListenOverflows", "ListenDrops"];

/// One diagnosis, as the log and `/status.json` give it.
#[derive(Clone)]
pub struct Finding {
    /// A stable name: `listen_queue`, `listen_overflows`, `workers_saturated`,
    /// `long_request`, `frequent_recycling`, `frequent_failures`, `slow_clients`.
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
    backlog_requested: u32,
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
    kernel_seen: Cell<Option<[u64; 2]>>,
    /// Since when every worker has been busy with requests waiting.
    saturated_since: Cell<Option<Instant>>,
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
    fn update(&self, findings: Vec<Finding>) {
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

fn log_finding(finding: &Finding, lasting: &str) {
    warning!("diagnosis {} ({}): {}{lasting}; fix: {}", finding.scenario, finding.name, finding.message, finding.fix);
}

/// Looks every `TICK` until the lobby stops; ages the connection counts as it goes.
pub async fn watch(lobby: Rc<Lobby>, connections: Arc<Semaphore>, max_connections: usize) {
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        lobby.connection_states.tick();
        let at_capacity = connections.available_permits() == 0;
        let mut findings = Vec::new();
        listen_queues(&lobby, at_capacity, max_connections, &mut findings);
        kernel_overflows(&lobby, &mut findings);
        saturation(&lobby, &mut findings);
        long_requests(&lobby, &mut findings);
        worker_exits(&lobby, &mut findings);
        slow_clients(&lobby, max_connections, &mut findings);
        lobby.diagnoses.update(findings);
    }
}

/// S1/S2: a listener's accept queue three quarters full.
fn listen_queues(lobby: &Lobby, at_capacity: bool, max_connections: usize, findings: &mut Vec<Finding>) {
    for listener in lobby.diagnoses.listeners().iter() {
        let Some(queued) = listener.queue() else { continue };
        if (queued as u64) * 4 < listener.backlog as u64 * FILLING_QUARTERS || queued == 0 {
            continue;
        }
        let capacity = if at_capacity {
            format!(
                "; maitred holds --max-connections ({max_connections}) connections, so it accepts no more until one \
                 closes: raise --max-connections (and the descriptor limit) first"
            )
        } else {
            String::new()
        };
        findings.push(Finding {
            name: "listen_queue",
            scenario: "S1/S2",
            subject: listener.name.clone(),
            message: format!(
                "the listen queue of {} held {queued} of its {} connections: when it is full the kernel drops \
                 connects (clients retry after 1 s, 3 s, ...)",
                listener.name, listener.backlog
            ),
            fix: format!(
                "raise --backlog (asked {}, granted {}; net.core.somaxconn {} caps it){capacity}",
                listener.backlog_requested,
                listener.backlog,
                listen::somaxconn()
            ),
        });
    }
}

/// S1/S2: the kernel's overflow counters moved since the last tick.
fn kernel_overflows(lobby: &Lobby, findings: &mut Vec<Finding>) {
    let Some(now) = kernel_counters() else { return };
    let seen = lobby.diagnoses.kernel_seen.replace(Some(now)).unwrap_or(now);
    let moved = [now[0].saturating_sub(seen[0]), now[1].saturating_sub(seen[1])];
    if moved == [0, 0] {
        return;
    }
    findings.push(Finding {
        name: "listen_overflows",
        scenario: "S1/S2",
        subject: String::new(),
        message: format!(
            "the kernel lost {} connects for a full listen queue in the last {:.1} s ({} +{}, {} +{}; counted for \
             the whole machine: maitred_listen_queue says whether one of maitred's queues is the full one)",
            moved[0].max(moved[1]),
            TICK.as_secs_f64(),
            KERNEL_COUNTERS[0],
            moved[0],
            KERNEL_COUNTERS[1],
            moved[1]
        ),
        fix: format!(
            "raise --backlog and net.core.somaxconn (now {}); clients whose connect was dropped retry after 1 s, 3 s, \
             ...",
            listen::somaxconn()
        ),
    });
}

/// S4/S5: every worker busy for over a second, with requests waiting.
fn saturation(lobby: &Lobby, findings: &mut Vec<Finding>) {
    let counts = lobby.scoreboard.counts();
    let busy = counts[WorkerState::Busy as usize];
    let waiting = lobby.seating.waiting();
    let saturated = busy > 0 && counts[WorkerState::Idle as usize] == 0 && waiting > 0;
    if !saturated {
        lobby.diagnoses.saturated_since.set(None);
        return;
    }
    let since = *lobby.diagnoses.saturated_since.get().get_or_insert_with(Instant::now);
    lobby.diagnoses.saturated_since.set(Some(since));
    if since.elapsed() < SATURATED_AFTER {
        return;
    }
    let oldest = lobby.seating.oldest_waiting().map_or(0.0, |at| at.elapsed().as_secs_f64());
    let mut running: Vec<(Duration, String, i32)> = lobby
        .scoreboard
        .cards()
        .iter()
        .filter_map(|card| {
            let request = card.request.borrow();
            let (summary, since) = request.as_ref()?;
            Some((since.elapsed(), summary.to_string(), card.pid.get()?))
        })
        .collect();
    running.sort_by_key(|(took, ..)| std::cmp::Reverse(*took));
    let longest: Vec<String> = running
        .iter()
        .take(3)
        .map(|(took, summary, pid)| format!("{summary} for {:.1} s (worker {pid})", took.as_secs_f64()))
        .collect();
    let settings = lobby.settings();
    let queue_timeout = settings.queue_timeout.map_or("off".to_string(), |limit| format!("{} s", limit.as_secs_f64()));
    findings.push(Finding {
        name: "workers_saturated",
        scenario: "S4/S5",
        subject: String::new(),
        message: format!(
            "every worker ({busy}) has been busy for {:.1} s with {waiting} requests waiting, the oldest for {oldest:.1} \
             s; running longest: {}",
            since.elapsed().as_secs_f64(),
            longest.join(", ")
        ),
        fix: format!(
            "more workers (-w {}, or one more now with SIGTTIN) if CPU and memory allow; --timeout ({} s) ends a \
             stuck request; --queue-timeout ({queue_timeout}) answers 503 instead of a long wait",
            settings.workers,
            settings.timeout.as_secs_f64()
        ),
    });
}

/// A worker in one request for over half of `--timeout`.
fn long_requests(lobby: &Lobby, findings: &mut Vec<Finding>) {
    let timeout = lobby.settings().timeout;
    let threshold = timeout / 2;
    for card in lobby.scoreboard.cards() {
        let request = card.request.borrow();
        let (Some((summary, since)), Some(pid)) = (request.as_ref(), card.pid.get()) else { continue };
        let took = since.elapsed();
        if took < threshold {
            continue;
        }
        findings.push(Finding {
            name: "long_request",
            scenario: "long request",
            // The request, not only the worker: the next long one is a new finding.
            subject: format!("{pid} {}", card.served.get()),
            message: format!(
                "worker {pid} has been in {summary} for {:.1} s, over half of --timeout ({} s), when it is killed",
                took.as_secs_f64(),
                timeout.as_secs_f64()
            ),
            fix: "if such a request is expected, raise --timeout; if not, the worker's Python stack is logged when \
                  --timeout kills it"
                .into(),
        });
    }
}

/// Workers recycled or lost often in the last minute.
fn worker_exits(lobby: &Lobby, findings: &mut Vec<Finding>) {
    let board = &lobby.scoreboard;
    let workers = lobby.settings().workers;
    let recycled = board.recent_exits(ExitReason::is_recycling);
    if recycled >= FREQUENT_RECYCLES.max(workers) {
        let by_reason = reasons(board, ExitReason::is_recycling);
        findings.push(Finding {
            name: "frequent_recycling",
            scenario: "recycling",
            subject: String::new(),
            message: format!(
                "{recycled} workers were recycled in the last minute ({by_reason}); each replacement loads the \
                 application again"
            ),
            fix: "raise --max-requests, --max-worker-memory or --max-worker-lifetime, or find what grows".into(),
        });
    }
    let failed = board.recent_exits(ExitReason::is_failure);
    if failed >= FREQUENT_FAILURES {
        let by_reason = reasons(board, ExitReason::is_failure);
        findings.push(Finding {
            name: "frequent_failures",
            scenario: "worker failures",
            subject: String::new(),
            message: format!("{failed} workers were lost in the last minute ({by_reason})"),
            fix: "the lines 'worker N timed out' (with its stack) and 'worker N lost' above name the requests; for \
                  timeouts fix the slow path or raise --timeout, for crashes see the application's traceback"
                .into(),
        });
    }
}

/// `2 timeout, 1 crash`
fn reasons(board: &crate::scoreboard::Scoreboard, select: fn(ExitReason) -> bool) -> String {
    ExitReason::ALL
        .iter()
        .filter(|reason| select(**reason))
        .map(|reason| (board.recent_exits(|r| r == *reason), reason.label()))
        .filter(|(count, _)| *count > 0)
        .map(|(count, label)| format!("{count} {label}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Many connections held by clients slow to send their request or to read their answer.
fn slow_clients(lobby: &Lobby, max_connections: usize, findings: &mut Vec<Finding>) {
    let states = &lobby.connection_states;
    let sending = states.old(ConnectionState::Reading);
    let reading = states.old(ConnectionState::Writing);
    if sending + reading < SLOW_CLIENTS {
        return;
    }
    let settings = lobby.settings();
    findings.push(Finding {
        name: "slow_clients",
        scenario: "slow clients",
        subject: String::new(),
        message: format!(
            "{sending} connections have been sending their request, and {reading} reading their answer, for over {} \
             s; they hold the lobby's memory, never a worker",
            OLD_AFTER.as_secs_f64()
        ),
        fix: format!(
            "nothing, while they are few against --max-connections ({max_connections}); to shed them sooner lower \
             --header-timeout ({} s), raise --body-min-rate ({} bytes/s), lower --send-timeout ({} s)",
            settings.header_timeout.as_secs_f64(),
            settings.body_min_rate,
            settings.send_timeout.as_secs_f64()
        ),
    });
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
