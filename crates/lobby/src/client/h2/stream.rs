//! One HTTP/2 stream, one request, in a task of its own: its head checked (`head.rs`), its
//! body read whole into the request's buffer or file (each byte taken gives the client its
//! window back), then queued as a `Job` like an HTTP/1.1 request, and answered (`send.rs`).
//!
//! A stream waits in the queue, never in a worker: the connection's streams are capped by
//! `--http2-max-concurrent-streams`, and the queue seats them one by one like any request. A
//! client that resets its stream while the request waits has it dropped without running
//! (counted as `abandoned`); one that resets it in service has its worker told, as when an
//! HTTP/1.1 client leaves: dropping the answer's receiver is what tells the relay. Each reset
//! is counted by where its request was (`maitred_http2_streams_reset_total`).
//!
//! A stream counts in `maitred_connections` as an HTTP/1.1 connection with one request would:
//! reading, then awaiting (queued or in service), then writing; the diagnoses see it so.

use std::cell::Cell;
use std::future::poll_fn;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::sleep_until;

use super::head::{self, Head, Refusal};
use super::reasons::StreamStage;
use super::send::{self, Sent};
use super::Shared;
use crate::client::body::Body;
use crate::client::exchange::{self, BodyPace};
use crate::client::proxies::{self, Origin};
use crate::client::states::{ConnectionState, StateMark};
use crate::client::Stop;
use crate::log::debug;
use crate::seating::job::{Job, JobState};
use crate::seating::spool::{answer_channel, AnswerReceiver, AnswerSender, ResponsePart};

/// A stream's body past this size goes to a temporary file, as an HTTP/1.1 one past 256 KiB
/// does: a connection may carry `--http2-max-concurrent-streams` bodies at once, and each file
/// takes a place under `--max-connections`, which bounds them all.
const BODY_MEMORY: usize = 64 * 1024;

/// Why a stream's request was not read whole.
enum Unread {
    Refused(Refusal),
    /// The client reset the stream.
    Reset,
    /// The connection ended.
    Gone,
}

impl From<Stop> for Unread {
    fn from(stop: Stop) -> Unread {
        match stop {
            Stop::Refuse(status, reason) => Unread::Refused((status, reason)),
            Stop::Quietly => Unread::Gone,
        }
    }
}

/// Serves one stream to its end.
pub(super) async fn serve(shared: Rc<Shared>, request: http::Request<RecvStream>, mut respond: SendResponse<Bytes>) {
    let started = Instant::now();
    let mut mark = shared.context.connection_states.mark(ConnectionState::Reading);
    let (parts, body) = request.into_parts();
    let read = async {
        let head = head::read(&parts, &shared.context.limits()).map_err(Unread::Refused)?;
        let origin = proxies::origin(shared.peer, &head.headers, &shared.context.settings().forwarding)
            .map_err(|e| Unread::Refused((400, e.to_string())))?;
        let body = read_body(&shared, &head, body).await?;
        Ok::<_, Unread>((head, origin, body))
    };
    match read.await {
        Ok((head, origin, body)) => seat(&shared, &head, &origin, body, respond, started, &mut mark).await,
        Err(Unread::Refused((status, reason))) => {
            mark.set(ConnectionState::Writing);
            send::refuse(&shared, &mut respond, status, &reason);
        }
        Err(Unread::Reset) => {
            shared.client_reset(StreamStage::Reading);
            debug!("the client {} reset an HTTP/2 stream before its request was whole", shared.peer_text)
        }
        Err(Unread::Gone) => {
            debug!("an HTTP/2 stream of {} ended with its connection before its request was whole", shared.peer_text)
        }
    }
    shared.stream_ended();
}

/// Reads the body to its end, within `--header-timeout` for each gap and `--body-min-rate`
/// overall, as an HTTP/1.1 body is read (`http1/read.rs`), and within `--max-body`.
async fn read_body(shared: &Shared, head: &Head, mut stream: RecvStream) -> Result<Body, Unread> {
    let mut body = Body::for_length(head.content_length, BODY_MEMORY, false, &shared.descriptors)?;
    if stream.is_end_stream() {
        return Ok(body);
    }
    let config = shared.context.settings();
    let mut pace = BodyPace::new(config.header_timeout, config.body_min_rate);
    loop {
        let data = tokio::select! {
            data = stream.data() => data,
            _ = sleep_until(pace.deadline(body.len()).into()) => {
                return Err(Unread::Refused((408, pace.missed(body.len()))));
            }
        };
        match data {
            None => {
                body.finish().await?;
                return Ok(body);
            }
            Some(Err(e)) if e.is_reset() && e.is_remote() => return Err(Unread::Reset),
            Some(Err(_)) => return Err(Unread::Gone),
            Some(Ok(data)) => {
                pace.arrived();
                let received = data.len();
                body.push(data, BODY_MEMORY, &shared.descriptors)?;
                body.flush_batch().await?;
                // The bytes are the request's now: the client may send as many more.
                let _ = stream.flow_control().release_capacity(received);
                if let Some(max) = config.limits.max_body.filter(|max| body.len() > *max) {
                    return Err(Unread::Refused((
                        413,
                        format!("the request body is larger than --max-body ({max} bytes)"),
                    )));
                }
            }
        }
    }
}

/// Queues the request, then sends its answer.
async fn seat(
    shared: &Rc<Shared>,
    head: &Head,
    origin: &Origin,
    body: Body,
    mut respond: SendResponse<Bytes>,
    started: Instant,
    mark: &mut StateMark,
) {
    let context = &shared.context;
    let (sender, responses) =
        answer_channel(context.spill_budget.clone(), context.settings().max_spill, shared.descriptors.clone());
    let upstream = origin.upstream_wait(SystemTime::now());
    // The body file's place under --max-connections is held until the answer is sent.
    let (job, _body_descriptor) = match job(shared, head, origin, body, sender, upstream) {
        Ok(job) => job,
        Err(detail) => return send::refuse(shared, &mut respond, 431, &detail),
    };
    let (state, enqueued_at, served) = (job.state.clone(), job.enqueued_at, job.served.clone());
    mark.set(ConnectionState::Awaiting);
    context.seating.submit(job);
    let Some(first) = first_part(shared, &mut respond, &responses, &state, enqueued_at, upstream).await else {
        return;
    };
    mark.set(ConnectionState::Writing);
    let mut sent = Sent::default();
    if send::answer(shared, head, respond, first, &responses, &mut sent).await {
        context.counts.answered_http2();
        let answered = exchange::Answered {
            method: &head.method,
            target: &head.target,
            version: "HTTP/2.0",
            request_headers: &head.headers,
            status: sent.status,
            body_bytes: sent.body_bytes,
            response_headers: &sent.headers,
            started,
            enqueued: enqueued_at,
            upstream,
            tls: shared.tls.as_ref(),
        };
        exchange::answered(context, origin, answered, served.as_deref());
    }
}

/// The `Job` a stream's request becomes, as an HTTP/1.1 request's does (`exchange.rs`), with
/// HTTP/2 as its version.
fn job(
    shared: &Shared,
    head: &Head,
    origin: &Origin,
    body: Body,
    respond: AnswerSender,
    upstream: Duration,
) -> Result<(Job, Option<OwnedSemaphorePermit>), String> {
    let summary =
        format!("{} {} HTTP/2.0", String::from_utf8_lossy(&head.method), String::from_utf8_lossy(&head.target));
    let request = exchange::Head {
        http_version: maitred_wire::HTTP_2,
        method: &head.method,
        target: &head.target,
        headers: head.headers.iter().map(|(n, v)| (n.as_ref(), v.as_ref())).collect(),
        client_subject: shared.tls.as_ref().and_then(|tls| tls.client_subject.as_deref()),
    };
    exchange::job(request, &shared.site, origin, body, respond, summary.into(), upstream)
}

/// The answer's first part, while the wait is watched: a request no worker took within
/// `--queue-timeout` is withdrawn and answered 503; a stream its client resets has its request
/// dropped (or its worker told), and None comes back.
async fn first_part(
    shared: &Shared,
    respond: &mut SendResponse<Bytes>,
    responses: &AnswerReceiver,
    state: &Rc<Cell<JobState>>,
    enqueued_at: Instant,
    upstream: Duration,
) -> Option<ResponsePart> {
    let context = &shared.context;
    // Turned off once a withdrawal fails: the worker has the request (an offer it took, which
    // the lobby has not yet seen), and the timer, due already, would fire again at every turn.
    let mut queue_timeout = context.settings().queue_timeout;
    loop {
        let unseated = matches!(state.get(), JobState::Queued | JobState::Offered);
        let timeout = queue_timeout.filter(|_| unseated);
        tokio::select! {
            part = responses.recv() => return part,
            reset = poll_fn(|cx| respond.poll_reset(cx)) => {
                let now = Instant::now();
                let waited = now.saturating_duration_since(enqueued_at) + upstream;
                let withdrawn = exchange::withdraw(&context.seating, state);
                if reset.is_ok() {
                    shared.client_reset(if withdrawn { StreamStage::Queued } else { StreamStage::InService });
                }
                if withdrawn {
                    context.seating.overload.left(now, waited);
                    debug!(
                        "the client {} reset its HTTP/2 stream after {:.3} s; its request is dropped",
                        shared.peer_text,
                        waited.as_secs_f64()
                    );
                } else {
                    debug!("the client {} reset its HTTP/2 stream in service; its worker is told", shared.peer_text);
                }
                return None;
            }
            _ = sleep_until((enqueued_at + timeout.unwrap_or_default()).into()), if timeout.is_some() => {
                let Some(limit) = timeout else { continue };
                if let Some(refused) = exchange::time_out(&context.seating, state, limit) {
                    return Some(refused);
                }
                queue_timeout = None;
            }
        }
    }
}
