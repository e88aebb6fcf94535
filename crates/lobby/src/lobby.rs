//! The context every task of the lobby shares: the settings, the queue, the zygotes, and the
//! state that more than one part keeps or reads (sleeping connections, budgets, counts, the
//! scoreboard, the diagnoses, the successor of a binary upgrade).
//!
//! It holds only types from files that never take a `Lobby` themselves, so that nothing it
//! holds can reach back into it.

use std::cell::RefCell;
use std::rc::Rc;

use maitred_protocol::Limits;
use tokio::sync::watch;

use crate::client::asleep::Hibernation;
use crate::client::heads::HeadBudget;
use crate::client::states::ConnectionStates;
use crate::client::tls::certificates::Certificates;
use crate::config::Config;
use crate::observe::findings::Diagnoses;
use crate::observe::metrics::Metrics;
use crate::process::upgrade::handover::Successor;
use crate::process::watchdog::Watchdog;
use crate::seating::spool::SpillBudget;
use crate::seating::streams::Streams;
use crate::seating::websocket::WebSockets;
use crate::seating::Seating;
use crate::supervise::zygote::Zygotes;
use crate::worker::scoreboard::Scoreboard;

/// What the connection and worker tasks share.
pub(crate) struct Lobby {
    /// The settings as the lobby started. Those a reload (SIGHUP) may change are read from
    /// `settings()`; these stay for what cannot change without a new lobby: the listeners,
    /// --max-connections and the budgets, the logs' paths, the application and --preload.
    pub config: Config,
    /// The settings now: `config`, or what the last SIGHUP read from the config file.
    pub(crate) settings: RefCell<Rc<Config>>,
    pub seating: Seating,
    /// The zygote that forks workers, and retired ones (a reload with --preload).
    pub zygotes: Rc<Zygotes>,
    /// Turns true once a shutdown has begun.
    pub shutdown: watch::Receiver<bool>,
    /// Keep-alive connections idle long enough to give up their tasks.
    pub hibernation: Hibernation,
    /// Answer bytes waiting in temporary files for slow clients (`--max-spill-total`).
    pub spill_budget: Rc<SpillBudget>,
    /// Incomplete request heads' memory (`--max-head-memory`).
    pub heads: Rc<HeadBudget>,
    /// What `--stats` shows.
    pub metrics: Metrics,
    /// Which workers take WebSockets, how many are open, and the stop's going-away signal.
    pub websockets: Rc<WebSockets>,
    /// How many ASGI streams are open, and the stop's signal that ends them.
    pub streams: Rc<Streams>,
    /// Every worker's state and current request, and why workers left.
    pub scoreboard: Scoreboard,
    /// How many connections are in each state, and for how long.
    pub connection_states: Rc<ConnectionStates>,
    /// The failures happening now, named in the log (`observe/diagnosis.rs`).
    pub diagnoses: Diagnoses,
    /// The worker_abort hook is set: a worker past --timeout gets SIGABRT before SIGKILL.
    pub abort_on_timeout: bool,
    /// The worker_int hook is set: SIGQUIT goes on to the workers before they are stopped.
    pub interrupt_workers: bool,
    pub started: std::time::Instant,
    /// Once a new maitred has taken over (SIGUSR2): where idle connections go instead of
    /// being closed.
    pub(crate) successor: RefCell<Option<Rc<Successor>>>,
    /// The TLS listeners' certificate (`--certfile`), read again at a SIGHUP; None: no TLS.
    pub tls: Option<Certificates>,
    /// The event loop's watchdog (`--lobby-timeout`), for its readings; None when it is off.
    pub watchdog: Option<Watchdog>,
}

impl Lobby {
    /// The settings in force now (see `config`).
    pub fn settings(&self) -> Rc<Config> {
        self.settings.borrow().clone()
    }

    /// Takes the settings a reload read; connections and workers use them from their next
    /// request on.
    pub fn set_settings(&self, config: Config) {
        self.seating.configure(config.overload_policy());
        *self.settings.borrow_mut() = Rc::new(config);
    }

    /// Whether connections close once answered: a shutdown has begun and no new maitred takes
    /// them over.
    pub fn closing(&self) -> bool {
        *self.shutdown.borrow() && self.successor.borrow().is_none()
    }

    /// Whether a new maitred takes this one's idle connections (SIGUSR2).
    pub fn handing_over(&self) -> bool {
        self.successor.borrow().is_some()
    }

    /// The new maitred that takes this one's idle connections, during an upgrade.
    pub fn successor(&self) -> Option<Rc<Successor>> {
        self.successor.borrow().clone()
    }

    /// The request limits in force now.
    pub fn limits(&self) -> Limits {
        let settings = self.settings.borrow();
        Limits {
            max_request_line: settings.limit_request_line,
            max_headers: settings.limit_request_fields,
            max_header_size: settings.limit_request_field_size,
            max_body: settings.max_body,
        }
    }
}
