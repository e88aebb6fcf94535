//! Relaying one request's answer from a WSGI worker's thread to its connection: each frame the
//! worker sends goes to the answer's spool as it comes; a client that leaves gets the worker
//! told (`CANCEL`); a worker past `--timeout`, wedged, or gone ends the request with 504 or 502,
//! or, when it provably never read it, sends it back to the queue. Once the answer has started,
//! `--timeout` counts the application's silence since its last frame, as gunicorn's worker
//! timeout does: a stream that keeps producing is never cut (issue 47, item 4). What the ASGI
//! workers' relays (`stream.rs`) share with it is here too: decoding a frame, the failure
//! answers.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::Instant;

use maitred_wire::{cancel_frame, FileRange, Kind, ResponseHead, WsAccept, WsClosing, WsData, WsOpcode};

use super::channel::{Channel, Frame};
use super::health;
use super::scoreboard::{Card, ExitReason};
use super::seat::Thread;
use crate::lobby::Lobby;
use crate::log::{debug, error, warning};
use crate::seating::job::Job;
use crate::seating::offer::{Offers, Taken};
use crate::seating::spool::{Held, ResponsePart};
use crate::seating::websocket::WsPart;

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
    lobby: &Lobby,
    pid: i32,
    channel: &mut Channel,
    offers: &Rc<Offers>,
    taken: &Taken,
    thread: Thread,
    card: &Card,
) -> Result<(), Lost> {
    let job = &taken.job;
    enum Next {
        Frame(io::Result<Option<Frame>>),
        ReadCheck,
        TimedOut,
        ClientGone,
    }
    let timeout = lobby.settings().timeout;
    let seated_at = Instant::now();
    if let Some(served) = &job.served {
        served.seated.set(Some(seated_at));
        served.worker.set(Some(pid));
    }
    let mut deadline = tokio::time::Instant::from_std(seated_at + timeout);
    // If the worker has not answered after a moment, it may be wedged: the request still in
    // its slot, or (sent on the channel) with bytes unread (health::never_read).
    let mut read_check = Some(tokio::time::Instant::from_std(seated_at + health::READ_WITHIN));
    let mut head_sent = false;
    let mut cancelled = false;
    loop {
        // A slow client's answer past its caps: stop reading from the worker until the client
        // catches up. The time spent so is the client's, not the application's: --timeout
        // does not count it. Said when it starts, since a client that never reads makes it last
        // until --send-timeout.
        if let Some(held) = job.respond.held() {
            let (waiting, cap) = match held {
                Held::AnswerCap => (job.respond.spill_waiting(), "--max-spill"),
                Held::TotalCap => (lobby.spill_budget.waiting(), "--max-spill-total"),
            };
            crate::log::warning_limited!(
                "reading the answer to {} from worker {pid} paused: {waiting} bytes are waiting for slow clients \
                 ({cap}); it goes on as they read",
                job.summary
            );
            let holding_since = tokio::time::Instant::now();
            job.respond.room().await;
            deadline += holding_since.elapsed();
            crate::log::info_limited!(
                "reading the answer to {} from worker {pid} went on after {:.1} s",
                job.summary,
                holding_since.elapsed().as_secs_f64()
            );
        }
        let check_first = read_check.filter(|at| *at < deadline && !head_sent && !cancelled);
        let next = tokio::select! {
            biased;
            read = tokio::time::timeout_at(check_first.unwrap_or(deadline), channel.next_answer(offers, taken.id)) => match read {
                Ok(read) => Next::Frame(read),
                Err(_) if check_first.is_some() => Next::ReadCheck,
                Err(_) => Next::TimedOut,
            },
            _ = job.respond.closed(), if !cancelled => Next::ClientGone,
        };
        let frame = match next {
            Next::Frame(Ok(Some(frame))) => frame,
            // A bad ring record, an answer for another request, or a frame the ring did not
            // announce: the worker is killed, as for a bad frame.
            Next::Frame(Err(e)) if e.kind() == io::ErrorKind::InvalidData => {
                let _ = lobby.zygotes.kill(pid, libc::SIGKILL).await;
                return Err(Lost::Answered(
                    ExitReason::Crash,
                    fail(job, head_sent, 502, &format!("the worker broke the protocol: {e}")),
                ));
            }
            Next::Frame(closed @ (Ok(None) | Err(_))) => {
                // A worker that leaves after an answer (SystemExit, a crash) may do so while the
                // lobby seats the next request at it. That request never ran if the worker never
                // had all of it: still in its slot, which the lobby takes back, or, sent on the
                // channel, with bytes the worker left unread, which the kernel reports as
                // ECONNRESET when the worker's end closes.
                if !head_sent && !cancelled {
                    let unread = offers.recall_answering()
                        || taken.on_channel && matches!(&closed, Err(e) if e.raw_os_error() == Some(libc::ECONNRESET));
                    if unread {
                        return Err(Lost::Unread(Unread::Exited));
                    }
                }
                return Err(Lost::Answered(
                    ExitReason::Crash,
                    match closed {
                        Ok(_) => fail(job, head_sent, 502, "the worker exited while handling this request"),
                        Err(e) => fail(job, head_sent, 502, &format!("the worker's channel failed: {e}")),
                    },
                ));
            }
            Next::ClientGone => {
                cancelled = true;
                // It names the request: a worker that has already moved on to the next one
                // skips it.
                debug!("the client of {} went away; telling worker {pid}", job.summary);
                if let Err(e) = channel.send(&cancel_frame(taken.id), None).await {
                    return Err(Lost::Answered(ExitReason::Crash, format!("could not send CANCEL: {e}")));
                }
                continue;
            }
            Next::ReadCheck => {
                read_check = None;
                // A worker with other threads keeps them: what they run may finish, under
                // --timeout (`threads.rs`); a worker with one has nothing else to lose.
                let keep = !thread.sole;
                let never_read = offers.recall_answering()
                    || taken.on_channel && health::never_read(lobby, pid, channel.socket.as_fd(), keep).await;
                if never_read {
                    if !keep {
                        if let Err(e) = lobby.zygotes.kill(pid, libc::SIGKILL).await {
                            error!("could not ask the zygote to kill worker {pid}: {e}");
                        }
                    }
                    return Err(Lost::Unread(Unread::Wedged));
                }
                continue;
            }
            Next::TimedOut => {
                // Said before the stack, which the worker writes to the same log
                // (health::dump_stack); the lobby says nothing more until it is written.
                let elapsed = seated_at.elapsed().as_secs_f64();
                let answering =
                    if head_sent { "; its answer had started, and nothing more of it came for that long" } else { "" };
                let then = if thread.sole {
                    "then it is killed"
                } else {
                    "then it takes no new request, and it is killed once its other threads have finished \
                     or --graceful-timeout has passed"
                };
                error!(
                    "worker {pid} timed out after {} s on {} (seated {elapsed:.1} s ago{answering}); its Python \
                     stack follows, {then} (--timeout)",
                    timeout.as_secs_f64(),
                    job.summary
                );
                health::dump_stack(lobby, pid).await;
                if thread.sole {
                    health::end(lobby, pid).await;
                }
                return Err(Lost::Answered(
                    ExitReason::Timeout,
                    fail(job, head_sent, 504, timed_out_detail(head_sent)),
                ));
            }
        };
        let part = match decode_part(frame).and_then(|part| websocket_in_step(job, part)) {
            Ok(part) => part,
            Err(e) => {
                let _ = lobby.zygotes.kill(pid, libc::SIGKILL).await;
                return Err(Lost::Answered(
                    ExitReason::Crash,
                    fail(job, head_sent, 502, &format!("the worker broke the protocol: {e}")),
                ));
            }
        };
        if matches!(part, ResponsePart::Abort) && !cancelled {
            warning!("the application failed while sending the response to {}; {}", job.summary, job.cut_short());
        }
        head_sent = true;
        // The application produced: --timeout now counts its silence from here.
        deadline = tokio::time::Instant::now() + timeout;
        card.produced(thread.number);
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
            let took = seated_at.elapsed();
            lobby.metrics.served(took);
            lobby.seating.answered_in(took);
            return Ok(());
        }
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
