//! Starting workers through the zygote, replacing those that are lost, retiring some (SIGTTOU,
//! recycling), and the spare that recycling keeps ready.

use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::oom::{mib, Verdict};
use super::{Event, Forked, Supervisor};
use crate::log::{debug, error, info};
use crate::process::zygote::Exit;
use crate::worker::recycle::{recycles, Recycle};
use crate::worker::scoreboard::{Card, ExitReason, Phase};
use crate::worker::seat::{Gone, Seat};
use crate::worker::threads;

/// First pause before re-spawning a worker whose application failed to load, doubled each time.
const REBOOT_BACKOFF: Duration = Duration::from_millis(500);
const MAX_REBOOT_BACKOFF: Duration = Duration::from_secs(30);

/// A worker the supervisor knows of, from the `spawn` it asked for to the end of its task.
pub(crate) struct WorkerEntry {
    /// What it shares with its task; its card holds its generation, pid and readiness.
    pub(super) seat: Rc<Seat>,
    pub(super) task: Option<JoinHandle<()>>,
    /// Why it was told to retire.
    pub(super) retired_for: Option<ExitReason>,
}

impl WorkerEntry {
    pub(super) fn generation(&self) -> u64 {
        self.seat.card.generation
    }

    /// None until the zygote has forked it.
    pub(super) fn pid(&self) -> Option<i32> {
        self.seat.card.pid.get()
    }

    /// It has loaded the application.
    pub(super) fn ready(&self) -> bool {
        self.seat.card.ready.get()
    }
}

/// Why a worker retires, as the log says it.
fn retirement(reason: ExitReason) -> &'static str {
    match reason {
        ExitReason::Reload => "reload",
        ExitReason::ScaleDown => "SIGTTOU",
        _ => "recycled",
    }
}

impl Supervisor {
    /// Records a worker about to be asked for, and returns its number.
    pub(super) fn add_worker(&mut self, generation: u64, phase: Phase) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        let card = Rc::new(Card::new(generation, phase));
        self.scoreboard.add(id, card.clone());
        self.workers.insert(id, WorkerEntry { seat: Seat::new(card), task: None, retired_for: None });
        id
    }

    /// Asks the zygote for a new worker of `generation`, after `pause`.
    pub(super) fn spawn(&mut self, generation: u64, phase: Phase, pause: Duration) {
        let id = self.add_worker(generation, phase);
        // A reload's workers come from its own zygote, when it has one (--preload).
        let zygote = match &self.reload_zygote {
            Some(zygote) if self.pending_generation() == Some(generation) => zygote.clone(),
            _ => self.worker.zygotes.serving(),
        };
        let target = self.target;
        // The settings of the moment: a reload's workers take the config file's new threads.
        let settings = self.worker.settings();
        tokio::task::spawn_local(async move {
            tokio::time::sleep(pause).await;
            if let Err(e) = zygote.control.spawn(id, target, &settings).await {
                error!("cannot ask the zygote for a worker: {e}");
            }
        });
    }

    pub(super) fn start_worker(&mut self, id: usize, pid: i32, channels: Vec<OwnedFd>) {
        let Some(entry) = self.workers.get_mut(&id) else {
            self.forked.insert(pid, Forked { age: id + 1, card: None });
            return;
        };
        self.forked.insert(pid, Forked { age: id + 1, card: Some(entry.seat.card.clone()) });
        entry.seat.card.pid.set(Some(pid));
        let worker = self.worker.clone();
        let events = self.events_tx.clone();
        let tell = self.events_tx.clone();
        let recycle = Recycle::new(
            &worker.settings(),
            pid,
            Box::new(move |reason, detail| {
                let _ = tell.send(Event::Recycling { id, pid, reason, detail });
            }),
        );
        let seat = entry.seat.clone();
        let task = tokio::task::spawn_local(async move {
            let ready = {
                let events = events.clone();
                move || drop(events.send(Event::Ready { id, pid }))
            };
            let gone = threads::serve_worker(worker, pid, channels, recycle, seat, ready).await;
            let _ = events.send(Event::Gone { id, pid, gone });
        });
        if let Some(old) = entry.task.replace(task) {
            old.abort();
        }
    }

    pub(super) async fn on_gone(&mut self, id: usize, pid: i32, mut gone: Gone) {
        self.scoreboard.remove(id);
        let Some(entry) = self.workers.remove(&id) else {
            debug!("worker {pid}, no longer wanted, is gone: {gone:?}");
            return;
        };
        // A loss maitred did not cause may be the OOM killer's; the zygote's report of the
        // exit status may come before this or after.
        let on_its_own = matches!(gone, Gone::Lost(ExitReason::Crash, _)) && !self.worker.zygotes.sent_sigkill(pid);
        let oom_kill = self.oom.judge(pid, on_its_own, self.forked.contains_key(&pid)).certain();
        if let (Some(kill), Gone::Lost(reason, detail)) = (&oom_kill, &mut gone) {
            *reason = ExitReason::OomKill;
            detail.push_str(&format!("; killed by the kernel's OOM killer, as the {} counted", kill.counted));
        }
        let exit = match &gone {
            Gone::Lost(reason, _) => Some(*reason),
            Gone::BootFailed(_) => Some(ExitReason::BootFailed),
            Gone::Retired => entry.retired_for,
        };
        if let Some(reason) = exit {
            self.scoreboard.exited(reason);
        }
        if self.pending_generation() == Some(entry.generation()) {
            let reason = match gone {
                Gone::BootFailed(message) => format!("a new worker could not load the application: {message}"),
                Gone::Lost(_, detail) => format!("new worker {pid} lost: {detail}"),
                Gone::Retired => format!("new worker {pid} was retired"),
            };
            self.abandon_reload(&reason).await;
            return;
        }
        if let Some(reason) = entry.retired_for {
            let why = retirement(reason);
            match gone {
                // Its one line was logged when it began to retire.
                Gone::Retired if reason.is_recycling() => debug!("worker {pid} retired ({why})"),
                Gone::Retired => info!("worker {pid} retired ({why})"),
                Gone::Lost(_, detail) => error!("worker {pid} lost while retiring ({why}): {detail}"),
                Gone::BootFailed(message) => info!("worker {pid} retired ({why}) before it had loaded: {message}"),
            }
            return;
        }
        let replaced = self.wants_more();
        let replacing = if replaced { "; starting a replacement" } else { "" };
        let pause = match gone {
            Gone::Retired => {
                info!("worker {pid} retired{replacing}");
                Duration::ZERO
            }
            Gone::Lost(_, detail) => {
                error!("worker {pid} lost: {detail}{replacing}");
                Duration::ZERO
            }
            Gone::BootFailed(message) => {
                self.boot_failures += 1;
                let pause = REBOOT_BACKOFF.saturating_mul(1 << self.boot_failures.min(8)).min(MAX_REBOOT_BACKOFF);
                if replaced {
                    error!(
                        "a new worker could not load the application: {message}; retrying in {} s",
                        pause.as_secs_f64()
                    );
                } else {
                    error!("a new worker could not load the application: {message}");
                }
                pause
            }
        };
        self.balance(pause).await;
    }

    /// The zygote reports worker `pid`'s exit status: a SIGKILL maitred did not send is named an
    /// OOM kill, for certain when the memory cgroup counted one (`oom.rs`), else a probable one.
    pub(super) fn on_exited(&mut self, zygote: i32, pid: i32, how: Exit) {
        let card = self.forked.get(&pid).and_then(|forked| forked.card.clone());
        let by_maitred = self.worker.zygotes.exit_reported(pid);
        let sigkill = how == Exit::Signal(libc::SIGKILL);
        let loss_to_come = self.workers.values().any(|worker| worker.pid() == Some(pid));
        let verdict = self.oom.judge(pid, sigkill && !by_maitred, loss_to_come);
        let rss = card.and_then(|card| card.resident.get()).map_or_else(|| "not sampled".into(), mib);
        match (sigkill, by_maitred, verdict) {
            (true, true, _) => info!("worker {pid} exited ({how}, sent by maitred)"),
            (true, false, Verdict::Certain(kill)) => {
                let limit =
                    kill.limit.map_or_else(|| "no limit set".into(), |limit| format!("its limit {}", mib(limit)));
                error!(
                    "worker {pid} exited ({how}): an OOM kill: the kernel's OOM killer ended it, as the {} counted; \
                     {limit}, the worker's last RSS {rss}",
                    kill.counted
                );
            }
            (true, false, Verdict::Unknown(why)) => error!(
                "worker {pid} exited ({how}): a probable OOM kill: a SIGKILL maitred did not send, as the kernel's \
                 OOM killer sends (or a kill -9 from outside); {why}; the worker's last RSS {rss}"
            ),
            _ => info!("worker {pid} exited ({how})"),
        }
        self.child_exited(zygote, pid);
    }

    /// A worker retires for recycling: the spare takes its place, and a new spare is started.
    pub(super) async fn on_recycling(&mut self, id: usize, pid: i32, reason: ExitReason, detail: &str) {
        if self.workers.get(&id).is_none_or(|entry| entry.retired_for.is_some()) {
            // Retired already (a reload, SIGTTOU): its place is taken care of.
            debug!("retiring worker {pid}: {detail}");
            return;
        }
        self.retire(&[id], reason);
        let successor = match self.spare().map(|spare| &self.workers[&spare]) {
            _ if !self.wants_more() => String::new(),
            Some(spare) => match (spare.ready(), spare.pid()) {
                (true, Some(spare)) => format!("; the spare worker {spare} takes its place"),
                _ => "; the spare worker, still loading, takes its place".into(),
            },
            None => "; starting a replacement".into(),
        };
        info!("retiring worker {pid}: {detail}{successor}");
        self.balance(Duration::ZERO).await;
    }

    /// The serving generation's spare: ready, or loading, and seated at nothing until it takes
    /// the place of a worker that retires or is lost.
    pub(super) fn spare(&self) -> Option<usize> {
        self.workers
            .iter()
            .find(|(_, w)| w.generation() == self.generation && w.seat.phase() == Phase::Hold)
            .map(|(id, _)| *id)
    }

    /// The serving generation's workers that serve (not the spare, not those retiring), by
    /// number, oldest first.
    pub(super) fn serving(&self) -> Vec<usize> {
        let mut ids: Vec<usize> = self
            .workers
            .iter()
            .filter(|(_, w)| w.generation() == self.generation && w.seat.phase() == Phase::Serve)
            .map(|(id, _)| *id)
            .collect();
        ids.sort();
        ids
    }

    /// Whether `balance` would start a worker now: fewer serve than the target, and the server
    /// is not shutting down, or it is with requests waiting (or no worker left to take them).
    pub(super) fn wants_more(&self) -> bool {
        let serving = self.serving().len();
        if serving >= self.target {
            return false;
        }
        !*self.worker.shutdown.borrow() || self.worker.seating.queued() > 0 || serving == 0
    }

    /// Starts or retires workers of the serving generation until `target` serve, the spare
    /// first taking a missing worker's place; then starts a spare if recycling wants one.
    pub(super) async fn balance(&mut self, pause: Duration) {
        let serving = self.serving();
        if self.wants_more() {
            let mut missing = self.target - serving.len();
            if let Some(spare) = self.spare() {
                self.workers[&spare].seat.serve();
                missing -= 1;
            }
            for _ in 0..missing {
                self.spawn(self.generation, Phase::Serve, pause);
            }
        } else if serving.len() > self.target && !*self.worker.shutdown.borrow() {
            // Those still loading go first, the newest first; then the oldest, as gunicorn does.
            let mut doomed: Vec<usize> = serving.iter().rev().copied().filter(|id| !self.workers[id].ready()).collect();
            doomed.extend(serving.iter().copied().filter(|id| self.workers[id].ready()));
            doomed.truncate(serving.len() - self.target);
            self.retire(&doomed, ExitReason::ScaleDown);
        }
        if recycles(&self.worker.settings()) && self.spare().is_none() && !*self.worker.shutdown.borrow() {
            self.spawn(self.generation, Phase::Hold, pause);
        }
    }

    /// Tells workers to retire: each answers the requests it holds, then its channel is closed
    /// and it exits. The offers they had not received go back to the queue, in its order.
    pub(super) fn retire(&mut self, ids: &[usize], why: ExitReason) {
        let mut recalled = Vec::new();
        for id in ids {
            if let Some(entry) = self.workers.get_mut(id) {
                entry.retired_for = Some(why);
                recalled.extend(entry.seat.retire());
            }
        }
        recalled.sort_by_key(|job| job.enqueued_at);
        self.worker.seating.requeue_front(recalled);
    }
}
