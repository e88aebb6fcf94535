//! What the lobby counts, as the `prometheus` library keeps it: counters and histograms are
//! updated where things happen (atomic adds); gauges, and the counters kept elsewhere, are
//! read when a scrape comes (`Now`, read by `status.rs`). The connections and the workers' tasks
//! count into the families registered here through counts of their own (`client/counts.rs`,
//! `worker/counts.rs`), handed to them as the lobby starts.

use std::cell::Cell;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use maitred_protocol::RequestError;

use super::findings::KERNEL_COUNTERS;
use crate::client::counts::Counts as ClientCounts;
use crate::client::h2::reasons::{GoawayReason, Http2Refusal, StreamStage};
use crate::process::watchdog::Readings;
use crate::seating::overload::ShedReason;
use crate::worker::counts::Counts as WorkerCounts;
use crate::worker::scoreboard::{ExitReason, WorkerState};

pub(super) const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The statuses the lobby refuses a request with besides the protocol's errors
/// (`RequestError::STATUSES`): a head or body later than --header-timeout (408), a WebSocket
/// version other than 13 (426), a request body that could not be buffered (500) or had no
/// descriptor for its temporary file (503). With those, `maitred_refusals_total`'s label values,
/// at zero from the first scrape.
const LOBBY_REFUSAL_STATUSES: [u16; 4] = [408, 426, 500, 503];

pub struct Metrics {
    pub(super) registry: Registry,
    /// What the connections count, and the workers' tasks: handed to them (`client_counts`,
    /// `worker_counts`), read here for `/status.json`.
    pub(super) client: ClientCounts,
    pub(super) worker: WorkerCounts,
    queue: Queue,
    workers: Workers,
    connections: Connections,
    lobby_loop: LobbyLoop,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new_custom(Some("maitred".into()), None).expect("a valid prefix");
        let families = Families(&registry);
        let (client, worker) = (client_counts(&families), worker_counts(&families));
        let (queue, workers, connections) =
            (Queue::new(&families), Workers::new(&families), Connections::new(&families));
        let lobby_loop = LobbyLoop::new(&families);
        Metrics { registry, client, worker, queue, workers, connections, lobby_loop }
    }

    /// What the connections count into.
    pub fn client_counts(&self) -> ClientCounts {
        self.client.clone()
    }

    /// What the workers' tasks count into.
    pub fn worker_counts(&self) -> WorkerCounts {
        self.worker.clone()
    }

    /// Reads the gauges, and the counters kept elsewhere, now.
    pub(super) fn refresh(&self, now: &Now) {
        self.queue.refresh(now);
        self.workers.refresh(now);
        self.connections.refresh(now);
        self.lobby_loop.refresh(now);
    }

    /// The exposition (Prometheus text format 0.0.4), with the gauges read now.
    pub(super) fn render(&self, now: &Now) -> prometheus::Result<String> {
        self.refresh(now);
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

/// Where each group of families below registers.
struct Families<'a>(&'a Registry);

impl Families<'_> {
    /// Registers `made` and keeps a handle on it. Every name and label here is fixed and
    /// valid: none of these can fail.
    fn add<C: Collector + Clone + 'static>(&self, made: prometheus::Result<C>) -> C {
        let collector = made.expect("valid");
        self.0.register(Box::new(collector.clone())).expect("each family registered once, with a valid name");
        collector
    }

    /// A counter by one label, each of whose values is on the first scrape, at zero.
    fn counter_by(
        &self,
        name: &str,
        help: &str,
        label: &str,
        values: impl Iterator<Item = &'static str>,
    ) -> IntCounterVec {
        let counter = self.add(IntCounterVec::new(Opts::new(name, help), &[label]));
        for value in values {
            counter.with_label_values(&[value]);
        }
        counter
    }

    /// A gauge by one label, whose series each scrape sets.
    fn gauges_by(&self, name: &str, help: &str, label: &str) -> IntGaugeVec {
        self.add(IntGaugeVec::new(Opts::new(name, help), &[label]))
    }
}

/// What the connections count: `requests_total` by class (those of HTTP/2 counted again apart),
/// the lobby's refusals by status, and what HTTP/2 clients made the lobby do (end their
/// connections, send GOAWAY, and what their resets interrupted).
fn client_counts(families: &Families) -> ClientCounts {
    let by_class = families.add(IntCounterVec::new(
        Opts::new("requests_total", "Requests answered, by the class of their status"),
        &["class"],
    ));
    let http2_requests = families.add(IntCounter::new(
        "http2_requests_total",
        "Requests answered that came over HTTP/2, as streams (counted in requests_total too)",
    ));
    let refusals = families.add(IntCounterVec::new(
        Opts::new(
            "refusals_total",
            "Requests refused by the lobby without a worker (bad requests, limits, --queue-timeout)",
        ),
        &["status"],
    ));
    for status in RequestError::STATUSES.iter().chain(&LOBBY_REFUSAL_STATUSES) {
        refusals.with_label_values(&[&status.to_string()]);
    }
    let http2_refused = families.counter_by(
        "http2_refused_total",
        "HTTP/2 connections ended for what their client sent, by what it was: a flood (rapid_reset, \
         continuation_flood, header_list_too_large, empty_data_flood, malformed_streams, settings_flood, \
         ping_flood), a client that gave no window for --send-timeout (zero_window), or a broken rule \
         (flow_control, invalid_preface, protocol_error)",
        "reason",
        Http2Refusal::ALL.iter().map(|refusal| refusal.label()),
    );
    let http2_goaways = families.counter_by(
        "http2_goaways_total",
        "GOAWAY frames the lobby sent to HTTP/2 clients, one a connection, by why: shutdown (a shutdown or a \
         binary upgrade), idle (--keep-alive), protocol_error, flood (ENHANCE_YOUR_CALM)",
        "reason",
        GoawayReason::ALL.iter().map(|reason| reason.label()),
    );
    let http2_streams_reset = families.counter_by(
        "http2_streams_reset_total",
        "HTTP/2 streams their client reset (RST_STREAM) before their answer was whole, by where their request \
         was: reading, queued, in_service, writing",
        "state",
        StreamStage::ALL.iter().map(|stage| stage.label()),
    );
    ClientCounts {
        // Looked up once: an answer costs one atomic add.
        requests: STATUS_CLASSES.map(|class| by_class.with_label_values(&[class])),
        http2_requests,
        refusals,
        http2_refused,
        http2_goaways,
        http2_streams_reset,
    }
}

/// What the workers' tasks count: how long requests waited in the queue, and how long a worker
/// took.
fn worker_counts(families: &Families) -> WorkerCounts {
    // 0.1 ms to about 6.5 s.
    let queue_wait = families.add(Histogram::with_opts(
        HistogramOpts::new("queue_wait_seconds", "Time a request waited in the lobby's queue for a worker")
            .buckets(exponential_buckets(0.0001, 2.0, 17).expect("valid")),
    ));
    // 1 ms to about 65 s.
    let duration = families.add(Histogram::with_opts(
        HistogramOpts::new(
            "request_duration_seconds",
            "Time a worker spent on a request, from its seating to the end of its answer",
        )
        .buckets(exponential_buckets(0.001, 2.0, 17).expect("valid")),
    ));
    WorkerCounts { queue_wait, duration }
}

/// The queue: what waits in it now, and those it did not serve (how long requests waited is the
/// workers' count).
struct Queue {
    requests: IntGauge,
    websockets_queued: IntGauge,
    shed: IntCounterVec,
    /// What the seating's count of requests not served had reached at the last scrape, to
    /// add what it moved since.
    shed_reported: Cell<[u64; ShedReason::ALL.len()]>,
}

impl Queue {
    fn new(families: &Families) -> Queue {
        let requests = families.add(IntGauge::new("queue_requests", "Requests waiting for a worker now"));
        let websockets_queued =
            families.add(IntGauge::new("websockets_queued", "WebSocket handshakes waiting in the queue for a worker"));
        let shed = families.counter_by(
            "shed_total",
            "Requests not served, by reason: abandoned (the client left while it waited), overload (it could no \
             longer be answered in time), deadline (--request-deadline), queue_timeout (--queue-timeout)",
            "reason",
            ShedReason::ALL.iter().map(|reason| reason.label()),
        );
        Queue { requests, websockets_queued, shed, shed_reported: Cell::new([0; ShedReason::ALL.len()]) }
    }

    fn refresh(&self, now: &Now) {
        self.requests.set(now.waiting as i64);
        self.websockets_queued.set(now.websockets_queued as i64);
        add_moved(&self.shed_reported, now.shed, |index| {
            self.shed.with_label_values(&[ShedReason::ALL[index].label()])
        });
    }
}

/// The workers: how many in each state, their threads, why they left, and each ASGI worker's
/// admissions, streams and event loop.
struct Workers {
    by_state: IntGaugeVec,
    seats: IntGaugeVec,
    exits: IntCounterVec,
    /// What the scoreboard's count of exits had reached at the last scrape, to add what it
    /// moved since.
    exits_reported: Cell<[u64; ExitReason::ALL.len()]>,
    admitted: IntGaugeVec,
    streams: IntGaugeVec,
    loop_lag: GaugeVec,
}

impl Workers {
    fn new(families: &Families) -> Workers {
        let by_state = families.gauges_by(
            "workers",
            "Workers, by state: starting, held (the spare, a reload's), idle, busy, retiring",
            "state",
        );
        let seats = families.gauges_by(
            "seats",
            "Threads of the workers that serve, by state: busy with a request, or free",
            "state",
        );
        let exits = families.counter_by(
            "worker_exits_total",
            "Workers that left the service, by reason",
            "reason",
            ExitReason::ALL.iter().map(|reason| reason.label()),
        );
        // By pid: a worker's series goes with it (each scrape sets those of the workers there).
        let admitted = families.gauges_by(
            "worker_admitted",
            "An ASGI worker's requests admitted whose answers have not started: what --worker-connections \
             bounds (docs/ASGI.md, \"Streams and admission\"); 0 for a WSGI worker",
            "pid",
        );
        let streams = families.gauges_by(
            "worker_streams",
            "An ASGI worker's open streams: answers started and not ended, WebSockets included, which cost its \
             admission nothing",
            "pid",
        );
        let loop_lag = families.add(GaugeVec::new(
            Opts::new(
                "worker_loop_lag_seconds",
                "How late an ASGI worker's event loop ran its last heartbeat (every 0.1 s), or how long past a beat it \
                 has been silent (0 for a WSGI worker); the lobby admits no new request to a worker whose loop is late",
            ),
            &["pid"],
        ));
        let exits_reported = Cell::new([0; ExitReason::ALL.len()]);
        Workers { by_state, seats, exits, exits_reported, admitted, streams, loop_lag }
    }

    fn refresh(&self, now: &Now) {
        for (state, count) in WorkerState::ALL.iter().zip(now.workers) {
            self.by_state.with_label_values(&[state.label()]).set(count as i64);
        }
        for (state, count) in SEAT_STATES.iter().zip(now.seats) {
            self.seats.with_label_values(&[state]).set(count as i64);
        }
        self.admitted.reset();
        self.streams.reset();
        self.loop_lag.reset();
        for worker in &now.workers_now {
            let pid = worker.pid.to_string();
            self.admitted.with_label_values(&[&pid]).set(worker.admitted as i64);
            self.streams.with_label_values(&[&pid]).set(worker.streams as i64);
            let lag = worker.loop_lag.unwrap_or_default();
            self.loop_lag.with_label_values(&[&pid]).set(lag.as_secs_f64());
        }
        add_moved(&self.exits_reported, now.exits, |index| {
            self.exits.with_label_values(&[ExitReason::ALL[index].label()])
        });
    }
}

/// The client connections by state, the open WebSockets among them, and the listeners: their
/// queues now, their backlogs, and the kernel's overflows.
struct Connections {
    by_state: IntGaugeVec,
    websockets_open: IntGauge,
    listen_queue: IntGaugeVec,
    listen_backlog: IntGaugeVec,
    listen_overflows: IntCounterVec,
    /// What the kernel's overflow counters had reached at the last scrape, to add what they
    /// moved since.
    overflows_reported: Cell<[u64; 2]>,
}

impl Connections {
    fn new(families: &Families) -> Connections {
        let by_state = families.gauges_by(
            "connections",
            "Client connections held, by state: reading, queued, in_service, writing, websocket, idle, \
             hibernating",
            "state",
        );
        let websockets_open = families.add(IntGauge::new(
            "websockets_open",
            "WebSockets accepted and not yet closed (an ASGI worker's open WebSockets hold no seat)",
        ));
        let listen_queue = families.gauges_by(
            "listen_queue",
            "Connections waiting in a listener's accept queue now (TCP listeners)",
            "listener",
        );
        let listen_backlog =
            families.gauges_by("listen_backlog", "The accept queue's size the kernel granted a listener", "listener");
        let listen_overflows = families.add(IntCounterVec::new(
            Opts::new(
                "listen_overflows_total",
                "Connections the kernel dropped or refused for a full listen queue since maitred started \
                 (/proc/net/netstat: machine-wide, every listener)",
            ),
            &["counter", "scope"],
        ));
        for counter in KERNEL_COUNTERS {
            listen_overflows.with_label_values(&[counter, "machine"]);
        }
        let overflows_reported = Cell::new([0; 2]);
        Connections { by_state, websockets_open, listen_queue, listen_backlog, listen_overflows, overflows_reported }
    }

    fn refresh(&self, now: &Now) {
        self.websockets_open.set(now.websockets_open as i64);
        for (state, count) in now.connections {
            self.by_state.with_label_values(&[state]).set(count as i64);
        }
        for listener in &now.listeners {
            self.listen_backlog.with_label_values(&[&listener.name]).set(listener.backlog as i64);
            if let Some(queued) = listener.queue {
                self.listen_queue.with_label_values(&[&listener.name]).set(queued as i64);
            }
        }
        add_moved(&self.overflows_reported, now.overflows, |index| {
            self.listen_overflows.with_label_values(&[KERNEL_COUNTERS[index], "machine"])
        });
    }
}

/// Adds to each counter what the count kept elsewhere for it moved since the last scrape,
/// `reported`, which becomes `now`.
fn add_moved<const N: usize>(reported: &Cell<[u64; N]>, now: [u64; N], counter: impl Fn(usize) -> IntCounter) {
    let reported = reported.replace(now);
    for index in 0..N {
        counter(index).inc_by(now[index].saturating_sub(reported[index]));
    }
}

/// The lobby's own event loop, as its watchdog reads it (--lobby-timeout).
struct LobbyLoop {
    lateness_max: Gauge,
    stall_max: Gauge,
}

impl LobbyLoop {
    fn new(families: &Families) -> LobbyLoop {
        let lateness_max = families.add(Gauge::new(
            "lobby_loop_lateness_max_seconds",
            "The longest the lobby's event loop ran its once-a-second heartbeat late, since the start (--lobby-timeout)",
        ));
        let stall_max = families.add(Gauge::new(
            "lobby_loop_stall_max_seconds",
            "The longest the lobby's watchdog saw its event loop make no progress, since the start; the lobby ends \
             itself at --lobby-timeout",
        ));
        LobbyLoop { lateness_max, stall_max }
    }

    fn refresh(&self, now: &Now) {
        self.lateness_max.set(now.event_loop.longest_late.as_secs_f64());
        self.stall_max.set(now.event_loop.longest_stall.as_secs_f64());
    }
}

/// `maitred_seats`' label values.
pub(super) const SEAT_STATES: [&str; 2] = ["busy", "free"];

/// The figures read at a scrape, shared by `/metrics` and `/status.json`.
pub(super) struct Now {
    pub(super) waiting: usize,
    pub(super) workers: [usize; WorkerState::ALL.len()],
    /// Busy and free threads, in `SEAT_STATES`' order.
    pub(super) seats: [usize; 2],
    pub(super) connections: [(&'static str, usize); 7],
    pub(super) listeners: Vec<ListenerNow>,
    /// Worker exits by reason, the kernel's listen overflows and the requests the queue did not
    /// serve, as counted elsewhere.
    pub(super) exits: [u64; ExitReason::ALL.len()],
    pub(super) overflows: [u64; 2],
    pub(super) shed: [u64; ShedReason::ALL.len()],
    pub(super) websockets_open: usize,
    /// WebSocket handshakes waiting for a seat (cancelled ones not yet swept included).
    pub(super) websockets_queued: usize,
    /// The watchdog's readings of the event loop (zero when it is off).
    pub(super) event_loop: Readings,
    /// Every worker with a pid, each with its admitted requests, open streams and loop lag (0,
    /// 0 and none for a WSGI worker): a series each from the first scrape.
    pub(super) workers_now: Vec<WorkerNow>,
}

pub(super) struct WorkerNow {
    pub(super) pid: i32,
    pub(super) admitted: usize,
    pub(super) streams: usize,
    /// None from a WSGI worker, and until an ASGI one's first heartbeat: 0 on /metrics.
    pub(super) loop_lag: Option<Duration>,
}

pub(super) struct ListenerNow {
    pub(super) name: String,
    pub(super) queue: Option<u32>,
    pub(super) backlog: u32,
}
