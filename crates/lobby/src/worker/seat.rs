//! What the supervisor and a worker's task share: the worker's seat (its scoreboard card and
//! its offer sockets), how the worker's time with the lobby ended, and its READY.

use std::cell::RefCell;
use std::rc::Rc;

use maitred_wire::{Kind, Ready};

use super::channel::Channel;
use super::scoreboard::{Card, ExitReason, Phase};
use crate::seating::job::Job;
use crate::seating::offer::Offers;

/// How a worker's time with the lobby ended.
#[derive(Debug)]
pub enum Gone {
    /// The app could not be loaded; the message is one line for the operator.
    BootFailed(String),
    /// Closed by the lobby: when it was recycled (`--max-requests`, `--max-worker-memory`,
    /// `--max-worker-lifetime`), when the supervisor retired it (a reload, SIGTTOU), or at
    /// shutdown.
    Retired,
    /// The process or its channel failed, or the lobby killed it; the detail is for the log.
    Lost(ExitReason, String),
}

/// Waits for the worker's `READY`. Errors say what went wrong, for a start-up failure line.
pub async fn await_ready(channel: &mut Channel) -> Result<Ready, Gone> {
    match channel.read_frame().await {
        Ok(Some(frame)) if frame.header.kind == Kind::Ready => Ready::decode_payload(&frame.payload)
            .map_err(|e| Gone::Lost(ExitReason::Crash, format!("sent a bad READY: {e}"))),
        Ok(Some(frame)) if frame.header.kind == Kind::BootFailed => {
            Err(Gone::BootFailed(String::from_utf8_lossy(&frame.payload).trim().to_string()))
        }
        Ok(Some(frame)) => Err(Gone::Lost(ExitReason::Crash, format!("sent {:?} before READY", frame.header.kind))),
        Ok(None) => Err(Gone::Lost(ExitReason::Crash, "exited before it was ready".into())),
        Err(e) => Err(Gone::Lost(ExitReason::Crash, format!("channel failed before READY: {e}"))),
    }
}

/// What the supervisor and a worker's task share.
pub struct Seat {
    /// Its line on the scoreboard, which holds what the supervisor wants of it (its phase).
    pub card: Rc<Card>,
    /// The offers of each of the worker's threads, once it serves.
    pub(super) offers: RefCell<Vec<Rc<Offers>>>,
}

impl Seat {
    pub fn new(card: Rc<Card>) -> Rc<Seat> {
        Rc::new(Seat { card, offers: RefCell::new(Vec::new()) })
    }

    pub fn phase(&self) -> Phase {
        *self.card.phase.borrow()
    }

    /// Lets a held worker take requests.
    pub fn serve(&self) {
        self.card.phase.send_if_modified(|phase| {
            let held = *phase == Phase::Hold;
            if held {
                *phase = Phase::Serve;
            }
            held
        });
    }

    /// Seats no more requests at the worker. The offers it has not received yet come back,
    /// oldest first, for the caller to queue again; it answers those it has, and the request it
    /// is busy with, then its task ends with `Gone::Retired`.
    pub fn retire(&self) -> Vec<Job> {
        self.card.phase.send_replace(Phase::Retire);
        let mut recalled: Vec<Job> =
            self.offers.borrow().iter().flat_map(|offers| offers.recall_until(|_| false)).collect();
        // Oldest first, across the threads, as the queue takes them back.
        recalled.sort_by_key(|job| job.enqueued_at);
        recalled
    }
}

/// Which of its worker's threads a seat's task serves.
#[derive(Clone, Copy, Debug)]
pub struct Thread {
    /// Its line on the worker's card.
    pub number: usize,
    /// It is the worker's only thread: a timeout kills the worker at once, since nothing else
    /// runs in it (docs/PROTOCOL.md, section 4).
    pub sole: bool,
}

/// How long an event loop may leave a `CANCEL` unread before the lobby takes it for blocked. A
/// loop that runs reads it within milliseconds; one that misses its heartbeat for 0.5 s is
/// diagnosed blocked by the worker's own watchdog (docs/ASGI.md).
pub const EVENT_LOOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
