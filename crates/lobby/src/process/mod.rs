//! The process's own life, apart from serving: the binary upgrade (`upgrade/`), starting a
//! maitred process that talks to this one (`spawn.rs`), the config file's server hooks
//! (`hooks.rs`), telling systemd how things stand (`notify.rs`), dropping root
//! (`privileges.rs`), ending the lobby when its event loop stalls (`watchdog.rs`), and, as PID
//! 1, reaping the orphans it adopts (`orphans.rs`); and the zygotes that fork the workers,
//! with the control channel to them (`zygote.rs`).
//!
//! It may import the client connections' sleeping state (an upgrade hands idle connections
//! over), the queue (for systemd's status line), the logs and the settings; never the workers
//! or the supervisor, which drive it.

pub(crate) mod hooks;
pub(crate) mod notify;
pub(crate) mod orphans;
pub(crate) mod privileges;
pub(crate) mod spawn;
pub(crate) mod upgrade;
pub(crate) mod watchdog;
pub(crate) mod zygote;
