//! What the lobby counts, and the stats listener (`--stats`) that shows it: Prometheus metrics
//! at `/metrics` (docs/METRICS.md), written by the `prometheus` library (the Prometheus text
//! format, which `promtool check metrics` checks), answered by the lobby itself so that a scrape
//! never waits for a worker.
//!
//! `/status.json` gives the same figures with the worker scoreboard and the diagnoses in force,
//! for the page at `/` and `maitred top`.
//!
//! Counters and histograms are updated where things happen (atomic adds); gauges are read when
//! a scrape comes.

use std::borrow::Cow;
use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use prometheus::core::{Collector, Metric};
use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use serde_json::{json, Value};

use crate::connection_states::ConnectionState;
use crate::diagnosis::KERNEL_COUNTERS;
use crate::listen::Listener;
use crate::log::{debug, info_limited};
use crate::scoreboard::{ExitReason, WorkerState};
use crate::{stats_page, Lobby};

/// The most a stats request's head may be, and how long it may take to arrive.
const MAX_HEAD: usize = 8 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Stats connections open at once: a scraper, a page or two, `maitred top`; more are refused.
const MAX_STATS_CONNECTIONS: usize = 64;

const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

pub struct Metrics {
    registry: Registry,
    /// `maitred_requests_total` for 1xx to 5xx, looked up once: an answer costs one atomic add.
    requests: [IntCounter; 5],
    refusals: IntCounterVec,
    request_duration: Histogram,
    queue_wait: Histogram,
    queue_requests: IntGauge,
    workers: IntGaugeVec,
    connections: IntGaugeVec,
    worker_exits: IntCounterVec,
    listen_overflows: IntCounterVec,
    listen_queue: IntGaugeVec,
    listen_backlog: IntGaugeVec,
    /// What the counters kept elsewhere (the scoreboard's exits, the kernel's overflows) had
    /// reached at the last scrape, to add what they moved since.
    exits_reported: Cell<[u64; ExitReason::ALL.len()]>,
    overflows_reported: Cell<[u64; 2]>,
}

impl Metrics {
    pub fn new() -> Metrics {
        // Every name and label below is fixed and valid: none of these can fail.
        let registry = Registry::new_custom(Some("maitred".into()), None).expect("a valid prefix");
        let register = |collector: Box<dyn prometheus::core::Collector>| {
            registry.register(collector).expect("each family registered once, with a valid name")
        };
        let by_class = IntCounterVec::new(
            Opts::new("requests_total", "Requests answered, by the class of their status"),
            &["class"],
        )
        .expect("valid");
        register(Box::new(by_class.clone()));
        let requests = STATUS_CLASSES.map(|class| by_class.with_label_values(&[class]));
        let refusals = IntCounterVec::new(
            Opts::new(
                "refusals_total",
                "Requests refused by the lobby without a worker (bad requests, limits, --queue-timeout)",
            ),
            &["status"],
        )
        .expect("valid");
        register(Box::new(refusals.clone()));
        // 1 ms to about 65 s.
        let request_duration = Histogram::with_opts(
            HistogramOpts::new(
                "request_duration_seconds",
                "Time a worker spent on a request, from its seating to the end of its answer",
            )
            .buckets(exponential_buckets(0.001, 2.0, 17).expect("valid")),
        )
        .expect("valid");
        register(Box::new(request_duration.clone()));
        // 0.1 ms to about 6.5 s.
        let queue_wait = Histogram::with_opts(
            HistogramOpts::new("queue_wait_seconds", "Time a request waited in the lobby's queue for a worker")
                .buckets(exponential_buckets(0.0001, 2.0, 17).expect("valid")),
        )
        .expect("valid");
        register(Box::new(queue_wait.clone()));
        let queue_requests = IntGauge::new("queue_requests", "Requests waiting for a worker now").expect("valid");
        register(Box::new(queue_requests.clone()));
        let workers = IntGaugeVec::new(
            Opts::new("workers", "Workers, by state: starting, held (the spare, a reload's), idle, busy, retiring"),
            &["state"],
        )
        .expect("valid");
        register(Box::new(workers.clone()));
        let connections = IntGaugeVec::new(
            Opts::new(
                "connections",
                "Client connections held, by state: reading, queued, in_service, writing, idle, hibernating",
            ),
            &["state"],
        )
        .expect("valid");
        register(Box::new(connections.clone()));
        let worker_exits = IntCounterVec::new(
            Opts::new("worker_exits_total", "Workers that left the service, by reason"),
            &["reason"],
        )
        .expect("valid");
        register(Box::new(worker_exits.clone()));
        for reason in ExitReason::ALL {
            worker_exits.with_label_values(&[reason.label()]);
        }
        let listen_overflows = IntCounterVec::new(
            Opts::new(
                "listen_overflows_total",
                "Connections the kernel dropped or refused for a full listen queue since maitred started \
                 (/proc/net/netstat: machine-wide, every listener)",
            ),
            &["counter", "scope"],
        )
        .expect("valid");
        register(Box::new(listen_overflows.clone()));
        for counter in KERNEL_COUNTERS {
            listen_overflows.with_label_values(&[counter, "machine"]);
        }
        let listen_queue = IntGaugeVec::new(
            Opts::new("listen_queue", "Connections waiting in a listener's accept queue now (TCP listeners)"),
            &["listener"],
        )
        .expect("valid");
        register(Box::new(listen_queue.clone()));
        let listen_backlog = IntGaugeVec::new(
            Opts::new("listen_backlog", "The accept queue's size the kernel granted a listener"),
            &["listener"],
        )
        .expect("valid");
        register(Box::new(listen_backlog.clone()));
        Metrics {
            registry,
            requests,
            refusals,
            request_duration,
            queue_wait,
            queue_requests,
            workers,
            connections,
            worker_exits,
            listen_overflows,
            listen_queue,
            listen_backlog,
            exits_reported: Cell::new([0; ExitReason::ALL.len()]),
            overflows_reported: Cell::new([0; 2]),
        }
    }

    /// An answer written to a client, worker's or lobby's.
    pub fn answered(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.requests[class].inc();
    }

    /// A request the lobby answered itself, with an error.
    pub fn refused(&self, status: u16) {
        self.refusals.with_label_values(&[&status.to_string()]).inc();
        self.answered(status);
    }

    pub fn waited(&self, wait: Duration) {
        self.queue_wait.observe(wait.as_secs_f64());
    }

    pub fn served(&self, took: Duration) {
        self.request_duration.observe(took.as_secs_f64());
    }

    /// Reads the gauges, and the counters kept elsewhere, now.
    fn refresh(&self, lobby: &Lobby, now: &Now) {
        self.queue_requests.set(now.waiting as i64);
        for (state, count) in WorkerState::ALL.iter().zip(now.workers) {
            self.workers.with_label_values(&[state.label()]).set(count as i64);
        }
        for (state, count) in now.connections {
            self.connections.with_label_values(&[state]).set(count as i64);
        }
        for listener in &now.listeners {
            self.listen_backlog.with_label_values(&[&listener.name]).set(listener.backlog as i64);
            if let Some(queued) = listener.queue {
                self.listen_queue.with_label_values(&[&listener.name]).set(queued as i64);
            }
        }
        let exits = lobby.scoreboard.exits();
        let reported = self.exits_reported.replace(exits);
        for (index, reason) in ExitReason::ALL.iter().enumerate() {
            self.worker_exits.with_label_values(&[reason.label()]).inc_by(exits[index].saturating_sub(reported[index]));
        }
        let overflows = lobby.diagnoses.kernel_overflows();
        let reported = self.overflows_reported.replace(overflows);
        for (index, counter) in KERNEL_COUNTERS.iter().enumerate() {
            self.listen_overflows
                .with_label_values(&[counter, "machine"])
                .inc_by(overflows[index].saturating_sub(reported[index]));
        }
    }

    /// The exposition (Prometheus text format 0.0.4), with the gauges read now.
    fn render(&self, lobby: &Lobby) -> prometheus::Result<String> {
        self.refresh(lobby, &Now::read(lobby));
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }

    /// `/status.json` (docs/METRICS.md): the same figures, the scoreboard and the diagnoses.
    fn status(&self, lobby: &Lobby, max_connections: usize) -> String {
        let now = Now::read(lobby);
        self.refresh(lobby, &now);
        let settings = lobby.settings();
        let requests: serde_json::Map<String, Value> = STATUS_CLASSES
            .iter()
            .zip(&self.requests)
            .map(|(class, count)| (class.to_string(), json!(count.get())))
            .collect();
        let refusals: serde_json::Map<String, Value> = self
            .refusals
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .filter_map(|metric| {
                let status = metric.get_label().first()?.value().to_string();
                Some((status, json!(metric.get_counter().get_value() as u64)))
            })
            .collect();
        let workers: serde_json::Map<String, Value> = WorkerState::ALL
            .iter()
            .zip(now.workers)
            .map(|(state, count)| (state.label().into(), json!(count)))
            .collect();
        let connections: serde_json::Map<String, Value> =
            now.connections.iter().map(|(state, count)| (state.to_string(), json!(count))).collect();
        let listeners: Vec<Value> =
            now.listeners.iter().map(|l| json!({"name": l.name, "queue": l.queue, "backlog": l.backlog})).collect();
        let overflows = lobby.diagnoses.kernel_overflows();
        let exits = lobby.scoreboard.exits();
        let worker_exits: serde_json::Map<String, Value> =
            ExitReason::ALL.iter().zip(exits).map(|(reason, count)| (reason.label().into(), json!(count))).collect();
        let scoreboard: Vec<Value> = lobby
            .scoreboard
            .cards()
            .iter()
            .map(|card| {
                let request = card.request.borrow().as_ref().map(|(summary, since)| {
                    let mut words = summary.split(' ');
                    let method = words.next().unwrap_or_default();
                    let target = words.next().unwrap_or_default();
                    let path = target.split('?').next().unwrap_or_default();
                    json!({"method": method, "path": path, "elapsed_seconds": since.elapsed().as_secs_f64()})
                });
                let pid = card.pid.get();
                json!({
                    "pid": pid,
                    "generation": card.generation,
                    "state": card.state().label(),
                    "served": card.served.get(),
                    "rss_bytes": pid.and_then(crate::recycle::resident_of),
                    "age_seconds": card.born.elapsed().as_secs_f64(),
                    "request": request,
                })
            })
            .collect();
        let diagnoses: Vec<Value> = lobby
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
        let status = json!({
            "server": {
                "version": env!("CARGO_PKG_VERSION"),
                "pid": std::process::id(),
                "uptime_seconds": lobby.started.elapsed().as_secs_f64(),
                "generation": lobby.scoreboard.generation.get(),
                "workers_target": settings.workers,
                "max_connections": max_connections,
            },
            "requests": requests,
            "refusals": refusals,
            "queue": {
                "waiting": now.waiting,
                "oldest_wait_seconds": lobby.seating.oldest_waiting().map_or(0.0, |at| at.elapsed().as_secs_f64()),
            },
            "queue_wait_seconds": histogram(&self.queue_wait),
            "request_duration_seconds": histogram(&self.request_duration),
            "workers": workers,
            "connections": connections,
            "listeners": listeners,
            "listen_overflows": {KERNEL_COUNTERS[0]: overflows[0], KERNEL_COUNTERS[1]: overflows[1]},
            "worker_exits": worker_exits,
            "scoreboard": scoreboard,
            "diagnoses": diagnoses,
        });
        status.to_string()
    }
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

/// The figures read at a scrape, shared by `/metrics` and `/status.json`.
struct Now {
    waiting: usize,
    workers: [usize; WorkerState::ALL.len()],
    connections: [(&'static str, usize); 6],
    listeners: Vec<ListenerNow>,
}

struct ListenerNow {
    name: String,
    queue: Option<u32>,
    backlog: u32,
}

impl Now {
    fn read(lobby: &Lobby) -> Now {
        let states = &lobby.connection_states;
        let waiting = lobby.seating.waiting();
        let awaiting = states.count(ConnectionState::Awaiting) as usize;
        // A request offered to a busy worker is still waiting; once its worker has it, it
        // is in service.
        let queued = waiting.min(awaiting);
        Now {
            waiting,
            workers: lobby.scoreboard.counts(),
            connections: [
                ("reading", states.count(ConnectionState::Reading) as usize),
                ("queued", queued),
                ("in_service", awaiting - queued),
                ("writing", states.count(ConnectionState::Writing) as usize),
                ("idle", states.count(ConnectionState::Idle) as usize),
                ("hibernating", lobby.hibernation.sleeping()),
            ],
            listeners: lobby
                .diagnoses
                .listeners()
                .iter()
                .map(|l| ListenerNow { name: l.name.clone(), queue: l.queue(), backlog: l.backlog })
                .collect(),
        }
    }
}

/// Serves the stats listener until the lobby stops: one request per connection, at most
/// `MAX_STATS_CONNECTIONS` at once (those past it are closed at once).
pub async fn serve(lobby: Rc<Lobby>, listener: Listener, max_connections: usize) {
    let std_listener: std::os::fd::OwnedFd = listener.socket.into();
    let open = Arc::new(Semaphore::new(MAX_STATS_CONNECTIONS));
    if listener.unix_path.is_some() {
        let Ok(accepting) = tokio::net::UnixListener::from_std(std_listener.into()) else { return };
        loop {
            match accepting.accept().await {
                Ok((stream, _)) => spawn_answer(&lobby, stream, &open, max_connections),
                Err(e) => accept_failed(e).await,
            }
        }
    } else {
        let Ok(accepting) = tokio::net::TcpListener::from_std(std_listener.into()) else { return };
        loop {
            match accepting.accept().await {
                Ok((stream, _)) => spawn_answer(&lobby, stream, &open, max_connections),
                Err(e) => accept_failed(e).await,
            }
        }
    }
}

async fn accept_failed(e: io::Error) {
    info_limited!("the stats listener could not accept a connection: {e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn spawn_answer<S>(lobby: &Rc<Lobby>, stream: S, open: &Arc<Semaphore>, max_connections: usize)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let Ok(permit) = open.clone().try_acquire_owned() else {
        info_limited!("the stats listener has {MAX_STATS_CONNECTIONS} connections open; closing another");
        return;
    };
    let lobby = lobby.clone();
    tokio::task::spawn_local(async move {
        if let Err(e) = answer(&lobby, stream, max_connections).await {
            debug!("stats request: {e}");
        }
        drop(permit);
    });
}

/// Reads one request head and answers it, then closes.
async fn answer<S>(lobby: &Lobby, mut stream: S, max_connections: usize) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut head = Vec::with_capacity(1024);
    let read = tokio::time::timeout(HEAD_TIMEOUT, async {
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut chunk).await?;
            if n == 0 || head.len() + n > MAX_HEAD {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "no complete request head"));
            }
            head.extend_from_slice(&chunk[..n]);
        }
        Ok(())
    })
    .await;
    let (status, content_type, body) = match read {
        Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "the request head took too long")),
        Ok(Err(e)) => (400, "text/plain; charset=utf-8", format!("bad request: {e}\n").into_bytes().into()),
        Ok(Ok(())) => route(lobby, &head, max_connections),
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Internal Server Error",
    };
    // no-cache: the live page's files change with the binary, and every other answer is of now.
    let mut response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: \
         no-cache\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(&body);
    stream.write_all(&response).await?;
    stream.shutdown().await
}

fn route(lobby: &Lobby, head: &[u8], max_connections: usize) -> (u16, &'static str, Cow<'static, [u8]>) {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    let text = "text/plain; charset=utf-8";
    if method != b"GET" {
        return (405, text, b"the stats listener answers GET only\n"[..].into());
    }
    match path {
        b"/metrics" => match lobby.metrics.render(lobby) {
            Ok(exposition) => (200, prometheus::TEXT_FORMAT, exposition.into_bytes().into()),
            Err(_) => (500, text, b"the metrics could not be written\n"[..].into()),
        },
        b"/status.json" => (200, "application/json", lobby.metrics.status(lobby, max_connections).into_bytes().into()),
        _ => match stats_page::file(path) {
            Some((content_type, body)) => (200, content_type, body.into()),
            None => (
                404,
                text,
                b"not found: the stats listener serves / (a live page), /metrics and /status.json\n"[..].into(),
            ),
        },
    }
}
