//! `/status.json` (docs/METRICS.md): the metrics' figures with the worker scoreboard and the
//! diagnoses in force, for the page at `/` and `maitred top`; and the figures a scrape reads
//! from the lobby (`Now::read`).

use std::rc::Rc;
use std::time::Instant;

use prometheus::core::{Collector, Metric};
use prometheus::Histogram;
use serde_json::{json, Value};

use super::findings::KERNEL_COUNTERS;
use super::metrics::{ListenerNow, Now, WorkerNow, STATUS_CLASSES};
use super::Observed;
use crate::client::states::ConnectionState;
use crate::config::QueuePolicy;
use crate::process::watchdog::Watchdog;
use crate::seating::overload::{ShedReason, SUSTAINED};
use crate::worker::recycle::resident_of;
use crate::worker::scoreboard::{ExitReason, WorkerState};

/// `/metrics`: the exposition (Prometheus text format 0.0.4), with the gauges read now.
pub(super) fn metrics(observed: &Observed) -> prometheus::Result<String> {
    observed.metrics.render(&Now::read(observed))
}

/// `/status.json` (docs/METRICS.md): the same figures, the scoreboard and the diagnoses.
pub(super) fn status(observed: &Observed, max_connections: usize) -> String {
    let metrics = &observed.metrics;
    let now = Now::read(observed);
    metrics.refresh(&now);
    let settings = observed.settings();
    let requests: serde_json::Map<String, Value> = STATUS_CLASSES
        .iter()
        .zip(&metrics.client.requests)
        .map(|(class, count)| (class.to_string(), json!(count.get())))
        .collect();
    let refusals: serde_json::Map<String, Value> = metrics
        .client
        .refusals
        .collect()
        .iter()
        .flat_map(|family| family.get_metric())
        .filter_map(|metric| {
            let status = metric.get_label().first()?.value().to_string();
            Some((status, json!(metric.get_counter().get_value() as u64)))
        })
        .collect();
    let workers: serde_json::Map<String, Value> =
        WorkerState::ALL.iter().zip(now.workers).map(|(state, count)| (state.label().into(), json!(count))).collect();
    let connections: serde_json::Map<String, Value> =
        now.connections.iter().map(|(state, count)| (state.to_string(), json!(count))).collect();
    let listeners: Vec<Value> =
        now.listeners.iter().map(|l| json!({"name": l.name, "queue": l.queue, "backlog": l.backlog})).collect();
    let (overflows, exits) = (now.overflows, now.exits);
    let shed: serde_json::Map<String, Value> =
        ShedReason::ALL.iter().zip(now.shed).map(|(reason, count)| (reason.label().into(), json!(count))).collect();
    let worker_exits: serde_json::Map<String, Value> =
        ExitReason::ALL.iter().zip(exits).map(|(reason, count)| (reason.label().into(), json!(count))).collect();
    let scoreboard: Vec<Value> = observed
        .scoreboard
        .cards()
        .iter()
        .map(|card| {
            let request_of = |(summary, since): &(Rc<str>, Instant)| {
                let mut words = summary.split(' ');
                let method = words.next().unwrap_or_default();
                let target = words.next().unwrap_or_default();
                let path = target.split('?').next().unwrap_or_default();
                json!({"method": method, "path": path, "elapsed_seconds": since.elapsed().as_secs_f64()})
            };
            let request = card.longest_request().as_ref().map(request_of);
            let threads: Vec<Value> =
                card.threads.borrow().iter().map(|line| line.as_ref().map_or(Value::Null, request_of)).collect();
            let pid = card.pid.get();
            json!({
                "pid": pid,
                "generation": card.generation,
                "state": card.state().label(),
                "served": card.served.get(),
                "rss_bytes": pid.and_then(resident_of),
                "age_seconds": card.born.elapsed().as_secs_f64(),
                "request": request,
                "threads": threads,
                // An ASGI worker's requests admitted whose answers have not started, and its open
                // streams (docs/ASGI.md, "Streams"); 0 for a WSGI worker.
                "asgi": card.asgi.get(),
                "admitted": card.admitted.get(),
                "streams": card.streams.get(),
                // How late its event loop is (null for a WSGI worker): the lobby admits nothing
                // new to a loop later than 50 ms (worker/mux.rs).
                "loop_lag_seconds": card.loop_lag(Instant::now()).map(|lag| lag.as_secs_f64()),
            })
        })
        .collect();
    let diagnoses: Vec<Value> = observed
        .diagnoses
        .current()
        .into_iter()
        .map(|(finding, lasted)| {
            json!({
                "name": finding.name,
                "scenario": finding.scenario,
                "subject": finding.subject,
                "since_seconds": lasted.as_secs_f64(),
                "message": finding.message,
                "fix": finding.fix,
            })
        })
        .collect();
    let instant = std::time::Instant::now();
    let status = json!({
        "server": {
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "uptime_seconds": observed.started.elapsed().as_secs_f64(),
            "generation": observed.scoreboard.generation.get(),
            "workers_target": settings.workers,
            "max_connections": max_connections,
            "lobby_timeout_seconds": settings.lobby_timeout.map(|limit| limit.as_secs_f64()),
            "loop_lateness_max_seconds": now.event_loop.longest_late.as_secs_f64(),
            "loop_stall_max_seconds": now.event_loop.longest_stall.as_secs_f64(),
            "loop_watchdog_looks": now.event_loop.looks,
        },
        "requests": requests,
        "refusals": refusals,
        "queue": {
            "waiting": now.waiting,
            "oldest_wait_seconds": observed.seating.oldest_waiting().map_or(0.0, |at| at.elapsed().as_secs_f64()),
        },
        "overload": {
            "policy": if settings.queue_policy == QueuePolicy::Adaptive { "adaptive" } else { "fifo" },
            "patience_seconds": observed.seating.overload.patience(instant).map(|p| p.as_secs_f64()),
            "overloaded": observed.seating.overload.overloaded(instant),
            "learned": observed.seating.overload.learned(instant).map(|learned| json!({
                "patience_seconds": learned.patience.as_secs_f64(),
                "departures": learned.departures,
                "clients": learned.clients,
                "over_seconds": learned.over.as_secs_f64(),
                "lapses": format!(
                    "once the queue has drained and stayed short of overload for {} s",
                    SUSTAINED.as_secs_f64()
                ),
            })),
            "shed": shed,
        },
        "queue_wait_seconds": histogram(&metrics.worker.queue_wait),
        "request_duration_seconds": histogram(&metrics.worker.duration),
        "workers": workers,
        "seats": {"busy": now.seats[0], "free": now.seats[1]},
        "connections": connections,
        "websockets": {"open": now.websockets_open, "queued": now.websockets_queued},
        "listeners": listeners,
        "listen_overflows": {KERNEL_COUNTERS[0]: overflows[0], KERNEL_COUNTERS[1]: overflows[1]},
        "worker_exits": worker_exits,
        "scoreboard": scoreboard,
        "diagnoses": diagnoses,
    });
    status.to_string()
}

/// A cumulative histogram as `/status.json` gives it: `counts[i]` observations at most
/// `bounds[i]`, and a last count of them all.
fn histogram(histogram: &Histogram) -> Value {
    let metric = histogram.metric();
    let buckets = metric.get_histogram().get_bucket();
    let bounds: Vec<f64> = buckets.iter().map(|bucket| bucket.upper_bound()).collect();
    let mut counts: Vec<u64> = buckets.iter().map(|bucket| bucket.cumulative_count()).collect();
    counts.push(histogram.get_sample_count());
    json!({"bounds": bounds, "counts": counts, "count": histogram.get_sample_count(), "sum": histogram.get_sample_sum()})
}

impl Now {
    pub(super) fn read(observed: &Observed) -> Now {
        let states = &observed.connection_states;
        let waiting = observed.seating.waiting();
        let awaiting = states.count(ConnectionState::Awaiting) as usize;
        // A request offered to a busy worker is still waiting; once its worker has it, it
        // is in service.
        let queued = waiting.min(awaiting);
        Now {
            waiting,
            workers: observed.scoreboard.counts(),
            seats: observed.scoreboard.seats(observed.settings().worker_connections),
            connections: [
                ("reading", states.count(ConnectionState::Reading) as usize),
                ("queued", queued),
                ("in_service", awaiting - queued),
                ("writing", states.count(ConnectionState::Writing) as usize),
                ("websocket", states.count(ConnectionState::WebSocket) as usize),
                ("idle", states.count(ConnectionState::Idle) as usize),
                ("hibernating", observed.hibernation.sleeping()),
            ],
            listeners: observed
                .diagnoses
                .listeners()
                .iter()
                .map(|l| ListenerNow { name: l.name.clone(), queue: l.queue(), backlog: l.backlog })
                .collect(),
            exits: observed.scoreboard.exits(),
            shed: observed.seating.overload.counts(),
            overflows: observed.diagnoses.kernel_overflows(),
            websockets_open: observed.websockets.open(),
            websockets_queued: observed.seating.websockets_queued(),
            event_loop: observed.watchdog.as_ref().map(Watchdog::readings).unwrap_or_default(),
            workers_now: observed
                .scoreboard
                .cards()
                .iter()
                .filter_map(|card| {
                    Some(WorkerNow {
                        pid: card.pid.get()?,
                        admitted: card.admitted.get(),
                        streams: card.streams.get(),
                        loop_lag: card.loop_lag(Instant::now()),
                    })
                })
                .collect(),
        }
    }
}
