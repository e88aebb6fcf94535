//! A log's destination: a bounded queue that the lobby's thread fills and a writer thread of
//! its own empties (docs/LIMITS.md, "Logs"). When the destination stops taking lines, the
//! queue fills, later lines are dropped and counted, and the count is written once it takes
//! lines again; a reopening (SIGUSR1) takes its place in the queue.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use super::limited::{Site, Window, RATE_BURST, RATE_WINDOW};
use super::text::{format_line, grouped};
use super::{block_terminal_signals, Level};

/// Bytes of lines a log holds while its destination does not take them.
pub(super) const QUEUE_BYTES: usize = 1 << 20;

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

/// A log's destination: the queue and its writer thread.
pub(super) struct Sink {
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
pub(super) enum DropReport {
    /// In its own destination: the error log.
    Here,
    /// In the error log: the access log.
    ErrorLog,
}

impl Sink {
    /// Starts a writer thread for `fd`, which stays open for the life of the process.
    pub(super) fn start(
        fd: BorrowedFd<'static>,
        ordinary_bytes: usize,
        report: DropReport,
    ) -> io::Result<&'static Sink> {
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
    pub(super) fn push(&self, line: String, reserved: bool) {
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
    pub(super) fn reopen(&self, path: &str, mode: u32) {
        let mut queue = self.lock();
        if queue.reopen.is_none() {
            let before = queue.lines.len();
            queue.reopen = Some((before, path.to_string(), mode));
        }
        self.wake_writer(&mut queue);
    }

    /// Closes the rate-limit windows early, and waits until the writer has written everything
    /// or `deadline` passes.
    pub(super) fn flush(&self, deadline: Instant) {
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

    /// Whether the writer has written every line queued so far.
    pub(super) fn caught_up(&self) -> bool {
        let queue = self.lock();
        queue.lines.is_empty() && !queue.writing && queue.dropped == 0 && queue.reopen.is_none()
    }

    /// A line from a rate-limited call site (`write_limited`).
    pub(super) fn write_limited(&self, site: &'static Site, level: Level, message: std::fmt::Arguments<'_>) {
        let now = Instant::now();
        let mut queue = self.lock();
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
                self.enqueue(&mut queue, summary, true);
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
            self.enqueue(&mut queue, line, false);
        } else {
            window.suppressed += 1;
            if window.suppressed == 1 {
                // The writer times the summary: it must hear of the window if it is waiting.
                self.wake_writer(&mut queue);
            }
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
pub(super) fn stderr() -> BorrowedFd<'static> {
    static STDERR: OnceLock<std::io::Stderr> = OnceLock::new();
    STDERR.get_or_init(std::io::stderr).as_fd()
}

/// The error log's queue and writer, started with the first line; None if no thread could be
/// started, and then lines are written directly, as a last resort.
pub(super) fn error_log() -> Option<&'static Sink> {
    static ERROR_LOG: OnceLock<Option<&'static Sink>> = OnceLock::new();
    *ERROR_LOG.get_or_init(|| Sink::start(stderr(), ORDINARY_BYTES, DropReport::Here).ok())
}

/// The permissions a new log file gets (before the umask): the error log's are the CLI's
/// (python/maitred/cli.py), the access log's std's default.
pub(super) const ERROR_LOG_MODE: u32 = 0o644;

pub(super) const ACCESS_LOG_MODE: u32 = 0o666;

pub(super) fn open_log_file(path: &str, mode: u32) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new().create(true).append(true).mode(mode).open(path)
}

/// Opens `path` again (creating it) and puts it in the place of descriptor `fd`: whoever
/// writes to `fd` writes to the new file from the next write on.
pub(super) fn reopen_onto(path: &str, fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    let file = open_log_file(path, mode)?;
    // `fd` stays open for the life of the process; `file` closes its own when dropped.
    maitred_sys::fd::replace(fd, file.as_fd())
}

/// Writes a line straight to standard error: when no writer thread could be started. On the
/// event loop's thread, so it waits for room a moment at most: a destination that takes
/// nothing loses the line rather than stopping the lobby.
pub(super) fn write_to_stderr(line: &str) {
    let _ = maitred_sys::fd::write_all_within(stderr(), line.as_bytes(), STDERR_WITHIN);
}

/// How long `write_to_stderr` waits for room.
const STDERR_WITHIN: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

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
}
