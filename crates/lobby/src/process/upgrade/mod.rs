//! The binary upgrade (SIGUSR2, docs/SIGNALS.md): a new maitred takes over from the running
//! one, and no client notices.
//!
//! | step | old lobby                                         | new lobby                          |
//! |------|---------------------------------------------------|------------------------------------|
//! | 1    | SIGUSR2: starts the command it was started with, passing its listen sockets and one end of a `SOCK_SEQPACKET` pair | |
//! | 2    | serves as before                                  | takes the sockets, starts its workers |
//! | 3    |                                                   | `ready`: it serves                  |
//! | 4    | `MAINPID=` to systemd, then `main`; stops accepting | writes `--pid`, accepts too; `READY=1` after `main` |
//! | 5    | finishes its requests; each idle keep-alive connection goes over the pair with its state | puts each to sleep as its own |
//! | 6    | exits 0 once no connection is left                | serves alone                        |
//!
//! A new maitred that exits, or does not say `ready` within `READY_WITHIN`, is stopped and the
//! old one goes on serving; the log says why.
//!
//! The old lobby's side is `handover.rs`, the new one's `takeover.rs`; what both use is here.
//! The variable names below are this module's; the CLI (`maitred.succession`) reads them from
//! `maitred._native`, checks the sockets and matches them to its `--bind` addresses.

pub(crate) mod handover;
pub(crate) mod takeover;

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

use bytes::BytesMut;
use tokio::io::unix::AsyncFd;

use crate::config::BindAddress;

/// The descriptor of the new lobby's end of the pair.
pub const UPGRADE_CHANNEL_VARIABLE: &str = "MAITRED_UPGRADE_FD";
/// The listen sockets passed, comma-separated descriptor numbers.
pub const UPGRADE_LISTENERS_VARIABLE: &str = "MAITRED_LISTEN_FDS";
/// The longest message: a connection's state with its server name.
pub(super) const MAX_MESSAGE: usize = 4096;
pub(super) const READY: &[u8] = b"ready";
/// The old lobby's answer to `ready`, once it has told systemd (MAINPID=) that the new one is
/// the service's main process: only then may the new one notify (READY=1, STATUS=) itself.
pub(super) const MAIN: &[u8] = b"main";

/// How this lobby came to be, and how it would start its successor.
pub struct Succession {
    /// The command line this maitred was started with, interpreter first.
    pub command: Vec<String>,
    /// The directory it was started in (before `--chdir`).
    pub directory: PathBuf,
    /// `--pid`, written with the new lobby's pid when it takes over.
    pub pid_file: Option<PathBuf>,
    /// When this lobby is itself an upgrade: its end of the pair with the lobby it replaces,
    pub predecessor: Option<OwnedFd>,
    /// and the listen sockets that lobby passed, each for the --bind address it listens on.
    pub inherited: Vec<(BindAddress, OwnedFd)>,
}

/// Why an upgrade did not happen.
#[derive(Debug)]
pub enum UpgradeError {
    Start(io::Error),
    Exited(std::process::ExitStatus),
    NotReady,
    Channel(io::Error),
}

impl std::fmt::Display for UpgradeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpgradeError::Start(e) => write!(f, "cannot start the new maitred: {e}"),
            UpgradeError::Exited(status) => match (status.code(), status.signal()) {
                (Some(code), _) => write!(f, "the new maitred exited with code {code} before it was ready"),
                (None, Some(signal)) => write!(f, "the new maitred was killed by signal {signal} before it was ready"),
                _ => write!(f, "the new maitred ended before it was ready"),
            },
            UpgradeError::NotReady => {
                write!(f, "the new maitred was not ready within {} s; it was stopped", handover::READY_WITHIN.as_secs())
            }
            UpgradeError::Channel(e) => write!(f, "the channel to the new maitred failed: {e}"),
        }
    }
}

/// The next message on the pair, and the descriptors that came with it; None at its end.
pub(super) async fn receive(channel: &AsyncFd<OwnedFd>, fds: &mut VecDeque<OwnedFd>) -> io::Result<Option<Vec<u8>>> {
    let mut buf = BytesMut::with_capacity(MAX_MESSAGE);
    loop {
        let mut ready = channel.readable().await?;
        match ready.try_io(|inner| {
            maitred_sys::fdpass::recv_into(inner.as_raw_fd(), &mut buf, fds, libc::MSG_DONTWAIT)
                .map_err(io::Error::from)
        }) {
            Ok(Ok(0)) => return Ok(None),
            Ok(Ok(_)) => return Ok(Some(buf.to_vec())),
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}
