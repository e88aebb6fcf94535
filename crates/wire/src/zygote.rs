//! The control channel between the lobby and a zygote (docs/PROTOCOL.md, section 1): one
//! datagram a message, ASCII words separated by single spaces. The lobby's orders and the
//! zygote's reports are spelled here once: the lobby encodes orders and decodes reports with
//! them; the zygote (python/maitred/zygote.py, through `maitred._native`) and bench/stub's
//! zygote decode orders and encode reports with them.

use std::fmt;

/// What the lobby asks of a zygote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Order {
    /// A worker for `slot`, with `threads` threads; `workers` is how many the lobby keeps
    /// serving (for the hooks' `server.num_workers`).
    Spawn { slot: usize, workers: usize, threads: usize },
    /// Signal `signal` to the zygote's worker `pid`.
    Kill { pid: i32, signal: i32 },
    /// Reopen the zygote's error log, and have every worker reopen its own.
    Reopen,
    /// The log level, by name, for the zygote and the workers it forks from now on.
    Level(String),
}

/// What a zygote tells the lobby.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// The worker for `slot` is `pid`; its channels come with this message, one per thread.
    Spawned { slot: usize, pid: i32 },
    /// Worker `pid` has exited, and how.
    Exited { pid: i32, how: Exit },
    /// The zygote cannot make workers (its `--preload` import failed): it exits next.
    Failed(String),
}

/// How a worker exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exit code {code}"),
            Exit::Signal(signal) => write!(f, "signal {signal}"),
        }
    }
}

/// A message that is none of the channel's: its text, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed(pub String);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a malformed control message {:?}", self.0)
    }
}

impl std::error::Error for Malformed {}

impl Order {
    pub fn encode(&self) -> String {
        match self {
            Order::Spawn { slot, workers, threads } => format!("spawn {slot} {workers} {threads}"),
            Order::Kill { pid, signal } => format!("kill {pid} {signal}"),
            Order::Reopen => "reopen".into(),
            Order::Level(name) => format!("level {name}"),
        }
    }

    pub fn decode(message: &[u8]) -> Result<Order, Malformed> {
        let (text, words) = words(message)?;
        let order = match words.as_slice() {
            ["spawn", slot, workers, threads] => {
                Order::Spawn { slot: number(slot)?, workers: number(workers)?, threads: number(threads)? }
            }
            ["kill", pid, signal] => Order::Kill { pid: number(pid)?, signal: number(signal)? },
            ["reopen"] => Order::Reopen,
            ["level", name] if !name.is_empty() => Order::Level((*name).to_owned()),
            _ => return Err(Malformed(text.into())),
        };
        Ok(order)
    }
}

impl Report {
    pub fn encode(&self) -> String {
        match self {
            Report::Spawned { slot, pid } => format!("spawned {slot} {pid}"),
            Report::Exited { pid, how: Exit::Code(code) } => format!("exited {pid} code {code}"),
            Report::Exited { pid, how: Exit::Signal(signal) } => format!("exited {pid} signal {signal}"),
            Report::Failed(message) => format!("failed {message}"),
        }
    }

    pub fn decode(message: &[u8]) -> Result<Report, Malformed> {
        let text = String::from_utf8_lossy(message);
        if let Some(why) = text.strip_prefix("failed ") {
            return Ok(Report::Failed(why.to_owned()));
        }
        let (text, words) = words(message)?;
        let report = match words.as_slice() {
            ["spawned", slot, pid] => Report::Spawned { slot: number(slot)?, pid: number(pid)? },
            ["exited", pid, "code", code] => Report::Exited { pid: number(pid)?, how: Exit::Code(number(code)?) },
            ["exited", pid, "signal", signal] => {
                Report::Exited { pid: number(pid)?, how: Exit::Signal(number(signal)?) }
            }
            _ => return Err(Malformed(text.into())),
        };
        Ok(report)
    }
}

/// The message's text and its words; Malformed when it is not ASCII.
fn words(message: &[u8]) -> Result<(&str, Vec<&str>), Malformed> {
    match std::str::from_utf8(message) {
        Ok(text) if text.is_ascii() => Ok((text, text.split(' ').collect())),
        _ => Err(Malformed(String::from_utf8_lossy(message).into_owned())),
    }
}

/// A word that is a decimal number, digits only (no sign).
fn number<T: std::str::FromStr>(word: &str) -> Result<T, Malformed> {
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Malformed(word.into()));
    }
    word.parse().map_err(|_| Malformed(word.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_go_and_come_back() {
        for order in [
            Order::Spawn { slot: 2, workers: 4, threads: 8 },
            Order::Kill { pid: 4321, signal: 9 },
            Order::Reopen,
            Order::Level("debug".into()),
        ] {
            assert_eq!(Order::decode(order.encode().as_bytes()), Ok(order));
        }
        assert_eq!(Order::Spawn { slot: 2, workers: 4, threads: 8 }.encode(), "spawn 2 4 8");
    }

    #[test]
    fn reports_go_and_come_back() {
        for report in [
            Report::Spawned { slot: 2, pid: 4321 },
            Report::Exited { pid: 4321, how: Exit::Code(0) },
            Report::Exited { pid: 4321, how: Exit::Signal(9) },
            Report::Failed("cannot import 'x': No module named 'x'".into()),
        ] {
            assert_eq!(Report::decode(report.encode().as_bytes()), Ok(report));
        }
        assert_eq!(Report::Exited { pid: 1, how: Exit::Signal(9) }.encode(), "exited 1 signal 9");
    }

    #[test]
    fn malformed_messages_are_refused() {
        for bad in [
            &b"spawn 1 2"[..],
            b"spawn -1 2 3",
            b"kill x 9",
            b"kill 1  9",
            b"level",
            b"level ",
            b"hello",
            b"",
            b"reopen \xff",
        ] {
            assert!(Order::decode(bad).is_err(), "{}", bad.escape_ascii());
        }
        for bad in [&b"spawned 2"[..], b"exited 1 dumped 3", b"exited 1 code", b"hello", b"failed"] {
            assert!(Report::decode(bad).is_err(), "{}", bad.escape_ascii());
        }
    }
}
