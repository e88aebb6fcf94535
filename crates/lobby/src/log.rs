//! The error log and the access log.
//!
//! The error log goes to standard error (the CLI has pointed it at `--error-logfile`) in the
//! same format as the Python side (python/maitred/log.py), so the lobby, the zygote and the
//! workers write one story: `[2026-11-22 05:30:00 +0000] [1234] [INFO] message`.
//!
//! Logging never blocks the event loop (docs/LIMITS.md, "Logs"). A line is formatted on the
//! lobby's thread and put in a bounded queue; a writer thread of its own, one per log, takes
//! the lines out and writes them. When the destination stops taking them (a pipe nobody
//! reads), the queue fills, later lines are dropped and counted, and once the destination
//! takes lines again the count is written: "N log lines dropped while the log was not being
//! read". A quarter of the error log's queue is kept for lines that are not about one request
//! (start, worker exits, shutdown) and for the counts.
//!
//! Lines that a client can cause at will (refusals, cut connections, failed accepts) are also
//! rate-limited where they are written (`info_limited!` and its siblings): the first few of
//! each 10 s are written, then one line says how many more there were.
//!
//! SIGUSR1 reopens both logs at their paths (`reopen_error_log`, `reopen_access_log`). The
//! reopening takes its place in the log's queue: the writer writes the lines queued before it to
//! the old file, then opens the new one in the place of the old under the same descriptor, and
//! writes the lines queued after it there. No line is lost, and none lands in the wrong file.

use std::cell::Cell;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::access_format::AccessFormat;

/// Bytes of lines a log holds while its destination does not take them.
const QUEUE_BYTES: usize = 1 << 20;
/// Of those, what lines about one request (and debug lines) may fill; the rest is kept for
/// lifecycle lines and the counts.
const ORDINARY_BYTES: usize = QUEUE_BYTES / 4 * 3;
/// What a queued line costs besides its text: its place in the queue and its allocation.
const LINE_OVERHEAD: usize = 32;
/// One write(2) takes whole lines up to this many bytes: PIPE_BUF, what a pipe writes at
/// once, so lines stay whole when the other processes of maitred write to the same pipe.
const WRITE_BATCH: usize = 4096;
/// How long a writer that has just written waits for more lines before it sleeps until woken.
const LINGER: Duration = Duration::from_millis(5);
/// A rate-limited call site writes its first `RATE_BURST` lines of each `RATE_WINDOW`.
const RATE_WINDOW: Duration = Duration::from_secs(10);
const RATE_BURST: u32 = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Warning,
    Error,
    Critical,
}

impl Level {
    pub fn parse(name: &str) -> Option<Level> {
        Some(match name.to_ascii_lowercase().as_str() {
            "debug" => Level::Debug,
            "info" => Level::Info,
            "warning" => Level::Warning,
            "error" => Level::Error,
            "critical" => Level::Critical,
            _ => return None,
        })
    }

    /// The name `parse` reads, as the CLI and the zygote spell it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Error => "error",
            Level::Critical => "critical",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warning => "WARNING",
            Level::Error => "ERROR",
            Level::Critical => "CRITICAL",
        }
    }
}

thread_local! {
    static THRESHOLD: Cell<Level> = const { Cell::new(Level::Info) };
}

/// Sets the lowest level that is written (on the lobby's thread).
pub fn set_level(level: Level) {
    THRESHOLD.with(|t| t.set(level));
}

pub fn enabled(level: Level) -> bool {
    THRESHOLD.with(|t| level >= t.get())
}

/// Writes one line to the error log if `level` passes the threshold.
pub fn write(level: Level, message: std::fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let line = format_line(SystemTime::now(), level, message);
    match error_log() {
        // Debug lines may come once per request: they do not get the lifecycle lines' room.
        Some(sink) => sink.push(line, level > Level::Debug),
        None => {
            let _ = write_all(stderr(), line.as_bytes());
        }
    }
}

fn format_line(time: SystemTime, level: Level, message: impl std::fmt::Display) -> String {
    format!("[{}] [{}] [{}] {}\n", timestamp(time), std::process::id(), level.label(), message)
}

macro_rules! debug { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($arg)*)) } }
macro_rules! info { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($arg)*)) } }
macro_rules! warning { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Warning, format_args!($($arg)*)) } }
macro_rules! error { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($arg)*)) } }
pub(crate) use {debug, error, info, warning};

/// The rate-limited forms, for lines that may come once per request or per connection:
/// each call site writes its first few lines of each 10 s, then one line with how many more.
macro_rules! limited {
    ($level:ident, $($arg:tt)*) => {{
        static SITE: $crate::log::Site = $crate::log::Site::new();
        $crate::log::write_limited(&SITE, $crate::log::Level::$level, format_args!($($arg)*))
    }};
}
macro_rules! info_limited { ($($arg:tt)*) => { $crate::log::limited!(Info, $($arg)*) } }
macro_rules! warning_limited { ($($arg:tt)*) => { $crate::log::limited!(Warning, $($arg)*) } }
macro_rules! error_limited { ($($arg:tt)*) => { $crate::log::limited!(Error, $($arg)*) } }
#[allow(unused_imports)]
pub(crate) use {error_limited, info_limited, limited, warning_limited};

/// A rate-limited call site: its window's place in the error log's state, once it has one.
pub struct Site {
    index: AtomicUsize,
}

impl Site {
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Site {
        Site { index: AtomicUsize::new(usize::MAX) }
    }
}

/// One call site's current window: what it wrote and what it left out.
struct Window {
    level: Level,
    /// When the window began (both clocks: one to measure, one to print); None between windows.
    began: Option<(Instant, SystemTime)>,
    written: u32,
    suppressed: u64,
    /// The window's first message, which the summary quotes.
    example: String,
}

impl Window {
    /// The summary of a window that ends at `now` (at the latest at its full length), if it
    /// left anything out; the window is closed either way.
    fn close(&mut self, now: Instant) -> Option<String> {
        let (began, wall) = self.began.take()?;
        let suppressed = std::mem::take(&mut self.suppressed);
        self.written = 0;
        if suppressed == 0 {
            return None;
        }
        let length = now.saturating_duration_since(began).min(RATE_WINDOW);
        let message =
            format!("… and {} more like \"{}\" in the last {} s", grouped(suppressed), self.example, seconds(length));
        Some(format_line(wall + length, self.level, message))
    }

    fn due(&self) -> Option<Instant> {
        self.began.filter(|_| self.suppressed > 0).map(|(began, _)| began + RATE_WINDOW)
    }
}

/// Writes a line from a rate-limited call site (`info_limited!` and the like): the first
/// `RATE_BURST` of each `RATE_WINDOW` are written; when the window ends, one line says how
/// many more there were.
pub fn write_limited(site: &'static Site, level: Level, message: std::fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let Some(sink) = error_log() else { return write(level, message) };
    let now = Instant::now();
    let mut queue = sink.lock();
    let index = match site.index.load(Ordering::Relaxed) {
        usize::MAX => {
            let index = queue.windows.len();
            queue.windows.push(Window { level, began: None, written: 0, suppressed: 0, example: String::new() });
            site.index.store(index, Ordering::Relaxed);
            index
        }
        index => index,
    };
    let window = &mut queue.windows[index];
    if window.began.is_some_and(|(began, _)| now >= began + RATE_WINDOW) {
        if let Some(summary) = window.close(now) {
            sink.enqueue(&mut queue, summary, true);
        }
    }
    let window = &mut queue.windows[index];
    let wall = match window.began {
        Some(_) => SystemTime::now(),
        None => {
            let wall = SystemTime::now();
            window.began = Some((now, wall));
            wall
        }
    };
    if window.written < RATE_BURST {
        window.written += 1;
        let message = message.to_string();
        let line = format_line(wall, level, &message);
        if window.written == 1 {
            window.example = message;
        }
        sink.enqueue(&mut queue, line, false);
    } else {
        window.suppressed += 1;
        if window.suppressed == 1 {
            // The writer times the summary: it must hear of the window if it is waiting.
            sink.wake_writer(&mut queue);
        }
    }
}

/// A log's destination: the queue and its writer thread.
struct Sink {
    queue: Mutex<Queue>,
    /// The writer waits here for lines, or for a rate-limit window to end.
    wake: Condvar,
    /// `flush` waits here for the writer to catch up.
    caught_up: Condvar,
    /// What the lines that do not get the reserved room may fill.
    ordinary_bytes: usize,
}

#[derive(Default)]
struct Queue {
    lines: VecDeque<String>,
    bytes: usize,
    /// Lines dropped since the writer last took the queue.
    dropped: u64,
    /// The writer is waiting on `wake`.
    writer_waiting: bool,
    /// The writer is writing lines it took from the queue.
    writing: bool,
    /// The error log's rate-limited call sites, by `Site::index`.
    windows: Vec<Window>,
    /// A reopening asked for (SIGUSR1): after how many of the queued lines, and of which path.
    reopen: Option<(usize, String, u32)>,
}

/// Where a log's writer reports what it had to drop, or could not reopen.
#[derive(Clone, Copy)]
enum DropReport {
    /// In its own destination: the error log.
    Here,
    /// In the error log: the access log.
    ErrorLog,
}

impl Sink {
    /// Starts a writer thread for `fd`, which stays open for the life of the process.
    fn start(fd: BorrowedFd<'static>, ordinary_bytes: usize, report: DropReport) -> io::Result<&'static Sink> {
        let sink: &'static Sink = Box::leak(Box::new(Sink {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            caught_up: Condvar::new(),
            ordinary_bytes,
        }));
        std::thread::Builder::new().name("maitred-log".into()).spawn(move || {
            block_terminal_signals();
            sink.drain(fd, report)
        })?;
        Ok(sink)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a line, or drops and counts it if there is no room. `reserved`: the line may
    /// use the whole queue, not only the ordinary part.
    fn push(&self, line: String, reserved: bool) {
        let mut queue = self.lock();
        self.enqueue(&mut queue, line, reserved);
    }

    fn enqueue(&self, queue: &mut Queue, line: String, reserved: bool) {
        let room = if reserved { QUEUE_BYTES } else { self.ordinary_bytes };
        let cost = line.len() + LINE_OVERHEAD;
        if queue.bytes + cost > room {
            queue.dropped += 1;
        } else {
            queue.bytes += cost;
            queue.lines.push_back(line);
        }
        self.wake_writer(queue);
    }

    fn wake_writer(&self, queue: &mut Queue) {
        if std::mem::take(&mut queue.writer_waiting) {
            self.wake.notify_one();
        }
    }

    /// The writer thread: takes what is queued, writes it, reports what was dropped; and
    /// between lines, writes the summaries of rate-limit windows as they end.
    fn drain(&self, fd: BorrowedFd<'_>, report: DropReport) {
        let mut batch = VecDeque::new();
        // The writer has waited `LINGER` since it last found the queue empty.
        let mut lingered = true;
        loop {
            let (dropped, reopen) = {
                let mut queue = self.lock();
                queue.writing = false;
                loop {
                    let now = Instant::now();
                    let mut next_due: Option<Instant> = None;
                    for index in 0..queue.windows.len() {
                        match queue.windows[index].due() {
                            Some(due) if due <= now => {
                                if let Some(summary) = queue.windows[index].close(now) {
                                    self.enqueue(&mut queue, summary, true);
                                }
                            }
                            Some(due) => next_due = Some(next_due.map_or(due, |next| next.min(due))),
                            None => {}
                        }
                    }
                    if !queue.lines.is_empty() || queue.dropped > 0 || queue.reopen.is_some() {
                        break;
                    }
                    self.caught_up.notify_all();
                    if !std::mem::replace(&mut lingered, true) {
                        // Under load, waiting a moment before taking the next lines saves
                        // a wake-up (and a write) per line; the callers do not wake it meanwhile.
                        let wait = next_due.map_or(LINGER, |due| due.saturating_duration_since(now).min(LINGER));
                        queue = self.wake.wait_timeout(queue, wait).unwrap_or_else(|p| p.into_inner()).0;
                        continue;
                    }
                    queue.writer_waiting = true;
                    queue = match next_due {
                        Some(due) => {
                            let wait = due.saturating_duration_since(now);
                            self.wake.wait_timeout(queue, wait).unwrap_or_else(|p| p.into_inner()).0
                        }
                        None => self.wake.wait(queue).unwrap_or_else(|p| p.into_inner()),
                    };
                    queue.writer_waiting = false;
                }
                lingered = false;
                std::mem::swap(&mut batch, &mut queue.lines);
                queue.bytes = 0;
                queue.writing = true;
                (std::mem::take(&mut queue.dropped), queue.reopen.take())
            };
            // A destination that fails for good (closed, full disk) loses the lines: there
            // is nowhere else to say so.
            if let Some((before, path, mode)) = reopen {
                let _ = write_lines(fd, batch.drain(..before.min(batch.len())));
                if let Err(e) = reopen_onto(&path, fd, mode) {
                    let message = format!("SIGUSR1: cannot reopen {path}: {e}; writing on to the old file");
                    self.report(fd, report, Level::Error, message);
                }
            }
            let _ = write_lines(fd, batch.drain(..));
            if dropped > 0 {
                let message = match report {
                    DropReport::Here => {
                        format!("{} log lines dropped while the log was not being read", grouped(dropped))
                    }
                    DropReport::ErrorLog => {
                        format!("{} access log lines dropped while the access log was not being read", grouped(dropped))
                    }
                };
                self.report(fd, report, Level::Warning, message);
            }
        }
    }

    /// A line of the writer's own: written here (the error log), or queued in the error log.
    fn report(&self, fd: BorrowedFd<'_>, report: DropReport, level: Level, message: String) {
        let line = format_line(SystemTime::now(), level, message);
        match report {
            DropReport::Here => {
                let _ = write_all(fd, line.as_bytes());
            }
            DropReport::ErrorLog => {
                if let Some(sink) = error_log() {
                    sink.push(line, true);
                }
            }
        }
    }

    /// Asks the writer to reopen its destination at `path` once it has written the lines
    /// queued now (SIGUSR1).
    fn reopen(&self, path: &str, mode: u32) {
        let mut queue = self.lock();
        if queue.reopen.is_none() {
            let before = queue.lines.len();
            queue.reopen = Some((before, path.to_string(), mode));
        }
        self.wake_writer(&mut queue);
    }

    /// Closes the rate-limit windows early, and waits until the writer has written everything
    /// or `deadline` passes.
    fn flush(&self, deadline: Instant) {
        let mut queue = self.lock();
        let now = Instant::now();
        for index in 0..queue.windows.len() {
            if let Some(summary) = queue.windows[index].close(now) {
                self.enqueue(&mut queue, summary, true);
            }
        }
        while !queue.lines.is_empty() || queue.dropped > 0 || queue.reopen.is_some() || queue.writing {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            self.wake_writer(&mut queue);
            queue = self.caught_up.wait_timeout(queue, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// Writes lines, several per write(2) as long as they fit in `WRITE_BATCH` bytes.
fn write_lines(fd: BorrowedFd<'_>, lines: impl Iterator<Item = String>) -> io::Result<()> {
    let mut buffer = Vec::with_capacity(WRITE_BATCH);
    for line in lines {
        if !buffer.is_empty() && buffer.len() + line.len() > WRITE_BATCH {
            write_all(fd, &buffer)?;
            buffer.clear();
        }
        if line.len() >= WRITE_BATCH {
            write_all(fd, line.as_bytes())?;
        } else {
            buffer.extend_from_slice(line.as_bytes());
        }
    }
    if !buffer.is_empty() {
        write_all(fd, &buffer)?;
    }
    Ok(())
}

/// Writes everything, waiting as long as it takes: this runs on a log's own thread. The
/// descriptor may have been made non-blocking by another process that shares it.
fn write_all(fd: BorrowedFd<'_>, bytes: &[u8]) -> io::Result<()> {
    maitred_sys::fd::write_all_waiting(fd, bytes)
}

/// Standard error, where the CLI has put the error log, for the life of the process.
fn stderr() -> BorrowedFd<'static> {
    static STDERR: OnceLock<std::io::Stderr> = OnceLock::new();
    STDERR.get_or_init(std::io::stderr).as_fd()
}

/// The error log's queue and writer, started with the first line; None if no thread could be
/// started, and then lines are written directly, as a last resort.
fn error_log() -> Option<&'static Sink> {
    static ERROR_LOG: OnceLock<Option<&'static Sink>> = OnceLock::new();
    *ERROR_LOG.get_or_init(|| Sink::start(stderr(), ORDINARY_BYTES, DropReport::Here).ok())
}

static ACCESS_LOG: OnceLock<&'static Sink> = OnceLock::new();

/// Waits, until `timeout` has passed at most, for both logs to write what they hold; the
/// rate-limited call sites write their counts first. For the end of the process: lines still
/// queued then are lost.
pub fn flush(timeout: Duration) {
    let deadline = Instant::now() + timeout;
    // The access log's writer reports its drops in the error log: it goes first.
    if let Some(sink) = ACCESS_LOG.get() {
        sink.flush(deadline);
    }
    if let Some(sink) = error_log() {
        sink.flush(deadline);
    }
}

/// Whether the error log's writer has written every line queued so far. For a line that must
/// be in the log before another process writes there (a worker's stack, `health::dump_stack`);
/// the caller waits by looking again, as the event loop must not wait on the writer.
pub fn error_log_written() -> bool {
    error_log().is_none_or(|sink| {
        let queue = sink.lock();
        queue.lines.is_empty() && !queue.writing && queue.dropped == 0 && queue.reopen.is_none()
    })
}

/// The access log's path, when it is a file, for `reopen_access_log`.
static ACCESS_FILE: OnceLock<String> = OnceLock::new();

/// Opens the access log: `-` is standard output. Lines are appended.
pub fn open_access_log(target: &str) -> io::Result<()> {
    let file = if target == "-" {
        File::from(std::io::stdout().as_fd().try_clone_to_owned()?)
    } else {
        open_log_file(target, ACCESS_LOG_MODE)?
    };
    // The file stays open, for its writer, for the life of the process.
    let file: &'static File = Box::leak(Box::new(file));
    let fd = file.as_fd();
    let sink = Sink::start(fd, QUEUE_BYTES, DropReport::ErrorLog)?;
    ACCESS_LOG.set(sink).map_err(|_| io::Error::other("the access log is already open"))?;
    if target != "-" {
        let _ = ACCESS_FILE.set(target.to_string());
    }
    Ok(())
}

/// The permissions a new log file gets (before the umask): the error log's are the CLI's
/// (python/maitred/cli.py), the access log's std's default.
const ERROR_LOG_MODE: u32 = 0o644;
const ACCESS_LOG_MODE: u32 = 0o666;

fn open_log_file(path: &str, mode: u32) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new().create(true).append(true).mode(mode).open(path)
}

/// Opens `path` again (creating it) and puts it in the place of descriptor `fd`: whoever
/// writes to `fd` writes to the new file from the next write on.
fn reopen_onto(path: &str, fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let file = open_log_file(path, mode)?;
    // `fd` stays open for the life of the process; `file` closes its own when dropped.
    maitred_sys::fd::replace(fd, file.as_fd())
}

/// Reopens the error log (standard error, which the CLI pointed at `--error-logfile`) at
/// `path`, for SIGUSR1: after a rotation that renamed the file, the lines queued from now on go
/// to a new file there. A failure is written in the log.
pub fn reopen_error_log(path: &str) {
    match error_log() {
        Some(sink) => sink.reopen(path, ERROR_LOG_MODE),
        None => {
            if let Err(e) = reopen_onto(path, stderr(), ERROR_LOG_MODE) {
                error!("SIGUSR1: cannot reopen {path}: {e}; writing on to the old file");
            }
        }
    }
}

/// Reopens the access log at its path, as `reopen_error_log` does, if it is a file; returns
/// the path.
pub fn reopen_access_log() -> Option<&'static str> {
    let path = ACCESS_FILE.get()?;
    ACCESS_LOG.get()?.reopen(path, ACCESS_LOG_MODE);
    Some(path)
}

/// Blocks SIGTTOU and SIGTTIN in the calling thread. A process in the background of a job-
/// control shell with `stty tostop` is sent SIGTTOU when it writes to the terminal; the lobby
/// handles SIGTTOU (one worker fewer), and the kernel would restart the write after the handler
/// and send the signal again, without end. A thread that blocks the signal writes through.
/// Threads that may write to a terminal call this (the logs' writers, the config re-read).
pub(crate) fn block_terminal_signals() {
    maitred_sys::process::block_in_this_thread(&[libc::SIGTTOU, libc::SIGTTIN]);
}

pub fn access_log_enabled() -> bool {
    ACCESS_LOG.get().is_some()
}

pub use crate::access_format::AccessRecord;

/// Writes the access-log line for `record` in `format` (`--access-logformat`).
pub fn access(format: &AccessFormat, record: &AccessRecord<'_>) {
    let Some(sink) = ACCESS_LOG.get() else { return };
    let mut line = String::with_capacity(256);
    format.render(record, SystemTime::now(), Instant::now(), &mut line);
    sink.push(line, true);
}

/// `9,998`
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `10`, `3.2`
fn seconds(duration: Duration) -> String {
    let tenths = (duration.as_secs_f64() * 10.0).round() as u64;
    if tenths.is_multiple_of(10) {
        (tenths / 10).to_string()
    } else {
        format!("{}.{}", tenths / 10, tenths % 10)
    }
}

/// Makes request bytes safe for a log line: printable ASCII as is, `"` and `\\` behind a
/// backslash, everything else `\xHH`.
pub(crate) fn escape_into(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => {
                out.push_str("\\x");
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 0xf)] as char);
            }
        }
    }
}

/// A UTC calendar date and time.
pub(crate) struct Civil {
    pub(crate) year: i64,
    pub(crate) month: u32,
    pub(crate) day: u32,
    pub(crate) hour: u32,
    pub(crate) minute: u32,
    pub(crate) second: u32,
}

pub(crate) fn civil(time: SystemTime) -> Civil {
    let secs = time.duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    Civil { year, month, day, hour: (rem / 3600) as u32, minute: (rem / 60 % 60) as u32, second: (rem % 60) as u32 }
}

/// `2026-11-22 05:30:00 +0000`
fn timestamp(time: SystemTime) -> String {
    let c = civil(time);
    format!("{:04}-{:02}-{:02} {:02}:{:02}:{:02} +0000", c.year, c.month, c.day, c.hour, c.minute, c.second)
}

/// `22/Nov/2026:05:30:00 +0000`
pub(crate) fn clf_timestamp(time: SystemTime) -> String {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let c = civil(time);
    format!(
        "{:02}/{}/{:04}:{:02}:{:02}:{:02} +0000",
        c.day,
        MONTHS[c.month as usize - 1],
        c.year,
        c.hour,
        c.minute,
        c.second
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_timestamps_in_utc() {
        let t = UNIX_EPOCH + Duration::from_secs(1_795_325_400); // 2026-11-22 05:30:00 UTC
        assert_eq!(timestamp(t), "2026-11-22 05:30:00 +0000");
        assert_eq!(clf_timestamp(t), "22/Nov/2026:05:30:00 +0000");
        assert_eq!(timestamp(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29 00:00:00 +0000");
    }

    #[test]
    fn groups_thousands_and_rounds_seconds() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(9_998), "9,998");
        assert_eq!(grouped(1_234_567), "1,234,567");
        assert_eq!(seconds(Duration::from_secs(10)), "10");
        assert_eq!(seconds(Duration::from_millis(3_240)), "3.2");
    }

    #[test]
    fn a_window_sums_up_what_it_left_out() {
        let start = Instant::now();
        let wall = UNIX_EPOCH + Duration::from_secs(1_795_325_400);
        let mut window = Window {
            level: Level::Info,
            began: Some((start, wall)),
            written: RATE_BURST,
            suppressed: 9_995,
            example: "400 to 127.0.0.1:5000: bare LF".into(),
        };
        assert_eq!(window.due(), Some(start + RATE_WINDOW));
        // Written late, the summary still covers the window's 10 s and is stamped with its end.
        let summary = window.close(start + Duration::from_secs(25)).unwrap();
        assert!(summary.starts_with("[2026-11-22 05:30:10 +0000] ["), "{summary}");
        assert!(
            summary.ends_with("[INFO] … and 9,995 more like \"400 to 127.0.0.1:5000: bare LF\" in the last 10 s\n"),
            "{summary}"
        );
        assert_eq!((window.began, window.written, window.suppressed), (None, 0, 0));
        // A window that left nothing out ends without a line.
        window.began = Some((start, wall));
        window.written = 2;
        assert_eq!(window.due(), None);
        assert_eq!(window.close(start + RATE_WINDOW), None);
    }

    #[test]
    fn a_stalled_destination_costs_the_caller_nothing_and_the_drops_are_counted() {
        let (read_end, write_end) = io::pipe().unwrap();
        // The writer's descriptor stays open for the life of the test process, as in the lobby.
        let write_end: &'static io::PipeWriter = Box::leak(Box::new(write_end));
        let sink = Sink::start(write_end.as_fd(), ORDINARY_BYTES, DropReport::Here).unwrap();
        // Nobody reads: the pipe fills, then the queue, then lines are dropped, all at once.
        let sent = 3_000;
        let started = Instant::now();
        for n in 0..sent {
            sink.push(format!("line {n:05} {}\n", "x".repeat(1000)), false);
        }
        assert!(started.elapsed() < Duration::from_secs(2), "pushing took {:?}", started.elapsed());
        // Not `sink.lock().dropped > 0`: the writer takes the count with the queue, and may have
        // done so since the last drop. 3 MB against at most the queue, one batch taken from it
        // and the pipe's 64 KiB: some were dropped, and the report read below says how many.
        // Now the log is read: every line kept arrives whole, then the count of the others.
        let mut reader = io::BufReader::new(read_end);
        // The writer reports the drops it took with each batch: there may be several reports.
        let (mut kept, mut dropped) = (0u64, 0u64);
        let mut line = String::new();
        while kept + dropped < sent {
            line.clear();
            if reader.buffer().is_empty() {
                let ready = maitred_sys::fd::wait_readable(reader.get_ref().as_fd(), Some(Duration::from_secs(10)));
                assert!(ready.unwrap(), "nothing more to read after {kept} lines kept and {dropped} reported dropped");
            }
            assert!(io::BufRead::read_line(&mut reader, &mut line).unwrap() > 0);
            if let Some(count) = line.strip_suffix(" log lines dropped while the log was not being read\n") {
                dropped += count.rsplit("] ").next().unwrap().replace(',', "").parse::<u64>().unwrap();
                assert!(line.contains("[WARNING]"), "{line}");
            } else {
                assert!(line.starts_with("line ") && line.len() == 1_012, "{line:?}");
                kept += 1;
            }
        }
        assert_eq!(kept + dropped, sent);
        assert!(dropped > 0);
        assert!(kept as usize * 1_012 <= ORDINARY_BYTES + (1 << 20), "{kept} lines kept");
    }

    #[test]
    fn a_reopening_comes_between_the_lines_queued_before_and_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("maitred.log");
        let rotated = dir.path().join("maitred.log.1");
        let path_text = path.to_str().unwrap();
        // The writer's descriptor stays open for the life of the test process, as in the lobby.
        let file: &'static File = Box::leak(Box::new(open_log_file(path_text, ERROR_LOG_MODE).unwrap()));
        let fd = file.as_fd();
        let sink = Sink::start(fd, ORDINARY_BYTES, DropReport::Here).unwrap();
        sink.push("one\n".into(), true);
        sink.push("two\n".into(), true);
        std::fs::rename(&path, &rotated).unwrap();
        sink.reopen(path_text, ERROR_LOG_MODE);
        sink.push("three\n".into(), true);
        sink.flush(Instant::now() + Duration::from_secs(5));
        assert_eq!(std::fs::read_to_string(&rotated).unwrap(), "one\ntwo\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "three\n");
    }

    #[test]
    fn escapes_unsafe_bytes() {
        let mut out = String::new();
        escape_into(&mut out, b"GET /\"a\"\x01\xff HTTP/1.1");
        assert_eq!(out, "GET /\\\"a\\\"\\x01\\xff HTTP/1.1");
    }
}
