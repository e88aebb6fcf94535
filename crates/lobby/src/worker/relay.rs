//! Relaying one request's answer from a WSGI worker's thread to its connection: each frame the
//! worker sends goes to the answer's spool as it comes; a client that leaves gets the worker
//! told (`CANCEL`); a worker past `--timeout`, wedged, or gone ends the request with 504 or 502,
//! or, when it provably never read it, sends it back to the queue. Once the answer has started,
//! `--timeout` counts the application's silence since its last frame, as gunicorn's worker
//! timeout does: a stream that keeps producing is never cut (issue 47, item 4). What the ASGI
//! workers' relays (`stream.rs`) share with it is here too: decoding a frame, the failure
//! answers.

use std::fmt::Display;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use maitred_wire::{cancel_frame, FileRange, Kind, ResponseHead, WsAccept, WsClosing, WsData, WsOpcode};

use super::channel::{Channel, Frame};
use super::health;
use super::scoreboard::{Card, ExitReason};
use super::seat::Thread;
use crate::log::{debug, error, warning};
use crate::seating::job::Job;
use crate::seating::offer::{Offers, Taken};
use crate::seating::spool::{Held, ResponsePart};
use crate::seating::websocket::WsPart;
use crate::worker::context::Context;

/// How a worker was lost during a request.
pub(super) enum Lost {
    /// The request has been answered (502/504) or cut; why, and the detail for the log.
    Answered(ExitReason, String),
    /// The worker provably never had the whole request, so it never ran: it may run
    /// elsewhere.
    Unread(Unread),
}

/// Why a worker never read a request.
pub(super) enum Unread {
    /// It exited (after an answer: `SystemExit`, a crash).
    Exited,
    /// It is alive but did not read within `health::READ_WITHIN`, and was killed.
    Wedged,
}

/// Reads the worker's answer to the request it took and hands it to the request's connection.
/// If the client goes away meanwhile, the worker is told (`CANCEL`) so it stops producing the
/// answer. Errors mean the worker is lost; the request has been answered (502/504) or cut, or
/// the worker never read it. A timeout kills the worker here when `thread` is its only one;
/// with threads, the worker's task gives the others a grace first. Until the answer's head,
/// --timeout counts from the seating; after it, from the last frame: a thread is held while
/// it streams, and one silent for --timeout is taken for stuck (gunicorn's worker silence).
pub(super) async fn relay_response(
    context: &Context,
    pid: i32,
    channel: &mut Channel,
    offers: &Rc<Offers>,
    taken: &Taken,
    thread: Thread,
    card: &Card,
) -> Result<(), Lost> {
    let timeout = context.settings().timeout;
    let seated_at = Instant::now();
    if let Some(served) = &taken.job.served {
        served.seated.set(Some(seated_at));
        served.worker.set(Some(pid));
    }
    let mut relay = Relay {
        context,
        pid,
        channel,
        offers,
        taken,
        thread,
        card,
        timeout,
        seated_at,
        deadline: tokio::time::Instant::from_std(seated_at + timeout),
        read_check: Some(tokio::time::Instant::from_std(seated_at + health::READ_WITHIN)),
        head_sent: false,
        cancelled: false,
    };
    loop {
        if let Some(held) = taken.job.respond.held() {
            relay.hold_for_slow_clients(held).await;
        }
        let frame = match relay.next().await {
            Next::Frame(Ok(Some(frame))) => frame,
            // A bad ring record, an answer for another request, or a frame the ring did not
            // announce: the worker is killed, as for a bad frame.
            Next::Frame(Err(e)) if e.kind() == io::ErrorKind::InvalidData => return Err(relay.broke_protocol(e).await),
            Next::Frame(closed @ (Ok(None) | Err(_))) => return Err(relay.worker_left(closed)),
            Next::ClientGone => {
                relay.tell_cancelled().await?;
                continue;
            }
            Next::ReadCheck => {
                relay.check_read().await?;
                continue;
            }
            Next::TimedOut => return Err(relay.timed_out().await),
        };
        let part = match decode_part(frame).and_then(|part| websocket_in_step(&taken.job, part)) {
            Ok(part) => part,
            Err(e) => return Err(relay.broke_protocol(e).await),
        };
        if relay.pass_on(part) {
            return Ok(());
        }
    }
}

/// What wakes the relay.
enum Next {
    Frame(io::Result<Option<Frame>>),
    ReadCheck,
    TimedOut,
    ClientGone,
}

/// One request's relay, from its seating to the end of its answer: who takes part, and what
/// the relay has seen so far.
struct Relay<'a> {
    context: &'a Context,
    pid: i32,
    channel: &'a mut Channel,
    offers: &'a Rc<Offers>,
    taken: &'a Taken,
    thread: Thread,
    card: &'a Card,
    timeout: Duration,
    seated_at: Instant,
    /// When --timeout runs out: from the seating until the answer starts, then from the last
    /// frame; pushed back by the time the answer was held for slow clients.
    deadline: tokio::time::Instant,
    /// If the worker has not answered after a moment, it may be wedged: the request still in
    /// its slot, or (sent on the channel) with bytes unread (health::never_read). None once
    /// looked.
    read_check: Option<tokio::time::Instant>,
    /// A part of the answer has gone to the client: a failure now cuts it rather than answers.
    head_sent: bool,
    /// The client went away and the worker was told (`CANCEL`).
    cancelled: bool,
}

impl Relay<'_> {
    /// A slow client's answer past its caps: stop reading from the worker until the client
    /// catches up. The time spent so is the client's, not the application's: --timeout
    /// does not count it. Said when it starts, since a client that never reads makes it last
    /// until --send-timeout.
    async fn hold_for_slow_clients(&mut self, held: Held) {
        let (job, pid) = (&self.taken.job, self.pid);
        let (waiting, cap) = match held {
            Held::AnswerCap => (job.respond.spill_waiting(), "--max-spill"),
            Held::TotalCap => (self.context.spill_budget.waiting(), "--max-spill-total"),
        };
        crate::log::warning_limited!(
            "reading the answer to {} from worker {pid} paused: {waiting} bytes are waiting for slow clients \
             ({cap}); it goes on as they read",
            job.summary
        );
        let holding_since = tokio::time::Instant::now();
        job.respond.room().await;
        self.deadline += holding_since.elapsed();
        crate::log::info_limited!(
            "reading the answer to {} from worker {pid} went on after {:.1} s",
            job.summary,
            holding_since.elapsed().as_secs_f64()
        );
    }

    /// The next frame, or the read check, the timeout or the client's leaving, whichever
    /// comes first.
    async fn next(&mut self) -> Next {
        let job = &self.taken.job;
        let check_first = self.read_check.filter(|at| *at < self.deadline && !self.head_sent && !self.cancelled);
        tokio::select! {
            biased;
            read = tokio::time::timeout_at(check_first.unwrap_or(self.deadline), self.channel.next_answer(self.offers, self.taken.id)) => match read {
                Ok(read) => Next::Frame(read),
                Err(_) if check_first.is_some() => Next::ReadCheck,
                Err(_) => Next::TimedOut,
            },
            _ = job.respond.closed(), if !self.cancelled => Next::ClientGone,
        }
    }

    /// A frame or a part the protocol does not allow here: the worker is killed.
    async fn broke_protocol(&self, e: impl Display) -> Lost {
        let _ = self.context.zygotes.kill(self.pid, libc::SIGKILL).await;
        Lost::Answered(ExitReason::Crash, self.fail(502, &format!("the worker broke the protocol: {e}")))
    }

    /// The worker's channel closed, or failed.
    fn worker_left(&self, closed: io::Result<Option<Frame>>) -> Lost {
        // A worker that leaves after an answer (SystemExit, a crash) may do so while the
        // lobby seats the next request at it. That request never ran if the worker never
        // had all of it: still in its slot, which the lobby takes back, or, sent on the
        // channel, with bytes the worker left unread, which the kernel reports as
        // ECONNRESET when the worker's end closes.
        if !self.head_sent && !self.cancelled {
            let unread = self.offers.recall_answering()
                || self.taken.on_channel && matches!(&closed, Err(e) if e.raw_os_error() == Some(libc::ECONNRESET));
            if unread {
                return Lost::Unread(Unread::Exited);
            }
        }
        Lost::Answered(
            ExitReason::Crash,
            match closed {
                Ok(_) => self.fail(502, "the worker exited while handling this request"),
                Err(e) => self.fail(502, &format!("the worker's channel failed: {e}")),
            },
        )
    }

    async fn tell_cancelled(&mut self) -> Result<(), Lost> {
        self.cancelled = true;
        // It names the request: a worker that has already moved on to the next one
        // skips it.
        let pid = self.pid;
        debug!("the client of {} went away; telling worker {pid}", self.taken.job.summary);
        if let Err(e) = self.channel.send(&cancel_frame(self.taken.id), None).await {
            return Err(Lost::Answered(ExitReason::Crash, format!("could not send CANCEL: {e}")));
        }
        Ok(())
    }

    /// Whether the worker, silent since its seating, has read the request at all.
    async fn check_read(&mut self) -> Result<(), Lost> {
        self.read_check = None;
        let pid = self.pid;
        // A worker with other threads keeps them: what they run may finish, under
        // --timeout (`threads.rs`); a worker with one has nothing else to lose.
        let keep = !self.thread.sole;
        let never_read = self.offers.recall_answering()
            || self.taken.on_channel && health::never_read(self.context, pid, self.channel.socket.as_fd(), keep).await;
        if never_read {
            if !keep {
                if let Err(e) = self.context.zygotes.kill(pid, libc::SIGKILL).await {
                    error!("could not ask the zygote to kill worker {pid}: {e}");
                }
            }
            return Err(Lost::Unread(Unread::Wedged));
        }
        Ok(())
    }

    async fn timed_out(&self) -> Lost {
        let pid = self.pid;
        // Said before the stack, which the worker writes to the same log
        // (health::dump_stack); the lobby says nothing more until it is written.
        let elapsed = self.seated_at.elapsed().as_secs_f64();
        let answering =
            if self.head_sent { "; its answer had started, and nothing more of it came for that long" } else { "" };
        let then = if self.thread.sole {
            "then it is killed"
        } else {
            "then it takes no new request, and it is killed once its other threads have finished \
             or --graceful-timeout has passed"
        };
        error!(
            "worker {pid} timed out after {} s on {} (seated {elapsed:.1} s ago{answering}); its Python \
             stack follows, {then} (--timeout)",
            self.timeout.as_secs_f64(),
            self.taken.job.summary
        );
        health::dump_stack(self.context, pid).await;
        if self.thread.sole {
            health::end(self.context, pid).await;
        }
        Lost::Answered(ExitReason::Timeout, self.fail(504, timed_out_detail(self.head_sent)))
    }

    /// Hands a part of the answer to the connection. True when it was the last.
    fn pass_on(&mut self, part: ResponsePart) -> bool {
        let job = &self.taken.job;
        if matches!(part, ResponsePart::Abort) && !self.cancelled {
            warning!("the application failed while sending the response to {}; {}", job.summary, job.cut_short());
        }
        self.head_sent = true;
        // The application produced: --timeout now counts its silence from here.
        self.deadline = tokio::time::Instant::now() + self.timeout;
        self.card.produced(self.thread.number);
        let last = part.is_last();
        if let Some(served) = job.served.as_ref().filter(|_| last) {
            served.answered.set(Some(Instant::now()));
        }
        // A connection that has gone away no longer listens; the worker is still in step.
        if let Err(e) = job.respond.send(part) {
            // The client is cut; dropping its end makes `closed()` tell the worker to stop.
            crate::log::error_limited!("{} cut off: could not spill its answer to a temporary file: {e}", job.summary);
            let _ = job.respond.send(ResponsePart::Abort);
        }
        if last {
            let took = self.seated_at.elapsed();
            self.context.counts.served(took);
            self.context.seating.answered_in(took);
        }
        last
    }

    fn fail(&self, status: u16, detail: &str) -> String {
        fail(&self.taken.job, self.head_sent, status, detail)
    }
}

/// What the client of a request past --timeout is told, in the 504's body or the log.
pub(super) fn timed_out_detail(head_sent: bool) -> &'static str {
    if head_sent {
        "the application sent nothing more of its response for --timeout"
    } else {
        "the application did not answer within --timeout"
    }
}

/// Checks a part against the request it answers: WebSocket frames answer only a WebSocket
/// handshake, and before `WS_ACCEPT` only `WS_ACCEPT` and `WS_CLOSE` (a refusal) may come.
pub(super) fn websocket_in_step(job: &Job, part: ResponsePart) -> Result<ResponsePart, String> {
    match &part {
        ResponsePart::WebSocket(_) if job.websocket.is_none() => {
            Err("a WebSocket frame in the answer to an HTTP request".into())
        }
        ResponsePart::WebSocket(WsPart::Send { .. }) => Err("a WS_SEND before WS_ACCEPT".into()),
        _ => Ok(part),
    }
}

/// Answers `job` for a lost worker and returns the reason for the log.
pub(super) fn fail(job: &Job, head_sent: bool, status: u16, detail: &str) -> String {
    if head_sent {
        error!("{} cut off: {detail}", job.summary);
    } else {
        error!("{status} for {}: {detail}", job.summary);
    }
    let part = if head_sent {
        ResponsePart::Abort
    } else {
        ResponsePart::Refused { status, detail: detail.to_string(), retry_after: None }
    };
    // Parts without body bytes are never spilled: this send cannot fail.
    let _ = job.respond.send(part);
    detail.to_string()
}

pub(super) fn decode_part(frame: Frame) -> Result<ResponsePart, String> {
    let end = frame.header.is_end();
    match frame.header.kind {
        Kind::ResponseHead => {
            let (head, body) = ResponseHead::decode_payload(&frame.payload).map_err(|e| e.to_string())?;
            let slice = |s: &[u8]| frame.payload.slice_ref(s);
            Ok(ResponsePart::Head {
                status: head.status,
                reason: slice(head.reason),
                headers: head.headers.iter().map(|(n, v)| (slice(n), slice(v))).collect(),
                body: slice(body),
                end,
            })
        }
        Kind::ResponseBody => Ok(ResponsePart::Body { data: frame.payload, end }),
        Kind::ResponseFile => {
            let range = FileRange::decode_payload(&frame.payload).map_err(|e| e.to_string())?;
            let fd = frame.fd.ok_or("RESPONSE_FILE without a descriptor")?;
            Ok(ResponsePart::File {
                file: Rc::new(File::from(fd)),
                offset: range.offset,
                count: range.count,
                end,
                spilled: false,
            })
        }
        Kind::ResponseAbort => Ok(ResponsePart::Abort),
        Kind::WsAccept | Kind::WsSend | Kind::WsClose => decode_websocket(&frame).map(ResponsePart::WebSocket),
        other => Err(format!("unexpected {other:?} frame during a response")),
    }
}

/// The part a WebSocket frame from the worker stands for.
pub(super) fn decode_websocket(frame: &Frame) -> Result<WsPart, String> {
    let slice = |s: &[u8]| frame.payload.slice_ref(s);
    match frame.header.kind {
        Kind::WsAccept => {
            let accept = WsAccept::decode_payload(&frame.payload).map_err(|e| e.to_string())?;
            Ok(WsPart::Accept {
                subprotocol: slice(accept.subprotocol),
                headers: accept.headers.iter().map(|(n, v)| (slice(n), slice(v))).collect(),
            })
        }
        Kind::WsSend => {
            let data = WsData::decode_payload(&frame.payload).map_err(|e| e.to_string())?;
            Ok(WsPart::Send { text: data.opcode == WsOpcode::Text, data: slice(data.data) })
        }
        Kind::WsClose if !frame.header.is_end() => Err("a WS_CLOSE without END".into()),
        Kind::WsClose => {
            let closing = WsClosing::decode_payload(&frame.payload).map_err(|e| e.to_string())?;
            Ok(WsPart::Close { code: closing.code, reason: closing.reason.to_string() })
        }
        other => Err(format!("unexpected {other:?} frame on a WebSocket")),
    }
}
