//! The access log (`--access-logfile`): a sink of its own, whose drops are reported in the
//! error log, and one line per answer in `--access-logformat`.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::sync::OnceLock;
use std::time::{Instant, SystemTime};

use super::access_format::{AccessFormat, AccessRecord};
use super::sink::{open_log_file, DropReport, Sink, ACCESS_LOG_MODE, QUEUE_BYTES};

static ACCESS_LOG: OnceLock<&'static Sink> = OnceLock::new();

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

/// Reopens the access log at its path, as `reopen_error_log` does, if it is a file; returns
/// the path.
pub fn reopen_access_log() -> Option<&'static str> {
    let path = ACCESS_FILE.get()?;
    ACCESS_LOG.get()?.reopen(path, ACCESS_LOG_MODE);
    Some(path)
}

pub fn access_log_enabled() -> bool {
    ACCESS_LOG.get().is_some()
}

/// Writes the access-log line for `record` in `format` (`--access-logformat`).
pub fn access(format: &AccessFormat, record: &AccessRecord<'_>) {
    let Some(sink) = ACCESS_LOG.get() else { return };
    let mut line = String::with_capacity(256);
    format.render(record, SystemTime::now(), Instant::now(), &mut line);
    sink.push(line, true);
}

/// The access log's queue and writer, once it is open.
pub(super) fn sink() -> Option<&'static Sink> {
    ACCESS_LOG.get().copied()
}
