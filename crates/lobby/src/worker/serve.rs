//! A worker's task: seats requests at it, one after the other, through the slots of its
//! shared region, until it goes away or is retired; offers it the next queued requests while
//! it is busy (docs/DESIGN.md, "Offers keep busy workers busy").

use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use maitred_shm::Corrupt;
use maitred_wire::{FrameHeader, Kind, FLAG_FD};
use tokio::sync::watch;

use super::channel::Channel;
use super::health::{self, ProcStat};
use super::recycle::Recycle;
use super::relay::{fail, relay_response, Lost, Unread};
use super::scoreboard::{Card, ExitReason, Phase};
use super::seat::{Gone, Seat};
use crate::lobby::Lobby;
use crate::log::{debug, error};
use crate::seating::job::{Job, JobState};
use crate::seating::offer::{Offers, Taken};
use crate::seating::Next;

/// The longest the lobby goes without looking whether its worker has taken a request queued at
/// it, while the worker writes nothing.
const LOOK_AT_MOST_EVERY: Duration = Duration::from_millis(100);

/// Seats jobs at this worker until it goes away or is retired. A worker held by `seat` waits,
/// idle, until it may serve.
pub async fn serve(lobby: Rc<Lobby>, pid: i32, mut channel: Channel, mut recycle: Recycle, seat: Rc<Seat>) -> Gone {
    // Made as soon as the worker is ready, held or not: the workers held at the start have all
    // their descriptors open before the server says it serves.
    let offers = match Offers::new() {
        Ok((offers, region)) => {
            let offers = Rc::new(offers);
            for (kind, fd) in [(Kind::Region, region.as_fd()), (Kind::Bell, offers.bell())] {
                let frame = FrameHeader { kind, flags: FLAG_FD, len: 0 }.encode();
                if let Err(e) = channel.send(&frame, Some(fd)).await {
                    return Gone::Lost(ExitReason::Crash, format!("could not send its shared region: {e}"));
                }
            }
            offers
        }
        Err(e) => return Gone::Lost(ExitReason::Crash, format!("could not make its shared region: {e}")),
    };
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
    // Recycled: it answers what it has taken from its slots, and takes nothing more.
    let mut recycled = false;
    let stat = ProcStat::open(pid);
    // Since when the worker has been free for the next request queued at it: the end of its
    // last answer, or when that request was seated at it idle.
    let mut free_since = Instant::now();
    loop {
        if offers.is_empty() {
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
            let look =
                card.served.get() == 0 || idle_since.is_some_and(|since| since.elapsed() >= health::LOOK_AFTER_IDLE);
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
            let waited = job.enqueued_at.elapsed();
            lobby.metrics.waited(waited);
            debug!("worker {pid} takes {} after {:.1} ms in the queue", job.summary, waited.as_secs_f64() * 1e3);
            if let Err(gone) = seat_idle(lobby, channel, offers, job).await {
                return gone;
            }
            free_since = Instant::now();
        }
        let taken = match wait_taken(lobby, pid, channel, offers, free_since).await {
            Ok(Some(taken)) => taken,
            // Everything queued at it was taken back meanwhile.
            Ok(None) => continue,
            Err(gone) => return gone,
        };
        card.begin(taken.job.summary.clone());
        let served = card.served.get();
        // A retiring worker is offered nothing: its offers went back to the queue.
        if *phase.borrow() != Phase::Retire && !recycled {
            offer_queued(lobby, offers, recycle.requests_left(served));
        }
        let relayed = relay_response(lobby, pid, channel, &taken, free_since).await;
        card.end();
        if let Err(lost) = relayed {
            return lost_with(lobby, offers, taken.job, lost);
        }
        if let Err(corrupt) = offers.answered() {
            return broke(lobby, pid, offers, corrupt).await;
        }
        free_since = Instant::now();
        if !recycled && recycle.check(served, true).is_some() {
            recycled = true;
            // The offers it has not taken go back to the queue, for the worker that takes its
            // place; those it has, it answers.
            lobby.seating.requeue_front(offers.recall_until(|_| false));
        }
    }
}

/// Seats `job` at the idle worker: in a slot, or, when it does not fit one, on the channel
/// with its place in a slot.
async fn seat_idle(lobby: &Lobby, channel: &mut Channel, offers: &Offers, job: Job) -> Result<(), Gone> {
    if offers.fits(&job) {
        return offers.make(job).map_err(|job| {
            lobby.seating.return_unstarted(job);
            Gone::Lost(ExitReason::Crash, format!("it broke its shared region: {}", broken(offers)))
        });
    }
    if let Err(e) = channel.send(&job.frame, job.body_file.as_ref().map(|file| file.as_fd())).await {
        lobby.seating.return_unstarted(job);
        return Err(Gone::Lost(ExitReason::Crash, format!("could not send a request: {e}")));
    }
    offers.make_on_channel(job).map_err(|job| {
        // It is on the channel of a worker the lobby gives up on: it may have begun it.
        let detail = format!("it broke its shared region: {}", broken(offers));
        fail(&job, false, 502, &detail);
        Gone::Lost(ExitReason::Crash, detail)
    })
}

fn broken(offers: &Offers) -> String {
    offers.broken().map(|corrupt| corrupt.to_string()).unwrap_or_default()
}

/// Waits until the worker takes one of the requests queued at it: the one it answers next.
/// None when they were all taken back meanwhile, by idle workers or by clients that left.
///
/// A worker that has just answered, or was just woken with a request, takes it within
/// microseconds; the lobby looks at its slots when it writes (its answer's first frame) or
/// closes its channel, at growing intervals meanwhile, and at `health::READ_WITHIN` after it
/// became free. One that has taken nothing by then is wedged or stopped: what it was queued
/// comes back, provably never begun, and it is killed.
async fn wait_taken(
    lobby: &Rc<Lobby>,
    pid: i32,
    channel: &mut Channel,
    offers: &Offers,
    free_since: Instant,
) -> Result<Option<Taken>, Gone> {
    let read_by = tokio::time::Instant::from_std(free_since + health::READ_WITHIN);
    // A request that writes nothing for a while (a slow application) is seen taken by a look at
    // its slot: after 1 ms, then at doubling intervals up to `LOOK_AT_MOST_EVERY`, so that the
    // scoreboard and the diagnoses name it. A fast one answers before the first look.
    let mut look_after = Duration::from_millis(1);
    let mut next_look = tokio::time::Instant::now() + look_after;
    loop {
        match offers.take_taken() {
            Ok(Some(taken)) => return Ok(Some(taken)),
            Ok(None) if offers.is_empty() => return Ok(None),
            Ok(None) => {}
            Err(corrupt) => return Err(broke(lobby, pid, offers, corrupt).await),
        }
        tokio::select! {
            biased;
            _ = offers.recall() => {}
            _ = tokio::time::sleep_until(next_look), if next_look < read_by => {
                look_after = (look_after * 2).min(LOOK_AT_MOST_EVERY);
                next_look += look_after;
            }
            _ = channel.closed_while_idle() => {
                match offers.take_taken() {
                    Ok(Some(taken)) => return Ok(Some(taken)),
                    Ok(None) => {}
                    Err(corrupt) => return Err(broke(lobby, pid, offers, corrupt).await),
                }
                // It wrote before taking a request, or closed its channel: it is lost, and
                // what it had not taken never ran.
                let never_taken = offers.give_up();
                let detail = match idle_loss(channel).await {
                    exited if never_taken.is_empty() => exited,
                    _ => format!("exited without reading {}, which goes to another worker", named(&never_taken)),
                };
                lobby.seating.requeue_front(never_taken);
                return Err(Gone::Lost(ExitReason::Crash, detail));
            }
            _ = tokio::time::sleep_until(read_by) => {
                let never_taken = offers.give_up();
                // What it took at the last moment, it answers.
                if !offers.is_empty() {
                    lobby.seating.requeue_front(never_taken);
                    continue;
                }
                if let Err(e) = lobby.zygotes.kill(pid, libc::SIGKILL).await {
                    error!("could not ask the zygote to kill worker {pid}: {e}");
                }
                let detail = format!(
                    "was killed: alive but wedged (its main thread did not take, in {} s, the request seated at it; \
                     another thread holding the GIL does this) before it read {}, which goes to another worker",
                    health::READ_WITHIN.as_secs_f64(),
                    named(&never_taken)
                );
                lobby.seating.requeue_front(never_taken);
                return Err(Gone::Lost(ExitReason::Wedged, detail));
            }
        }
    }
}

/// `jobs` for a log line: the oldest's summary, and how many more.
fn named(jobs: &[Job]) -> String {
    match jobs {
        [] => "nothing".into(),
        [job] => job.summary.to_string(),
        [job, more @ ..] => format!("{} and {} more", job.summary, more.len()),
    }
}

/// The worker broke its shared region: it is killed, and what it had not taken goes to
/// another worker; what it had taken is answered 502.
async fn broke(lobby: &Lobby, pid: i32, offers: &Offers, corrupt: Corrupt) -> Gone {
    if let Err(e) = lobby.zygotes.kill(pid, libc::SIGKILL).await {
        error!("could not ask the zygote to kill worker {pid}: {e}");
    }
    let detail = format!("it broke its shared region: {corrupt}");
    lobby.seating.requeue_front(offers.give_up());
    for job in offers.drain() {
        fail(&job, false, 502, &detail);
    }
    Gone::Lost(ExitReason::Crash, detail)
}

/// The worker was lost while answering `job`: what it had not taken goes back to the queue,
/// and `job` too when it provably never read it.
fn lost_with(lobby: &Lobby, offers: &Offers, job: Job, lost: Lost) -> Gone {
    lobby.seating.requeue_front(offers.give_up());
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
