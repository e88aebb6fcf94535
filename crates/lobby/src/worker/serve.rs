//! A seat's task: seats requests at one thread of a worker (its only one, or one of its
//! `--threads`: `threads.rs`), one after the other, through the slots of that thread's shared
//! region, until the worker goes away or is retired; offers it the next queued requests while
//! it is busy (docs/DESIGN.md, "Offers keep busy workers busy"). A thread of several looks for
//! a request only while its worker has CPU to spare (`gate.rs`).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::time::Instant;

use maitred_shm::Corrupt;
use maitred_wire::{FrameHeader, Kind, FLAG_FD};
use tokio::sync::watch;

use super::channel::Channel;
use super::gate::{self, CpuDemand};
use super::health::{self, ProcStat};
use super::recycle::Recycle;
use super::relay::{fail, relay_response, Lost, Unread};
use super::scoreboard::{Card, ExitReason, Phase};
use super::seat::{Gone, Seat, Thread};
use crate::log::{debug, error};
use crate::seating::job::{Job, JobState};
use crate::seating::offer::{Offers, Taken};
use crate::seating::Next;
use crate::worker::context::Context;

/// Seats jobs at one thread of this worker, through that thread's channel, until the worker
/// goes away or is retired (docs/PROTOCOL.md, section 4). A worker held by `seat` waits, idle,
/// until it may serve. `cpu`, for a worker of several threads, is what they share of its CPU.
pub async fn serve(
    context: Rc<Context>,
    pid: i32,
    mut channel: Channel,
    recycle: Rc<Recycle>,
    seat: Rc<Seat>,
    thread: Thread,
    cpu: Option<Rc<CpuDemand>>,
) -> Gone {
    // Made as soon as the worker is ready, held or not: the workers held at the start have all
    // their descriptors open before the server says it serves.
    let (offers, mut phase) = match set_up(&mut channel, Offers::new(), &seat).await {
        Ok(set_up) => set_up,
        Err(gone) => return gone,
    };
    seat.offers.borrow_mut().push(offers.clone());
    context.seating.add_offers(offers.clone());
    recycle.begin();
    let worker = WorkerThread { pid, card: &seat.card, recycle: &recycle, thread, cpu: cpu.as_deref() };
    let gone = seat_jobs(&context, &worker, &mut channel, &offers, &mut phase).await;
    context.seating.remove_offers(&offers);
    seat.offers.borrow_mut().retain(|other| !Rc::ptr_eq(other, &offers));
    gone
}

/// The thread of a worker that a seat's task serves, and what it shares with the worker's
/// other threads: its card, its recycling and, of several threads, its CPU.
#[derive(Clone, Copy)]
struct WorkerThread<'a> {
    pid: i32,
    card: &'a Card,
    recycle: &'a Recycle,
    thread: Thread,
    cpu: Option<&'a CpuDemand>,
}

async fn seat_jobs(
    context: &Rc<Context>,
    worker: &WorkerThread<'_>,
    channel: &mut Channel,
    offers: &Rc<Offers>,
    phase: &mut watch::Receiver<Phase>,
) -> Gone {
    let WorkerThread { pid, card, recycle, thread, cpu } = *worker;
    // Recycled: it answers what it has taken from its slots, and takes nothing more.
    let mut recycled = false;
    let stat = ProcStat::open(pid);
    loop {
        let taken = match offers.take_accepted() {
            // The worker takes it from its slot now that it has answered the one before.
            Some(taken) => taken,
            None => {
                if recycled || *phase.borrow() == Phase::Retire {
                    return Gone::Retired;
                }
                if let Some(cpu) = cpu {
                    if let Err(gone) = until_cpu_to_spare(context, card, cpu, channel, phase).await {
                        return gone;
                    }
                }
                // Whether this seat waited for a request.
                let mut seat_waited = false;
                let job = match context.seating.next() {
                    Next::Now(job) => job,
                    Next::Later(mut wait) => {
                        seat_waited = true;
                        let lifetime_end = recycle.deadline();
                        tokio::select! {
                            biased;
                            job = &mut wait => match job {
                                Ok(job) => job,
                                Err(_) => return Gone::Retired,
                            },
                            _ = phase.wait_for(|phase| *phase == Phase::Retire) => {
                                wait.close();
                                if let Ok(job) = wait.try_recv() {
                                    context.seating.return_unstarted(job);
                                }
                                return Gone::Retired;
                            }
                            // An idle worker past its lifetime retires at once.
                            _ = tokio::time::sleep_until(lifetime_end.unwrap_or_else(tokio::time::Instant::now)),
                                if lifetime_end.is_some() => {
                                wait.close();
                                if let Ok(job) = wait.try_recv() {
                                    context.seating.return_unstarted(job);
                                }
                                recycle.check(card.served.get(), false);
                                return Gone::Retired;
                            }
                            _ = channel.closed_while_idle() => {
                                // Take back a job that may have been handed over at the same moment.
                                wait.close();
                                if let Ok(job) = wait.try_recv() {
                                    context.seating.return_unstarted(job);
                                }
                                return Gone::Lost(ExitReason::Crash, idle_loss(channel).await);
                            }
                        }
                    }
                };
                if job.state.get() != JobState::Queued {
                    continue;
                }
                // Handed over while this thread waited: its other threads may have begun
                // requests that use the worker's CPU since.
                if let Some(cpu) = cpu.filter(|_| seat_waited) {
                    if !gate::may_take(card, cpu, context.seating.stale_after(), Instant::now()) {
                        context.seating.return_unstarted(job);
                        continue;
                    }
                }
                // A worker idle for a while may have been stopped meanwhile; one that has just
                // answered, on this seat or another of its own, was running then, and is not
                // looked at (health::LOOK_AFTER_IDLE). Its first request is looked at whatever
                // the time: the lobby may have read its READY late, from a worker stopped since.
                let look = card.served.get() == 0 || seat_waited && card.quiet_for(health::LOOK_AFTER_IDLE);
                if look && stat.is_stopped() {
                    context.seating.return_unstarted(job);
                    let bound = context.settings().timeout;
                    health::kill_if_still_there(context.clone(), pid, stat, bound);
                    return Gone::Lost(
                        ExitReason::Stopped,
                        format!(
                            "it is stopped (SIGSTOP), so no request goes to it; it is killed unless it \
                         exits within {} s (--timeout)",
                            bound.as_secs_f64()
                        ),
                    );
                }
                let waited = job.enqueued_at.elapsed();
                context.counts.waited(waited);
                debug!("worker {pid} takes {} after {:.1} ms in the queue", job.summary, waited.as_secs_f64() * 1e3);
                match seat_idle(context, channel, offers, job).await {
                    Ok(taken) => taken,
                    Err(gone) => return gone,
                }
            }
        };
        card.begin(thread.number, taken.job.summary.clone());
        let served = card.served.get();
        // A retiring worker is offered nothing: its offers went back to the queue.
        if *phase.borrow() != Phase::Retire && !recycled {
            offer_queued(context, offers, recycle.requests_left(served));
        }
        let relayed = relay_response(context, pid, channel, offers, &taken, thread, card).await;
        card.end(thread.number);
        if let Err(lost) = relayed {
            return lost_with(context, offers, thread, taken.job, lost);
        }
        if let Err(corrupt) = offers.answered() {
            return broke(context, pid, offers, corrupt).await;
        }
        if !recycled && recycle.check(served, true).is_some() {
            recycled = true;
            // The offers it has not taken go back to the queue, for the worker that takes its
            // place; those it has, it answers.
            context.seating.requeue_front(offers.recall_until(|_| false));
        }
    }
}

/// Waits while this idle thread's worker has no CPU to spare for another request (`gate.rs`):
/// looks again when a request is queued, when one of its threads answers, and every
/// `gate::LOOK_AGAIN` while a request waits. Err when the worker retires or is lost meanwhile.
async fn until_cpu_to_spare(
    context: &Context,
    card: &Card,
    cpu: &CpuDemand,
    channel: &mut Channel,
    phase: &mut watch::Receiver<Phase>,
) -> Result<(), Gone> {
    while !gate::may_take(card, cpu, context.seating.stale_after(), Instant::now()) {
        let look_again = async {
            if context.seating.waiting() > 0 {
                tokio::time::sleep(gate::LOOK_AGAIN).await;
            } else {
                context.seating.joined().await;
            }
        };
        tokio::select! {
            () = look_again => {}
            () = card.answered() => {}
            _ = phase.wait_for(|phase| *phase == Phase::Retire) => return Err(Gone::Retired),
            _ = channel.closed_while_idle() => return Err(Gone::Lost(ExitReason::Crash, idle_loss(channel).await)),
        }
    }
    Ok(())
}

/// Sends the worker its shared region, made with `made`, and its bells on `channel`, then
/// waits, idle, until the worker may serve (a held worker) or is retired. The region's offers,
/// and the phase to follow from then on.
pub(super) async fn set_up(
    channel: &mut Channel,
    made: io::Result<(Offers, OwnedFd)>,
    seat: &Seat,
) -> Result<(Rc<Offers>, watch::Receiver<Phase>), Gone> {
    let (offers, region) =
        made.map_err(|e| Gone::Lost(ExitReason::Crash, format!("could not make its shared region: {e}")))?;
    let setup = [(Kind::Region, region.as_fd()), (Kind::Bell, offers.bell()), (Kind::LobbyBell, channel.lobby_bell())];
    for (kind, fd) in setup {
        let frame = FrameHeader { kind, flags: FLAG_FD, len: 0 }.encode();
        if let Err(e) = channel.send(&frame, Some(fd)).await {
            return Err(Gone::Lost(ExitReason::Crash, format!("could not send its shared region: {e}")));
        }
    }
    let mut phase = seat.card.phase.subscribe();
    loop {
        let now = *phase.borrow_and_update();
        match now {
            Phase::Serve => return Ok((Rc::new(offers), phase)),
            Phase::Retire => return Err(Gone::Retired),
            Phase::Hold => {}
        }
        tokio::select! {
            changed = phase.changed() => if changed.is_err() { return Err(Gone::Retired) },
            _ = channel.closed_while_idle() => return Err(Gone::Lost(ExitReason::Crash, idle_loss(channel).await)),
        }
    }
}

/// Seats `job` at the idle worker: in a slot, or, when it does not fit one, on the channel
/// with its place in a slot.
async fn seat_idle(context: &Context, channel: &mut Channel, offers: &Offers, job: Job) -> Result<Taken, Gone> {
    let broken = |offers: &Offers| {
        let corrupt = offers.broken().map(|corrupt| corrupt.to_string()).unwrap_or_default();
        format!("it broke its shared region: {corrupt}")
    };
    if offers.fits(&job) {
        return offers.seat(job).map_err(|job| {
            context.seating.return_unstarted(job);
            Gone::Lost(ExitReason::Crash, broken(offers))
        });
    }
    if let Err(e) = channel.send(&job.frame, job.body_file.as_ref().map(|file| file.as_fd())).await {
        context.seating.return_unstarted(job);
        return Err(Gone::Lost(ExitReason::Crash, format!("could not send a request: {e}")));
    }
    offers.seat_on_channel(job).map_err(|job| {
        // It is on the channel of a worker the lobby gives up on: it may have begun it.
        let detail = broken(offers);
        fail(&job, false, 502, &detail);
        Gone::Lost(ExitReason::Crash, detail)
    })
}

/// The worker broke its shared region: it is killed, and what it had not taken goes to
/// another worker; what it had taken is answered 502.
async fn broke(context: &Context, pid: i32, offers: &Offers, corrupt: Corrupt) -> Gone {
    if let Err(e) = context.zygotes.kill(pid, libc::SIGKILL).await {
        error!("could not ask the zygote to kill worker {pid}: {e}");
    }
    let detail = format!("it broke its shared region: {corrupt}");
    context.seating.requeue_front(offers.give_up());
    for job in offers.drain() {
        fail(&job, false, 502, &detail);
    }
    Gone::Lost(ExitReason::Crash, detail)
}

/// The worker was lost while answering `job`: what it had not taken goes back to the queue,
/// and `job` too when it provably never read it.
fn lost_with(context: &Context, offers: &Offers, thread: Thread, job: Job, lost: Lost) -> Gone {
    context.seating.requeue_front(offers.give_up());
    for taken in offers.drain() {
        fail(&taken, false, 502, "the worker exited while handling this request");
    }
    match lost {
        Lost::Answered(reason, detail) => Gone::Lost(reason, detail),
        Lost::Unread(why) => {
            let (reason, why) = match why {
                Unread::Exited => (ExitReason::Crash, "exited without reading".to_string()),
                Unread::Wedged => (
                    ExitReason::Wedged,
                    format!(
                        "{}: alive but wedged (its main thread did not take, in {} s, the request seated at it; \
                         another thread holding the GIL, or a SIGSTOP, does this) before it read",
                        if thread.sole {
                            "was killed"
                        } else {
                            "takes no new request, and its other threads finish what they hold (--timeout)"
                        },
                        health::READ_WITHIN.as_secs_f64()
                    ),
                ),
            };
            let detail = format!("{why} {}, which goes to another worker", job.summary);
            // Older than the offers just queued again: it goes in front of them.
            context.seating.return_unstarted(job);
            Gone::Lost(reason, detail)
        }
    }
}

/// Offers this (busy) worker the oldest queued jobs: as many as requests of the typical time
/// call for (`Seating::offer_depth`), and, when it is to be retired, no more than the `left`
/// requests it will still take.
fn offer_queued(context: &Context, offers: &Offers, left: Option<u64>) {
    context.seating.offer_to(offers, Instant::now(), left, |waited| context.counts.waited(waited));
}

/// Why an idle worker's channel became readable: it has exited, or it broke the protocol.
async fn idle_loss(channel: &mut Channel) -> String {
    match channel.read_frame().await {
        Ok(None) => "exited while idle".into(),
        Ok(Some(frame)) => format!("sent {:?} while idle", frame.header.kind),
        Err(e) => format!("channel failed while idle: {e}"),
    }
}
