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
//!
//! The files: `sink.rs` is a log's bounded queue and writer thread, `limited.rs` the rate
//! limit's windows, `access.rs` the access log and `access_format.rs` its line format, `text.rs`
//! the dates and escaping every line uses. The words they share (the levels) are here.
//!
//! It imports nothing of the lobby's: every other part may log.

mod access;
pub(crate) mod access_format;
mod limited;
mod sink;
mod text;

use std::cell::Cell;
use std::time::{Duration, Instant, SystemTime};

pub use access::{access, access_log_enabled, open_access_log, reopen_access_log};
pub use access_format::AccessRecord;
pub use limited::Site;
use sink::{error_log, Sink, ERROR_LOG_MODE};
use text::format_line;

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

    pub(super) fn label(self) -> &'static str {
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
        None => sink::write_to_stderr(&line),
    }
}

macro_rules! debug { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($arg)*)) } }
macro_rules! info { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($arg)*)) } }
macro_rules! warning { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Warning, format_args!($($arg)*)) } }
macro_rules! error { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($arg)*)) } }
pub(crate) use {debug, error, info, warning};

/// The rate-limited forms, for lines that may come once per request or per connection:
/// each call site writes its first few lines of each 10 s, then one line with how many more.
macro_rules! rate_limited {
    ($level:ident, $($arg:tt)*) => {{
        static SITE: $crate::log::Site = $crate::log::Site::new();
        $crate::log::write_limited(&SITE, $crate::log::Level::$level, format_args!($($arg)*))
    }};
}
macro_rules! info_limited { ($($arg:tt)*) => { $crate::log::rate_limited!(Info, $($arg)*) } }
macro_rules! warning_limited { ($($arg:tt)*) => { $crate::log::rate_limited!(Warning, $($arg)*) } }
macro_rules! error_limited { ($($arg:tt)*) => { $crate::log::rate_limited!(Error, $($arg)*) } }
#[allow(unused_imports)]
pub(crate) use {error_limited, info_limited, rate_limited, warning_limited};

/// Waits, until `timeout` has passed at most, for both logs to write what they hold; the
/// rate-limited call sites write their counts first. For the end of the process: lines still
/// queued then are lost.
pub fn flush(timeout: Duration) {
    let deadline = Instant::now() + timeout;
    // The access log's writer reports its drops in the error log: it goes first.
    if let Some(sink) = access::sink() {
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
    error_log().is_none_or(Sink::caught_up)
}

/// Reopens the error log (standard error, which the CLI pointed at `--error-logfile`) at
/// `path`, for SIGUSR1: after a rotation that renamed the file, the lines queued from now on go
/// to a new file there. A failure is written in the log.
pub fn reopen_error_log(path: &str) {
    match error_log() {
        Some(sink) => sink.reopen(path, ERROR_LOG_MODE),
        None => {
            if let Err(e) = sink::reopen_onto(path, sink::stderr(), ERROR_LOG_MODE) {
                error!("SIGUSR1: cannot reopen {path}: {e}; writing on to the old file");
            }
        }
    }
}

/// Blocks SIGTTOU and SIGTTIN in the calling thread. A process in the background of a job-
/// control shell with `stty tostop` is sent SIGTTOU when it writes to the terminal; the lobby
/// handles SIGTTOU (one worker fewer), and the kernel would restart the write after the handler
/// and send the signal again, without end. A thread that blocks the signal writes through.
/// Threads that may write to a terminal call this (the logs' writers, the config re-read).
pub(crate) fn block_terminal_signals() {
    maitred_sys::process::block_in_this_thread(&[libc::SIGTTOU, libc::SIGTTIN]);
}

/// Writes a line from a rate-limited call site (`info_limited!` and the like): the first
/// `RATE_BURST` of each `RATE_WINDOW` are written; when the window ends, one line says how
/// many more there were.
pub fn write_limited(site: &'static Site, level: Level, message: std::fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    match error_log() {
        Some(sink) => sink.write_limited(site, level, message),
        None => write(level, message),
    }
}
