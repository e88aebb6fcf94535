//! What a request is to the lobby, whatever protocol brought it: the rules its body is read
//! under, the `Job` it becomes, its wait for a worker, the `Date` its answer carries, its
//! access line, and the drain after a refusal. HTTP/1.1 (`http1/`) and HTTP/2
//! (`h2/stream.rs`) translate their wire formats into these and back,
//! so that each rule, its status and its words are written once; the rules on a head's target,
//! Host and fields are crates/protocol's (`rules.rs`).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use maitred_wire::{build_frame, Kind, FLAG_FD, FLAG_RECORDS};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::sleep_until;

use super::body::Body;
use super::peer::{Site, TlsAbout};
use super::proxies::Origin;
use crate::client::context::Context;
use crate::log;
use crate::seating::job::{Job, JobState, Served};
use crate::seating::overload::ShedReason;
use crate::seating::spool::{AnswerSender, ResponsePart};
use crate::seating::Seating;

/// The pace a request body must keep (docs/LIMITS.md, "Slow bodies end"): no gap longer than
/// `--header-timeout`, and, with `--body-min-rate`, each byte received earns 1/rate s more
/// after a first `--header-timeout`, so that a body trickled slower than the rate ends however
/// steady it is. Past either: 408.
pub(super) struct BodyPace {
    started: Instant,
    gap_started: Instant,
    header_timeout: Duration,
    /// `--body-min-rate`, bytes/s; 0: none.
    min_rate: u64,
}

impl BodyPace {
    pub(super) fn new(header_timeout: Duration, min_rate: u64) -> BodyPace {
        let now = Instant::now();
        BodyPace { started: now, gap_started: now, header_timeout, min_rate }
    }

    /// How long since the body began.
    pub(super) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Bytes came: the gap starts again.
    pub(super) fn arrived(&mut self) {
        self.gap_started = Instant::now();
    }

    fn gap_deadline(&self) -> Instant {
        self.gap_started + self.header_timeout
    }

    fn rate_deadline(&self, received: u64) -> Option<Instant> {
        (self.min_rate > 0).then(|| {
            self.started + self.header_timeout + Duration::from_secs_f64(received as f64 / self.min_rate as f64)
        })
    }

    /// When the body, `received` bytes of it so far, is too slow unless more comes.
    pub(super) fn deadline(&self, received: u64) -> Instant {
        let gap = self.gap_deadline();
        self.rate_deadline(received).map_or(gap, |rate| rate.min(gap))
    }

    /// The 408's reason, past the deadline: which of the two the body missed.
    pub(super) fn missed(&self, received: u64) -> String {
        if self.rate_deadline(received).is_some_and(|rate| rate < self.gap_deadline()) {
            format!(
                "the request body arrived slower than --body-min-rate ({} bytes/s): {received} bytes in {:.0} s",
                self.min_rate,
                self.started.elapsed().as_secs_f64()
            )
        } else {
            "the request body stalled for longer than --header-timeout".into()
        }
    }
}

/// A request's head as the `REQUEST` frame carries it, from either protocol.
pub(super) struct Head<'a> {
    /// maitred_wire's `HTTP_1_0`, `HTTP_1_1` or `HTTP_2`.
    pub(super) http_version: u8,
    pub(super) method: &'a [u8],
    pub(super) target: &'a [u8],
    pub(super) headers: Vec<(&'a [u8], &'a [u8])>,
    /// The subject of the client's TLS certificate, when it gave one.
    pub(super) client_subject: Option<&'a str>,
}

/// The `Job` a request becomes: its `REQUEST` frame, its body's file if it has one (with the
/// descriptor's place under `--max-connections`, which the caller keeps until the answer has
/// gone), and how its answer comes back.
pub(super) fn job(
    head: Head<'_>,
    site: &Site,
    origin: &Origin,
    body: Body,
    respond: AnswerSender,
    summary: Rc<str>,
    upstream: Duration,
) -> Result<(Job, Option<OwnedSemaphorePermit>), String> {
    let body_len = body.len();
    let records = if body.in_records() { FLAG_RECORDS } else { 0 };
    let (inline, body_file, body_descriptor) = match body {
        Body::Memory(bytes) => (bytes, None, None),
        Body::File { file, descriptor, .. } | Body::Streaming { reader: file, descriptor, .. } => {
            (Vec::new(), Some(file), Some(descriptor))
        }
    };
    let peer_addr = origin.ip_text();
    let http2 = head.http_version == maitred_wire::HTTP_2;
    let request = maitred_wire::Request {
        http_version: head.http_version,
        method: head.method,
        target: head.target,
        peer_addr: peer_addr.as_bytes(),
        peer_port: origin.port.unwrap_or(0),
        server_name: site.server_name.as_bytes(),
        server_port: site.server_port,
        https: origin.https || site.tls,
        client_subject: head.client_subject.map(str::as_bytes),
        headers: head.headers,
        body_len,
        inline_body: &inline,
    };
    let flags = if body_file.is_some() { FLAG_FD | records } else { 0 };
    let frame = build_frame(Kind::Request, flags, |out| request.encode_payload(out)).map_err(|e| e.to_string())?;
    let job = Job {
        frame,
        body_file,
        state: Rc::new(Cell::new(JobState::Queued)),
        respond,
        enqueued_at: Instant::now(),
        upstream,
        summary,
        served: log::access_log_enabled().then(Rc::default),
        websocket: None,
        http2,
    };
    Ok((job, body_descriptor))
}

/// Takes the request back from the queue (or from the busy worker it was offered to) if no
/// worker has begun it; it is then never seated.
pub(super) fn withdraw(seating: &Seating, state: &Rc<Cell<JobState>>) -> bool {
    match state.get() {
        JobState::Queued => {
            state.set(JobState::Cancelled);
            true
        }
        JobState::Offered => seating.withdraw_offer(state),
        JobState::Seated | JobState::Cancelled => false,
    }
}

/// A request answered, as its access line tells it: what its protocol read and wrote.
pub(super) struct Answered<'a> {
    pub(super) method: &'a [u8],
    pub(super) target: &'a [u8],
    pub(super) version: &'a str,
    pub(super) request_headers: &'a [(Bytes, Bytes)],
    pub(super) status: u16,
    pub(super) body_bytes: u64,
    pub(super) response_headers: &'a [(Bytes, Bytes)],
    /// When its head began to be read.
    pub(super) started: Instant,
    pub(super) enqueued: Instant,
    pub(super) upstream: Duration,
    pub(super) tls: Option<&'a TlsAbout>,
}

/// Counts an answered request (`maitred_requests_total`) and writes its access line, with what
/// the queue and its worker say of it (`served`: none for a request answered by the lobby).
pub(super) fn answered(context: &Context, origin: &Origin, answered: Answered<'_>, served: Option<&Served>) {
    context.counts.answered(answered.status);
    if !log::access_log_enabled() {
        return;
    }
    log::access(
        &context.settings().access_log_format,
        &log::AccessRecord {
            peer: &origin.ip_text(),
            method: answered.method,
            target: answered.target,
            version: answered.version,
            request_headers: answered.request_headers,
            status: answered.status,
            body_bytes: answered.body_bytes,
            response_headers: answered.response_headers,
            started: answered.started,
            enqueued: answered.enqueued,
            upstream: answered.upstream,
            seated: served.and_then(|served| served.seated.get()),
            answered: served.and_then(|served| served.answered.get()),
            worker: served.and_then(|served| served.worker.get()),
            tls: answered.tls.map(|tls| (tls.version, tls.cipher)),
        },
    );
}

/// A request that has waited `--queue-timeout` (`limit`) is withdrawn, counted, and answered
/// 503; None when a worker has it already (an offer it took, which the lobby has not seen yet).
pub(super) fn time_out(seating: &Seating, state: &Rc<Cell<JobState>>, limit: Duration) -> Option<ResponsePart> {
    if !withdraw(seating, state) {
        return None;
    }
    seating.overload.count(ShedReason::QueueTimeout);
    Some(queue_timed_out(limit))
}

/// `--queue-timeout` for a request whose body streams to it while it waits for a worker
/// (`http1/pump.rs`): its 503 once it has waited `limit` since `enqueued_at`; never, with no
/// limit or once a worker has it.
pub(super) async fn streaming_timed_out(
    seating: &Seating,
    state: &Rc<Cell<JobState>>,
    enqueued_at: Instant,
    limit: Option<Duration>,
) -> ResponsePart {
    if let Some(limit) = limit {
        sleep_until((enqueued_at + limit).into()).await;
        if let Some(refused) = time_out(seating, state, limit) {
            return refused;
        }
    }
    std::future::pending().await
}

/// The answer to a request withdrawn at `--queue-timeout` (`limit`): 503, and when to retry.
fn queue_timed_out(limit: Duration) -> ResponsePart {
    ResponsePart::Refused {
        status: 503,
        detail: format!("no worker was free within --queue-timeout ({} s)", limit.as_secs_f64()),
        retry_after: Some(limit.as_secs_f64().ceil().max(1.0) as u64),
    }
}

/// How long, and how much of what the client still sends, a refused connection is drained
/// before it is closed.
pub(super) struct Linger {
    pub(super) time: Duration,
    pub(super) bytes: usize,
}

/// How long, and how much input, a connection refused for what it sent is drained before it
/// is closed.
pub(super) const LINGER_AFTER_REFUSAL: Linger = Linger { time: Duration::from_secs(2), bytes: 1 << 20 };

/// Closing a socket with unread input makes the kernel send a reset, which can destroy the
/// refusal just written before the client reads it. So: stop writing, then read and discard
/// what the client is still sending, within `bounds`, before the caller closes it.
pub(super) async fn linger<S: AsyncRead + AsyncWrite + Unpin>(io: &mut S, bounds: Linger) {
    if io.shutdown().await.is_err() {
        return;
    }
    let deadline = tokio::time::Instant::now() + bounds.time;
    let mut discarded = 0;
    let mut sink = [0u8; 4096];
    while discarded < bounds.bytes {
        match tokio::time::timeout_at(deadline, io.read(&mut sink)).await {
            Ok(Ok(n)) if n > 0 => discarded += n,
            _ => return,
        }
    }
}

thread_local! {
    static DATE: RefCell<(u64, Bytes)> = const { RefCell::new((u64::MAX, Bytes::new())) };
}

/// The `Date` header value, formatted at most once a second.
pub(super) fn http_date() -> Bytes {
    let now = SystemTime::now();
    let second = now.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    DATE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.0 != second {
            *cache = (second, Bytes::from(httpdate::fmt_http_date(now)));
        }
        cache.1.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_misses_the_gap_or_the_rate() {
        let pace = BodyPace::new(Duration::from_secs(10), 0);
        assert_eq!(pace.deadline(1 << 20), pace.gap_deadline());
        assert_eq!(pace.missed(0), "the request body stalled for longer than --header-timeout");
        // 100 bytes at 10 bytes/s earn 10 s past the first 10: the gap's deadline comes first.
        let mut pace = BodyPace::new(Duration::from_secs(10), 10);
        assert_eq!(pace.deadline(100), pace.gap_deadline());
        // None received: the rate's deadline is the first --header-timeout, the gap's too.
        assert!(pace.missed(0).contains("--header-timeout"));
        // Later, a gap restarted now ends past what the bytes earned.
        pace.gap_started += Duration::from_secs(5);
        assert!(pace.deadline(0) < pace.gap_deadline());
        assert!(pace
            .missed(0)
            .starts_with("the request body arrived slower than --body-min-rate (10 bytes/s): 0 bytes in"));
    }

    #[test]
    fn a_queue_timeout_is_a_503_with_a_retry() {
        match queue_timed_out(Duration::from_millis(1500)) {
            ResponsePart::Refused { status: 503, detail, retry_after: Some(2) } => {
                assert_eq!(detail, "no worker was free within --queue-timeout (1.5 s)")
            }
            other => panic!("{other:?}"),
        }
    }
}
