//! Telling a service manager how the lobby is doing: systemd's notify protocol (sd_notify(3)),
//! for `Type=notify` units. docs/SYSTEMD.md says what is sent when.
//!
//! It is off unless NOTIFY_SOCKET is set. Then the lobby sends `READY=1` once its workers serve,
//! `STOPPING=1` when a shutdown begins, `RELOADING=1` and `READY=1` around a reload, a `STATUS=`
//! line when the figures change (at most one a second), and, when WATCHDOG_USEC is set for this
//! process, `WATCHDOG=1` at half that interval from a task on the event loop, so that a loop that
//! stops turning stops the heartbeat too. The zygote and the workers never see these variables:
//! the CLI removes them from the zygote's environment (python/maitred/config/service_manager.py).
//!
//! A few lines over a std `UnixDatagram` rather than the `sd-notify` crate: that crate opens a
//! blocking socket for each message, so a manager slow to read would stall the event loop, and
//! it takes an `@` name for a path. Here one non-blocking socket serves the whole run (a message
//! the manager has no room for is dropped, with a rate-limited line in the log) and abstract
//! names work.

use std::ffi::OsStr;
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::{interval, Instant, MissedTickBehavior};

use crate::log::{info, warning, warning_limited};
use crate::seating::Seating;

/// At most one `STATUS=` line in this long, and only when it has changed.
const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// Where the server is in its life, for `STATUS=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Starting = 0,
    Serving = 1,
    Reloading = 2,
    Stopping = 3,
}

impl Phase {
    fn from_u8(value: u8) -> Phase {
        match value {
            0 => Phase::Starting,
            1 => Phase::Serving,
            2 => Phase::Reloading,
            _ => Phase::Stopping,
        }
    }
}

/// The service manager's socket, and what it asked for.
struct Notifier {
    socket: UnixDatagram,
    address: SocketAddr,
    /// NOTIFY_SOCKET as given, for the log.
    name: String,
    /// How often to send `WATCHDOG=1`: half of WATCHDOG_USEC.
    watchdog: Option<Duration>,
    phase: AtomicU8,
    /// Wakes the heartbeat to send a fresh `STATUS=` at once.
    changed: Notify,
}

static NOTIFIER: OnceLock<Option<Notifier>> = OnceLock::new();

/// The notifier, made from the environment on first use; None when nobody listens.
fn notifier() -> Option<&'static Notifier> {
    NOTIFIER
        .get_or_init(|| {
            let socket = std::env::var_os("NOTIFY_SOCKET")?;
            let watchdog = watchdog_interval(
                std::env::var_os("WATCHDOG_USEC").as_deref(),
                std::env::var_os("WATCHDOG_PID").as_deref(),
                std::process::id(),
            );
            match Notifier::new(&socket, watchdog) {
                Ok(notifier) => Some(notifier),
                Err(e) => {
                    warning!("NOTIFY_SOCKET={}: {e}; not notifying the service manager", socket.to_string_lossy());
                    None
                }
            }
        })
        .as_ref()
}

impl Notifier {
    fn new(socket_name: &OsStr, watchdog: Option<Duration>) -> io::Result<Notifier> {
        let address = notify_address(socket_name)?;
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(Notifier {
            socket,
            address,
            name: socket_name.to_string_lossy().into_owned(),
            watchdog,
            phase: AtomicU8::new(Phase::Starting as u8),
            changed: Notify::new(),
        })
    }

    fn send(&self, message: &str) {
        if let Err(e) = self.socket.send_to_addr(message.as_bytes(), &self.address) {
            let first = message.lines().next().unwrap_or_default();
            warning_limited!("cannot notify the service manager at {} ({first}): {e}", self.name);
        }
    }

    fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Relaxed))
    }

    /// Sends `message` and moves to `phase`, with a fresh `STATUS=` right after.
    fn enter(&self, phase: Phase, message: &str) {
        self.phase.store(phase as u8, Ordering::Relaxed);
        self.send(message);
        self.changed.notify_one();
    }
}

/// NOTIFY_SOCKET's address: an absolute path, or `@name` in the abstract namespace.
fn notify_address(name: &OsStr) -> io::Result<SocketAddr> {
    let bytes = name.as_bytes();
    match bytes.first() {
        Some(b'/') => SocketAddr::from_pathname(name),
        Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..]),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "neither an absolute path nor an @name (maitred speaks the notify protocol over Unix sockets only)",
        )),
    }
}

/// Half of WATCHDOG_USEC, when it is set, valid, and meant for `pid` (WATCHDOG_PID, if set, names
/// the process it is for, as sd_watchdog_enabled(3) checks).
fn watchdog_interval(usec: Option<&OsStr>, for_pid: Option<&OsStr>, pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.to_str()?.parse().ok().filter(|usec| *usec > 0)?;
    if let Some(for_pid) = for_pid {
        if for_pid.to_str().and_then(|p| p.parse::<u32>().ok()) != Some(pid) {
            return None;
        }
    }
    Some(Duration::from_micros(usec) / 2)
}

/// Starts telling the service manager how the lobby is doing, if one listens: the `STATUS=`
/// lines and the watchdog's heartbeat, from a task on the event loop. Call once, as the lobby
/// starts (on the event loop: it spawns a local task).
pub(crate) fn watch(standing: Standing) {
    let Some(notifier) = notifier() else { return };
    match notifier.watchdog {
        Some(every) => info!(
            "notifying the service manager at NOTIFY_SOCKET={}; watchdog every {} ms",
            notifier.name,
            every.as_millis()
        ),
        None => info!("notifying the service manager at NOTIFY_SOCKET={}", notifier.name),
    }
    tokio::task::spawn_local(heartbeat(notifier, standing));
}

/// What the `STATUS=` line is read from.
#[derive(Clone)]
pub(crate) struct Standing {
    pub seating: Rc<Seating>,
    /// Turns true once a shutdown has begun.
    pub shutdown: watch::Receiver<bool>,
    /// `--workers` as the lobby started: how many the start waits for.
    pub workers: usize,
}

/// `READY=1`: the server serves. Sent as the lobby starts serving, and again when a reload
/// (`reloading`) is complete.
pub fn ready() {
    if let Some(notifier) = notifier() {
        notifier.enter(Phase::Serving, "READY=1");
    }
}

/// `RELOADING=1` with `MONOTONIC_USEC=`, as a reload begins; `ready` ends it.
pub fn reloading() {
    if let Some(notifier) = notifier() {
        notifier.enter(Phase::Reloading, &format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()));
    }
}

/// `MAINPID=`: after a binary upgrade (SIGUSR2), the new lobby is the service's main process.
pub fn main_pid(pid: i32) {
    if let Some(notifier) = notifier() {
        notifier.send(&format!("MAINPID={pid}"));
    }
}

/// `STOPPING=1`, as a shutdown begins.
pub fn stopping() {
    if let Some(notifier) = notifier() {
        notifier.enter(Phase::Stopping, "STOPPING=1");
    }
}

/// CLOCK_MONOTONIC in microseconds, the clock systemd compares MONOTONIC_USEC with.
fn monotonic_usec() -> u64 {
    maitred_sys::limits::monotonic_usec()
}

/// One line for `systemctl status`: "serving, 4 workers (3 idle), 0 queued".
fn status(phase: Phase, standing: &Standing) -> String {
    let workers = standing.seating.workers();
    let idle = standing.seating.idle();
    let queued = standing.seating.waiting();
    let phase = if *standing.shutdown.borrow() { Phase::Stopping } else { phase };
    match phase {
        Phase::Starting => format!("starting: {workers} of {} ready", count(standing.workers, "worker")),
        Phase::Serving => format!("serving, {} ({idle} idle), {queued} queued", count(workers, "worker")),
        Phase::Reloading => format!("reloading, {} ({idle} idle), {queued} queued", count(workers, "worker")),
        Phase::Stopping => format!("stopping: {} busy, {queued} queued", count(workers.saturating_sub(idle), "worker")),
    }
}

/// "1 worker", "4 workers".
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Sends `STATUS=` when it changes (at most once per `STATUS_INTERVAL`, or at once after
/// `ready`, `reloading` or `stopping`) and `WATCHDOG=1` on time, until the runtime is dropped.
async fn heartbeat(notifier: &'static Notifier, standing: Standing) {
    let mut statuses = interval(STATUS_INTERVAL);
    statuses.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Without a watchdog this timer is never polled.
    let mut watchdog = interval(notifier.watchdog.unwrap_or(Duration::from_secs(3600)));
    watchdog.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last = String::new();
    loop {
        tokio::select! {
            _ = watchdog.tick(), if notifier.watchdog.is_some() => {
                notifier.send("WATCHDOG=1");
                continue;
            }
            _ = statuses.tick() => {}
            _ = notifier.changed.notified() => statuses.reset_at(Instant::now() + STATUS_INTERVAL),
        }
        let now = status(notifier.phase(), &standing);
        if now != last {
            notifier.send(&format!("STATUS={now}"));
            last = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(text: &str) -> Option<&OsStr> {
        Some(OsStr::new(text))
    }

    #[test]
    fn the_watchdog_runs_at_half_its_interval_for_this_process_only() {
        assert_eq!(watchdog_interval(os("10000000"), None, 7), Some(Duration::from_secs(5)));
        assert_eq!(watchdog_interval(os("10000000"), os("7"), 7), Some(Duration::from_secs(5)));
        assert_eq!(watchdog_interval(os("10000000"), os("8"), 7), None);
        assert_eq!(watchdog_interval(os("10000000"), os("x"), 7), None);
        assert_eq!(watchdog_interval(os("0"), None, 7), None);
        assert_eq!(watchdog_interval(os("soon"), None, 7), None);
        assert_eq!(watchdog_interval(None, os("7"), 7), None);
    }

    #[test]
    fn sends_to_a_path_and_to_an_abstract_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let receiver = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::new(path.as_os_str(), None).unwrap();
        notifier.enter(Phase::Serving, "READY=1");
        let mut buf = [0u8; 256];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        assert_eq!(notifier.phase(), Phase::Serving);

        let name = format!("maitred-notify-test-{}", std::process::id());
        let receiver = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        let notifier = Notifier::new(OsStr::new(&format!("@{name}")), None).unwrap();
        notifier.send("STOPPING=1");
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }

    #[test]
    fn a_relative_name_is_refused() {
        assert!(notify_address(OsStr::new("notify.sock")).is_err());
        assert!(notify_address(OsStr::new("")).is_err());
    }

    #[test]
    fn a_full_socket_drops_the_message_instead_of_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let _receiver = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::new(path.as_os_str(), None).unwrap();
        // Nobody reads: the queue fills, and each send after that returns at once.
        let started = std::time::Instant::now();
        for _ in 0..5000 {
            notifier.send("WATCHDOG=1");
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
