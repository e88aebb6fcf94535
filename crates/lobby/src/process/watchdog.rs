//! The lobby's own watchdog (`--lobby-timeout`, docs/SIGNALS.md, "A stalled lobby"): a thread
//! beside the event loop that ends the lobby once the loop has made no progress for that long,
//! naming where its thread is, so that systemd, Kubernetes or any supervisor starts a new one
//! (the workers and the zygote follow the lobby out, as when it is killed). A stalled loop
//! answers nothing, logs nothing and takes no signal, not even SIGTERM (issue 46): without this
//! it stays so for good.
//!
//! Progress is a heartbeat: a task on the loop counts a beat every `BEAT`. The watchdog looks
//! every `LOOK`; a look that finds the count where it was adds the time since the last look to
//! the stall, one that finds it moved ends the stall. The watchdog counts only time it has seen
//! pass: a look that comes later than `LATE_LOOK` counts nothing, because a process stopped
//! (SIGSTOP, a frozen cgroup, a debugger) or starved of CPU stops the watchdog too, and its
//! loop cannot be blamed for time nobody ran. So a stopped-and-continued lobby, or one under a
//! CPU quota of 0.1, never reaches the bound; docs/SIGNALS.md gives the measurements behind
//! the default.
//!
//! The loop's lateness at each beat (how long after its time the beat ran) is kept as the
//! longest seen, for the stats listener: how close a healthy lobby comes to the bound.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::time::MissedTickBehavior;

use crate::log::{self, Level};

/// How often the loop beats.
const BEAT: Duration = Duration::from_secs(1);
/// How often the watchdog looks at the beats.
const LOOK: Duration = Duration::from_secs(1);
/// A look this late counts nothing: the watchdog itself did not run meanwhile.
const LATE_LOOK: Duration = Duration::from_secs(2);
/// How long the watchdog waits for the stalled thread to give its stack.
const STACK_WITHIN: Duration = Duration::from_secs(2);
/// How long the watchdog waits for the log to write its lines before the process ends.
const LOG_WITHIN: Duration = Duration::from_secs(2);
/// The most frames of the stalled thread's stack the log shows.
const SHOWN_FRAMES: usize = 40;
/// The exit code of a lobby the watchdog ended (EX_SOFTWARE, sysexits.h).
pub const STALLED_EXIT_CODE: i32 = 70;

/// What the loop and the watchdog share.
#[derive(Default)]
struct Shared {
    beats: AtomicU64,
    /// The loop's longest lateness at a beat, in microseconds.
    longest_late_us: AtomicU64,
    /// The longest stall the watchdog counted, in milliseconds.
    longest_stall_ms: AtomicU64,
    /// The looks the watchdog has taken.
    looks: AtomicU64,
    ended: AtomicBool,
}

/// The watchdog of the lobby's event loop, from `start` to `stop`.
#[derive(Clone)]
pub struct Watchdog {
    shared: Arc<Shared>,
}

/// The readings the stats listener shows.
#[derive(Clone, Copy, Default)]
pub struct Readings {
    /// How late the loop's heartbeat ran, at the most, since the start.
    pub longest_late: Duration,
    /// The longest the watchdog saw the loop make no progress.
    pub longest_stall: Duration,
    /// The looks the watchdog has taken: a test of a negative waits for the next ones.
    pub looks: u64,
}

impl Watchdog {
    /// Starts the watchdog thread for the calling thread, the one that runs the event loop,
    /// ending the process once it has made no progress for `limit`. The loop's heartbeat is
    /// `heartbeat()`, to be spawned on it.
    pub fn start(limit: Duration) -> std::io::Result<Watchdog> {
        maitred_sys::stack::install_capture()?;
        let shared = Arc::new(Shared::default());
        let loop_thread = maitred_sys::stack::thread_id();
        let watched = shared.clone();
        std::thread::Builder::new().name("maitred-watchdog".into()).spawn(move || {
            log::block_terminal_signals();
            watch(&watched, limit, loop_thread);
        })?;
        Ok(Watchdog { shared })
    }

    /// The task that beats on the event loop.
    pub fn heartbeat(&self) -> impl std::future::Future<Output = ()> + 'static {
        let shared = self.shared.clone();
        async move {
            let mut beats = tokio::time::interval(BEAT);
            beats.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                let due = beats.tick().await;
                let late = due.elapsed().as_micros() as u64;
                shared.longest_late_us.fetch_max(late, Ordering::Relaxed);
                shared.beats.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn readings(&self) -> Readings {
        Readings {
            longest_late: Duration::from_micros(self.shared.longest_late_us.load(Ordering::Relaxed)),
            longest_stall: Duration::from_millis(self.shared.longest_stall_ms.load(Ordering::Relaxed)),
            looks: self.shared.looks.load(Ordering::Relaxed),
        }
    }

    /// The loop has ended (the lobby stops): the watchdog stops watching.
    pub fn stop(&self) {
        self.shared.ended.store(true, Ordering::Relaxed);
    }
}

/// The watchdog thread's loop.
fn watch(shared: &Shared, limit: Duration, loop_thread: i32) {
    let mut seen = shared.beats.load(Ordering::Relaxed);
    let mut stall = Duration::ZERO;
    let mut cpu_at_last_beat = thread_cpu(loop_thread);
    let mut last_look = Instant::now();
    while !shared.ended.load(Ordering::Relaxed) {
        std::thread::sleep(LOOK);
        let now = Instant::now();
        let since = now.duration_since(last_look);
        last_look = now;
        let beats = shared.beats.load(Ordering::Relaxed);
        shared.looks.fetch_add(1, Ordering::Relaxed);
        if beats != seen {
            seen = beats;
            stall = Duration::ZERO;
            cpu_at_last_beat = thread_cpu(loop_thread);
            continue;
        }
        if since < LATE_LOOK {
            stall += since;
        }
        shared.longest_stall_ms.fetch_max(stall.as_millis() as u64, Ordering::Relaxed);
        if stall >= limit && !shared.ended.load(Ordering::Relaxed) {
            end_stalled(stall, limit, loop_thread, cpu_at_last_beat);
        }
    }
}

/// Says where the stalled thread is, and ends the process.
fn end_stalled(stall: Duration, limit: Duration, loop_thread: i32, cpu_at_last_beat: Option<Duration>) -> ! {
    let state = thread_state(loop_thread);
    let cpu = match (cpu_at_last_beat, thread_cpu(loop_thread)) {
        (Some(before), Some(now)) => format!(", {:.1} s of CPU since its last heartbeat", (now - before).as_secs_f64()),
        _ => String::new(),
    };
    let stack = match maitred_sys::stack::frames_of(loop_thread, STACK_WITHIN) {
        Some(frames) => format!("; its stack, innermost first:\n{}", describe(&frames)),
        None => format!("; its stack could not be taken within {} s", STACK_WITHIN.as_secs()),
    };
    log::write(
        Level::Critical,
        format_args!(
            "the lobby's event loop has made no progress for {:.1} s (--lobby-timeout {}): it answers no request and \
             takes no signal. Its thread {loop_thread} {state}{cpu}. Exiting with code {STALLED_EXIT_CODE}, for the \
             service manager to start maitred again{stack}",
            stall.as_secs_f64(),
            limit.as_secs_f64(),
        ),
    );
    log::flush(LOG_WITHIN);
    maitred_sys::stack::exit_now(STALLED_EXIT_CODE)
}

/// One line per frame: the function and where it is, as far as the binary's symbols say.
/// The frames of the capture itself (its signal handler, and the kernel's return from it, which
/// has no symbol) are left out; at most `SHOWN_FRAMES` follow.
fn describe(frames: &[usize]) -> String {
    let named = |ip: usize| {
        let mut name = String::new();
        backtrace::resolve(ip as *mut std::ffi::c_void, |symbol| {
            if let Some(found) = symbol.name() {
                name.push_str(&format!("{found:#}"));
            }
        });
        name
    };
    let handler = frames.iter().position(|&ip| named(ip).contains("on_capture_signal"));
    let frames = handler.map_or(frames, |at| frames.get(at + 2..).unwrap_or_default());
    let mut lines = Vec::new();
    for (number, &ip) in frames.iter().take(SHOWN_FRAMES).enumerate() {
        let mut names = Vec::new();
        backtrace::resolve(ip as *mut std::ffi::c_void, |symbol| {
            let name = symbol.name().map_or_else(|| "?".to_string(), |name| format!("{name:#}"));
            let place = match (symbol.filename(), symbol.lineno()) {
                (Some(file), Some(line)) => format!(" at {}:{line}", file.display()),
                _ => String::new(),
            };
            names.push(format!("{name}{place}"));
        });
        if names.is_empty() {
            names.push(format!("{ip:#x}"));
        }
        for name in names {
            lines.push(format!("  #{number} {name}"));
        }
    }
    lines.join("\n")
}

/// "is running (R)", "is waiting (S) in system call 232, at ep_poll", from /proc.
fn thread_state(thread: i32) -> String {
    let task = format!("/proc/self/task/{thread}");
    let state = std::fs::read_to_string(format!("{task}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string)))
        .unwrap_or_else(|| "?".into());
    let syscall = std::fs::read_to_string(format!("{task}/syscall")).unwrap_or_default();
    let wchan = std::fs::read_to_string(format!("{task}/wchan")).unwrap_or_default();
    match state.as_str() {
        "R" => "is running, not waiting (state R)".into(),
        _ => {
            let call = syscall.split_whitespace().next().filter(|call| call.parse::<i64>().is_ok());
            let call = call.map(|call| format!(" in system call {call}")).unwrap_or_default();
            let at = if wchan.is_empty() || wchan == "0" { String::new() } else { format!(", at {wchan}") };
            format!("is waiting (state {state}){call}{at}")
        }
    }
}

/// The CPU time the thread has used (user and system), from /proc.
fn thread_cpu(thread: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{thread}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of the line, utime 14 and stime 15.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / maitred_sys::limits::clock_ticks_per_second() as f64))
}

/// The variable that arms `wedge_on_signal`: `spin` or `block`.
pub const WEDGE_VARIABLE: &str = "MAITRED_TEST_WEDGE";

/// For testing the watchdog only (docs/SIGNALS.md, "A stalled lobby"): with `MAITRED_TEST_WEDGE`
/// set to `spin` or `block` in its environment, the lobby wedges its event loop on
/// `SIGRTMIN + 5`: its thread then runs a loop that never yields, or sleeps for ever, as the
/// loops and waits of issue 46 did. Without the variable, nothing listens for the signal.
pub fn wedge_on_signal() -> Option<impl std::future::Future<Output = ()> + 'static> {
    let how = std::env::var(WEDGE_VARIABLE).ok()?;
    let spin = match how.as_str() {
        "spin" => true,
        "block" => false,
        other => {
            log::write(Level::Warning, format_args!("{WEDGE_VARIABLE}={other:?} is neither spin nor block; ignored"));
            return None;
        }
    };
    Some(async move {
        let kind = tokio::signal::unix::SignalKind::from_raw(libc::SIGRTMIN() + 5);
        let Ok(mut signal) = tokio::signal::unix::signal(kind) else { return };
        signal.recv().await;
        log::write(Level::Warning, format_args!("{WEDGE_VARIABLE}={how}: wedging the event loop, as asked"));
        if spin {
            loop {
                std::hint::spin_loop();
            }
        }
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    })
}
