//! A connection's task: wait for a request (holding no buffer), read it (`read.rs`), queue it
//! and take its answer, write it (`write.rs`), then keep alive or go to sleep (`asleep.rs`).
//!
//! A connection costs no worker at any point: while idle it holds no buffer and waits for
//! readability (S4, S5); a request reaches the queue only when its body is complete (S1), or
//! when its body comes fast enough to stream to its worker as it arrives (`pump.rs`);
//! the answer is taken from the worker as fast as it comes and written here at the client's
//! pace.

use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime};

use bytes::BytesMut;
use maitred_protocol::{write_error_response, Opening, RequestHead, ResponseContext, Version};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::sleep_until;

use super::read::{read_now, Pumping, READ_CHUNK};
use super::watch::Waiting;
use super::websocket::{self, Handshake};
use super::write::Answer;
use super::{Connection, NotHttp1};
use crate::client::asleep::{self, Sleeper, TICK};
use crate::client::body::Body;
use crate::client::exchange::{self, http_date};
use crate::client::peer::ClientStream;
use crate::client::proxies::Origin;
use crate::client::states::ConnectionState;
use crate::client::{Stop, HIBERNATE_AFTER};
use crate::log::{self, debug};
use crate::seating::job::{Job, Served};
use crate::seating::spool::{answer_channel, AnswerReceiver, AnswerSender, ResponsePart};
use crate::seating::websocket::{ToWorker, WsPart};

/// How long a request that had to queue waits before its client is watched for leaving.
/// Watching costs a peek (recv with MSG_PEEK) per request, as the socket's readiness is still
/// set from reading the request; a request answered sooner never pays it, and a client gone
/// sooner than this is found as soon as its request has waited this long.
const WATCH_AFTER: Duration = Duration::from_millis(50);
/// The same for a request handed to an idle worker at once: the heartbeat's period
/// (`asleep::TICK`). Its timer is then never due before every other, which would make tokio
/// write to its eventfd once per request (0.6 times per request at one client with 50 ms,
/// H1-hop); and such a request is in service already, so the watch only cuts its answer short.
const WATCH_SERVED_AFTER: Duration = TICK;
/// How a request's answer left its connection.
enum Seated {
    KeepOpen,
    Close,
    /// A streaming body broke off before its end (408 when its pace was missed): the
    /// connection ends as a request read short does.
    BodyBroke(Stop),
    /// The worker answered a WebSocket handshake: what its life needs.
    WebSocket(Box<Accepted>),
}

/// A WebSocket handshake the worker has answered, and what its access line needs.
struct Accepted {
    handshake: Handshake,
    first: WsPart,
    link: ToWorker,
    responses: AnswerReceiver,
    answer: Answer,
    waiting: Waiting,
    served: Option<Rc<Served>>,
}

/// How the wait for a request ended.
enum Wait {
    /// Bytes arrived and are in the buffer.
    Request,
    /// Idle for `HIBERNATE_AFTER`: the connection leaves its task until the client speaks (or,
    /// during a binary upgrade, goes to the new maitred at once).
    Hibernate { deadline: tokio::time::Instant },
    /// The client closed, the patience ran out, or it idled `HIBERNATE_AFTER` during a shutdown.
    Close,
}

impl<S: ClientStream> Connection<S> {
    /// Serves the connection to its close, or, for a plain connection that opens with other
    /// bytes than an HTTP/1.x request's, hands it back. Only the wait between requests runs
    /// inline: everything that holds buffers while a request is read or answered runs in a
    /// boxed future that exists only meanwhile.
    pub(in crate::client) async fn run(mut self) -> Option<NotHttp1<S>> {
        // A connection just accepted or woken from hibernation has, most often, its request
        // waiting already: read it before asking the event loop.
        let mut read_first = true;
        loop {
            if self.buf.is_empty() && self.decoder.is_idle() {
                self.mark.set(ConnectionState::Idle);
                match self.wait_for_request(std::mem::take(&mut read_first)).await {
                    Wait::Request => {}
                    Wait::Close => return None,
                    Wait::Hibernate { deadline } => {
                        self.hibernate(deadline.into_std());
                        return None;
                    }
                }
            }
            // A plain connection's first bytes say which protocol it speaks; a TLS one's
            // handshake has said (`handshake.rs`).
            if self.answered == 0 && !S::ENCRYPTED {
                let opening = match self.protocol_chosen() {
                    Some(chosen) => chosen,
                    None => {
                        // A PROXY header, or more of the preface, is read: as a head is.
                        self.mark.set(ConnectionState::Reading);
                        Box::pin(self.read_opening()).await
                    }
                };
                match opening {
                    Ok(Opening::Http1) => {}
                    Ok(other) => return Some(self.not_http1(other)),
                    Err(stop) => {
                        self.stop(stop).await;
                        return None;
                    }
                }
            }
            self.mark.set(ConnectionState::Reading);
            let stop = match Box::pin(self.next_request()).await {
                Ok((head, origin, body, pumping)) => match Box::pin(self.seat(&head, &origin, body, pumping)).await {
                    Ok(Seated::KeepOpen) => continue,
                    Ok(Seated::Close) => return None,
                    Ok(Seated::BodyBroke(stop)) => stop,
                    Ok(Seated::WebSocket(accepted)) => {
                        self.into_websocket(head, origin, accepted);
                        return None;
                    }
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                        log::info_limited!("connection from {} cut while answering: {e}", self.peer.display());
                        return None;
                    }
                    Err(e) => {
                        debug!("connection from {} ended while answering: {e}", self.peer.display());
                        return None;
                    }
                },
                Err(stop) => stop,
            };
            self.stop(stop).await;
            return None;
        }
    }

    /// Ends the connection; a refusal is written first. The refusal's future is boxed, so that
    /// this one adds no more to the connection's future than the inline code it replaces.
    async fn stop(&mut self, stop: Stop) {
        if let Stop::Refuse(status, reason) = stop {
            // What was read is not needed to refuse it; a head given up for
            // --max-head-memory must give its memory back now, not after the linger.
            self.buf = BytesMut::new();
            Box::pin(self.refuse(status, &reason)).await;
        }
    }

    /// An accepted WebSocket's life goes on in a task of its own, the size of what it needs:
    /// this one has room for everything a request may wait on.
    fn into_websocket(self, head: RequestHead, origin: Origin, accepted: Box<Accepted>) {
        let mut connection = self;
        tokio::task::spawn_local(async move { connection.websocket_life(&head, &origin, accepted).await });
    }

    fn hibernate(self, deadline: Instant) {
        let Connection { context, stream, peer, site, permit, answered, .. } = self;
        match stream.into_sleeping() {
            Ok((socket, tls)) => {
                let sleeper =
                    Sleeper { socket, kind: S::KIND, peer, site, permit, answered, deadline, tls, http2: None };
                match context.successor() {
                    Some(successor) if sleeper.can_move() => successor.hand_over(sleeper),
                    _ => context.hibernation.put(sleeper),
                }
            }
            Err(e) => debug!("closing an idle connection that cannot hibernate: {e}"),
        }
    }

    /// Waits, holding no buffer, until the client sends something, and reads it; or until
    /// the connection should close: the client closed it, or it idled past `--keep-alive`
    /// (`--header-timeout` for a first request); or until it has idled long enough to
    /// hibernate.
    ///
    /// During a shutdown a connection that has been answered does not hibernate: it closes
    /// once it has idled for `HIBERNATE_AFTER`. Its last answer may have said keep-alive just
    /// before the shutdown began, and a client in a hurry sends its next request at once:
    /// that request is answered, with `Connection: close`, instead of meeting a connection
    /// closed under it (docs/SIGNALS.md). At a binary upgrade nothing closes for idling: a
    /// connection goes to the new maitred, or, if it cannot (TLS, PROXY protocol), waits here
    /// as at any other time; an idle connection closed under a request its client is sending
    /// is a request lost, and a client whose pace is the idle time meets that every time.
    async fn wait_for_request(&mut self, mut read_first: bool) -> Wait {
        self.buf = BytesMut::new();
        let settings = self.context.settings();
        let patience = if self.answered == 0 { settings.header_timeout } else { settings.keep_alive };
        let now = tokio::time::Instant::now();
        let deadline = now + patience;
        let hibernate_at = now + HIBERNATE_AFTER;
        // A new maitred has taken over (SIGUSR2): it gets the connection now, with whatever
        // the client has sent and this lobby has not read, rather than once it has idled. One
        // it cannot take (TLS, PROXY protocol) waits here as at any time, and its next request
        // is answered here with `Connection: close`.
        if self.context.handing_over() && asleep::can_move(S::ENCRYPTED, &self.peer) {
            return Wait::Hibernate { deadline };
        }
        loop {
            if !std::mem::take(&mut read_first) {
                tokio::select! {
                    // Bytes that came with the timer are a request, not a reason to close.
                    biased;
                    ready = poll_fn(|cx| self.stream.poll_read_ready(cx)) => if ready.is_err() { return Wait::Close },
                    _ = sleep_until(deadline.min(hibernate_at)) => {
                        let closing = self.answered > 0 && self.context.closing();
                        return if hibernate_at < deadline && !closing { Wait::Hibernate { deadline } } else { Wait::Close };
                    }
                }
            }
            // Nothing may be there yet (or readiness was stale, left from the last request):
            // then the buffer goes again until the client really sends.
            self.buf.reserve(READ_CHUNK);
            match poll_fn(|cx| Poll::Ready(read_now(&mut self.stream, cx, &mut self.buf))).await {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Wait::Close,
                Poll::Ready(Ok(_)) => return Wait::Request,
                Poll::Pending => self.buf = BytesMut::new(),
            }
        }
    }

    /// Whether the connection closes after its answer: at a shutdown, and at a binary upgrade
    /// when the new maitred cannot take it (TLS, PROXY protocol).
    pub(super) fn closes_when_answered(&self) -> bool {
        self.context.closing() || (self.context.handing_over() && !asleep::can_move(S::ENCRYPTED, &self.peer))
    }

    async fn refuse(&mut self, status: u16, reason: &str) {
        self.mark.set(ConnectionState::Writing);
        log::info_limited!("{status} to {}: {reason}", self.peer.display());
        self.context.counts.refused(status);
        let mut out = Vec::new();
        write_error_response(&mut out, status, reason, &http_date(), false, None);
        if self.write_closing(&out).await.is_ok() {
            self.linger().await;
        }
    }

    /// Drains what the client still sends after a refusal (`exchange::linger`).
    pub(super) async fn linger(&mut self) {
        exchange::linger(&mut self.stream, exchange::LINGER_AFTER_REFUSAL).await;
    }

    /// Queues the request, then writes its answer. Returns whether the connection stays open,
    /// or the WebSocket the worker answered, whose life runs once this future, and the 2 KB it
    /// holds, are gone (`into_websocket`).
    async fn seat(
        &mut self,
        head: &RequestHead,
        origin: &Origin,
        body: Body,
        pumping: Option<Box<Pumping>>,
    ) -> io::Result<Seated> {
        let Ok(websocket) = self.websocket_handshake(head, body.len()).await else { return Ok(Seated::Close) };
        // A WebSocket's messages wait for its client within the answer's memory, never in a
        // file (`--max-spill` 0).
        let max_spill = if websocket.is_some() { 0 } else { self.context.settings().max_spill };
        let (respond, responses) =
            answer_channel(self.context.spill_budget.clone(), max_spill, self.permit.semaphore().clone());
        let summary: Rc<str> = format!(
            "{} {} {}",
            String::from_utf8_lossy(&head.method),
            String::from_utf8_lossy(&head.target),
            head.version.as_str()
        )
        .into();
        let upstream = origin.upstream_wait(SystemTime::now());
        // The body file's place under --max-connections is held until the answer is written.
        let (mut job, _body_descriptor) = match self.job(head, origin, body, respond, summary.clone(), upstream) {
            Ok(job) => job,
            Err(detail) => {
                log::info_limited!("431 to {}: {detail}", self.peer.display());
                let mut out = Vec::new();
                write_error_response(&mut out, 431, &detail, &http_date(), false, None);
                self.write_closing(&out).await?;
                return Ok(Seated::Close);
            }
        };
        let to_worker = websocket.is_some().then(|| websocket::link_job(&mut job));
        let (state, enqueued_at) = (job.state.clone(), job.enqueued_at);
        let served = job.served.clone();
        let watch_after = if self.context.seating.submit(job) { WATCH_SERVED_AFTER } else { WATCH_AFTER };
        let waiting = Waiting { state, enqueued_at, upstream, watch_after };
        // A streaming body is pumped to its end first, unless the answer begins before that,
        // or, while it still waits for a worker, --queue-timeout ends its wait.
        let mut answered_early = None;
        if let Some(mut pumping) = pumping {
            let context = self.context.clone();
            let queue_timeout = context.settings().queue_timeout;
            let pumped = tokio::select! {
                biased;
                part = responses.recv() => Err(part),
                // Boxed, as the pump is: every request's future would otherwise have room for
                // them (M1: 10,000 requests in flight at once held 0.07 KB more each for the
                // pump's).
                refused = Box::pin(exchange::streaming_timed_out(
                    &context.seating,
                    &waiting.state,
                    waiting.enqueued_at,
                    queue_timeout,
                )) => Err(Some(refused)),
                pumped = Box::pin(self.pump_body(&mut pumping)) => Ok(pumped),
            };
            match pumped {
                Ok(Ok(())) => {}
                Ok(Err(stop)) => {
                    exchange::withdraw(&self.context.seating, &waiting.state);
                    return Ok(Seated::BodyBroke(stop));
                }
                Err(part) => answered_early = Some(part),
            }
        }
        self.mark.set(ConnectionState::Awaiting);
        let context = ResponseContext {
            head_request: head.method.as_ref() == b"HEAD",
            version: head.version,
            // --keep-alive 0 closes after each answer, and says so. A WebSocket's denial
            // response (ASGI's websocket.http.response) closes the connection too.
            keep_alive: head.keep_alive
                && !self.context.settings().keep_alive.is_zero()
                && !self.closes_when_answered()
                && websocket.is_none()
                // The rest of a body its application did not wait for is never read.
                && answered_early.is_none(),
        };
        let mut answer = Answer::new(&context);
        // The client may still be sending the body: its answer is followed by a lingering
        // close, as a refusal's is, so that the close does not reset the connection under it.
        let body_unread = answered_early.is_some();
        let mut next = match answered_early {
            Some(part) => part,
            None => self.first_part(&responses, &waiting).await,
        };
        // Whether the client is watched for leaving while the answer streams (`next_part`).
        let mut watching = true;
        loop {
            let part = match next {
                Some(part) => part,
                // The client left, or the lobby dropped the job: it is shutting down past
                // --graceful-timeout.
                None => return Ok(Seated::Close),
            };
            if let ResponsePart::WebSocket(first) = part {
                let (Some(handshake), Some(link)) = (websocket, to_worker) else {
                    unreachable!("only a WebSocket's job has WebSocket parts: {first:?}")
                };
                return Ok(Seated::WebSocket(Box::new(Accepted {
                    handshake,
                    first,
                    link,
                    responses,
                    answer,
                    waiting,
                    served,
                })));
            }
            self.mark.set(ConnectionState::Writing);
            let last = part.is_last();
            let keep_open = self.write_part(&mut answer, part, &responses).await?;
            if last {
                self.answered += 1;
                self.answered(head, origin, &answer, &waiting, served.as_deref());
                if body_unread {
                    self.linger().await;
                }
                // An answer that said keep-alive keeps the connection open, even if a shutdown
                // began while it was written: the client may send its next request at once, and
                // that one is answered with `Connection: close` (wait_for_request).
                return Ok(if keep_open { Seated::KeepOpen } else { Seated::Close });
            }
            next = self.next_part(&responses, &mut watching).await;
        }
    }

    /// An accepted WebSocket (or the worker's refusal of it), to its end; then its one access
    /// line, whose time is the WebSocket's life.
    async fn websocket_life(&mut self, head: &RequestHead, origin: &Origin, accepted: Box<Accepted>) {
        let Accepted { handshake, first, link, responses, mut answer, waiting, served } = *accepted;
        let status = self.websocket(&handshake, first, link, &responses).await;
        answer.status = status;
        self.answered(head, origin, &answer, &waiting, served.as_deref());
    }

    fn job(
        &self,
        head: &RequestHead,
        origin: &Origin,
        body: Body,
        respond: AnswerSender,
        summary: Rc<str>,
        upstream: Duration,
    ) -> Result<(Job, Option<OwnedSemaphorePermit>), String> {
        let request = exchange::Head {
            http_version: match head.version {
                Version::Http10 => maitred_wire::HTTP_1_0,
                Version::Http11 => maitred_wire::HTTP_1_1,
            },
            method: &head.method,
            target: &head.target,
            headers: head.headers.iter().map(|(n, v)| (n.as_ref(), v.as_ref())).collect(),
            client_subject: self.stream.tls().and_then(|tls| tls.client_subject.as_deref()),
        };
        exchange::job(request, &self.site, origin, body, respond, summary, upstream)
    }

    fn answered(
        &self,
        head: &RequestHead,
        origin: &Origin,
        answer: &Answer,
        waiting: &Waiting,
        served: Option<&Served>,
    ) {
        let answered = exchange::Answered {
            method: &head.method,
            target: &head.target,
            version: head.version.as_str(),
            request_headers: &head.headers,
            status: answer.status,
            body_bytes: answer.body_bytes,
            response_headers: &answer.headers,
            started: self.request_started,
            enqueued: waiting.enqueued_at,
            upstream: waiting.upstream,
            tls: self.stream.tls(),
        };
        exchange::answered(&self.context, origin, answered, served);
    }
}
