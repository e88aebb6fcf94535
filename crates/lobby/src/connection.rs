//! One client connection: read each request completely, queue it, write its answer.
//!
//! A connection costs no worker at any point: while idle it holds no buffer and waits for
//! readability (S4, S5); a request reaches the queue only when its body is complete (S1);
//! the answer is taken from the worker as fast as it comes and written here at the client's
//! pace.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::future::poll_fn;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use maitred_protocol::{
    decode_proxy_header, write_chunk, write_error_response, write_response_head, BodyLength, Event, Framing,
    ProxyHeader, RequestDecoder, RequestError, RequestHead, ResponseContext, Version, LAST_CHUNK,
};
use maitred_wire::{build_frame, Kind, FLAG_FD};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::sleep_until;

use crate::connection_states::{ConnectionState, StateMark};
use crate::hibernation::{Sleeper, StreamKind, HIBERNATE_AFTER};
use crate::log::{self, debug};
use crate::proxies::{self, Origin};
use crate::seating::{Job, JobState, Served};
use crate::spool::{answer_channel, AnswerReceiver, AnswerSender, ResponsePart};
use crate::Lobby;

/// Bodies up to this size travel inline in the `REQUEST` frame; larger ones are spilled to an
/// unlinked temporary file whose descriptor the worker reads.
const BODY_MEMORY_LIMIT: usize = 256 * 1024;
/// How long, and how much input, a refused connection is drained before it is closed.
const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(2);
const LINGER_BYTES: usize = 1 << 20;
/// Reads take at least this much free room; most request heads fit in one.
const READ_CHUNK: usize = 4 * 1024;

/// A client stream: TCP or Unix.
pub trait ClientStream: AsyncRead + AsyncWrite + AsFd + AsRawFd + Unpin + 'static {
    const KIND: StreamKind;
    /// Leaves the event loop, keeping the connection open.
    fn into_fd(self) -> io::Result<OwnedFd>;
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
}

macro_rules! client_stream {
    ($t:ty, $kind:expr) => {
        impl ClientStream for $t {
            const KIND: StreamKind = $kind;
            fn into_fd(self) -> io::Result<OwnedFd> {
                Ok(self.into_std()?.into())
            }
            fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                <$t>::poll_read_ready(self, cx)
            }
            fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                <$t>::poll_write_ready(self, cx)
            }
            fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
                <$t>::try_io(self, interest, f)
            }
        }
    };
}
client_stream!(tokio::net::TcpStream, StreamKind::Tcp);
client_stream!(tokio::net::UnixStream, StreamKind::Unix);

/// Who is on the other end, for the environ and the logs: an address for TCP, none for a
/// Unix socket. Kept as the socket address, not as text, so that it costs a hibernating
/// connection no allocation of its own.
pub struct Peer {
    /// The socket's peer; once a PROXY header has been read, the client it named.
    pub addr: Option<SocketAddr>,
    pub proxy: ProxyStage,
}

/// Where a connection stands with the PROXY protocol (`--proxy-protocol`, docs/PROXIES.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyStage {
    /// Off when the connection was accepted: the peer is the client.
    Off,
    /// The connection must begin with a PROXY header, which has not been read yet.
    Awaited,
    /// The header has been read.
    Read,
}

impl Peer {
    pub fn new(addr: Option<SocketAddr>, proxy_protocol: bool) -> Peer {
        Peer { addr, proxy: if proxy_protocol { ProxyStage::Awaited } else { ProxyStage::Off } }
    }

    pub(crate) fn display(&self) -> String {
        match self.addr {
            Some(addr) => format!("{}:{}", addr.ip(), addr.port()),
            None => "unix socket".into(),
        }
    }
}

/// The listener a connection came through.
pub struct Site {
    pub server_name: String,
    pub server_port: u16,
}

/// Why a connection stops reading requests.
enum Stop {
    /// The client closed, the connection idled out, or the lobby is shutting down.
    Quietly,
    /// The request is refused with this status and reason; the connection closes after it.
    Refuse(u16, String),
}

impl From<RequestError> for Stop {
    fn from(e: RequestError) -> Stop {
        Stop::Refuse(e.status(), e.to_string())
    }
}

/// A complete request body.
enum Body {
    Memory(Vec<u8>),
    /// Spilled to an unlinked temporary file, whose descriptor takes a place under
    /// --max-connections as a connection does, until the answer is written.
    File {
        file: File,
        len: u64,
        descriptor: OwnedSemaphorePermit,
    },
}

impl Body {
    fn for_length(expected: Option<u64>, descriptors: &Arc<Semaphore>) -> Result<Body, Stop> {
        match expected {
            Some(len) if len > BODY_MEMORY_LIMIT as u64 => {
                let (file, descriptor) = spill_file(descriptors)?;
                Ok(Body::File { file, len: 0, descriptor })
            }
            Some(len) => Ok(Body::Memory(Vec::with_capacity(len as usize))),
            None => Ok(Body::Memory(Vec::new())),
        }
    }

    fn push(&mut self, data: &[u8], descriptors: &Arc<Semaphore>) -> Result<(), Stop> {
        if let Body::Memory(bytes) = self {
            if bytes.len() + data.len() <= BODY_MEMORY_LIMIT {
                bytes.extend_from_slice(data);
                return Ok(());
            }
            let (mut file, descriptor) = spill_file(descriptors)?;
            file.write_all(bytes).map_err(|e| spill_failed(&e))?;
            *self = Body::File { file, len: bytes.len() as u64, descriptor };
        }
        if let Body::File { file, len, .. } = self {
            file.write_all(data).map_err(|e| spill_failed(&e))?;
            *len += data.len() as u64;
        }
        Ok(())
    }

    fn len(&self) -> u64 {
        match self {
            Body::Memory(bytes) => bytes.len() as u64,
            Body::File { len, .. } => *len,
        }
    }
}

/// Serves a connection from its first request (`answered` 0) or after hibernating.
pub fn start<S: ClientStream>(
    lobby: &Rc<Lobby>,
    stream: S,
    peer: Peer,
    site: Rc<Site>,
    permit: OwnedSemaphorePermit,
    answered: u64,
) {
    let decoder = RequestDecoder::new(lobby.limits());
    let connection = Connection {
        lobby: lobby.clone(),
        stream,
        peer,
        site,
        permit,
        buf: BytesMut::new(),
        decoder,
        answered,
        request_started: Instant::now(),
        mark: lobby.connection_states.mark(ConnectionState::Idle),
    };
    tokio::task::spawn_local(connection.run());
}

/// Wakes a hibernating connection whose client has spoken (or closed).
pub fn resume(lobby: &Rc<Lobby>, sleeper: Sleeper) {
    let Sleeper { socket, kind, peer, site, permit, answered, .. } = sleeper;
    let started = match kind {
        StreamKind::Tcp => tokio::net::TcpStream::from_std(socket.into())
            .map(|stream| start(lobby, stream, peer, site, permit, answered)),
        StreamKind::Unix => tokio::net::UnixStream::from_std(socket.into())
            .map(|stream| start(lobby, stream, peer, site, permit, answered)),
    };
    if let Err(e) = started {
        debug!("could not wake an idle connection: {e}");
    }
}

struct Connection<S> {
    lobby: Rc<Lobby>,
    stream: S,
    peer: Peer,
    site: Rc<Site>,
    /// Its place under --max-connections, given back when the connection closes.
    permit: OwnedSemaphorePermit,
    buf: BytesMut,
    decoder: RequestDecoder,
    /// Requests answered so far: a shutdown closes idle connections that have had one (once
    /// they have been idle for `HIBERNATE_AFTER`), but lets a new connection send its first
    /// request.
    answered: u64,
    /// When the current request's head began to be read, for the access log's request time.
    request_started: Instant,
    /// Its place in `maitred_connections`.
    mark: StateMark,
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
    /// Only the wait between requests runs inline: everything that holds buffers while a
    /// request is read or answered runs in a boxed future that exists only meanwhile.
    async fn run(mut self) {
        // A connection just accepted or woken from hibernation has, most often, its request
        // waiting already: read it before asking the event loop.
        let mut read_first = true;
        loop {
            if self.buf.is_empty() && self.decoder.is_idle() {
                self.mark.set(ConnectionState::Idle);
                match self.wait_for_request(std::mem::take(&mut read_first)).await {
                    Wait::Request => {}
                    Wait::Close => return,
                    Wait::Hibernate { deadline } => return self.hibernate(deadline.into_std()),
                }
            }
            self.mark.set(ConnectionState::Reading);
            let stop = match Box::pin(self.next_request()).await {
                Ok((head, origin, body)) => match Box::pin(self.seat(&head, &origin, body)).await {
                    Ok(true) => continue,
                    Ok(false) => return,
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                        log::info_limited!("connection from {} cut while answering: {e}", self.peer.display());
                        return;
                    }
                    Err(e) => {
                        debug!("connection from {} ended while answering: {e}", self.peer.display());
                        return;
                    }
                },
                Err(stop) => stop,
            };
            if let Stop::Refuse(status, reason) = stop {
                // What was read is not needed to refuse it; a head given up for
                // --max-head-memory must give its memory back now, not after the linger.
                self.buf = BytesMut::new();
                Box::pin(self.refuse(status, &reason)).await;
            }
            return;
        }
    }

    fn hibernate(self, deadline: Instant) {
        let Connection { lobby, stream, peer, site, permit, answered, .. } = self;
        match stream.into_fd() {
            Ok(socket) => {
                let sleeper = Sleeper { socket, kind: S::KIND, peer, site, permit, answered, deadline };
                match lobby.successor() {
                    Some(successor) => successor.hand_over(sleeper),
                    None => lobby.hibernation.put(sleeper),
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
    /// closed under it (docs/SIGNALS.md).
    async fn wait_for_request(&mut self, mut read_first: bool) -> Wait {
        self.buf = BytesMut::new();
        let settings = self.lobby.settings();
        let patience = if self.answered == 0 { settings.header_timeout } else { settings.keep_alive };
        let now = tokio::time::Instant::now();
        let deadline = now + patience;
        let hibernate_at = now + HIBERNATE_AFTER;
        // A new maitred has taken over (SIGUSR2): it gets the connection now, with whatever
        // the client has sent and this lobby has not read, rather than once it has idled.
        if self.lobby.handing_over() {
            return Wait::Hibernate { deadline };
        }
        loop {
            if !std::mem::take(&mut read_first) {
                tokio::select! {
                    ready = poll_fn(|cx| self.stream.poll_read_ready(cx)) => if ready.is_err() { return Wait::Close },
                    _ = sleep_until(deadline.min(hibernate_at)) => {
                        let closing = self.answered > 0 && self.lobby.closing();
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

    async fn refuse(&mut self, status: u16, reason: &str) {
        self.mark.set(ConnectionState::Writing);
        log::info_limited!("{status} to {}: {reason}", self.peer.display());
        self.lobby.metrics.refused(status);
        let mut out = Vec::new();
        write_error_response(&mut out, status, reason, &http_date(), false, None);
        if self.write_closing(&out).await.is_ok() {
            self.linger().await;
        }
    }

    /// Closing a socket with unread input makes the kernel send a reset, which can destroy
    /// the refusal just written before the client reads it. So: stop writing, then read and
    /// discard what the client is still sending, within bounds, before closing.
    async fn linger(&mut self) {
        if self.stream.shutdown().await.is_err() {
            return;
        }
        let deadline = tokio::time::Instant::now() + LINGER_TIME;
        let mut discarded = 0;
        let mut sink = vec![0u8; 4096];
        while discarded < LINGER_BYTES {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut sink)).await {
                Ok(Ok(n)) if n > 0 => discarded += n,
                _ => return,
            }
        }
    }

    /// Reads one whole request: its head, then its body to the end. The client it comes from
    /// is settled with its head, so that a contradiction is refused before the body is read.
    async fn next_request(&mut self) -> Result<(RequestHead, Origin, Body), Stop> {
        if self.peer.proxy == ProxyStage::Awaited {
            self.read_proxy_header().await?;
        }
        let head = self.read_head().await?;
        let origin = proxies::origin(self.peer.addr, &head.headers, &self.lobby.settings().forwarding)
            .map_err(|e| Stop::Refuse(400, e.to_string()))?;
        if head.expect_continue && !matches!(head.body, BodyLength::Empty) {
            self.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.map_err(|_| Stop::Quietly)?;
        }
        let expected = match head.body {
            BodyLength::Length(n) => Some(n),
            BodyLength::Empty => Some(0),
            BodyLength::Chunked => None,
        };
        let descriptors = self.permit.semaphore().clone();
        let mut body = Body::for_length(expected, &descriptors)?;
        let started = Instant::now();
        let mut gap_started = started;
        let config = self.lobby.settings();
        loop {
            match self.decoder.decode(&mut self.buf)? {
                Some(Event::Data(data)) => body.push(&data, &descriptors)?,
                Some(Event::End { .. }) => return Ok((head, origin, body)),
                Some(Event::Head(_)) => unreachable!("the decoder yields End before the next Head"),
                None => {
                    let gap_deadline = gap_started + config.header_timeout;
                    // Each byte received earns 1/--body-min-rate s more, after a first
                    // --header-timeout: a body trickled slower than that ends however steady it is.
                    let rate_deadline = (config.body_min_rate > 0).then(|| {
                        started
                            + config.header_timeout
                            + std::time::Duration::from_secs_f64(body.len() as f64 / config.body_min_rate as f64)
                    });
                    let deadline = rate_deadline.map_or(gap_deadline, |rate| rate.min(gap_deadline));
                    tokio::select! {
                        read = self.read_more() => match read {
                            Ok(0) | Err(_) => return Err(Stop::Quietly),
                            Ok(_) => gap_started = Instant::now(),
                        },
                        _ = sleep_until(deadline.into()) => {
                            let reason = if rate_deadline.is_some_and(|rate| rate < gap_deadline) {
                                format!(
                                    "the request body arrived slower than --body-min-rate ({} bytes/s): {} bytes in {:.0} s",
                                    config.body_min_rate,
                                    body.len(),
                                    started.elapsed().as_secs_f64()
                                )
                            } else {
                                "the request body stalled for longer than --header-timeout".into()
                            };
                            return Err(Stop::Refuse(408, reason));
                        }
                    }
                }
            }
        }
    }

    /// Reads the PROXY header the connection must begin with, from a peer in
    /// `--proxy-allow-from` (any Unix-socket peer, as under gunicorn), within
    /// `--header-timeout`; the client it names becomes the peer.
    async fn read_proxy_header(&mut self) -> Result<(), Stop> {
        let settings = self.lobby.settings();
        let Some(versions) = settings.proxy_protocol else {
            // A reload turned it off after this connection was accepted.
            self.peer.proxy = ProxyStage::Off;
            return Ok(());
        };
        if let Some(addr) = self.peer.addr.filter(|addr| !settings.proxy_allow_ips.allows(addr.ip())) {
            return Err(Stop::Refuse(
                400,
                format!(
                    "{} is not in --proxy-allow-from, and this server takes only PROXY protocol connections",
                    addr.ip()
                ),
            ));
        }
        let deadline = Instant::now() + settings.header_timeout;
        loop {
            match decode_proxy_header(&self.buf, versions).map_err(|e| Stop::Refuse(400, e.to_string()))? {
                Some((header, len)) => {
                    let _ = self.buf.split_to(len);
                    if let ProxyHeader::Proxied { client, .. } = header {
                        self.peer.addr = Some(client);
                    }
                    self.peer.proxy = ProxyStage::Read;
                    return Ok(());
                }
                None => tokio::select! {
                    read = self.read_more() => match read {
                        Ok(0) | Err(_) => return Err(Stop::Quietly),
                        Ok(_) => {}
                    },
                    _ = sleep_until(deadline.into()) => {
                        return Err(Stop::Refuse(400, "the PROXY protocol header did not arrive within --header-timeout".into()));
                    }
                },
            }
        }
    }

    /// Reads up to a request head, which must arrive within `--header-timeout`.
    /// Its buffer counts against --max-head-memory meanwhile (`heads.rs`).
    async fn read_head(&mut self) -> Result<RequestHead, Stop> {
        let started = Instant::now();
        let mut ticket = None;
        loop {
            match self.decoder.decode(&mut self.buf)? {
                Some(Event::Head(head)) => {
                    self.request_started = started;
                    return Ok(head);
                }
                Some(_) => unreachable!("the decoder yields a Head first"),
                None => {}
            }
            // Most heads arrive whole in their first read and never need a ticket.
            let ticket = ticket.get_or_insert_with(|| self.lobby.heads.ticket());
            self.make_room();
            ticket.hold(self.buf.capacity());
            let deadline = started + self.lobby.settings().header_timeout;
            tokio::select! {
                read = self.read_more() => match read {
                    Ok(0) | Err(_) => return Err(Stop::Quietly),
                    Ok(_) => {}
                },
                _ = sleep_until(deadline.into()) => {
                    return Err(Stop::Refuse(408, "the request head did not arrive within --header-timeout".into()));
                }
                _ = ticket.evicted() => {
                    return Err(Stop::Refuse(
                        408,
                        "the memory for incomplete request heads (--max-head-memory) is full; the oldest are refused first"
                            .into(),
                    ));
                }
            }
        }
    }

    async fn read_more(&mut self) -> io::Result<usize> {
        self.make_room();
        self.stream.read_buf(&mut self.buf).await
    }

    /// Makes room in the buffer for the next read: it grows geometrically for a large head or
    /// body.
    fn make_room(&mut self) {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 2 {
            self.buf.reserve(READ_CHUNK.max(self.buf.len()));
        }
    }

    /// Queues the request, then writes its answer. Returns whether the connection stays open.
    async fn seat(&mut self, head: &RequestHead, origin: &Origin, body: Body) -> io::Result<bool> {
        let (respond, responses) = answer_channel(
            self.lobby.spill_budget.clone(),
            self.lobby.settings().max_spill,
            self.permit.semaphore().clone(),
        );
        let summary: Rc<str> = format!(
            "{} {} {}",
            String::from_utf8_lossy(&head.method),
            String::from_utf8_lossy(&head.target),
            version_text(head.version)
        )
        .into();
        // The body file's place under --max-connections is held until the answer is written.
        let (job, _body_descriptor) = match self.job(head, origin, body, respond, summary.clone()) {
            Ok(job) => job,
            Err(detail) => {
                log::info_limited!("431 to {}: {detail}", self.peer.display());
                let mut out = Vec::new();
                write_error_response(&mut out, 431, &detail, &http_date(), false, None);
                self.write_closing(&out).await?;
                return Ok(false);
            }
        };
        let state = job.state.clone();
        let enqueued_at = job.enqueued_at;
        let served = job.served.clone();
        self.lobby.seating.submit(job);
        self.mark.set(ConnectionState::Awaiting);
        let context = ResponseContext {
            head_request: head.method.as_ref() == b"HEAD",
            version: head.version,
            // --keep-alive 0 closes after each answer, and says so.
            keep_alive: head.keep_alive && !self.lobby.settings().keep_alive.is_zero() && !self.lobby.closing(),
        };
        let mut answer = Answer::new(&context);
        loop {
            let part = match self.next_part(&responses, &state, enqueued_at).await {
                Some(part) => part,
                // The lobby dropped the job: it is shutting down past --graceful-timeout.
                None => return Ok(false),
            };
            self.mark.set(ConnectionState::Writing);
            let last = part.is_last();
            let keep_open = self.write_part(&mut answer, part, &responses).await?;
            if last {
                self.answered += 1;
                self.lobby.metrics.answered(answer.status);
                self.log_access(head, origin, &answer, enqueued_at, served.as_deref());
                // An answer that said keep-alive keeps the connection open, even if a shutdown
                // began while it was written: the client may send its next request at once, and
                // that one is answered with `Connection: close` (wait_for_request).
                return Ok(keep_open);
            }
        }
    }

    fn job(
        &self,
        head: &RequestHead,
        origin: &Origin,
        body: Body,
        respond: AnswerSender,
        summary: Rc<str>,
    ) -> Result<(Job, Option<OwnedSemaphorePermit>), String> {
        let body_len = body.len();
        let (inline, body_file, body_descriptor) = match body {
            Body::Memory(bytes) => (bytes, None, None),
            Body::File { file, descriptor, .. } => (Vec::new(), Some(file), Some(descriptor)),
        };
        let peer_addr = origin.ip_text();
        let request = maitred_wire::Request {
            http_minor: match head.version {
                Version::Http10 => 0,
                Version::Http11 => 1,
            },
            method: &head.method,
            target: &head.target,
            peer_addr: peer_addr.as_bytes(),
            peer_port: origin.port.unwrap_or(0),
            server_name: self.site.server_name.as_bytes(),
            server_port: self.site.server_port,
            https: origin.https,
            headers: head.headers.iter().map(|(n, v)| (n.as_ref(), v.as_ref())).collect(),
            body_len,
            inline_body: &inline,
        };
        let flags = if body_file.is_some() { FLAG_FD } else { 0 };
        let frame = build_frame(Kind::Request, flags, |out| request.encode_payload(out)).map_err(|e| e.to_string())?;
        let job = Job {
            frame,
            body_file,
            state: Rc::new(Cell::new(JobState::Queued)),
            respond,
            enqueued_at: Instant::now(),
            summary,
            served: log::access_log_enabled().then(Rc::default),
        };
        Ok((job, body_descriptor))
    }

    /// The next part of the answer. Before the first part, a request still waiting for a
    /// worker after `--queue-timeout` (in the queue, or offered to a busy worker that has not
    /// taken it) is withdrawn and answered 503.
    async fn next_part(
        &mut self,
        responses: &AnswerReceiver,
        state: &Rc<Cell<JobState>>,
        enqueued_at: Instant,
    ) -> Option<ResponsePart> {
        let Some(limit) = self.lobby.settings().queue_timeout.filter(|_| state.get() == JobState::Queued) else {
            return responses.recv().await;
        };
        tokio::select! {
            part = responses.recv() => part,
            _ = sleep_until((enqueued_at + limit).into()) => {
                let withdrawn = match state.get() {
                    JobState::Queued => {
                        state.set(JobState::Cancelled);
                        true
                    }
                    JobState::Offered => self.lobby.seating.withdraw_offer(state),
                    JobState::Seated | JobState::Cancelled => false,
                };
                if !withdrawn {
                    return responses.recv().await;
                }
                Some(ResponsePart::Refused {
                    status: 503,
                    detail: format!("no worker was free within --queue-timeout ({} s)", limit.as_secs_f64()),
                })
            }
        }
    }

    /// Writes one part; returns whether the connection may stay open after this answer.
    async fn write_part(
        &mut self,
        answer: &mut Answer,
        part: ResponsePart,
        responses: &AnswerReceiver,
    ) -> io::Result<bool> {
        let mut out = Vec::new();
        let end = match part {
            ResponsePart::Head { status, reason, headers, body, end } => {
                // A shutdown that began while the request waited closes the connection after it.
                answer.context.keep_alive &= !self.lobby.closing();
                let fields: Vec<(&[u8], &[u8])> = headers.iter().map(|(n, v)| (n.as_ref(), v.as_ref())).collect();
                let known = end.then_some(body.len() as u64);
                let (framing, keep_alive) =
                    write_response_head(&mut out, &answer.context, status, &reason, &fields, known, &http_date());
                answer.started(status, framing, keep_alive);
                answer.body(&mut out, &body);
                // Kept for an access log that writes response headers; they hold the frame
                // they came in (and its first body bytes), so only then.
                if log::access_log_enabled() && self.lobby.settings().access_log_format.uses_response_headers() {
                    answer.headers = headers;
                }
                end
            }
            ResponsePart::Body { data, end } => {
                answer.body(&mut out, &data);
                end
            }
            ResponsePart::File { file, offset, count: available, end, spilled } => {
                let count = answer.file_part(&mut out, available);
                self.write_all(&out).await?;
                out.clear();
                if count > 0 {
                    self.send_file(&file, offset, count).await?;
                }
                if spilled {
                    responses.spilled_sent(available);
                }
                if count > 0 && answer.framing == Framing::Chunked {
                    out.extend_from_slice(b"\r\n");
                }
                end
            }
            ResponsePart::Abort => return Ok(false),
            ResponsePart::Refused { status, detail } => {
                // A 503 comes from --queue-timeout: the connection is healthy, and the client
                // may try again after about as long as this request waited.
                let overloaded = status == 503;
                let keep_alive = answer.context.keep_alive && overloaded && !self.lobby.closing();
                let retry_after = self
                    .lobby
                    .settings()
                    .queue_timeout
                    .filter(|_| overloaded)
                    .map(|t| t.as_secs_f64().ceil().max(1.0) as u64);
                write_error_response(&mut out, status, &detail, &http_date(), keep_alive, retry_after);
                answer.status = status;
                answer.keep_alive = keep_alive;
                true
            }
        };
        if end {
            answer.finish(&mut out);
        }
        let keep_open = answer.keep_alive && !answer.broken;
        if end && !keep_open {
            self.write_closing(&out).await?;
        } else {
            self.write_all(&out).await?;
        }
        Ok(keep_open)
    }

    /// Writes everything, giving up only on a client that takes nothing for `--send-timeout`:
    /// a client that keeps reading, however slowly, is never cut.
    async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.send_all(data, false).await
    }

    /// `send(2)`s all of `data` (with MSG_MORE when `more`), each call as soon as the client
    /// can take bytes.
    async fn send_all(&mut self, mut data: &[u8], more: bool) -> io::Result<()> {
        let fd = self.stream.as_fd();
        while !data.is_empty() {
            let sent = self.write_when_ready(|| maitred_sys::socket::send(fd, data, more).map(|n| n as u64));
            data = &data[sent.await? as usize..];
        }
        Ok(())
    }

    /// Writes the last bytes before the connection closes (or shuts down writing). TCP holds
    /// them back (MSG_MORE) and the close that follows sends them with its FIN, in one
    /// segment: per connection one packet fewer for both kernels to process and one wake-up
    /// fewer for the client (T2).
    async fn write_closing(&mut self, data: &[u8]) -> io::Result<()> {
        self.send_all(data, matches!(S::KIND, StreamKind::Tcp)).await
    }

    /// Copies `count` bytes of `file` from `offset` to the client inside the kernel.
    async fn send_file(&mut self, file: &File, mut offset: u64, mut count: u64) -> io::Result<()> {
        let (out_fd, in_fd) = (self.stream.as_fd(), file.as_fd());
        while count > 0 {
            let sent = self.write_when_ready(|| {
                let chunk = count.min(1 << 30) as usize;
                let mut at = offset;
                maitred_sys::socket::sendfile(out_fd, in_fd, &mut at, chunk).map(|n| n as u64)
            });
            match sent.await? {
                0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file is shorter than announced")),
                n => {
                    offset += n;
                    count -= n;
                }
            }
        }
        Ok(())
    }

    /// Runs one non-blocking write as soon as the client can take bytes, and returns how many
    /// it took; gives up on a client that takes nothing for `--send-timeout`.
    ///
    /// Progress is the kernel's queue of unsent bytes shrinking, not the socket becoming
    /// writable: with megabytes queued, a socket turns writable only once half of them are
    /// gone, which a client reading a few KiB a second takes minutes to do.
    async fn write_when_ready(&self, mut write: impl FnMut() -> io::Result<u64>) -> io::Result<u64> {
        let limit = self.lobby.settings().send_timeout;
        let mut unsent = maitred_sys::socket::unsent_bytes(self.stream.as_fd());
        loop {
            let attempt = async {
                loop {
                    poll_fn(|cx| self.stream.poll_write_ready(cx)).await?;
                    match self.stream.try_io(Interest::WRITABLE, &mut write) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        result => return result,
                    }
                }
            };
            if let Ok(result) = tokio::time::timeout(limit, attempt).await {
                return result;
            }
            let now = maitred_sys::socket::unsent_bytes(self.stream.as_fd());
            match (unsent, now) {
                (Some(before), Some(now)) if now < before => unsent = Some(now),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client took no byte of its answer for {} s (--send-timeout)", limit.as_secs_f64()),
                    ))
                }
            }
        }
    }

    fn log_access(
        &self,
        head: &RequestHead,
        origin: &Origin,
        answer: &Answer,
        enqueued: Instant,
        served: Option<&Served>,
    ) {
        if !log::access_log_enabled() {
            return;
        }
        log::access(
            &self.lobby.settings().access_log_format,
            &log::AccessRecord {
                peer: &origin.ip_text(),
                method: &head.method,
                target: &head.target,
                version: version_text(head.version),
                request_headers: &head.headers,
                status: answer.status,
                body_bytes: answer.body_bytes,
                response_headers: &answer.headers,
                started: self.request_started,
                enqueued,
                seated: served.and_then(|served| served.seated.get()),
                answered: served.and_then(|served| served.answered.get()),
                worker: served.and_then(|served| served.worker.get()),
            },
        );
    }
}

/// The state of one answer being written: its framing and how much of the body went out.
struct Answer {
    context: ResponseContext,
    status: u16,
    framing: Framing,
    keep_alive: bool,
    /// Body bytes still owed under a Content-Length.
    remaining: u64,
    body_bytes: u64,
    /// The application's header fields, when the access log writes some (`{name}o`).
    headers: Vec<(Bytes, Bytes)>,
    /// The application sent more or fewer bytes than it announced: the framing is broken
    /// and the connection must close after this answer.
    broken: bool,
}

impl Answer {
    fn new(context: &ResponseContext) -> Answer {
        Answer {
            context: *context,
            status: 0,
            framing: Framing::NoBody,
            keep_alive: false,
            remaining: 0,
            body_bytes: 0,
            headers: Vec::new(),
            broken: false,
        }
    }

    fn started(&mut self, status: u16, framing: Framing, keep_alive: bool) {
        self.status = status;
        self.framing = framing;
        self.keep_alive = keep_alive;
        if let Framing::Length(n) = framing {
            self.remaining = n;
        }
    }

    fn body(&mut self, out: &mut Vec<u8>, data: &[u8]) {
        match self.framing {
            Framing::NoBody => {}
            Framing::Length(_) => {
                let take = data.len().min(self.remaining as usize);
                out.extend_from_slice(&data[..take]);
                self.remaining -= take as u64;
                self.body_bytes += take as u64;
                if take < data.len() {
                    self.overrun();
                }
            }
            Framing::Chunked => {
                write_chunk(out, data);
                self.body_bytes += data.len() as u64;
            }
            Framing::UntilClose => {
                out.extend_from_slice(data);
                self.body_bytes += data.len() as u64;
            }
        }
    }

    /// Writes what precedes `count` file bytes and returns how many of them to send.
    fn file_part(&mut self, out: &mut Vec<u8>, count: u64) -> u64 {
        let count = match self.framing {
            Framing::NoBody => 0,
            Framing::Length(_) => {
                let take = count.min(self.remaining);
                self.remaining -= take;
                if take < count {
                    self.overrun();
                }
                take
            }
            Framing::Chunked => {
                if count > 0 {
                    out.extend_from_slice(format!("{count:x}\r\n").as_bytes());
                }
                count
            }
            Framing::UntilClose => count,
        };
        self.body_bytes += count;
        count
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        match self.framing {
            Framing::Chunked => out.extend_from_slice(LAST_CHUNK),
            Framing::Length(_) if self.remaining > 0 => {
                log::warning_limited!(
                    "the application sent {} bytes fewer than its Content-Length; closing the connection",
                    self.remaining
                );
                self.broken = true;
            }
            _ => {}
        }
    }

    fn overrun(&mut self) {
        if !self.broken {
            log::warning_limited!("the application sent more bytes than its Content-Length; the excess was dropped");
        }
        self.broken = true;
    }
}

/// A temporary file for a request body, and its place under --max-connections.
fn spill_file(descriptors: &Arc<Semaphore>) -> Result<(File, OwnedSemaphorePermit), Stop> {
    let descriptor = descriptors.clone().try_acquire_owned().map_err(|_| {
        Stop::Refuse(
            503,
            "every descriptor under --max-connections is in use: no temporary file for this request body".into(),
        )
    })?;
    let file = tempfile::tempfile().map_err(|e| spill_failed(&e))?;
    Ok((file, descriptor))
}

fn spill_failed(e: &io::Error) -> Stop {
    Stop::Refuse(500, format!("could not buffer the request body in a temporary file: {e}"))
}

/// One read attempt that does not wait: Pending when nothing is there, and then the stream
/// is registered to wake `cx` when there is.
fn read_now<S: AsyncRead + Unpin>(stream: &mut S, cx: &mut Context<'_>, buf: &mut BytesMut) -> Poll<io::Result<usize>> {
    tokio_util::io::poll_read_buf(std::pin::Pin::new(stream), cx, buf)
}

fn version_text(version: Version) -> &'static str {
    match version {
        Version::Http10 => "HTTP/1.0",
        Version::Http11 => "HTTP/1.1",
    }
}

thread_local! {
    static DATE: RefCell<(u64, Bytes)> = const { RefCell::new((u64::MAX, Bytes::new())) };
}

/// The `Date` header value, formatted at most once a second.
fn http_date() -> Bytes {
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
