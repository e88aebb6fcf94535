//! One request of an ASGI worker's multiplexed channel (`mux.rs`), from its admission to its
//! answer's end: the frames its worker writes for it come by its id, and go to its connection
//! through the answer's spool. Until its answer starts, `--timeout` answers 504 (the worker's
//! loop cancels the request's task itself; one that leaves the `CANCEL` unread is blocked, and
//! killed). Once it has started it is a stream, never cut for its length or its silence: the
//! loop's health is the watchdog's business (docs/ASGI.md, "Streams"); it ends, cleanly for its
//! client, at the --graceful-timeout of a stop or of its worker's retirement (docs/SIGNALS.md).
//! A client slower than the answer's caps holds the request's sends (`HOLD`, then `GO`), never
//! the channel. An accepted WebSocket's messages go both ways here too, each frame naming the
//! request.

use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::StreamExt;
use maitred_wire::{build_frame, cancel_frame, id_frame, Kind, WsClosing, WsData, WsOpcode, ID_LEN};
use tokio::sync::watch;

use super::channel::Frame;
use super::health;
use super::relay::{decode_part, decode_websocket, fail, timed_out_detail, websocket_in_step};
use super::routes::{Mux, RouteReceiver};
use super::scoreboard::Phase;
use super::seat::EVENT_LOOP_GRACE;
use crate::log::{debug, error, info_limited, warning, warning_limited};
use crate::seating::offer::Taken;
use crate::seating::spool::{ResponsePart, MEMORY_PER_ANSWER};
use crate::seating::streams::OpenStream;
use crate::seating::websocket::{ClientMessage, Closing, WsPart};
use crate::worker::context::Context;

/// How a request's relay ends.
enum Ended {
    /// Its answer is complete, or its client has had what it will get.
    Done,
    /// The worker was lost, or broke the protocol.
    Lost,
    /// The worker accepted its WebSocket: the messages are next.
    Accepted,
}

/// Relays request `taken`'s answer, then, for an accepted WebSocket, its messages both ways,
/// in a task of their own: this one has room for everything an answer may wait on (a stack
/// dump, a stop's grace), 2.1 KB, which 5,000 open WebSockets would hold for nothing.
pub(super) async fn relay(context: Rc<Context>, mux: Rc<Mux>, taken: Taken, mut frames: RouteReceiver) {
    let mut streamed = false;
    match answer(&context, &mux, &taken, &mut frames, &mut streamed).await {
        Ended::Accepted => drop(tokio::task::spawn_local(websocket_relay(context, mux, taken, frames))),
        ended => relayed(&context, &mux, taken, streamed, ended),
    }
}

async fn websocket_relay(context: Rc<Context>, mux: Rc<Mux>, taken: Taken, mut frames: RouteReceiver) {
    let ended = websocket(&context, &mux, &taken, &mut frames).await;
    relayed(&context, &mux, taken, true, ended);
}

/// The request's relay has ended.
fn relayed(context: &Context, mux: &Mux, taken: Taken, streamed: bool, ended: Ended) {
    let id = taken.id;
    if let Ended::Lost = ended {
        lost(context, mux, taken, streamed);
    }
    mux.ended(id, streamed);
}

/// The worker has gone with this request: it never ran if it is still in its slot, and goes to
/// another worker; otherwise its client gets a 502, or its cut connection (a WebSocket, 1011).
fn lost(context: &Context, mux: &Mux, taken: Taken, streamed: bool) {
    let detail = mux.lost.borrow().clone().unwrap_or_else(|| "the worker exited while handling this request".into());
    if !streamed && !taken.on_channel && mux.offers.recall_id(taken.id) {
        debug!("{} goes to another worker: worker {} never took it ({detail})", taken.job.summary, mux.pid);
        context.seating.return_unstarted(taken.job);
        return;
    }
    if taken.job.websocket.is_some() && streamed {
        error!("{} closed (1011): {detail}", taken.job.summary);
        let _ = taken.job.respond.send(ResponsePart::Abort);
        return;
    }
    fail(&taken.job, streamed, 502, &detail);
}

async fn answer(context: &Context, mux: &Mux, taken: &Taken, frames: &mut RouteReceiver, streamed: &mut bool) -> Ended {
    let job = &taken.job;
    // A coroutine's send waits for free, where a WSGI thread's would hold the thread: so an
    // ASGI answer spills nothing, and a slow client holds its sends past 256 KiB in memory
    // (docs/LIMITS.md, "A slow reader of an ASGI answer").
    job.respond.keep_in_memory();
    let pid = mux.pid;
    let seated_at = Instant::now();
    if let Some(served) = &job.served {
        served.seated.set(Some(seated_at));
        served.worker.set(Some(pid));
    }
    let mut deadline = tokio::time::Instant::from_std(seated_at + context.settings().timeout);
    let mut cancelled = false;
    // Past --timeout before its answer started: answered 504 already, its frames are read and
    // dropped until the loop has ended it.
    let mut timed_out = false;
    // Its place among the lobby's open streams, once its answer has started.
    let mut _open_stream: Option<OpenStream> = None;
    let mut phase = mux.phase.clone();
    let grace_over = grace_over(context, &mut phase);
    tokio::pin!(grace_over);
    loop {
        if *streamed && job.respond.held().is_some() {
            if !hold(mux, taken, frames).await {
                return Ended::Lost;
            }
            continue;
        }
        enum Next {
            Frame(Option<Frame>),
            TimedOut,
            ClientGone,
            GraceOver(&'static str),
        }
        let next = tokio::select! {
            biased;
            frame = frames.next() => Next::Frame(frame),
            _ = job.respond.closed(), if !cancelled => Next::ClientGone,
            () = tokio::time::sleep_until(deadline), if !*streamed => Next::TimedOut,
            why = &mut grace_over, if *streamed && job.websocket.is_none() => Next::GraceOver(why),
        };
        let frame = match next {
            Next::Frame(Some(frame)) => frame,
            Next::Frame(None) => return Ended::Lost,
            Next::GraceOver(why) => {
                info_limited!(
                    "{} ended at --graceful-timeout ({why}); its worker is told that its client left",
                    job.summary
                );
                if let Some(served) = &job.served {
                    served.answered.set(Some(Instant::now()));
                }
                let _ = job.respond.send(ResponsePart::Body { data: Bytes::new(), end: true });
                // What the worker still sends for it is dropped: its client has had the end.
                mux.dismiss(taken.id);
                let _ = mux.send(&cancel_frame(taken.id), None).await;
                return Ended::Done;
            }
            Next::ClientGone => {
                cancelled = true;
                debug!("the client of {} went away; telling worker {pid}", job.summary);
                if mux.send(&cancel_frame(taken.id), None).await.is_err() {
                    return Ended::Lost;
                }
                continue;
            }
            Next::TimedOut => {
                if timed_out && mux.unread().is_some_and(|unread| unread > 0) {
                    error!(
                        "worker {pid} timed out on {}: its event loop is blocked (it did not read, in {} s, the \
                         CANCEL sent when the request ran past --timeout, {} s); its Python stack follows, then it \
                         is killed with every request it holds (--timeout)",
                        job.summary,
                        EVENT_LOOP_GRACE.as_secs_f64(),
                        context.settings().timeout.as_secs_f64()
                    );
                    health::dump_stack(context, pid).await;
                    health::end(context, pid).await;
                    return Ended::Done;
                }
                if !timed_out {
                    fail(job, false, 504, timed_out_detail(false));
                }
                timed_out = true;
                cancelled = true;
                if mux.send(&cancel_frame(taken.id), None).await.is_err() {
                    return Ended::Lost;
                }
                deadline = tokio::time::Instant::now() + EVENT_LOOP_GRACE;
                continue;
            }
        };
        if timed_out {
            match decode_part(frame) {
                Ok(part) if part.is_last() => return Ended::Done,
                Ok(_) => continue,
                Err(e) => return broke(context, mux, job, false, &e).await,
            }
        }
        let part = match decode_part(frame).and_then(|part| websocket_in_step(job, part)) {
            Ok(part) => part,
            Err(e) => return broke(context, mux, job, *streamed, &e).await,
        };
        if matches!(part, ResponsePart::Abort) && !cancelled {
            warning!("the application failed while sending the response to {}; {}", job.summary, job.cut_short());
        }
        let last = part.is_last();
        let accepted = matches!(part, ResponsePart::WebSocket(WsPart::Accept { .. }));
        if !*streamed {
            *streamed = true;
            mux.started(taken.id);
            if job.websocket.is_none() {
                _open_stream = Some(context.streams.opened());
            }
        }
        if let Some(served) = job.served.as_ref().filter(|_| last) {
            served.answered.set(Some(Instant::now()));
        }
        if let Err(e) = job.respond.send(part) {
            crate::log::error_limited!("{} cut off: could not spill its answer to a temporary file: {e}", job.summary);
            let _ = job.respond.send(ResponsePart::Abort);
        }
        if accepted {
            return Ended::Accepted;
        }
        if last {
            context.counts.served(seated_at.elapsed());
            return Ended::Done;
        }
    }
}

/// Resolves, saying why, when an open stream is to end: a stop's --graceful-timeout has
/// passed, or its worker has been retiring (a reload, SIGTTOU) for --graceful-timeout. Until
/// then a retiring worker keeps its streams, as gunicorn's keeps its requests.
async fn grace_over(context: &Context, phase: &mut watch::Receiver<Phase>) -> &'static str {
    let retired = async {
        if phase.wait_for(|phase| *phase == Phase::Retire).await.is_err() {
            // The worker's card is gone: only a stop ends the stream now.
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(context.settings().graceful_timeout).await;
    };
    tokio::select! {
        () = context.streams.ending() => "the server stops",
        () = retired => "its worker retired",
    }
}

/// The answer waits for a slow client past its caps: the worker's sends for it wait (`HOLD`)
/// until the client has read enough (`GO`); frames already written meanwhile still come, and
/// are kept (the bound in docs/PROTOCOL.md, section 4). False: the worker was lost.
async fn hold(mux: &Mux, taken: &Taken, frames: &mut RouteReceiver) -> bool {
    let job = &taken.job;
    // Routine for an answer kept in memory, as flow control is under uvicorn: not a warning.
    debug!(
        "the answer to {} from worker {} is held: its client reads slowly; it goes on as it reads",
        job.summary, mux.pid
    );
    if mux.send(&id_frame(Kind::Hold, taken.id), None).await.is_err() {
        return false;
    }
    let since = Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = job.respond.room() => break,
            _ = job.respond.closed() => break,
            frame = frames.next() => match frame {
                // Written before the worker read HOLD: kept, within the spool's file.
                Some(frame) => match decode_part(frame) {
                    Ok(part) => drop(job.respond.send(part)),
                    Err(_) => return false,
                },
                None => return false,
            },
        }
    }
    debug!("the answer to {} went on after {:.1} s", job.summary, since.elapsed().as_secs_f64());
    mux.send(&id_frame(Kind::Go, taken.id), None).await.is_ok()
}

/// An accepted WebSocket's messages both ways, until the worker's `WS_CLOSE`. A worker that
/// retires meanwhile (a reload) keeps it until it closes or --graceful-timeout passes; then the
/// connection closes it with 1001. Each way is held on its own: a client slow to read what the
/// worker sends holds the worker's sends for it (`HOLD`, then `GO`, as for an HTTP answer);
/// the worker says when it has as many of the client's messages waiting as it keeps
/// (`WS_HOLD`): the client is not read until `WS_GO`.
async fn websocket(context: &Context, mux: &Mux, taken: &Taken, frames: &mut RouteReceiver) -> Ended {
    let job = &taken.job;
    let Some(websocket) = &job.websocket else { unreachable!("only a WebSocket handshake is accepted") };
    let Some(mut messages) = websocket.messages.borrow_mut().take() else {
        unreachable!("a WebSocket is relayed once")
    };
    let _open = context.websockets.opened();
    let opened_at = Instant::now();
    let mut client_done = false;
    let mut worker_full = false;
    let mut phase = mux.phase.clone();
    let mut retired_at: Option<tokio::time::Instant> = None;
    let mut going_away_sent = false;
    // `HOLD` sent for a client slow to read, and when; `GO` once it has caught up.
    let mut holding: Option<Instant> = None;
    loop {
        // Parts for a client that has gone are dropped: nothing holds the worker then.
        let held = job.respond.held().is_some() && job.respond.closed().now_or_never().is_none();
        match (held, holding) {
            (true, None) => {
                warning_limited!(
                    "reading the messages of {} from worker {} paused: {} KiB are waiting for a slow client; it \
                     goes on as the client reads",
                    job.summary,
                    mux.pid,
                    MEMORY_PER_ANSWER / 1024
                );
                holding = Some(Instant::now());
                if mux.send(&id_frame(Kind::Hold, taken.id), None).await.is_err() {
                    return Ended::Lost;
                }
            }
            (false, Some(since)) => {
                info_limited!(
                    "reading the messages of {} from worker {} went on after {:.1} s",
                    job.summary,
                    mux.pid,
                    since.elapsed().as_secs_f64()
                );
                holding = None;
                if mux.send(&id_frame(Kind::Go, taken.id), None).await.is_err() {
                    return Ended::Lost;
                }
            }
            _ => {}
        }
        let grace_end = retired_at.map(|at| at + context.settings().graceful_timeout);
        tokio::select! {
            biased;
            frame = frames.next() => {
                let Some(frame) = frame else { return Ended::Lost };
                match frame.header.kind {
                    Kind::WsHold => { worker_full = true; continue; }
                    Kind::WsGo => { worker_full = false; continue; }
                    _ => {}
                }
                let part = match decode_websocket(&frame) {
                    Ok(WsPart::Accept { .. }) => Err("a second WS_ACCEPT".to_string()),
                    other => other,
                };
                let part = match part {
                    Ok(part) => part,
                    Err(e) => return broke(context, mux, job, true, &e).await,
                };
                let last = part.is_last();
                // Parts of a WebSocket are never spilled (its spool has no file): what the worker
                // wrote before it read HOLD is kept, within the bound docs/PROTOCOL.md gives.
                let _ = job.respond.send(ResponsePart::WebSocket(part));
                if last {
                    if let Some(served) = &job.served {
                        served.answered.set(Some(Instant::now()));
                    }
                    context.counts.served(opened_at.elapsed());
                    debug!("worker {} closed {} after {:.1} s", mux.pid, job.summary, opened_at.elapsed().as_secs_f64());
                    return Ended::Done;
                }
            }
            _ = job.respond.room(), if held => {}
            message = messages.next(), if !client_done && !worker_full => {
                let frame = match message {
                    Some(ClientMessage { text, data }) => message_frame(taken.id, text, &data),
                    None => {
                        client_done = true;
                        closed_frame(taken.id, &websocket.closing())
                    }
                };
                if mux.send(&frame, None).await.is_err() {
                    return Ended::Lost;
                }
            }
            _ = phase.wait_for(|phase| *phase == Phase::Retire), if retired_at.is_none() => {
                retired_at = Some(tokio::time::Instant::now());
            }
            () = tokio::time::sleep_until(grace_end.unwrap_or_else(tokio::time::Instant::now)),
                if grace_end.is_some() && !going_away_sent && !client_done => {
                going_away_sent = true;
                info_limited!("worker {} retired with {} open; closing it (1001) as --graceful-timeout has passed", mux.pid, job.summary);
                let _ = job.respond.send(ResponsePart::WebSocket(WsPart::GoingAway));
            }
        }
    }
}

/// The worker broke the protocol on this request: it is killed, and the client told.
async fn broke(context: &Context, mux: &Mux, job: &crate::seating::job::Job, streamed: bool, e: &str) -> Ended {
    let _ = context.zygotes.kill(mux.pid, libc::SIGKILL).await;
    let detail = format!("the worker broke the protocol: {e}");
    mux.lost.replace(Some(detail.clone()));
    if job.websocket.is_some() && streamed {
        error!("{} closed (1011): {detail}", job.summary);
        let _ = job.respond.send(ResponsePart::Abort);
    } else {
        fail(job, streamed, 502, &detail);
    }
    Ended::Done
}

fn message_frame(id: u32, text: bool, data: &Bytes) -> Vec<u8> {
    let opcode = if text { WsOpcode::Text } else { WsOpcode::Binary };
    build_frame(Kind::WsMessage, 0, |out| {
        out.extend_from_slice(&id.to_le_bytes());
        WsData { opcode, data }.encode_payload(out);
        Ok(())
    })
    .expect("the connection passes no message over --ws-max-size, within MAX_WS_MESSAGE")
}

fn closed_frame(id: u32, closing: &Closing) -> Vec<u8> {
    build_frame(Kind::WsClosed, 0, |out| {
        out.reserve(ID_LEN);
        out.extend_from_slice(&id.to_le_bytes());
        WsClosing { code: closing.code, reason: &closing.reason }.encode_payload(out);
        Ok(())
    })
    .expect("a close reason is at most 123 bytes")
}
