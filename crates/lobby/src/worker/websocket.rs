//! An accepted WebSocket, seen from its worker (docs/PROTOCOL.md, section 5): the client's
//! messages go to the worker on its channel (`WS_MESSAGE`, then `WS_CLOSED`), the worker's
//! (`WS_SEND`, then `WS_CLOSE`) to the connection through the answer's spool, until the worker's
//! `WS_CLOSE`. The seat is the WebSocket's meanwhile: `--timeout` no longer runs.

use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::FutureExt;
use maitred_wire::{build_frame, Kind, WsClosing, WsData, WsOpcode};
use tokio::sync::watch;

use super::channel::Channel;
use super::relay::{decode_websocket, Lost};
use super::scoreboard::{ExitReason, Phase};
use crate::lobby::Lobby;
use crate::log::{debug, error, info_limited, warning_limited};
use crate::seating::job::Job;
use crate::seating::offer::{Offers, Taken};
use crate::seating::spool::{ResponsePart, MEMORY_PER_ANSWER};
use crate::seating::websocket::{ClientMessage, Closing, WsPart};

/// Relays the accepted WebSocket of `taken` both ways until the worker's `WS_CLOSE`. A worker
/// that retires meanwhile (a reload) keeps it until it closes or --graceful-timeout passes;
/// then the connection closes it with 1001. Errors mean the worker is lost; the connection has
/// been told to close (1011).
pub(super) async fn relay_accepted(
    lobby: &Lobby,
    pid: i32,
    channel: &mut Channel,
    offers: &Rc<Offers>,
    taken: &Taken,
    phase: &mut watch::Receiver<Phase>,
) -> Result<(), Lost> {
    let job = &taken.job;
    let Some(websocket) = &job.websocket else {
        unreachable!("only a WebSocket handshake is accepted (relay::websocket_in_step)")
    };
    let Some(mut messages) = websocket.messages.borrow_mut().take() else {
        unreachable!("a WebSocket is relayed once")
    };
    let _open = lobby.websockets.opened();
    let opened_at = Instant::now();
    // The client side has ended and the worker has been sent WS_CLOSED.
    let mut client_done = false;
    // When the worker retired with the WebSocket open: it goes away once --graceful-timeout has
    // passed since.
    let mut retired_at: Option<tokio::time::Instant> = None;
    let mut going_away_sent = false;
    loop {
        // Parts for a client that has gone are dropped: nothing holds the relay then (its
        // connection has told the worker, or will: WS_CLOSED).
        let held = job.respond.held().is_some() && job.respond.closed().now_or_never().is_none();
        let grace_end = retired_at.map(|at| at + lobby.settings().graceful_timeout);
        tokio::select! {
            biased;
            _ = held_back(job, pid), if held => {}
            read = channel.next_answer(offers, taken.id), if !held => {
                let frame = match read {
                    Ok(Some(frame)) => frame,
                    Ok(None) => return Err(lost(job, "the worker exited while it held this WebSocket".into())),
                    Err(e) => {
                        let _ = lobby.zygotes.kill(pid, libc::SIGKILL).await;
                        return Err(lost(job, format!("the worker broke the protocol: {e}")));
                    }
                };
                let part = match decode_websocket(&frame) {
                    Ok(WsPart::Accept { .. }) => Err("a second WS_ACCEPT".to_string()),
                    other => other,
                };
                let part = match part {
                    Ok(part) => part,
                    Err(e) => {
                        let _ = lobby.zygotes.kill(pid, libc::SIGKILL).await;
                        return Err(lost(job, format!("the worker broke the protocol: {e}")));
                    }
                };
                let last = part.is_last();
                // Parts of a WebSocket are never spilled (its spool has no file): this cannot fail.
                let _ = job.respond.send(ResponsePart::WebSocket(part));
                if last {
                    if let Some(served) = &job.served {
                        served.answered.set(Some(Instant::now()));
                    }
                    lobby.metrics.served(opened_at.elapsed());
                    debug!("worker {pid} closed {} after {:.1} s", job.summary, opened_at.elapsed().as_secs_f64());
                    return Ok(());
                }
            }
            message = messages.recv(), if !client_done => {
                let frame = match message {
                    Some(ClientMessage { text, data }) => message_frame(text, &data),
                    None => {
                        client_done = true;
                        closed_frame(&websocket.closing())
                    }
                };
                if let Err(e) = channel.send(&frame, None).await {
                    return Err(lost(job, format!("could not send the worker a WebSocket frame: {e}")));
                }
            }
            _ = phase.wait_for(|phase| *phase == Phase::Retire), if retired_at.is_none() => {
                retired_at = Some(tokio::time::Instant::now());
            }
            _ = tokio::time::sleep_until(grace_end.unwrap_or_else(tokio::time::Instant::now)),
                if grace_end.is_some() && !going_away_sent && !client_done => {
                going_away_sent = true;
                info_limited!(
                    "worker {pid} retired with {} open; closing it (1001) as --graceful-timeout has passed",
                    job.summary
                );
                let _ = job.respond.send(ResponsePart::WebSocket(WsPart::GoingAway));
            }
        }
    }
}

/// Waits, while the client is slow to read, until the messages waiting for it are under the
/// answer's memory again; the worker's sends wait meanwhile. Said when it starts and ends.
async fn held_back(job: &Job, pid: i32) {
    warning_limited!(
        "reading the messages of {} from worker {pid} paused: {} KiB are waiting for a slow client; it \
         goes on as the client reads",
        job.summary,
        MEMORY_PER_ANSWER / 1024
    );
    let since = Instant::now();
    job.respond.room().await;
    info_limited!(
        "reading the messages of {} from worker {pid} went on after {:.1} s",
        job.summary,
        since.elapsed().as_secs_f64()
    );
}

/// The worker was lost with the WebSocket open: its connection closes it (1011).
fn lost(job: &Job, detail: String) -> Lost {
    error!("{} closed (1011): {detail}", job.summary);
    let _ = job.respond.send(ResponsePart::Abort);
    Lost::Answered(ExitReason::Crash, detail)
}

fn message_frame(text: bool, data: &Bytes) -> Vec<u8> {
    let opcode = if text { WsOpcode::Text } else { WsOpcode::Binary };
    build_frame(Kind::WsMessage, 0, |out| {
        WsData { opcode, data }.encode_payload(out);
        Ok(())
    })
    .expect("the connection passes no message over --ws-max-size, within MAX_WS_MESSAGE")
}

fn closed_frame(closing: &Closing) -> Vec<u8> {
    build_frame(Kind::WsClosed, 0, |out| {
        WsClosing { code: closing.code, reason: &closing.reason }.encode_payload(out);
        Ok(())
    })
    .expect("a close reason is at most 123 bytes")
}
