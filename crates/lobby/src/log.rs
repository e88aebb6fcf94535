//! The error log and the access log.
//!
//! The error log goes to standard error (the CLI has pointed it at `--error-logfile`) in the
//! same format as the Python side (python/maitred/log.py), so the lobby, the zygote and the
//! workers write one story: `[2026-11-22 05:30:00 +0000] [1234] [INFO] message`.

use std::cell::{Cell, RefCell};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

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
    static ACCESS_LOG: RefCell<Option<File>> = const { RefCell::new(None) };
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
    let line = format!("[{}] [{}] [{}] {}\n", timestamp(SystemTime::now()), std::process::id(), level.label(), message);
    // One write call per line keeps lines whole when several processes share the file.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

macro_rules! debug { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Debug, format_args!($($arg)*)) } }
macro_rules! info { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Info, format_args!($($arg)*)) } }
macro_rules! warning { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Warning, format_args!($($arg)*)) } }
macro_rules! error { ($($arg:tt)*) => { $crate::log::write($crate::log::Level::Error, format_args!($($arg)*)) } }
pub(crate) use {debug, error, info, warning};

/// Opens the access log: `-` is standard output. Lines are appended.
pub fn open_access_log(target: &str) -> std::io::Result<()> {
    let file = if target == "-" {
        use std::os::fd::AsFd;
        File::from(std::io::stdout().as_fd().try_clone_to_owned()?)
    } else {
        OpenOptions::new().create(true).append(true).open(target)?
    };
    ACCESS_LOG.with(|log| *log.borrow_mut() = Some(file));
    Ok(())
}

pub fn access_log_enabled() -> bool {
    ACCESS_LOG.with(|log| log.borrow().is_some())
}

/// One access-log line, in the common log format extended with referer and user agent
/// (gunicorn's default): `h - - [t] "r" s b "f" "a"`.
pub struct AccessRecord<'a> {
    pub peer: &'a str,
    pub request_line: &'a [u8],
    pub status: u16,
    pub body_bytes: u64,
    pub referer: &'a [u8],
    pub user_agent: &'a [u8],
}

pub fn access(record: &AccessRecord<'_>) {
    ACCESS_LOG.with(|log| {
        if let Some(file) = log.borrow_mut().as_mut() {
            let dash = |value: &[u8]| if value.is_empty() { "-".to_string() } else { escape(value) };
            let line = format!(
                "{} - - [{}] \"{}\" {} {} \"{}\" \"{}\"\n",
                if record.peer.is_empty() { "-" } else { record.peer },
                clf_timestamp(SystemTime::now()),
                escape(record.request_line),
                record.status,
                if record.body_bytes == 0 { "-".to_string() } else { record.body_bytes.to_string() },
                dash(record.referer),
                dash(record.user_agent),
            );
            let _ = file.write_all(line.as_bytes());
        }
    });
}

/// Makes request bytes safe for a log line: printable ASCII as is, everything else `\xHH`.
fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// A UTC calendar date and time.
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

fn civil(time: SystemTime) -> Civil {
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
fn clf_timestamp(time: SystemTime) -> String {
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
    fn escapes_unsafe_bytes() {
        assert_eq!(escape(b"GET /\"a\"\x01 HTTP/1.1"), "GET /\\\"a\\\"\\x01 HTTP/1.1");
    }
}
