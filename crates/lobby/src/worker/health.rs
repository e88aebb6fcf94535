//! Whether a worker can take a request, and what it was doing when it could not
//! (docs/SIGNALS.md, "--timeout and worker health").

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;

use crate::log::{error, warning};
use crate::worker::context::Context;

/// How long a worker waiting for a request may have been idle before the lobby looks at its
/// state when a request comes for it. A worker that sent the last frame of an answer less than
/// this ago, on any of its seats, was running then; one idle for longer may have been stopped
/// (SIGSTOP) meanwhile, and a request seated at it would wait for --timeout. The worker's
/// idleness, not a seat's: the lobby seats a request at the longest-idle seat, so with one
/// client each of an event loop's 64 seats (`-w 2`) waits 64 requests between two, 13 ms at
/// A1-c1's rate, and every request was looked at.
///
/// The look is one pread(2) of /proc/PID/stat on a descriptor opened when the worker started:
/// 3.4, 4.8 and 3.8 µs in three runs of 1,000,000 looks at a sleeping process, on two cores
/// shared with other builds (load 4.8; `cargo test -p maitred-lobby --release -- --ignored
/// stat_read_cost --nocapture`), against 23-30 µs of lobby CPU per request (PERFORMANCE.md).
/// Under load workers are not idle this long (the queue or an offer hands them the next
/// request as they answer), so the look costs nothing there; and as a worker is looked at at
/// most once per this interval, N workers idle between requests spend at most
/// N × 100 × 5 µs a second on it: 0.05 % of a core per worker.
/// What it leaves open: a request that comes less than this after the lobby read the end of
/// the worker's last answer is seated without a look, and waits for --timeout if the worker
/// was stopped in between.
pub const LOOK_AFTER_IDLE: Duration = Duration::from_millis(10);

/// How long the lobby gives a worker that timed out to write its stack before it kills it.
const DUMP_GRACE: Duration = Duration::from_secs(1);

/// How often, during `DUMP_GRACE`, the lobby looks whether the worker is done writing.
const DUMP_POLL: Duration = Duration::from_millis(20);

/// How long the lobby waits for its own line saying a stack follows to be written, before it
/// asks for the stack anyway (a log far behind its writer: the line comes later).
const LINE_FIRST: Duration = Duration::from_millis(200);

/// How often, during `LINE_FIRST`, the lobby looks whether its log has caught up.
const LINE_POLL: Duration = Duration::from_millis(2);

/// The signal that makes a worker write every thread's Python stack to the error log
/// (faulthandler, from the C signal handler). The worker asks `maitred._native.STACK_SIGNAL`.
pub fn stack_signal() -> i32 {
    libc::SIGRTMIN() + 2
}

/// A worker's /proc/PID/stat, opened once. The descriptor stays bound to that process: once it
/// has been reaped reads fail, so a pid used again is never mistaken for it.
pub struct ProcStat(Option<File>);

impl ProcStat {
    /// Without /proc (or where it cannot be read) the worker is taken to be running.
    pub fn open(pid: i32) -> ProcStat {
        ProcStat(File::open(format!("/proc/{pid}/stat")).ok())
    }

    /// The stat of thread `thread` of process `pid`: its state is the thread's own.
    pub fn of_thread(pid: i32, thread: i32) -> ProcStat {
        ProcStat(File::open(format!("/proc/{pid}/task/{thread}/stat")).ok())
    }

    /// The state letter (`R`, `S`, `D`, `T` stopped, `t` stopped by a tracer, `Z`…), or None
    /// when it cannot be read (the process is gone, or there is no /proc).
    pub fn state(&self) -> Option<u8> {
        let file = self.0.as_ref()?;
        // "pid (comm) state …": comm is at most 16 bytes but may hold ')' and spaces, so the
        // state follows the last ')'. 512 bytes hold every field up to it.
        let mut buf = [0u8; 512];
        let n = file.read_at(&mut buf, 0).ok()?;
        let line = &buf[..n];
        let close = line.iter().rposition(|&b| b == b')')?;
        line.get(close + 2).copied()
    }

    /// Stopped by a signal (`T`: SIGSTOP, SIGTSTP): it reads no request until it is
    /// continued. A process held by a tracer (`t`) is not: a sampling profiler (py-spy) holds
    /// it for a millisecond or so at a time, and a worker replaced then would be lost to the
    /// profiler; a debugger that holds one for good leaves its request to --timeout.
    pub fn is_stopped(&self) -> bool {
        self.state() == Some(b'T')
    }

    /// Still a process, not yet a zombie.
    pub fn is_alive(&self) -> bool {
        matches!(self.state(), Some(state) if state != b'Z' && state != b'X')
    }
}

/// Bytes the worker has written so far, all threads (/proc/PID/io, `wchar`).
fn written(pid: i32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines().find_map(|line| line.strip_prefix("wchar: ")).and_then(|count| count.trim().parse().ok())
}

/// Has the worker write its Python stack to the error log, and waits until it has: until
/// what it has written stopped growing after the signal (two looks `DUMP_POLL` apart), or
/// `DUMP_GRACE` at most. The lobby's lines queued before (the one saying why) are written
/// first; this task writes nothing in between, so its own lines do not land inside the stack.
/// A stopped worker writes nothing until it is continued: that one costs the whole grace.
pub async fn dump_stack(context: &Context, pid: i32) {
    let line_deadline = Instant::now() + LINE_FIRST;
    while !crate::log::error_log_written() && Instant::now() < line_deadline {
        tokio::time::sleep(LINE_POLL).await;
    }
    let before = written(pid);
    if let Err(e) = context.zygotes.kill(pid, stack_signal()).await {
        warning!("could not ask the zygote to have worker {pid} write its stack: {e}");
        return;
    }
    let deadline = Instant::now() + DUMP_GRACE;
    let mut last = before;
    while Instant::now() < deadline {
        tokio::time::sleep(DUMP_POLL).await;
        let now = written(pid);
        // Unreadable (no /proc, or the worker is gone): wait out the grace, or stop at once.
        if now.is_none() && before.is_some() {
            return;
        }
        if now.is_some() && now > before && now == last {
            return;
        }
        last = now;
    }
}

/// How long a worker sent SIGABRT at --timeout (its worker_abort hook) has to exit before it is
/// killed.
const ABORT_GRACE: Duration = Duration::from_secs(1);

/// How often, during `ABORT_GRACE`, the lobby looks whether the worker has exited.
const ABORT_POLL: Duration = Duration::from_millis(10);

/// Sends SIGABRT to a worker that timed out, as gunicorn does, so that its worker_abort hook
/// runs, and waits until it has exited, `ABORT_GRACE` at most. A worker stuck where no Python
/// runs (a C call holding the GIL) costs the whole grace, and is killed after it.
pub async fn abort(context: &Context, pid: i32) {
    let stat = ProcStat::open(pid);
    if let Err(e) = context.zygotes.kill(pid, libc::SIGABRT).await {
        warning!("could not ask the zygote to send SIGABRT to worker {pid}: {e}");
        return;
    }
    let deadline = Instant::now() + ABORT_GRACE;
    while stat.is_alive() && Instant::now() < deadline {
        tokio::time::sleep(ABORT_POLL).await;
    }
}

/// Ends a worker past --timeout: SIGABRT first when it has a worker_abort hook (`abort`), then
/// SIGKILL.
pub async fn end(context: &Context, pid: i32) {
    if context.abort_on_timeout {
        abort(context, pid).await;
    }
    if let Err(e) = context.zygotes.kill(pid, libc::SIGKILL).await {
        error!("could not ask the zygote to kill worker {pid}: {e}");
    }
}

/// How long a request sent to an idle worker may stay unread on its channel before the lobby
/// looks whether the worker is wedged: alive, but its main thread never gets to read (another
/// thread holds the GIL in a C call, a deadlock in a signal handler). A healthy idle worker
/// reads a request within microseconds of its arrival; this is long enough that no load makes
/// one wait so, and short against --timeout's 30 s.
pub const READ_WITHIN: Duration = Duration::from_secs(2);

/// How long the lobby waits for a worker it stopped to be seen stopped.
const STOP_SEEN_WITHIN: Duration = Duration::from_millis(500);
const STOP_POLL: Duration = Duration::from_millis(5);

/// Whether a worker that has not answered a request `READ_WITHIN` after it was sent on its
/// channel never read the whole of it, and so never started it: then the request may go to
/// another worker.
///
/// The worker reads the request on its main thread, holding the GIL, and calls the
/// application only once the whole frame is in (crates/python/src/channel/receive.rs): while bytes of
/// it are still in the channel (`SIOCOUTQ`), the application has not been called. To be sure
/// it cannot start meanwhile, the worker is stopped (SIGSTOP) and seen stopped before the
/// bytes are counted. The lobby continues (SIGCONT) a worker it stopped itself when it read the
/// request, which then waits for --timeout like any slow request, and, with `keep`, one that did
/// not (its other threads have requests to finish); never one that someone else had stopped
/// (`kill -STOP` to look at it). `channel` is the lobby's end of the worker's channel.
pub async fn never_read(context: &Context, pid: i32, channel: BorrowedFd<'_>, keep: bool) -> bool {
    if maitred_sys::socket::unsent_bytes(channel).is_none_or(|unsent| unsent == 0) {
        return false;
    }
    let stat = ProcStat::open(pid);
    let stopped_before = stat.is_stopped();
    if context.zygotes.kill(pid, libc::SIGSTOP).await.is_err() {
        return false;
    }
    let deadline = Instant::now() + STOP_SEEN_WITHIN;
    while !stat.is_stopped() && Instant::now() < deadline {
        tokio::time::sleep(STOP_POLL).await;
    }
    let unread = stat.is_stopped() && maitred_sys::socket::unsent_bytes(channel).is_some_and(|unsent| unsent > 0);
    if !stopped_before && (keep || !unread) {
        let _ = context.zygotes.kill(pid, libc::SIGCONT).await;
    }
    unread
}

/// Kills a worker found stopped once it has had `bound` to be continued and exit: its channel
/// is closed, so a continued worker exits by itself. Someone who stopped it to look at it
/// (`kill -STOP`, then gdb or py-spy) has that long. A shutdown kills it at once: the zygote
/// waits for its children, and the lobby no longer counts this one among its workers.
pub fn kill_if_still_there(context: Rc<Context>, pid: i32, stat: ProcStat, bound: Duration) {
    tokio::task::spawn_local(async move {
        let mut shutdown = context.shutdown.clone();
        let why = tokio::select! {
            _ = tokio::time::sleep(bound) => format!("{} s after it was found stopped", bound.as_secs_f64()),
            _ = shutdown.wait_for(|stopping| *stopping) => "at the shutdown".to_string(),
        };
        if stat.is_alive() {
            warning!("worker {pid} was still there {why}; killing it");
            if let Err(e) = context.zygotes.kill(pid, libc::SIGKILL).await {
                crate::log::error!("could not ask the zygote to kill worker {pid}: {e}");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_state() {
        let stat = ProcStat::open(std::process::id() as i32);
        // The test harness's main thread waits for this one.
        assert!(matches!(stat.state(), Some(b'R' | b'S')));
        assert!(!stat.is_stopped());
        assert!(stat.is_alive());
    }

    #[test]
    fn a_stopped_child_is_stopped_and_a_reaped_one_is_gone() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id() as i32;
        let stat = ProcStat::open(pid);
        maitred_sys::process::kill(pid, libc::SIGSTOP).unwrap();
        let stopped = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(5));
            stat.is_stopped()
        });
        assert!(stopped);
        assert!(stat.is_alive());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(stat.state(), None);
        assert!(!stat.is_alive());
    }

    /// The figure in LOOK_AFTER_IDLE's comment.
    #[test]
    #[ignore]
    fn stat_read_cost() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let stat = ProcStat::open(child.id() as i32);
        let rounds = 1_000_000;
        let started = std::time::Instant::now();
        for _ in 0..rounds {
            assert_eq!(stat.state(), Some(b'S'));
        }
        let each = started.elapsed() / rounds;
        child.kill().unwrap();
        child.wait().unwrap();
        println!("one look at /proc/PID/stat: {each:?}");
    }
}
