//! An ASGI worker's one channel, carrying any number of requests at once (docs/PROTOCOL.md,
//! section 4): this task admits requests from the FIFO while fewer than `--worker-connections`
//! of the worker's wait for their answers to start, queues each in the region's slots (or on
//! the channel, its place in a slot), reads the answer ring and hands each frame, by the id its
//! record names, to that request's relay (`stream.rs`). A request whose answer has started (its
//! head, or its WebSocket's accept) is a stream: it costs the worker's admission nothing.
//!
//! A breach (an unknown id, a bad record, a frame the ring did not announce) is the worker's
//! fault: it is killed, every request it took is answered 502 (or, a WebSocket, closed 1011),
//! and those still in their slots go back to the queue.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::rc::Rc;

use tokio::sync::{oneshot, watch, Notify};

use super::channel::Channel;
use super::recycle::Recycle;
use super::routes::{route, Mux, ROUTE_BACKLOG};
use super::scoreboard::{ExitReason, Phase};
use super::seat::{Gone, Seat};
use super::{serve, stream};
use crate::log::{debug, error};
use crate::seating::job::{Job, JobState};
use crate::seating::offer::{multiplexed_layout, Offers};
use crate::seating::Next;
use crate::worker::context::Context;

/// How late a worker's event loop may be and still be given new requests (issue 47, item 2).
/// Measured on the 2-core development machine, `-w 2`, status.json's `loop_lag_seconds`
/// sampled every 20 ms under 10 s of wrk: an I/O-bound loop (bench's A1 hello, 47,000 req/s at
/// c=64) lags 0.7 ms at p90 and 10 ms at most; O1-ASGI's endpoint (2 ms of CPU, then a 50 ms
/// await) lags 2.2 ms at p99 at c=16 (300 req/s), and at c=64, past its CPU (745 req/s), 7 ms
/// at p50, 28 ms at p90 and 177 ms at p99. 50 ms is above what a loop that keeps up ever
/// showed, and past it a request admitted waits that long in the loop before it runs, where
/// the FIFO's overload policy could have shed it or another worker taken it. O1-ASGI's goodput
/// stayed at 94-106% of capacity with it (docs/ASGI.md).
pub(super) const LOOP_LATE: std::time::Duration = std::time::Duration::from_millis(50);

/// How often admission looks again at a late loop's heartbeat, which comes every 100 ms
/// (`scoreboard::LOOP_BEAT`) with no ring: often enough to open within a tenth of a beat of
/// the beat that says the loop keeps up again.
const LOOK_AGAIN_WHILE_LATE: std::time::Duration = std::time::Duration::from_millis(10);

/// Serves the ASGI worker `pid` through its one channel until it goes away or is retired and
/// every request it holds has ended.
pub async fn serve(context: Rc<Context>, pid: i32, mut channel: Channel, recycle: Rc<Recycle>, seat: Rc<Seat>) -> Gone {
    let cap = context.settings().worker_connections;
    let (offers, mut phase) =
        match serve::set_up(&mut channel, Offers::with_layout(multiplexed_layout(cap)), &seat).await {
            Ok(set_up) => set_up,
            Err(gone) => return gone,
        };
    let writer = match channel.writer() {
        Ok(writer) => writer,
        Err(e) => return Gone::Lost(ExitReason::Crash, format!("could not use its channel: {e}")),
    };
    let heartbeat = offers.clone();
    *seat.card.loop_beat.borrow_mut() = Some(Box::new(move || heartbeat.loop_beat()));
    let mux = Rc::new(Mux {
        pid,
        offers: offers.clone(),
        writer,
        writing: tokio::sync::Mutex::new(()),
        routes: RefCell::new(HashMap::new()),
        dismissed: RefCell::default(),
        streaming: Cell::new(0),
        room: Notify::new(),
        phase: phase.clone(),
        card: seat.card.clone(),
        lost: RefCell::new(None),
    });
    recycle.begin();
    let gone = run(&context, &mux, &mut channel, &recycle, cap, &mut phase).await;
    // Every relay still running hears that its worker has gone (its route closes); one whose
    // request is still in its slot takes it back, and it goes to another worker.
    if let Gone::Lost(_, detail) = &gone {
        mux.lost.replace(Some(detail.clone()));
    }
    mux.routes.borrow_mut().clear();
    mux.card.loop_beat.replace(None);
    gone
}

/// The worker's task, once it serves: admission, and the ring read and routed.
async fn run(
    context: &Rc<Context>,
    mux: &Rc<Mux>,
    channel: &mut Channel,
    recycle: &Recycle,
    cap: usize,
    phase: &mut watch::Receiver<Phase>,
) -> Gone {
    let pid = mux.pid;
    let mut waiting: Option<oneshot::Receiver<Job>> = None;
    let mut recycled = false;
    loop {
        let retiring = recycled || *phase.borrow() == Phase::Retire;
        let late = mux.card.loop_lag(std::time::Instant::now()).is_some_and(|lag| lag > LOOP_LATE);
        if retiring || late {
            // What waits for this worker goes to another, or waits in the FIFO.
            if let Some(mut wait) = waiting.take() {
                wait.close();
                if let Ok(job) = wait.try_recv() {
                    context.seating.return_unstarted(job);
                }
            }
        }
        if retiring && mux.routes.borrow().is_empty() {
            return Gone::Retired;
        }
        let room = !retiring && mux.admitted() < cap;
        let admit = room && !late && mux.offers.has_free_slot();
        if admit && waiting.is_none() {
            match context.seating.next() {
                Next::Now(job) => {
                    if let Err(gone) = admit_job(context, mux, job).await {
                        return gone;
                    }
                    if recycle.check(mux.card.served.get(), true).is_some() {
                        recycled = true;
                    }
                    continue;
                }
                Next::Later(wait) => waiting = Some(wait),
            }
        }
        tokio::select! {
            biased;
            read = channel.next_record(&mux.offers) => match read {
                Ok(Some((id, frame))) => {
                    let route = mux.routes.borrow().get(&id).cloned();
                    match route {
                        Some(route) => {
                            if route.send(frame) > ROUTE_BACKLOG {
                                tokio::task::yield_now().await;
                            }
                        }
                        None if mux.dismissed.borrow().contains(&id) => {
                            if super::relay::decode_part(frame).map_or(true, |part| part.is_last()) {
                                mux.dismissed.borrow_mut().remove(&id);
                            }
                        }
                        None => return broke(context, pid, format!("an answer for request {id}, which it does not hold")).await,
                    }
                }
                Ok(None) => return Gone::Lost(ExitReason::Crash, "exited while it held requests".into()),
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    return broke(context, pid, format!("it broke the protocol: {e}")).await;
                }
                Err(e) => return Gone::Lost(ExitReason::Crash, format!("its channel failed: {e}")),
            },
            job = async { waiting.as_mut().expect("a wait").await }, if waiting.is_some() => {
                waiting = None;
                match job {
                    // The loop fell behind while this worker waited for a request: it goes to
                    // another worker, or back to the front of the FIFO.
                    Ok(job) if mux.card.loop_lag(std::time::Instant::now()).is_some_and(|lag| lag > LOOP_LATE) => {
                        context.seating.return_unstarted(job);
                    }
                    Ok(job) => {
                        if let Err(gone) = admit_job(context, mux, job).await {
                            return gone;
                        }
                        if recycle.check(mux.card.served.get(), true).is_some() {
                            recycled = true;
                        }
                    }
                    Err(_) => return Gone::Retired,
                }
            }
            () = mux.room.notified() => {}
            _ = phase.changed() => {}
            // More requests than slots (past 1024 admitted): a slot frees as the worker copies a
            // request out, which it does not ring for; and a late loop publishes its next beat
            // without a ring either: both looked at again shortly.
            () = tokio::time::sleep(if late { LOOK_AGAIN_WHILE_LATE } else { std::time::Duration::from_millis(2) }),
                if room && !admit => {}
        }
    }
}

/// Queues `job` at the worker and starts its relay.
async fn admit_job(context: &Rc<Context>, mux: &Rc<Mux>, job: Job) -> Result<(), Gone> {
    if job.state.get() != JobState::Queued {
        return Ok(());
    }
    let waited = job.enqueued_at.elapsed();
    context.counts.waited(waited);
    debug!("worker {} takes {} after {:.1} ms in the queue", mux.pid, job.summary, waited.as_secs_f64() * 1e3);
    let on_channel = !mux.offers.fits(&job);
    if on_channel {
        // Through the writer's turn, as every frame to the worker: a relay's CANCEL or
        // WS_MESSAGE written meanwhile would otherwise land inside this frame.
        if let Err(e) = mux.send(&job.frame, job.body_file.as_ref().map(|file| file.as_fd())).await {
            context.seating.return_unstarted(job);
            return Err(Gone::Lost(ExitReason::Crash, format!("could not send a request: {e}")));
        }
    }
    let taken = match mux.offers.admit(job, on_channel) {
        Ok(taken) => taken,
        Err(job) => {
            let detail = mux.offers.broken().map(|corrupt| corrupt.to_string()).unwrap_or_default();
            if on_channel {
                super::relay::fail(&job, false, 502, &detail);
            } else {
                context.seating.return_unstarted(job);
            }
            return Err(broke(context, mux.pid, format!("it broke its shared region: {detail}")).await);
        }
    };
    let (route, frames) = route();
    mux.routes.borrow_mut().insert(taken.id, route);
    mux.card.admit(taken.id, taken.job.summary.clone());
    tokio::task::spawn_local(stream::relay(context.clone(), mux.clone(), taken, frames));
    Ok(())
}

/// The worker broke the protocol: it is killed.
async fn broke(context: &Context, pid: i32, detail: String) -> Gone {
    if let Err(e) = context.zygotes.kill(pid, libc::SIGKILL).await {
        error!("could not ask the zygote to kill worker {pid}: {e}");
    }
    Gone::Lost(ExitReason::Crash, detail)
}
