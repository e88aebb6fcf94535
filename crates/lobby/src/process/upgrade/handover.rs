//! The old lobby's side of a binary upgrade: starting the new maitred, waiting until it is
//! ready, then handing it each idle keep-alive connection with its state as it drains.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::process::{Child, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::{receive, Succession, UpgradeError, MAIN, READY, UPGRADE_CHANNEL_VARIABLE, UPGRADE_LISTENERS_VARIABLE};
use crate::client::asleep::{Sleeper, TakesIdleConnections};
use crate::client::peer::StreamKind;
use crate::log::{warning, warning_limited};
use crate::process::spawn::{self, seqpacket_pair};

/// How long the new maitred may take to start its workers and say it is ready.
pub(super) const READY_WITHIN: Duration = Duration::from_secs(60);

/// How long the connections waiting to be handed over may wait for the new maitred to take
/// them (its end of the pair full) before they are closed instead.
const HANDOVER_WITHIN: Duration = Duration::from_secs(1);

/// How long a new maitred that will not take over has to exit after SIGTERM, and after SIGKILL.
const STOP_WITHIN: Duration = Duration::from_secs(10);
/// How often the lobby looks whether it has.
const EXIT_POLL: Duration = Duration::from_millis(10);

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
        maitred_sys::process::waited_for(child.id() as i32);
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
            Ok(Ok(None)) => match self.exit_status(Duration::from_secs(1)).await {
                Some(status) => return Err(UpgradeError::Exited(status)),
                None => UpgradeError::Channel(io::Error::new(io::ErrorKind::UnexpectedEof, "it closed the channel")),
            },
            Ok(Err(e)) => UpgradeError::Channel(e),
            Err(_) => UpgradeError::NotReady,
        };
        self.stop().await;
        Err(failure)
    }

    /// The exit status, if the process ends within `within`. Looked for on the event loop's
    /// timer, never by sleeping its thread: the lobby serves meanwhile.
    async fn exit_status(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + within;
        loop {
            // Not `Child::try_wait`: as PID 1 the lobby reaps every child, and keeps this one's
            // status for here (maitred_sys::process::reap_any).
            match maitred_sys::process::exit_status(self.pid()) {
                Some(status) => return Some(status),
                None if Instant::now() < until => tokio::time::sleep(EXIT_POLL).await,
                None => return None,
            }
        }
    }

    /// Stops a new maitred that will not take over: SIGTERM (it stops its workers), then
    /// SIGKILL if it lingers; it is reaped once it has gone.
    pub(crate) async fn stop(&mut self) {
        // Our own child, which has not been reaped.
        let _ = maitred_sys::process::kill(self.pid(), libc::SIGTERM);
        if self.exit_status(STOP_WITHIN).await.is_none() {
            let _ = self.child.kill();
            self.exit_status(STOP_WITHIN).await;
        }
    }

    /// Makes the ready candidate the successor: it owns the listen sockets now too.
    pub(crate) fn into_successor(self) -> Successor {
        let pid = self.pid();
        // The child is not waited for: once this lobby exits, it is the service's main process.
        maitred_sys::process::not_waited_for(pid);
        std::mem::forget(self.child);
        let channel = Rc::new(self.channel);
        let waiting = Rc::new(RefCell::new(VecDeque::new()));
        let more = Rc::new(Notify::new());
        let handed = Rc::new(Cell::new(0));
        let sending =
            tokio::task::spawn_local(send_waiting(channel.clone(), waiting.clone(), more.clone(), handed.clone()));
        Successor { pid, channel, waiting, more, handed, sending }
    }
}

/// The new lobby, serving; this one hands it its idle connections as it drains.
pub(crate) struct Successor {
    pub(crate) pid: i32,
    channel: Rc<AsyncFd<OwnedFd>>,
    /// Connections to hand over, in order, while the pair is full.
    waiting: Rc<RefCell<VecDeque<Sleeper>>>,
    more: Rc<Notify>,
    handed: Rc<Cell<u64>>,
    sending: JoinHandle<()>,
}

impl Successor {
    /// Tells the new lobby that it is the service's main process now.
    pub(crate) fn confirm_main(&self) {
        let sent =
            maitred_sys::fdpass::send(self.channel.get_ref().as_raw_fd(), &[IoSlice::new(MAIN)], libc::MSG_DONTWAIT);
        if let Err(e) = sent {
            warning!("cannot tell the new maitred that it is the main process: {e}");
        }
    }

    pub(crate) fn handed(&self) -> u64 {
        self.handed.get()
    }
}

impl TakesIdleConnections for Successor {
    /// Hands an idle connection over, with what the new lobby needs to serve it as this one
    /// would: at once when the pair has room, else as soon as it has (`send_waiting`). Only a
    /// connection that `Sleeper::can_move` is given. Never waits: a send that would block
    /// (the new lobby busy, stopped, or starved of CPU) would hold this lobby's event loop, a
    /// second for each connection as it was (issue 46's list).
    fn hand_over(&self, sleeper: Sleeper) {
        debug_assert!(sleeper.can_move(), "a TLS or PROXY protocol connection stays in the old lobby");
        let mut waiting = self.waiting.borrow_mut();
        if waiting.is_empty() {
            match send_one(&self.channel, &sleeper) {
                Sent::Done => {
                    self.handed.set(self.handed.get() + 1);
                    return;
                }
                Sent::Failed => return,
                Sent::Full => {}
            }
        }
        waiting.push_back(sleeper);
        self.more.notify_one();
    }
}

impl Drop for Successor {
    /// The connections still waiting close here, with this lobby's end of the pair.
    fn drop(&mut self) {
        self.sending.abort();
        let left = self.waiting.borrow().len();
        if left > 0 {
            warning!("closing {left} idle connections the new maitred did not take in time");
        }
    }
}

/// How one send went.
enum Sent {
    Done,
    /// The pair has no room now.
    Full,
    /// The connection is closed instead (said in the log).
    Failed,
}

/// Sends one connection's state and socket without waiting.
fn send_one(channel: &AsyncFd<OwnedFd>, sleeper: &Sleeper) -> Sent {
    let kind = match sleeper.kind {
        StreamKind::Tcp => "tcp",
        StreamKind::Unix => "unix",
    };
    let patience = sleeper.deadline.saturating_duration_since(Instant::now()).as_millis();
    let message =
        format!("{kind} {} {patience} {} {}", sleeper.answered, sleeper.site.server_port, sleeper.site.server_name);
    let sent = maitred_sys::fdpass::send_with_fd(
        channel.get_ref().as_raw_fd(),
        &[IoSlice::new(message.as_bytes())],
        sleeper.socket.as_raw_fd(),
        libc::MSG_DONTWAIT,
    );
    match sent {
        Ok(_) => Sent::Done,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Sent::Full,
        Err(e) => {
            warning_limited!(
                "closing an idle connection from {} instead of handing it over: {e}",
                sleeper.peer.display()
            );
            Sent::Failed
        }
    }
}

/// Sends the connections waiting as the pair has room; those the new lobby does not take
/// within `HANDOVER_WITHIN` of the pair filling are closed. This lobby's copy of each socket
/// closes once it is sent, and its place under --max-connections with it.
async fn send_waiting(
    channel: Rc<AsyncFd<OwnedFd>>,
    waiting: Rc<RefCell<VecDeque<Sleeper>>>,
    more: Rc<Notify>,
    handed: Rc<Cell<u64>>,
) {
    loop {
        if waiting.borrow().is_empty() {
            more.notified().await;
            continue;
        }
        let room = tokio::time::timeout(HANDOVER_WITHIN, channel.writable()).await;
        let Ok(Ok(mut room)) = room else {
            let given_up = std::mem::take(&mut *waiting.borrow_mut());
            warning!(
                "the new maitred took no connection for {} s; closing {} idle connections instead of handing them \
                 over",
                HANDOVER_WITHIN.as_secs_f64(),
                given_up.len()
            );
            continue;
        };
        loop {
            let Some(sleeper) = waiting.borrow_mut().pop_front() else { break };
            match send_one(&channel, &sleeper) {
                Sent::Done => handed.set(handed.get() + 1),
                Sent::Failed => {}
                Sent::Full => {
                    waiting.borrow_mut().push_front(sleeper);
                    room.clear_ready();
                    break;
                }
            }
        }
    }
}
