//! What the lobby counts, and the stats listener (`--stats`) that shows it: Prometheus metrics
//! at `/metrics` (docs/METRICS.md), written by the `prometheus-client` library, answered by the
//! lobby itself so that a scrape never waits for a worker.
//!
//! Counters and histograms are updated where things happen (one atomic add, or one
//! uncontended lock for a histogram, per request); gauges are read when a scrape comes.

use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::listen::Listener;
use crate::log::{debug, info_limited};
use crate::Lobby;

/// The most a stats request's head may be, and how long it may take to arrive.
const MAX_HEAD: usize = 8 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// The exposition format `encode` writes.
const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KernelCounterLabel {
    counter: &'static str,
    /// The kernel counts for the whole machine, every listener of every process.
    scope: &'static str,
}

const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The kernel's counters of connections lost before accept(2) (docs/SCENARIOS.md, S1, S2).
const KERNEL_COUNTERS: [&str; 2] = ["ListenOverflows", "ListenDrops"];

pub struct Metrics {
    registry: Registry,
    /// `maitred_requests_total` for 1xx to 5xx, looked up once: an answer costs one atomic add.
    requests: [Counter; 5],
    refusals: Family<StatusLabel, Counter>,
    request_duration: Histogram,
    queue_wait: Histogram,
    queue_requests: Gauge,
    workers: Family<StateLabel, Gauge>,
    connections: Family<StateLabel, Gauge>,
    listen_overflows: Family<KernelCounterLabel, Counter>,
    /// The kernel's counters as last read, to add what they moved since.
    kernel_seen: std::cell::Cell<[u64; 2]>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("maitred");
        let by_class = Family::<ClassLabel, Counter>::default();
        registry.register("requests", "Requests answered, by the class of their status", by_class.clone());
        let requests = STATUS_CLASSES.map(|class| by_class.get_or_create(&ClassLabel { class }).clone());
        let refusals = Family::<StatusLabel, Counter>::default();
        registry.register(
            "refusals",
            "Requests refused by the lobby without a worker (bad requests, limits, --queue-timeout)",
            refusals.clone(),
        );
        // 1 ms to about 65 s.
        let request_duration = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        registry.register(
            "request_duration_seconds",
            "Time a worker spent on a request, from its seating to the end of its answer",
            request_duration.clone(),
        );
        // 0.1 ms to about 6.5 s.
        let queue_wait = Histogram::new(exponential_buckets(0.0001, 2.0, 17));
        registry.register(
            "queue_wait_seconds",
            "Time a request waited in the lobby's queue for a worker",
            queue_wait.clone(),
        );
        let queue_requests = Gauge::default();
        registry.register("queue_requests", "Requests waiting for a worker now", queue_requests.clone());
        let workers = Family::<StateLabel, Gauge>::default();
        registry.register("workers", "Workers serving, by state", workers.clone());
        let connections = Family::<StateLabel, Gauge>::default();
        registry.register("connections", "Client connections held, by state", connections.clone());
        let listen_overflows = Family::<KernelCounterLabel, Counter>::default();
        registry.register(
            "listen_overflows",
            "Connections the kernel dropped or refused for a full listen queue since maitred started \
             (/proc/net/netstat: machine-wide, every listener)",
            listen_overflows.clone(),
        );
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
            kernel_seen: std::cell::Cell::new(kernel_counters().unwrap_or_default()),
        }
    }

    /// An answer written to a client, worker's or lobby's.
    pub fn answered(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.requests[class].inc();
    }

    /// A request the lobby answered itself, with an error.
    pub fn refused(&self, status: u16) {
        self.refusals.get_or_create(&StatusLabel { status }).inc();
        self.answered(status);
    }

    pub fn waited(&self, wait: Duration) {
        self.queue_wait.observe(wait.as_secs_f64());
    }

    pub fn served(&self, took: Duration) {
        self.request_duration.observe(took.as_secs_f64());
    }

    /// The exposition, with the gauges read now.
    fn render(
        &self,
        lobby: &Lobby,
        connections: &Semaphore,
        max_connections: usize,
    ) -> Result<String, std::fmt::Error> {
        self.queue_requests.set(lobby.seating.waiting() as i64);
        let serving = lobby.seating.workers();
        let idle = lobby.seating.idle();
        self.workers.get_or_create(&StateLabel { state: "idle" }).set(idle as i64);
        self.workers.get_or_create(&StateLabel { state: "busy" }).set(serving.saturating_sub(idle) as i64);
        let open = max_connections.saturating_sub(connections.available_permits());
        let sleeping = lobby.hibernation.sleeping();
        self.connections.get_or_create(&StateLabel { state: "hibernating" }).set(sleeping as i64);
        self.connections.get_or_create(&StateLabel { state: "active" }).set(open.saturating_sub(sleeping) as i64);
        if let Some(now) = kernel_counters() {
            let seen = self.kernel_seen.replace(now);
            for (index, counter) in KERNEL_COUNTERS.iter().enumerate() {
                self.listen_overflows
                    .get_or_create(&KernelCounterLabel { counter, scope: "machine" })
                    .inc_by(now[index].saturating_sub(seen[index]));
            }
        }
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
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
        Ok(Err(e)) => (400, "text/plain; charset=utf-8", format!("bad request: {e}\n")),
        Ok(Ok(())) => route(lobby, &head, connections, max_connections),
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Internal Server Error",
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: \
         close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

fn route(lobby: &Lobby, head: &[u8], connections: &Semaphore, max_connections: usize) -> (u16, &'static str, String) {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    let text = "text/plain; charset=utf-8";
    if method != b"GET" {
        return (405, text, "the stats listener answers GET only\n".into());
    }
    match path {
        b"/metrics" => match lobby.metrics.render(lobby, connections, max_connections) {
            Ok(exposition) => (200, METRICS_CONTENT_TYPE, exposition),
            Err(_) => (500, text, "the metrics could not be written\n".into()),
        },
        _ => (404, text, "not found: the stats listener serves /metrics\n".into()),
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
