//! Diagnoses: the lobby looks at itself every `TICK` and names, in one log line with the
//! operator's fix, each failure of docs/SCENARIOS.md that is happening (and a few cousins),
//! within a second of its start. `/status.json` lists those in force (docs/METRICS.md).
//!
//! A finding is logged when it starts, again every `REPEAT` while it lasts (with the figures
//! of the moment), and once more when it has been gone for `HOLD`: a queue that fills in bursts
//! makes one episode, not a line per burst.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::findings::{kernel_counters, Finding, KERNEL_COUNTERS};
use super::Observed;
use crate::client::states::{ConnectionState, OLD_AFTER, TICK};
use crate::config::QueuePolicy;
use crate::listen::bind::somaxconn;
use crate::seating::overload::ShedReason;
use crate::seating::websocket::SUMMARY_MARK;
use crate::worker::recycle::resident_of;
use crate::worker::scoreboard::{ExitReason, Scoreboard};

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

/// Looks every `TICK` until the lobby stops; ages the connection counts as it goes.
pub async fn watch(observed: Rc<Observed>, connections: Arc<Semaphore>, max_connections: usize) {
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        observed.connection_states.tick();
        sample_resident(&observed);
        let at_capacity = connections.available_permits() == 0;
        let mut findings = Vec::new();
        listen_queues(&observed, at_capacity, max_connections, &mut findings);
        kernel_overflows(&observed, &mut findings);
        saturation(&observed, &mut findings);
        overload(&observed, &mut findings);
        long_requests(&observed, &mut findings);
        worker_exits(&observed, &mut findings);
        slow_clients(&observed, max_connections, &mut findings);
        observed.diagnoses.update(findings);
    }
}

/// Each worker's RSS, kept on its card for the line that names its kill (an OOM kill's): one
/// read of /proc/PID/statm a worker a tick, a few microseconds each.
fn sample_resident(observed: &Observed) {
    for card in observed.scoreboard.cards() {
        // A worker being killed, or a zombie, reads 0: not its last size.
        if let Some(resident) = card.pid.get().and_then(resident_of).filter(|resident| *resident > 0) {
            card.resident.set(Some(resident));
        }
    }
}

/// S1/S2: a listener's accept queue three quarters full.
fn listen_queues(observed: &Observed, at_capacity: bool, max_connections: usize, findings: &mut Vec<Finding>) {
    for listener in observed.diagnoses.listeners().iter() {
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
                somaxconn()
            ),
        });
    }
}

/// S1/S2: the kernel's overflow counters moved since the last tick.
fn kernel_overflows(observed: &Observed, findings: &mut Vec<Finding>) {
    let Some(now) = kernel_counters() else { return };
    let seen = observed.diagnoses.kernel_seen.replace(Some(now)).unwrap_or(now);
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
            somaxconn()
        ),
    });
}

/// S4/S5: every seat busy for over a second, with requests waiting: a WSGI worker's threads,
/// an ASGI worker's admissions (requests whose answers have not started; its open streams take
/// none, so a worker full of idle streams is not saturated).
fn saturation(observed: &Observed, findings: &mut Vec<Finding>) {
    let [busy, free] = observed.scoreboard.seats(observed.settings().worker_connections);
    let waiting = observed.seating.waiting();
    let saturated = busy > 0 && free == 0 && waiting > 0;
    if !saturated {
        observed.diagnoses.saturated_since.set(None);
        return;
    }
    let since = *observed.diagnoses.saturated_since.get().get_or_insert_with(Instant::now);
    observed.diagnoses.saturated_since.set(Some(since));
    if since.elapsed() < SATURATED_AFTER {
        return;
    }
    let oldest = observed.seating.oldest_waiting().map_or(0.0, |at| at.elapsed().as_secs_f64());
    let mut running: Vec<(Duration, String, i32)> = observed
        .scoreboard
        .cards()
        .iter()
        .flat_map(|card| {
            // A thread's request, or an ASGI worker's admitted one: never a stream.
            let pid = card.pid.get();
            card.running()
                .into_iter()
                .filter_map(|(summary, since)| Some((since.elapsed(), summary.to_string(), pid?)))
                .collect::<Vec<_>>()
        })
        .collect();
    running.sort_by_key(|(took, ..)| std::cmp::Reverse(*took));
    let longest: Vec<String> = running
        .iter()
        .take(3)
        .map(|(took, summary, pid)| format!("{summary} for {:.1} s (worker {pid})", took.as_secs_f64()))
        .collect();
    let settings = observed.settings();
    let queue_timeout = settings.queue_timeout.map_or("off".to_string(), |limit| format!("{} s", limit.as_secs_f64()));
    let (every, more) = if settings.threads > 1 {
        (
            "every thread of every worker",
            format!(
                "more workers or threads (-w {} --threads {}, or one more worker now with SIGTTIN)",
                settings.workers, settings.threads
            ),
        )
    } else {
        ("every worker", format!("more workers (-w {}, or one more now with SIGTTIN)", settings.workers))
    };
    findings.push(Finding {
        name: "workers_saturated",
        scenario: "S4/S5",
        subject: String::new(),
        message: format!(
            "{every} ({busy}) has been busy for {:.1} s with {waiting} requests waiting, the oldest for {oldest:.1} s; \
             running longest: {}",
            since.elapsed().as_secs_f64(),
            longest.join(", ")
        ),
        fix: format!(
            "{more} if CPU and memory allow; --timeout ({} s) ends a stuck request; --queue-timeout \
             ({queue_timeout}) answers 503 instead of a long wait",
            settings.timeout.as_secs_f64()
        ),
    });
}

/// Clients that gave up while their requests waited, or requests refused because they could no
/// longer be answered in time, since the last look: more arrives than the workers answer (O1).
fn overload(observed: &Observed, findings: &mut Vec<Finding>) {
    let counts = observed.seating.overload.counts();
    let seen = observed.diagnoses.shed_seen.replace(counts);
    let moved = |reason: ShedReason| counts[reason as usize].saturating_sub(seen[reason as usize]);
    let abandoned = moved(ShedReason::Abandoned);
    let refused = moved(ShedReason::Overload) + moved(ShedReason::Deadline);
    if abandoned + refused == 0 {
        return;
    }
    // Clients that left a queue that was not growing (a load generator's exit, a proxy's
    // reload) are not overload (`seating/overload.rs`).
    if refused == 0 && !observed.seating.overload.overloaded(Instant::now()) {
        return;
    }
    let settings = observed.settings();
    let shedding = match (settings.queue_policy, observed.seating.overload.patience(Instant::now())) {
        (QueuePolicy::Fifo, _) => "--queue-policy fifo serves the rest however late".to_string(),
        (QueuePolicy::Adaptive, Some(patience)) => format!(
            "requests that wait over {:.2} s, half of the {:.2} s clients wait, are answered 503",
            patience.as_secs_f64() / 2.0,
            patience.as_secs_f64()
        ),
        (QueuePolicy::Adaptive, None) => {
            "too few clients have given up one by one, while the queue grew, to tell how long they wait".to_string()
        }
    };
    findings.push(Finding {
        name: "overload",
        scenario: "O1",
        subject: String::new(),
        message: format!(
            "requests arrive faster than the workers answer them: in the last {:.1} s {abandoned} clients gave up \
             while their requests waited and {refused} requests were refused as too late; {shedding}",
            TICK.as_secs_f64()
        ),
        fix: format!(
            "more workers (-w {}, or one more now with SIGTTIN) if CPU and memory allow, or a faster application; \
             meanwhile the queue sheds what it cannot answer in time (docs/TUNING.md, \"Overload\")",
            settings.workers
        ),
    });
}

/// A worker in one request for over half of `--timeout`.
fn long_requests(observed: &Observed, findings: &mut Vec<Finding>) {
    let timeout = observed.settings().timeout;
    let threshold = timeout / 2;
    for card in observed.scoreboard.cards() {
        // An open WebSocket holds its seat for its life, with no --timeout: not a long request.
        let longest = card
            .running()
            .into_iter()
            .filter(|(summary, _)| !summary.ends_with(SUMMARY_MARK))
            .min_by_key(|(_, since)| *since);
        let (Some((summary, since)), Some(pid)) = (longest, card.pid.get()) else { continue };
        let took = since.elapsed();
        if took < threshold {
            continue;
        }
        // An event loop's request is cancelled at --timeout, and its worker serves on; a
        // worker of threads, or of one, is killed.
        let (at_timeout, fix) = if card.asgi.get() {
            (
                "when its task is cancelled and its client answered 504",
                "if such a request is expected, raise --timeout; if not, the worker serves on, and its event loop's \
                 stack is logged only if the loop is blocked then",
            )
        } else {
            (
                "when it is killed",
                "if such a request is expected, raise --timeout; if not, the worker's Python stack is logged when \
                 --timeout kills it",
            )
        };
        findings.push(Finding {
            name: "long_request",
            scenario: "long request",
            // The request, not only the worker: the next long one is a new finding.
            subject: format!("{pid} {}", card.served.get()),
            message: format!(
                "worker {pid} has been in {summary} for {:.1} s, over half of --timeout ({} s), {at_timeout}",
                took.as_secs_f64(),
                timeout.as_secs_f64()
            ),
            fix: fix.into(),
        });
    }
}

/// Workers recycled or lost often in the last minute.
fn worker_exits(observed: &Observed, findings: &mut Vec<Finding>) {
    let board = &observed.scoreboard;
    let workers = observed.settings().workers;
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
                  timeouts fix the slow path or raise --timeout, for crashes see the application's traceback; for an \
                  OOM kill ('worker N exited (signal 9): an OOM kill', or a probable one, with the limit and the \
                  worker's last RSS, and no traceback) raise the memory limit, run fewer workers, or find what grows \
                  (--max-worker-memory recycles a worker before the kernel kills it)"
                .into(),
        });
    }
}

/// `2 timeout, 1 crash`
fn reasons(board: &Scoreboard, select: fn(ExitReason) -> bool) -> String {
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
fn slow_clients(observed: &Observed, max_connections: usize, findings: &mut Vec<Finding>) {
    let states = &observed.connection_states;
    let sending = states.old(ConnectionState::Reading);
    let reading = states.old(ConnectionState::Writing);
    if sending + reading < SLOW_CLIENTS {
        return;
    }
    let settings = observed.settings();
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
