//! The lobby's side of the control channel to the zygote (docs/PROTOCOL.md, section 1), and
//! the zygotes themselves: the CLI forks the first; a reload with `--preload` has the lobby start
//! a fresh one, which imports the application anew, and retire the old one once the new
//! workers serve.

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::Stdio;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use socket2::SockRef;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

pub use maitred_wire::zygote::Exit;
use maitred_wire::zygote::{self, Order};

use crate::config::Config;
use crate::process::spawn;

/// The longest report the zygote sends (`failed` with its message) fits in this.
const MAX_REPORT: usize = 4096;

/// A message from the zygote, with the descriptors that came with it.
#[derive(Debug)]
pub enum Report {
    /// A worker, with its channels, one per thread (docs/PROTOCOL.md, section 4).
    Spawned {
        slot: usize,
        pid: i32,
        channels: Vec<OwnedFd>,
    },
    Exited {
        pid: i32,
        how: Exit,
    },
    PreloadFailed(String),
}

/// The variable that tells the `maitred` command to be a zygote on this control channel
/// (read by `maitred.cli`).
pub const ZYGOTE_CHANNEL_VARIABLE: &str = "MAITRED_ZYGOTE_FD";
/// How long a message to the zygote may wait for room in its channel. The zygote reads its
/// channel between forks, which take milliseconds; one that reads nothing for this long is
/// stopped or wedged.
const SEND_WITHIN: Duration = Duration::from_secs(10);
/// How often a retired zygote is looked for, until it has exited.
const REAP_POLL: Duration = Duration::from_millis(100);

/// A zygote: its pid and its control channel.
#[derive(Clone)]
pub struct Zygote {
    pub pid: i32,
    pub control: Rc<Control>,
}

impl Zygote {
    /// Starts a fresh zygote: `command` (the one maitred was started with, from `directory`)
    /// told to be a zygote on the channel it is given. It reads the settings and imports the
    /// application as the first one did.
    pub fn start(command: &[String], directory: &std::path::Path) -> io::Result<Zygote> {
        let (ours, theirs) = spawn::seqpacket_pair()?;
        let theirs_raw = theirs.as_raw_fd();
        let mut child = spawn::command_keeping(command, vec![theirs_raw])?;
        child.current_dir(directory).env(ZYGOTE_CHANNEL_VARIABLE, theirs_raw.to_string()).stdin(Stdio::null());
        let child = child.spawn()?;
        let pid = child.id() as i32;
        // Reaped with waitpid, as the first zygote is (`reaped`).
        maitred_sys::process::waited_for(pid);
        std::mem::forget(child);
        Ok(Zygote { pid, control: Rc::new(Control::new(ours)?) })
    }
}

/// The zygote that forks workers now, and retired ones that have not exited yet.
pub struct Zygotes {
    serving: RefCell<Zygote>,
    retired: RefCell<Vec<i32>>,
    /// The workers maitred sent SIGKILL, until the zygote reports their exit: a SIGKILL not
    /// among them came from outside, probably the kernel's OOM killer.
    killed: RefCell<HashSet<i32>>,
}

impl Zygotes {
    pub fn new(first: Zygote) -> Zygotes {
        Zygotes { serving: RefCell::new(first), retired: RefCell::new(Vec::new()), killed: RefCell::default() }
    }

    pub fn serving(&self) -> Zygote {
        self.serving.borrow().clone()
    }

    /// Makes `new` the zygote that forks workers; returns the one it replaces.
    pub fn replace(&self, new: Zygote) -> Zygote {
        std::mem::replace(&mut *self.serving.borrow_mut(), new)
    }

    /// Signals a worker through the serving zygote. A retired zygote's workers are its own to
    /// stop: it kills those still running --graceful-timeout after it was retired.
    pub async fn kill(&self, pid: i32, signal: i32) -> io::Result<()> {
        self.kill_through(&self.serving().control, pid, signal).await
    }

    /// Signals a worker through the zygote `control` leads to (a reload's own, when the worker
    /// is one of its).
    pub async fn kill_through(&self, control: &Control, pid: i32, signal: i32) -> io::Result<()> {
        if signal == libc::SIGKILL {
            // Before the send: the zygote may report the exit before this task runs again.
            self.killed.borrow_mut().insert(pid);
        }
        control.kill(pid, signal).await
    }

    /// Whether maitred sent worker `pid` SIGKILL.
    pub fn sent_sigkill(&self, pid: i32) -> bool {
        self.killed.borrow().contains(&pid)
    }

    /// The zygote reported worker `pid`'s exit: whether maitred had sent it SIGKILL, which it
    /// now forgets (the pid may be reused).
    pub fn exit_reported(&self, pid: i32) -> bool {
        self.killed.borrow_mut().remove(&pid)
    }

    /// Closes a zygote's channel: it exits once its workers have (killing them after its
    /// --graceful-timeout). It is reaped in the background; `reap_all` waits for what is left.
    pub fn retire(self: &Rc<Self>, zygote: Zygote) {
        zygote.control.close();
        self.retired.borrow_mut().push(zygote.pid);
        let zygotes = self.clone();
        tokio::task::spawn_local(async move {
            while !reaped(zygote.pid) {
                tokio::time::sleep(REAP_POLL).await;
            }
            zygotes.retired.borrow_mut().retain(|pid| *pid != zygote.pid);
        });
    }

    /// The retired zygotes not yet reaped.
    pub fn retired(&self) -> Vec<i32> {
        self.retired.borrow().clone()
    }
}

/// Whether the child `pid` has exited (and is reaped now).
pub fn reaped(pid: i32) -> bool {
    maitred_sys::process::reaped(pid)
}

/// The SOCK_SEQPACKET control channel: one datagram per message.
pub struct Control {
    socket: AsyncFd<OwnedFd>,
}

impl Control {
    pub fn new(socket: OwnedFd) -> io::Result<Control> {
        SockRef::from(&socket).set_nonblocking(true)?;
        let socket = maitred_sys::reactor::register(socket)?;
        Ok(Control { socket })
    }

    /// Asks for a worker with `threads` threads; `workers` is how many the lobby keeps serving
    /// (for the hooks' `server.num_workers`).
    pub async fn spawn(&self, slot: usize, workers: usize, settings: &Config) -> io::Result<()> {
        self.send(Order::Spawn { slot, workers, threads: settings.threads }).await
    }

    pub async fn kill(&self, pid: i32, signal: i32) -> io::Result<()> {
        self.send(Order::Kill { pid, signal }).await
    }

    /// Asks the zygote to reopen its error log and to have every worker reopen theirs (SIGUSR1).
    pub async fn reopen_logs(&self) -> io::Result<()> {
        self.send(Order::Reopen).await
    }

    /// Sets the zygote's log level, which the workers it forks from now on inherit.
    pub async fn set_log_level(&self, level: crate::log::Level) -> io::Result<()> {
        self.send(Order::Level(level.name().into())).await
    }

    /// Tells the zygote to finish: it exits once its workers have.
    pub fn close(&self) {
        let _ = SockRef::from(self.socket.get_ref()).shutdown(std::net::Shutdown::Both);
    }

    /// Sends one message; an error when the zygote has taken no message for `SEND_WITHIN`
    /// (its end of the pair full), so that no caller waits on it without end.
    async fn send(&self, order: Order) -> io::Result<()> {
        let message = order.encode();
        let sending = self.socket.async_io(Interest::WRITABLE, |socket| {
            maitred_sys::socket::send(socket.as_fd(), message.as_bytes(), false).map(drop)
        });
        tokio::time::timeout(SEND_WITHIN, sending).await.unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the zygote has read no message for {} s", SEND_WITHIN.as_secs()),
            ))
        })
    }

    /// The next report, or None when the zygote has gone away.
    pub async fn receive(&self) -> io::Result<Option<Report>> {
        let mut buf = BytesMut::with_capacity(MAX_REPORT);
        let mut fds = VecDeque::new();
        let len = self
            .socket
            .async_io(Interest::READABLE, |socket| {
                Ok(maitred_sys::fdpass::recv_into(socket.as_raw_fd(), &mut buf, &mut fds, 0)?)
            })
            .await?;
        if len == 0 {
            return Ok(None);
        }
        parse_report(&buf, fds.into()).map(Some)
    }
}

fn parse_report(message: &[u8], fds: Vec<OwnedFd>) -> io::Result<Report> {
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, format!("from the zygote: {why}"));
    match zygote::Report::decode(message).map_err(|malformed| bad(malformed.to_string()))? {
        zygote::Report::Spawned { slot, pid } if !fds.is_empty() => Ok(Report::Spawned { slot, pid, channels: fds }),
        zygote::Report::Spawned { slot, pid } => {
            Err(bad(format!("worker {pid} for slot {slot} came without channels")))
        }
        zygote::Report::Exited { pid, how } => Ok(Report::Exited { pid, how }),
        zygote::Report::Failed(why) => Ok(Report::PreloadFailed(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_reports() {
        let null = || -> OwnedFd { std::fs::File::open("/dev/null").unwrap().into() };
        match parse_report(b"spawned 2 4321", vec![null(), null()]).unwrap() {
            Report::Spawned { slot: 2, pid: 4321, channels } => assert_eq!(channels.len(), 2),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_report(b"exited 4321 signal 9", Vec::new()).unwrap(),
            Report::Exited { pid: 4321, how: Exit::Signal(9) }
        ));
        assert!(matches!(
            parse_report(b"exited 4321 code 0", Vec::new()).unwrap(),
            Report::Exited { pid: 4321, how: Exit::Code(0) }
        ));
        match parse_report(b"failed cannot import 'x': No module named 'x'", Vec::new()).unwrap() {
            Report::PreloadFailed(message) => assert_eq!(message, "cannot import 'x': No module named 'x'"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_malformed_reports() {
        assert!(parse_report(b"spawned 2 4321", Vec::new()).is_err());
        assert!(parse_report(b"exited 1 dumped 3", Vec::new()).is_err());
        assert!(parse_report(b"hello", Vec::new()).is_err());
    }
}
