//! The maitred lobby: the one process that owns the listen sockets, accepts connections,
//! reads requests completely, queues them in one FIFO and seats each at an idle worker.
//! See docs/DESIGN.md for why it is shaped this way, and its map of this source tree.
//!
//! The parts, one folder each, in the order a request meets them: `listen/` takes
//! connections, `client/` reads each request and writes its answer, `seating/` queues it,
//! `worker/` relays it to a worker and back, `supervise/` keeps the workers running and answers
//! the signals, `process/` is the process's own life (upgrade, hooks, systemd, privileges),
//! `observe/` counts and explains, `log/` writes it all down. `run.rs` starts, serves, drains
//! and stops, and hands each part a context of its own, made of what it needs; `config.rs` is
//! the typed settings.
//!
//! No `unsafe` here: raw system calls are `maitred_sys`'s.

#![forbid(unsafe_code)]

mod client;
mod config;
mod listen;
mod lobby;
mod log;
mod observe;
mod process;
mod run;
mod seating;
mod supervise;
mod worker;

use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::task::LocalSet;

use process::watchdog::{self, Watchdog};

pub use client::context::{HttpProtocols, WebSocketLimits};
pub use client::proxies::{AllowList, Forwarding};
pub use client::tls::certificates::{CertReqs, TlsSettings};
pub use config::{BindAddress, Config, Credentials, HalfClose, QueuePolicy};
pub use listen::bind::LISTEN_FDS_START;
pub use log::access_format::AccessFormat;
pub use log::Level;
pub use maitred_protocol::ProxyVersions;
pub use process::hooks::{HookCaller, HookFailed, LobbyHook, ServerHooks};
pub use process::upgrade::{Succession, UPGRADE_CHANNEL_VARIABLE, UPGRADE_LISTENERS_VARIABLE};
pub use process::zygote::ZYGOTE_CHANNEL_VARIABLE;
pub use supervise::{Reread, Rereader};
pub use worker::health::stack_signal;

/// Why the server could not start: one line for the operator.
#[derive(Debug)]
pub struct StartupError(pub String);

impl std::fmt::Display for StartupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How long the lobby waits, as it exits, for its logs to write what they hold.
const LOG_FLUSH_WAIT: Duration = Duration::from_secs(1);

/// Runs the lobby until a shutdown completes. Returns the process exit code. `rereader`, when
/// there is a config file, reads it again for a reload (SIGHUP); `succession` says how to
/// start a new maitred (SIGUSR2), and whether this one replaces another; `hooks`, the config
/// file's server hooks (docs/HOOKS.md).
pub fn run(
    config: Config,
    control: OwnedFd,
    zygote_pid: i32,
    rereader: Option<Rereader>,
    succession: Succession,
    hooks: Option<ServerHooks>,
) -> Result<i32, StartupError> {
    log::set_level(config.log_level);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(worker::look_before_parking)
        .build()
        .map_err(|e| StartupError(format!("cannot start the event loop: {e}")))?;
    let local = LocalSet::new();
    // Started on this thread, the one that runs the event loop, which the watchdog watches.
    let watchdog = config
        .lobby_timeout
        .map(Watchdog::start)
        .transpose()
        .map_err(|e| StartupError(format!("cannot start the lobby's watchdog (--lobby-timeout): {e}")))?;
    if let Some(watchdog) = &watchdog {
        local.spawn_local(watchdog.heartbeat());
    }
    if let Some(wedge) = watchdog::wedge_on_signal() {
        local.spawn_local(wedge);
    }
    let result = local.block_on(
        &runtime,
        run::until_stopped(config, control, zygote_pid, rereader, succession, hooks, watchdog.clone()),
    );
    if let Some(watchdog) = &watchdog {
        watchdog.stop();
    }
    // Tasks still holding connections are dropped here, after every worker was stopped.
    drop(local);
    // A config file still being read for a reload is not waited for.
    runtime.shutdown_timeout(Duration::ZERO);
    log::flush(LOG_FLUSH_WAIT);
    result
}
