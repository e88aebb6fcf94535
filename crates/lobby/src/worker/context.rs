//! What a worker's tasks are handed: the queue they take requests from, the settings that bound
//! a request's time, the zygote that signals a worker, and the counts they keep. It holds
//! nothing of the client connections or of the supervisor that starts the tasks.

use std::rc::Rc;

use tokio::sync::watch;

use super::counts::Counts;
use crate::config::Live;
use crate::process::zygote::Zygotes;
use crate::seating::spool::SpillBudget;
use crate::seating::streams::Streams;
use crate::seating::websocket::WebSockets;
use crate::seating::Seating;

pub(crate) struct Context {
    /// --timeout, --graceful-timeout and --worker-connections, as a reload leaves them.
    pub settings: Rc<Live>,
    pub seating: Rc<Seating>,
    /// The zygote that forks workers, which signals them for the context.
    pub zygotes: Rc<Zygotes>,
    /// Turns true once a shutdown has begun.
    pub shutdown: watch::Receiver<bool>,
    pub counts: Counts,
    /// Answer bytes waiting in temporary files for slow clients (`--max-spill-total`).
    pub spill_budget: Rc<SpillBudget>,
    /// Which workers take WebSockets, and how many are open.
    pub websockets: Rc<WebSockets>,
    /// How many ASGI streams are open, and the stop's signal that ends them.
    pub streams: Rc<Streams>,
    /// The worker_abort hook is set: a worker past --timeout gets SIGABRT before SIGKILL.
    pub abort_on_timeout: bool,
}

impl Context {
    /// The settings in force now.
    pub fn settings(&self) -> Rc<crate::config::Config> {
        self.settings.now()
    }
}
