//! The lobby's parts, made once as it starts: each side's context (the connections', the
//! workers', the supervisor's, what is observed), built of what that side needs and sharing
//! what more than one keeps or reads (the queue, the budgets, the counts by state). Only the
//! lobby's life (`run.rs`) holds it; no part takes it.

use std::rc::Rc;

use tokio::sync::watch;

use crate::client::asleep::Hibernation;
use crate::client::context::Context as Connections;
use crate::client::heads::HeadBudget;
use crate::client::tls::certificates::Certificates;
use crate::config::{Config, Live};
use crate::observe::findings::Diagnoses;
use crate::observe::metrics::Metrics;
use crate::observe::Observed;
use crate::process::hooks::{HookThread, ServerHooks};
use crate::process::notify::Standing;
use crate::process::watchdog::Watchdog;
use crate::process::zygote::{Zygote, Zygotes};
use crate::seating::spool::SpillBudget;
use crate::seating::Seating;
use crate::supervise;
use crate::worker::context::Context as Workers;
use crate::worker::scoreboard::Scoreboard;
use crate::StartupError;

/// The lobby's parts as its start makes them: each side is handed its own (the connections',
/// the workers', the observation's), sharing what more than one keeps or reads.
pub(crate) struct Lobby {
    /// The settings as the lobby started: the listeners, --max-connections and the budgets,
    /// the logs' paths, the application and --preload, which a reload cannot change.
    pub(crate) config: Rc<Config>,
    pub(crate) client: Rc<Connections>,
    pub(crate) worker: Rc<Workers>,
    pub(crate) observed: Rc<Observed>,
    /// The worker_int hook is set: SIGQUIT goes on to the workers before they are stopped.
    pub(crate) interrupt_workers: bool,
}

impl Lobby {
    /// What the supervisor is handed.
    pub(crate) fn supervised(&self) -> supervise::Context {
        supervise::Context {
            config: self.config.clone(),
            worker: self.worker.clone(),
            client: self.client.clone(),
            scoreboard: self.observed.scoreboard.clone(),
            interrupt_workers: self.interrupt_workers,
        }
    }

    /// What systemd's `STATUS=` line is read from.
    pub(crate) fn standing(&self) -> Standing {
        Standing {
            seating: self.worker.seating.clone(),
            shutdown: self.worker.shutdown.clone(),
            workers: self.config.workers,
        }
    }
}

/// The lobby's parts, and the thread that runs the server hooks, if the config file has any.
pub(crate) fn new_lobby(
    config: Config,
    first_zygote: &Zygote,
    shutdown: watch::Receiver<bool>,
    tls: Option<Certificates>,
    hooks: Option<ServerHooks>,
    watchdog: Option<Watchdog>,
) -> Result<(Lobby, Option<HookThread>), StartupError> {
    let hibernation =
        Rc::new(Hibernation::new().map_err(|e| StartupError(format!("cannot watch idle connections: {e}")))?);
    let (hook_thread, interrupt_workers, abort_on_timeout) = match hooks {
        Some(hooks) => (
            Some(
                HookThread::start(hooks.call)
                    .map_err(|e| StartupError(format!("cannot start the thread for the server hooks: {e}")))?,
            ),
            hooks.interrupt_workers,
            hooks.abort_on_timeout,
        ),
        None => (None, false, false),
    };
    let metrics = Metrics::new();
    let seating = Rc::new(Seating::default());
    seating.configure(config.overload_policy());
    let spill_budget = Rc::new(SpillBudget::new(config.max_spill_total));
    let settings = Rc::new(Live::new(config.clone()));
    let (websockets, connection_states) = (Rc::default(), Rc::default());
    let client = Rc::new(Connections {
        settings: std::cell::RefCell::new(Rc::new(config.client_settings())),
        protocols: config.http.clone(),
        seating: seating.clone(),
        shutdown: shutdown.clone(),
        hibernation: hibernation.clone(),
        spill_budget: spill_budget.clone(),
        heads: HeadBudget::new(config.max_head_memory),
        counts: metrics.client_counts(),
        websockets: Rc::clone(&websockets),
        connection_states: Rc::clone(&connection_states),
        tls: tls.map(Rc::new),
        successor: Default::default(),
    });
    let worker = Rc::new(Workers {
        settings: settings.clone(),
        seating: seating.clone(),
        zygotes: Rc::new(Zygotes::new(first_zygote.clone())),
        shutdown,
        counts: metrics.worker_counts(),
        spill_budget,
        websockets: websockets.clone(),
        streams: Rc::default(),
        abort_on_timeout,
    });
    let observed = Rc::new(Observed {
        settings,
        seating,
        scoreboard: Rc::new(Scoreboard::default()),
        connection_states,
        hibernation,
        websockets,
        watchdog,
        metrics,
        diagnoses: Diagnoses::new(),
        started: std::time::Instant::now(),
    });
    let lobby = Lobby { config: Rc::new(config), client, worker, observed, interrupt_workers };
    Ok((lobby, hook_thread))
}
