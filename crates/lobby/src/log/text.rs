//! The text every log line is made of: timestamps (the error log's and the access log's
//! common log format), escaping of request bytes, and figures grouped for reading. A leaf: it
//! takes only the levels from the parent module.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::Level;

pub(super) fn format_line(time: SystemTime, level: Level, message: impl std::fmt::Display) -> String {
    format!("[{}] [{}] [{}] {}\n", timestamp(time), std::process::id(), level.label(), message)
}

/// `9,998`
pub(super) fn grouped(n: u64) -> String {
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
pub(super) fn seconds(duration: Duration) -> String {
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
///
/// Every time maitred logs is UTC, written `+0000`: the error log's lines of the lobby, the
/// zygote and the workers (python/maitred/log.py follows this rule) and the access log's `t`.
/// gunicorn writes local time with its offset; maitred does not, because one log is written by
/// several processes and UTC cannot differ between them (a worker's `--env TZ=...`, an
/// application's `time.tzset()`), times from many hosts compare as written, no daylight-saving
/// change repeats an hour, and the lobby needs no time-zone database or C library's
/// `localtime_r` (which reads `TZ` and /etc/localtime) to write it. A container's clock is UTC
/// anyway; the offset still says which clock it is to anything that parses it.
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
    fn escapes_unsafe_bytes() {
        let mut out = String::new();
        escape_into(&mut out, b"GET /\"a\"\x01\xff HTTP/1.1");
        assert_eq!(out, "GET /\\\"a\\\"\\x01\\xff HTTP/1.1");
    }
}
