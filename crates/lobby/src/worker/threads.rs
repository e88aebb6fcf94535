//! A worker as a whole: its channels, one per thread, each a seat that `serve.rs` serves as it
//! would a worker with one thread (docs/PROTOCOL.md, section 4). Here what belongs to the
//! process rather than to one thread: it is ready once every thread is; one thread past
//! --timeout retires the worker, whose other threads then have --graceful-timeout to finish
//! before it is killed; and its time with the lobby ends once every seat's has.

use std::os::fd::OwnedFd;
use std::rc::Rc;

use tokio::task::JoinSet;

use super::channel::Channel;
use super::gate::CpuDemand;
use super::health;
use super::mux;
use super::recycle::Recycle;
use super::scoreboard::ExitReason;
use super::seat::{self, Gone, Seat, Thread};
use super::serve;
use crate::log::{debug, warning};
use crate::worker::context::Context;

/// Serves the worker `pid` through `channels`, one per thread: waits for each thread's `READY`,
/// calls `ready`, then seats requests at every thread until the worker goes away or retires.
pub async fn serve_worker(
    context: Rc<Context>,
    pid: i32,
    channels: Vec<OwnedFd>,
    recycle: Recycle,
    seat: Rc<Seat>,
    ready: impl FnOnce(),
) -> Gone {
    let mut opened = Vec::with_capacity(channels.len());
    for fd in channels {
        match Channel::new(fd) {
            Ok(channel) => opened.push(channel),
            Err(e) => return Gone::Lost(ExitReason::Crash, format!("unusable channel: {e}")),
        }
    }
    // Each thread says READY once the application is imported; a failed boot comes on the first
    // channel, and the process exits, closing the others.
    let mut asgi = true;
    for channel in &mut opened {
        match seat::await_ready(channel).await {
            Ok(said) => asgi &= said.asgi(),
            Err(gone) => return gone,
        }
    }
    seat.card.set_threads(opened.len());
    seat.card.asgi.set(asgi);
    ready();
    let recycle = Rc::new(recycle);
    // An ASGI worker's one channel carries every request it runs at once, WebSockets too (the
    // zygote makes one for it, whatever --threads is).
    if asgi {
        if opened.len() != 1 {
            return Gone::Lost(
                ExitReason::Crash,
                format!("an ASGI worker came with {} channels, not one", opened.len()),
            );
        }
        context.websockets.asgi_application();
        let channel = opened.pop().expect("one channel");
        return mux::serve(context, pid, channel, recycle, seat).await;
    }
    if opened.len() == 1 {
        let channel = opened.pop().expect("one channel");
        return serve::serve(context, pid, channel, recycle, seat, Thread { number: 0, sole: true }, None).await;
    }
    // Its threads take requests only while it has CPU to spare (`gate.rs`).
    let cpu = Rc::new(CpuDemand::new(pid));
    let mut seats = JoinSet::new();
    for (number, channel) in opened.into_iter().enumerate() {
        let thread = Thread { number, sole: false };
        let serving =
            serve::serve(context.clone(), pid, channel, recycle.clone(), seat.clone(), thread, Some(cpu.clone()));
        seats.spawn_local(serving);
    }
    let mut first_loss: Option<Gone> = None;
    while let Some(ended) = seats.join_next().await {
        let gone = ended.unwrap_or_else(|e| Gone::Lost(ExitReason::Crash, format!("its task failed: {e}")));
        match gone {
            Gone::Lost(ExitReason::Timeout, _) if !first_loss.as_ref().is_some_and(is_timeout) => {
                // Python cannot stop one thread: the worker takes nothing more, and goes once its
                // other threads have answered what they hold, or at the grace's end.
                context.seating.requeue_front(seat.retire());
                first_loss = Some(gone);
                let grace = context.settings().graceful_timeout;
                let finished =
                    tokio::time::timeout(grace, async { while let Some(_other) = seats.join_next().await {} }).await;
                if finished.is_err() {
                    debug!("worker {pid}'s other threads did not finish within --graceful-timeout");
                }
                health::end(&context, pid).await;
                // Its seats, cut by the kill, end on their own; what they held is answered 502.
                while seats.join_next().await.is_some() {}
            }
            Gone::Lost(ExitReason::Stopped | ExitReason::Wedged, _) if first_loss.is_none() => {
                // One thread's request was not taken (the worker is stopped, or another thread
                // holds the GIL): it went to another worker. What the other threads run may
                // still finish: the worker takes nothing more, and is killed only by --timeout,
                // which each of their requests keeps, or once --timeout has passed with the
                // worker still there.
                if let Gone::Lost(_, detail) = &gone {
                    warning!("worker {pid} takes no new request: {detail}");
                }
                context.seating.requeue_front(seat.retire());
                health::kill_if_still_there(
                    context.clone(),
                    pid,
                    health::ProcStat::open(pid),
                    context.settings().timeout,
                );
                first_loss = Some(gone);
            }
            Gone::Lost(..) if first_loss.is_none() => {
                // Lost to one thread is lost to all: the process is killed, if it has not gone
                // already, so that its other seats end now rather than at their timeouts.
                if let Err(e) = context.zygotes.kill(pid, libc::SIGKILL).await {
                    debug!("could not ask the zygote to kill worker {pid}: {e}");
                }
                first_loss = Some(gone);
            }
            _ => {}
        }
    }
    first_loss.unwrap_or(Gone::Retired)
}

fn is_timeout(gone: &Gone) -> bool {
    matches!(gone, Gone::Lost(ExitReason::Timeout, _))
}
