//! A worker's task: seats requests at it, one after the other, from the queue or from the
//! offers it holds, until it goes away or is retired; offers it the next queued requests while
//! it is busy (docs/DESIGN.md, "Offers keep busy workers busy").

use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::Instant;

use maitred_wire::{FrameHeader, Kind, FLAG_FD};
use tokio::sync::watch;

use super::channel::Channel;
use super::health::{self, ProcStat};
use super::recycle::Recycle;
use super::relay::{fail, relay_response, Lost, Unread};
use super::scoreboard::{Card, ExitReason, Phase};
use super::seat::{Gone, Seat};
use crate::lobby::Lobby;
use crate::log::debug;
use crate::seating::job::JobState;
use crate::seating::offer::Offers;
use crate::seating::Next;

/// Seats jobs at this worker until it goes away or is retired. A worker held by `seat` waits,
/// idle, until it may serve.
pub async fn serve(lobby: Rc<Lobby>, pid: i32, mut channel: Channel, mut recycle: Recycle, seat: Rc<Seat>) -> Gone {
    // Made as soon as the worker is ready, held or not: the workers held at the start have all
    // their descriptors open before the server says it serves.
    let offers = match Offers::new() {
        Ok(offers) => Rc::new(offers),
        Err(e) => return Gone::Lost(ExitReason::Crash, format!("could not make its offer sockets: {e}")),
    };
    let frame = FrameHeader { kind: Kind::Offers, flags: FLAG_FD, len: 0 }.encode();
    for receiver in offers.receivers() {
        if let Err(e) = channel.send(&frame, Some(receiver)).await {
            return Gone::Lost(ExitReason::Crash, format!("could not send its offer sockets: {e}"));
        }
    }
    let mut phase = seat.card.phase.subscribe();
    loop {
        match *phase.borrow_and_update() {
            Phase::Serve => break,
            Phase::Retire => return Gone::Retired,
            Phase::Hold => {}
        }
        tokio::select! {
            changed = phase.changed() => if changed.is_err() { return Gone::Retired },
            _ = channel.closed_while_idle() => return Gone::Lost(ExitReason::Crash, idle_loss(&mut channel).await),
        }
    }
    *seat.offers.borrow_mut() = Some(offers.clone());
    lobby.seating.add_offers(offers.clone());
    recycle.begin();
    let gone = seat_jobs(&lobby, pid, &mut channel, &offers, &recycle, &seat.card, &mut phase).await;
    lobby.seating.remove_offers(&offers);
    seat.offers.borrow_mut().take();
    gone
}

async fn seat_jobs(
    lobby: &Rc<Lobby>,
    pid: i32,
    channel: &mut Channel,
    offers: &Offers,
    recycle: &Recycle,
    card: &Card,
    phase: &mut watch::Receiver<Phase>,
) -> Gone {
    // Recycled: it answers what it has taken from its offer socket, and takes nothing more.
    let mut recycled = false;
    let stat = ProcStat::open(pid);
    loop {
        let (job, offered) = match offers.take_accepted() {
            // The worker takes it from its offer socket now that it has finished the last one.
            Some(job) => (job, true),
            None => {
                if recycled || *phase.borrow() == Phase::Retire {
                    return Gone::Retired;
                }
                // Since when the worker has waited for a request, if it has.
                let mut idle_since = None;
                let job = match lobby.seating.next() {
                    Next::Now(job) => job,
                    Next::Later(mut wait) => {
                        idle_since = Some(Instant::now());
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
                                    lobby.seating.return_unstarted(job);
                                }
                                return Gone::Retired;
                            }
                            // An idle worker past its lifetime retires at once.
                            _ = tokio::time::sleep_until(lifetime_end.unwrap_or_else(tokio::time::Instant::now)),
                                if lifetime_end.is_some() => {
                                wait.close();
                                if let Ok(job) = wait.try_recv() {
                                    lobby.seating.return_unstarted(job);
                                }
                                recycle.check(card.served.get(), false);
                                return Gone::Retired;
                            }
                            _ = channel.closed_while_idle() => {
                                // Take back a job that may have been handed over at the same moment.
                                wait.close();
                                if let Ok(job) = wait.try_recv() {
                                    lobby.seating.return_unstarted(job);
                                }
                                return Gone::Lost(ExitReason::Crash, idle_loss(channel).await);
                            }
                        }
                    }
                };
                if job.state.get() != JobState::Queued {
                    continue;
                }
                // A worker idle for a while may have been stopped meanwhile; one that has just
                // answered was running then, and is not looked at (health::LOOK_AFTER_IDLE).
                // Its first request is looked at whatever the time: the lobby may have read
                // its READY late, from a worker stopped since.
                let look = card.served.get() == 0
                    || idle_since.is_some_and(|since| since.elapsed() >= health::LOOK_AFTER_IDLE);
                if look && stat.is_stopped() {
                    lobby.seating.return_unstarted(job);
                    let bound = lobby.settings().timeout;
                    health::kill_if_still_there(lobby.clone(), pid, stat, bound);
                    return Gone::Lost(
                        ExitReason::Stopped,
                        format!(
                            "it is stopped (SIGSTOP), so no request goes to it; it is killed unless it \
                         exits within {} s (--timeout)",
                            bound.as_secs_f64()
                        ),
                    );
                }
                job.state.set(JobState::Seated);
                let waited = job.enqueued_at.elapsed();
                lobby.metrics.waited(waited);
                debug!("worker {pid} takes {} after {:.1} ms in the queue", job.summary, waited.as_secs_f64() * 1e3);
                if let Err(e) = channel.send(&job.frame, job.body_file.as_ref().map(|file| file.as_fd())).await {
                    lobby.seating.return_unstarted(job);
                    return Gone::Lost(ExitReason::Crash, format!("could not send a request: {e}"));
                }
                (job, false)
            }
        };
        card.begin(job.summary.clone());
        let served = card.served.get();
        // A retiring worker is offered nothing: its offers went back to the queue.
        if *phase.borrow() != Phase::Retire && !recycled {
            offer_queued(lobby, offers, recycle.requests_left(served));
        }
        let relayed = relay_response(lobby, pid, channel, offers, &job, offered).await;
        card.end();
        if let Err(lost) = relayed {
            // What the worker never received goes back to the queue; what it did, it had
            // started when it was lost.
            lobby.seating.requeue_front(offers.recall_until(|_| false));
            while let Some(offered) = offers.take_accepted() {
                fail(&offered, false, 502, "the worker exited while handling this request");
            }
            return match lost {
                Lost::Answered(reason, detail) => Gone::Lost(reason, detail),
                Lost::Unread(why) => {
                    let (reason, why) = match why {
                        Unread::Exited => (ExitReason::Crash, "exited without reading".to_string()),
                        Unread::Wedged => (
                            ExitReason::Wedged,
                            format!(
                            "was killed: alive but wedged (its main thread did not read, in {} s, the request sent \
                             to it idle; another thread holding the GIL does this) before it read",
                            health::READ_WITHIN.as_secs_f64()
                        ),
                        ),
                    };
                    let detail = format!("{why} {}, which goes to another worker", job.summary);
                    // Older than the offers just queued again: it goes in front of them.
                    lobby.seating.return_unstarted(job);
                    Gone::Lost(reason, detail)
                }
            };
        }
        if !recycled && recycle.check(served, true).is_some() {
            recycled = true;
            // The offers it has not received go back to the queue, for the worker that takes
            // its place; those it has, it answers.
            lobby.seating.requeue_front(offers.recall_until(|_| false));
        }
    }
}

/// Offers this (busy) worker the oldest queued jobs, as many as it may hold and, when it is
/// to be retired, no more than the `left` requests it will still take.
fn offer_queued(lobby: &Lobby, offers: &Offers, left: Option<u64>) {
    while !offers.is_full() && left.is_none_or(|left| (offers.len() as u64) < left) {
        let Some(next) = lobby.seating.take_queued() else { return };
        // Its wait ends here: the worker takes it as soon as it has answered.
        let waited = next.enqueued_at.elapsed();
        if let Err(next) = offers.make(next) {
            lobby.seating.return_unstarted(next);
            return;
        }
        lobby.metrics.waited(waited);
    }
}

/// Why an idle worker's channel became readable: it has exited, or it broke the protocol.
async fn idle_loss(channel: &mut Channel) -> String {
    match channel.read_frame().await {
        Ok(None) => "exited while idle".into(),
        Ok(Some(frame)) => format!("sent {:?} while idle", frame.header.kind),
        Err(e) => format!("channel failed while idle: {e}"),
    }
}
