//! What the lobby counts, and the stats listener (`--stats`) that shows it: Prometheus metrics
//! at `/metrics` (docs/METRICS.md), written by the `prometheus` library (the Prometheus text
//! format, which `promtool check metrics` checks), answered by the lobby itself so that a scrape
//! never waits for a worker.
//!
//! Counters and histograms are updated where things happen (atomic adds); gauges are read when
//! a scrape comes.

use std::borrow::Cow;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::listen::Listener;
use crate::log::{debug, info_limited};
use crate::{stats_page, Lobby};

/// The most a stats request's head may be, and how long it may take to arrive.
const MAX_HEAD: usize = 8 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The kernel's counters of connections lost before accept(2) (docs/SCENARIOS.md, S1, S2).
const KERNEL_COUNTERS: [&str; 2] = ["ListenOverflows", "ListenDrops"];

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
    listen_overflows: IntCounterVec,
    listen_queue: IntGaugeVec,
    listen_backlog: IntGaugeVec,
    /// The application's listeners, for their queues (set once they listen).
    listeners: std::cell::RefCell<Vec<Watched>>,
    /// The kernel's counters as last read, to add what they moved since.
    kernel_seen: std::cell::Cell<[u64; 2]>,
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
        let workers = IntGaugeVec::new(Opts::new("workers", "Workers serving, by state"), &["state"]).expect("valid");
        register(Box::new(workers.clone()));
        let connections =
            IntGaugeVec::new(Opts::new("connections", "Client connections held, by state"), &["state"]).expect("valid");
        register(Box::new(connections.clone()));
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
            listen_overflows,
            listen_queue,
            listen_backlog,
            listeners: std::cell::RefCell::new(Vec::new()),
            kernel_seen: std::cell::Cell::new(kernel_counters().unwrap_or_default()),
        }
    }

    /// The application's listeners, whose queues the scrape reads: copies of their sockets, so
    /// that a descriptor number used again after they close is never read for them.
    pub fn watch_listeners(&self, listeners: &[Listener]) {
        let watched = listeners
            .iter()
            .filter_map(|listener| {
                let socket = listener.socket.try_clone().ok()?;
                self.listen_backlog.with_label_values(&[&listener.display]).set(listener.backlog_granted as i64);
                Some(Watched { name: listener.display.clone(), socket })
            })
            .collect();
        *self.listeners.borrow_mut() = watched;
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

    /// The exposition (Prometheus text format 0.0.4), with the gauges read now.
    fn render(&self, lobby: &Lobby, connections: &Semaphore, max_connections: usize) -> prometheus::Result<String> {
        self.queue_requests.set(lobby.seating.waiting() as i64);
        let serving = lobby.seating.workers();
        let idle = lobby.seating.idle();
        self.workers.with_label_values(&["idle"]).set(idle as i64);
        self.workers.with_label_values(&["busy"]).set(serving.saturating_sub(idle) as i64);
        let open = max_connections.saturating_sub(connections.available_permits());
        let sleeping = lobby.hibernation.sleeping();
        self.connections.with_label_values(&["hibernating"]).set(sleeping as i64);
        self.connections.with_label_values(&["active"]).set(open.saturating_sub(sleeping) as i64);
        for listener in self.listeners.borrow().iter() {
            if let Ok(depth) = crate::listen::queue_depth(&listener.socket) {
                self.listen_queue.with_label_values(&[&listener.name]).set(depth as i64);
            }
        }
        if let Some(now) = kernel_counters() {
            let seen = self.kernel_seen.replace(now);
            for (index, counter) in KERNEL_COUNTERS.iter().enumerate() {
                self.listen_overflows
                    .with_label_values(&[counter, "machine"])
                    .inc_by(now[index].saturating_sub(seen[index]));
            }
        }
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

/// A listener whose queue a scrape reads.
struct Watched {
    name: String,
    socket: socket2::Socket,
}

/// ListenOverflows and ListenDrops from /proc/net/netstat.
fn kernel_counters() -> Option<[u64; 2]> {
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

/// Serves the stats listener until the lobby stops: one request per connection.
pub async fn serve(lobby: Rc<Lobby>, listener: Listener, connections: Arc<Semaphore>, max_connections: usize) {
    let std_listener: std::os::fd::OwnedFd = listener.socket.into();
    let is_unix = listener.unix_path.is_some();
    if is_unix {
        let Ok(accepting) = tokio::net::UnixListener::from_std(std_listener.into()) else { return };
        loop {
            match accepting.accept().await {
                Ok((stream, _)) => spawn_answer(&lobby, stream, &connections, max_connections),
                Err(e) => accept_failed(e).await,
            }
        }
    } else {
        let Ok(accepting) = tokio::net::TcpListener::from_std(std_listener.into()) else { return };
        loop {
            match accepting.accept().await {
                Ok((stream, _)) => spawn_answer(&lobby, stream, &connections, max_connections),
                Err(e) => accept_failed(e).await,
            }
        }
    }
}

async fn accept_failed(e: io::Error) {
    info_limited!("the stats listener could not accept a connection: {e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn spawn_answer<S>(lobby: &Rc<Lobby>, stream: S, connections: &Arc<Semaphore>, max_connections: usize)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let (lobby, connections) = (lobby.clone(), connections.clone());
    tokio::task::spawn_local(async move {
        if let Err(e) = answer(&lobby, stream, &connections, max_connections).await {
            debug!("stats request: {e}");
        }
    });
}

/// Reads one request head and answers it, then closes.
async fn answer<S>(lobby: &Lobby, mut stream: S, connections: &Semaphore, max_connections: usize) -> io::Result<()>
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
        Ok(Ok(())) => route(lobby, &head, connections, max_connections),
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

fn route(
    lobby: &Lobby,
    head: &[u8],
    connections: &Semaphore,
    max_connections: usize,
) -> (u16, &'static str, Cow<'static, [u8]>) {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    let text = "text/plain; charset=utf-8";
    if method != b"GET" {
        return (405, text, b"the stats listener answers GET only\n"[..].into());
    }
    match path {
        b"/metrics" => match lobby.metrics.render(lobby, connections, max_connections) {
            Ok(exposition) => (200, prometheus::TEXT_FORMAT, exposition.into_bytes().into()),
            Err(_) => (500, text, b"the metrics could not be written\n"[..].into()),
        },
        _ => match stats_page::file(path) {
            Some((content_type, body)) => (200, content_type, body.into()),
            None => (404, text, b"not found: the stats listener serves / (a live page) and /metrics\n"[..].into()),
        },
    }
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
