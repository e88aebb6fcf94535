//! The old lobby's side of a binary upgrade: starting the new maitred, waiting until it is
//! ready, then handing it each idle keep-alive connection with its state as it drains.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use socket2::SockRef;
use tokio::io::unix::AsyncFd;

use super::{receive, Succession, UpgradeError, MAIN, READY, UPGRADE_CHANNEL_VARIABLE, UPGRADE_LISTENERS_VARIABLE};
use crate::client::asleep::Sleeper;
use crate::client::peer::StreamKind;
use crate::log::{warning, warning_limited};
use crate::process::spawn::{self, seqpacket_pair};

/// How long the new maitred may take to start its workers and say it is ready.
pub(super) const READY_WITHIN: Duration = Duration::from_secs(60);

/// How long handing one connection over may block before it is closed instead.
const HANDOVER_SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// A new maitred that has been started and has not yet said it is ready.
pub(crate) struct Candidate {
    child: Child,
    channel: AsyncFd<OwnedFd>,
    started: Instant,
}

impl Candidate {
    /// Starts `succession.command` with the listen sockets `listeners` and its end of a new pair.
    pub(crate) fn start(succession: &Succession, listeners: &[RawFd]) -> Result<Candidate, UpgradeError> {
        let (ours, theirs) = seqpacket_pair().map_err(UpgradeError::Start)?;
        let theirs_raw = theirs.as_raw_fd();
        let mut inherited = listeners.to_vec();
        inherited.push(theirs_raw);
        let listed = listeners.iter().map(|fd| fd.to_string()).collect::<Vec<_>>().join(",");
        let mut command = spawn::command_keeping(&succession.command, inherited).map_err(UpgradeError::Start)?;
        command
            .current_dir(&succession.directory)
            .env(UPGRADE_CHANNEL_VARIABLE, theirs_raw.to_string())
            .env(UPGRADE_LISTENERS_VARIABLE, listed)
            // The watchdog is for whichever process is the service's main one; the new lobby
            // becomes it with MAINPID= (sd_watchdog_enabled(3) then applies it to itself).
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null());
        let child = command.spawn().map_err(UpgradeError::Start)?;
        drop(theirs);
        // Reads use MSG_DONTWAIT, so the socket itself may stay blocking.
        let channel = maitred_sys::reactor::register(ours).map_err(UpgradeError::Channel)?;
        Ok(Candidate { child, channel, started: Instant::now() })
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits until the new maitred says it is ready; then it is the successor. On any failure
    /// the new maitred has been stopped and reaped.
    pub(crate) async fn ready(&mut self) -> Result<(), UpgradeError> {
        let deadline = tokio::time::Instant::from_std(self.started + READY_WITHIN);
        let heard = tokio::time::timeout_at(deadline, receive(&self.channel, &mut VecDeque::new())).await;
        let failure = match heard {
            Ok(Ok(Some(message))) if message == READY => return Ok(()),
            Ok(Ok(Some(message))) => UpgradeError::Channel(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected message {:?}", String::from_utf8_lossy(&message)),
            )),
            Ok(Ok(None)) => match self.exit_status(Duration::from_secs(1)) {
                Some(status) => return Err(UpgradeError::Exited(status)),
                None => UpgradeError::Channel(io::Error::new(io::ErrorKind::UnexpectedEof, "it closed the channel")),
            },
            Ok(Err(e)) => UpgradeError::Channel(e),
            Err(_) => UpgradeError::NotReady,
        };
        self.stop();
        Err(failure)
    }

    /// The exit status, if the process ends within `within`.
    fn exit_status(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + within;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                _ => return None,
            }
        }
    }

    /// Stops a new maitred that will not take over: SIGTERM (it stops its workers), then
    /// SIGKILL if it lingers.
    pub(crate) fn stop(&mut self) {
        // Our own child, which has not been reaped.
        let _ = maitred_sys::process::kill(self.pid(), libc::SIGTERM);
        if self.exit_status(Duration::from_secs(10)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Makes the ready candidate the successor: it owns the listen sockets now too.
    pub(crate) fn into_successor(self) -> Successor {
        let pid = self.pid();
        let channel = self.channel.into_inner();
        // Handing over is rare and each message is small: a blocking send, bounded, is simpler
        // than a queue, and the new lobby reads them as they come.
        let socket = SockRef::from(&channel);
        if let Err(e) =
            socket.set_nonblocking(false).and_then(|()| socket.set_write_timeout(Some(HANDOVER_SEND_TIMEOUT)))
        {
            warning!("the channel to the new maitred: {e}; idle connections may be closed instead of handed over");
        }
        // The child is not waited for: once this lobby exits, it is the service's main process.
        std::mem::forget(self.child);
        Successor { pid, channel, handed: std::cell::Cell::new(0) }
    }
}

/// The new lobby, serving; this one hands it its idle connections as it drains.
pub(crate) struct Successor {
    pub(crate) pid: i32,
    channel: OwnedFd,
    handed: std::cell::Cell<u64>,
}

impl Successor {
    /// Sends an idle connection, with what the new lobby needs to serve it as this one would.
    /// Only a connection that `Sleeper::can_move` is given; if it cannot be sent, it is closed,
    /// as a shutdown would.
    pub(crate) fn hand_over(&self, sleeper: Sleeper) {
        debug_assert!(sleeper.can_move(), "a TLS or PROXY protocol connection stays in the old lobby");
        let kind = match sleeper.kind {
            StreamKind::Tcp => "tcp",
            StreamKind::Unix => "unix",
        };
        let patience = sleeper.deadline.saturating_duration_since(Instant::now()).as_millis();
        let message =
            format!("{kind} {} {patience} {} {}", sleeper.answered, sleeper.site.server_port, sleeper.site.server_name);
        let sent = maitred_sys::fdpass::send_with_fd(
            self.channel.as_raw_fd(),
            &[IoSlice::new(message.as_bytes())],
            sleeper.socket.as_raw_fd(),
            0,
        );
        match sent {
            Ok(_) => self.handed.set(self.handed.get() + 1),
            Err(e) => {
                warning_limited!(
                    "closing an idle connection from {} instead of handing it over: {e}",
                    sleeper.peer.display()
                )
            }
        }
        // This lobby's copy of the socket closes here, and the connection's place with it.
    }

    /// Tells the new lobby that it is the service's main process now.
    pub(crate) fn confirm_main(&self) {
        if let Err(e) = maitred_sys::fdpass::send(self.channel.as_raw_fd(), &[IoSlice::new(MAIN)], 0) {
            warning!("cannot tell the new maitred that it is the main process: {e}");
        }
    }

    pub(crate) fn handed(&self) -> u64 {
        self.handed.get()
    }
}
