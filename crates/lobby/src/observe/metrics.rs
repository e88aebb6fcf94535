//! What the lobby counts, as the `prometheus` library keeps it: counters and histograms are
//! updated where things happen (atomic adds); gauges, and the counters kept elsewhere, are
//! read when a scrape comes (`Now`, read by `status.rs`). A leaf: the lobby holds its
//! `Metrics`, so it takes no `Lobby`.

use std::cell::Cell;
use std::time::Duration;

use prometheus::{
    exponential_buckets, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use maitred_protocol::RequestError;

use super::findings::KERNEL_COUNTERS;
use crate::client::h2::reasons::{GoawayReason, Http2Refusal, StreamStage};
use crate::process::watchdog::Readings;
use crate::seating::overload::ShedReason;
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
    /// `maitred_requests_total` for 1xx to 5xx, looked up once: an answer costs one atomic add.
    pub(super) requests: [IntCounter; 5],
    /// `maitred_http2_requests_total`: those of them that came over HTTP/2.
    pub(super) http2_requests: IntCounter,
    pub(super) http2_refused: IntCounterVec,
    pub(super) http2_goaways: IntCounterVec,
    pub(super) http2_streams_reset: IntCounterVec,
    pub(super) refusals: IntCounterVec,
    pub(super) request_duration: Histogram,
    pub(super) queue_wait: Histogram,
    pub(super) queue_requests: IntGauge,
    pub(super) workers: IntGaugeVec,
    pub(super) seats: IntGaugeVec,
    pub(super) connections: IntGaugeVec,
    pub(super) worker_exits: IntCounterVec,
    pub(super) listen_overflows: IntCounterVec,
    pub(super) listen_queue: IntGaugeVec,
    pub(super) listen_backlog: IntGaugeVec,
    pub(super) shed: IntCounterVec,
    pub(super) websockets_open: IntGauge,
    pub(super) websockets_queued: IntGauge,
    pub(super) worker_admitted: IntGaugeVec,
    pub(super) worker_streams: IntGaugeVec,
    pub(super) worker_loop_lag: GaugeVec,
    pub(super) loop_lateness_max: Gauge,
    pub(super) loop_stall_max: Gauge,
    /// What the counters kept elsewhere (the scoreboard's exits, the kernel's overflows) had
    /// reached at the last scrape, to add what they moved since.
    pub(super) exits_reported: Cell<[u64; ExitReason::ALL.len()]>,
    pub(super) overflows_reported: Cell<[u64; 2]>,
    pub(super) shed_reported: Cell<[u64; ShedReason::ALL.len()]>,
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
        let http2_requests = IntCounter::new(
            "http2_requests_total",
            "Requests answered that came over HTTP/2, as streams (counted in requests_total too)",
        )
        .expect("valid");
        register(Box::new(http2_requests.clone()));
        // A counter by one label, each of whose values is on the first scrape, at zero.
        let counter_by = |name: &str, help: &str, label: &str, values: &mut dyn Iterator<Item = &'static str>| {
            let counter = IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid");
            register(Box::new(counter.clone()));
            for value in values {
                counter.with_label_values(&[value]);
            }
            counter
        };
        let http2_refused = counter_by(
            "http2_refused_total",
            "HTTP/2 connections ended for what their client sent, by what it was: a flood (rapid_reset, \
             continuation_flood, header_list_too_large, empty_data_flood, malformed_streams, settings_flood, \
             ping_flood), a client that gave no window for --send-timeout (zero_window), or a broken rule \
             (flow_control, invalid_preface, protocol_error)",
            "reason",
            &mut Http2Refusal::ALL.iter().map(|refusal| refusal.label()),
        );
        let http2_goaways = counter_by(
            "http2_goaways_total",
            "GOAWAY frames the lobby sent to HTTP/2 clients, one a connection, by why: shutdown (a shutdown or a \
             binary upgrade), idle (--keep-alive), protocol_error, flood (ENHANCE_YOUR_CALM)",
            "reason",
            &mut GoawayReason::ALL.iter().map(|reason| reason.label()),
        );
        let http2_streams_reset = counter_by(
            "http2_streams_reset_total",
            "HTTP/2 streams their client reset (RST_STREAM) before their answer was whole, by where their request \
             was: reading, queued, in_service, writing",
            "state",
            &mut StreamStage::ALL.iter().map(|stage| stage.label()),
        );
        let refusals = IntCounterVec::new(
            Opts::new(
                "refusals_total",
                "Requests refused by the lobby without a worker (bad requests, limits, --queue-timeout)",
            ),
            &["status"],
        )
        .expect("valid");
        register(Box::new(refusals.clone()));
        for status in RequestError::STATUSES.iter().chain(&LOBBY_REFUSAL_STATUSES) {
            refusals.with_label_values(&[&status.to_string()]);
        }
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
        let seats = IntGaugeVec::new(
            Opts::new("seats", "Threads of the workers that serve, by state: busy with a request, or free"),
            &["state"],
        )
        .expect("valid");
        register(Box::new(seats.clone()));
        let connections = IntGaugeVec::new(
            Opts::new(
                "connections",
                "Client connections held, by state: reading, queued, in_service, writing, websocket, idle, \
                 hibernating",
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
        let shed = IntCounterVec::new(
            Opts::new(
                "shed_total",
                "Requests not served, by reason: abandoned (the client left while it waited), overload (it could no \
                 longer be answered in time), deadline (--request-deadline), queue_timeout (--queue-timeout)",
            ),
            &["reason"],
        )
        .expect("valid");
        register(Box::new(shed.clone()));
        for reason in ShedReason::ALL {
            shed.with_label_values(&[reason.label()]);
        }
        let websockets_open = IntGauge::new(
            "websockets_open",
            "WebSockets accepted and not yet closed (an ASGI worker's open WebSockets hold no seat)",
        )
        .expect("valid");
        register(Box::new(websockets_open.clone()));
        let websockets_queued =
            IntGauge::new("websockets_queued", "WebSocket handshakes waiting in the queue for a worker")
                .expect("valid");
        register(Box::new(websockets_queued.clone()));
        // By pid: a worker's series goes with it (each scrape sets those of the workers there).
        let worker_admitted = IntGaugeVec::new(
            Opts::new(
                "worker_admitted",
                "An ASGI worker's requests admitted whose answers have not started: what --worker-connections \
                 bounds (docs/ASGI.md, \"Streams and admission\"); 0 for a WSGI worker",
            ),
            &["pid"],
        )
        .expect("valid");
        register(Box::new(worker_admitted.clone()));
        let worker_streams = IntGaugeVec::new(
            Opts::new(
                "worker_streams",
                "An ASGI worker's open streams: answers started and not ended, WebSockets included, which cost its \
                 admission nothing",
            ),
            &["pid"],
        )
        .expect("valid");
        register(Box::new(worker_streams.clone()));
        let worker_loop_lag = GaugeVec::new(
            Opts::new(
                "worker_loop_lag_seconds",
                "How late an ASGI worker's event loop ran its last heartbeat (every 0.1 s), or how long past a beat it \
                 has been silent (0 for a WSGI worker); the lobby admits no new request to a worker whose loop is late",
            ),
            &["pid"],
        )
        .expect("valid");
        register(Box::new(worker_loop_lag.clone()));
        let loop_lateness_max = Gauge::new(
            "lobby_loop_lateness_max_seconds",
            "The longest the lobby's event loop ran its once-a-second heartbeat late, since the start (--lobby-timeout)",
        )
        .expect("valid");
        register(Box::new(loop_lateness_max.clone()));
        let loop_stall_max = Gauge::new(
            "lobby_loop_stall_max_seconds",
            "The longest the lobby's watchdog saw its event loop make no progress, since the start; the lobby ends \
             itself at --lobby-timeout",
        )
        .expect("valid");
        register(Box::new(loop_stall_max.clone()));
        Metrics {
            registry,
            websockets_open,
            websockets_queued,
            worker_admitted,
            worker_streams,
            worker_loop_lag,
            loop_lateness_max,
            loop_stall_max,
            requests,
            http2_requests,
            http2_refused,
            http2_goaways,
            http2_streams_reset,
            refusals,
            request_duration,
            queue_wait,
            queue_requests,
            workers,
            seats,
            connections,
            worker_exits,
            listen_overflows,
            listen_queue,
            listen_backlog,
            shed,
            exits_reported: Cell::new([0; ExitReason::ALL.len()]),
            overflows_reported: Cell::new([0; 2]),
            shed_reported: Cell::new([0; ShedReason::ALL.len()]),
        }
    }

    /// An answer written to a client, worker's or lobby's.
    pub fn answered(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.requests[class].inc();
    }

    /// An answer written to an HTTP/2 stream, counted by `answered` or `refused` besides: HTTP/1.x's
    /// are the difference, so that its answers cost no second count.
    pub fn answered_http2(&self) {
        self.http2_requests.inc();
    }

    /// An HTTP/2 connection ended with GOAWAY for what its client sent.
    pub fn http2_refused(&self, refusal: Http2Refusal) {
        self.http2_refused.with_label_values(&[refusal.label()]).inc();
        self.http2_goaway(refusal.goaway());
    }

    pub fn http2_goaway(&self, reason: GoawayReason) {
        self.http2_goaways.with_label_values(&[reason.label()]).inc();
    }

    /// A stream its client reset.
    pub fn http2_stream_reset(&self, stage: StreamStage) {
        self.http2_streams_reset.with_label_values(&[stage.label()]).inc();
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
    pub(super) fn refresh(&self, now: &Now) {
        self.queue_requests.set(now.waiting as i64);
        self.websockets_open.set(now.websockets_open as i64);
        self.websockets_queued.set(now.websockets_queued as i64);
        self.loop_lateness_max.set(now.event_loop.longest_late.as_secs_f64());
        self.loop_stall_max.set(now.event_loop.longest_stall.as_secs_f64());
        for (state, count) in WorkerState::ALL.iter().zip(now.workers) {
            self.workers.with_label_values(&[state.label()]).set(count as i64);
        }
        for (state, count) in SEAT_STATES.iter().zip(now.seats) {
            self.seats.with_label_values(&[state]).set(count as i64);
        }
        self.worker_admitted.reset();
        self.worker_streams.reset();
        self.worker_loop_lag.reset();
        for worker in &now.workers_now {
            let pid = worker.pid.to_string();
            self.worker_admitted.with_label_values(&[&pid]).set(worker.admitted as i64);
            self.worker_streams.with_label_values(&[&pid]).set(worker.streams as i64);
            let lag = worker.loop_lag.unwrap_or_default();
            self.worker_loop_lag.with_label_values(&[&pid]).set(lag.as_secs_f64());
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
        let reported = self.exits_reported.replace(now.exits);
        for (index, reason) in ExitReason::ALL.iter().enumerate() {
            self.worker_exits
                .with_label_values(&[reason.label()])
                .inc_by(now.exits[index].saturating_sub(reported[index]));
        }
        let reported = self.shed_reported.replace(now.shed);
        for (index, reason) in ShedReason::ALL.iter().enumerate() {
            self.shed.with_label_values(&[reason.label()]).inc_by(now.shed[index].saturating_sub(reported[index]));
        }
        let reported = self.overflows_reported.replace(now.overflows);
        for (index, counter) in KERNEL_COUNTERS.iter().enumerate() {
            self.listen_overflows
                .with_label_values(&[counter, "machine"])
                .inc_by(now.overflows[index].saturating_sub(reported[index]));
        }
    }

    /// The exposition (Prometheus text format 0.0.4), with the gauges read now.
    pub(super) fn render(&self, now: &Now) -> prometheus::Result<String> {
        self.refresh(now);
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
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
