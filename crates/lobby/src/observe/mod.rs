//! Observation: what the lobby counts (`metrics.rs`), the diagnoses it makes of itself
//! (`diagnosis.rs`, kept in `findings.rs`), and the stats listener that shows them
//! (`server.rs`: `/metrics`, `/status.json` from `status.rs`, and the live page of `page.rs`),
//! and, once at start, how the machine's idle CPUs wait (`idle_cpus.rs`).
//!
//! It may read everything the lobby keeps: the queue, the connection counts, the scoreboard,
//! the listeners, the watchdog's readings, each handed to it in `Observed`. Nothing imports it
//! but the lobby's start (`run.rs`), which starts the watch and the listener, and hands the
//! connections and the workers the counts `metrics.rs` registers.

pub(crate) mod diagnosis;
pub(crate) mod findings;
pub(crate) mod idle_cpus;
pub(crate) mod metrics;
mod page;
pub(crate) mod server;
mod status;

use std::rc::Rc;
use std::time::Instant;

use crate::client::asleep::Hibernation;
use crate::client::states::ConnectionStates;
use crate::config::{Config, Live};
use crate::process::watchdog::Watchdog;
use crate::seating::websocket::WebSockets;
use crate::seating::Seating;
use crate::worker::scoreboard::Scoreboard;

/// What the diagnoses and the stats listener read.
pub(crate) struct Observed {
    pub settings: Rc<Live>,
    pub seating: Rc<Seating>,
    pub scoreboard: Rc<Scoreboard>,
    pub connection_states: Rc<ConnectionStates>,
    pub hibernation: Rc<Hibernation>,
    pub websockets: Rc<WebSockets>,
    /// The event loop's watchdog (`--lobby-timeout`); None when it is off.
    pub watchdog: Option<Watchdog>,
    pub metrics: metrics::Metrics,
    /// The failures happening now, named in the log (`diagnosis.rs`).
    pub diagnoses: findings::Diagnoses,
    pub started: Instant,
}

impl Observed {
    /// The settings in force now.
    pub fn settings(&self) -> Rc<Config> {
        self.settings.now()
    }
}
