//! The command line, as bench/measure.py writes it, and the URL the requests go to.

use std::net::{SocketAddr, ToSocketAddrs};

pub const USAGE: &str = "usage: deadline-clients {closed,open} URL --seconds S [--deadline D] \
[--rate R] [--concurrency N]

  closed            --concurrency clients (16), each starting its next request when its last
                    one is over, for --seconds
  open              requests started at --rate per second for --seconds, each at its due time
  --seconds S       how long requests are started
  --deadline D      seconds after which a request is given up (1)
  --rate R          open: requests started per second
  --concurrency N   closed: clients at once (16)";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Closed,
    Open,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Closed => "closed",
            Mode::Open => "open",
        }
    }
}

#[derive(Debug, PartialEq)]
pub struct Args {
    pub mode: Mode,
    pub url: String,
    pub seconds: f64,
    pub deadline: f64,
    /// Given in open mode only (required there); reported as given, or null.
    pub rate: Option<f64>,
    /// Reported in both modes, as the Python generator did; used in closed mode only.
    pub concurrency: usize,
}

/// What the command line asks, or why it is wrong. Options may come before or after the mode and
/// the URL, as `--name value` or `--name=value`.
pub fn parse(argv: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut positional = Vec::new();
    let (mut seconds, mut deadline, mut rate, mut concurrency) = (None, 1.0, None, 16);
    let mut argv = argv.into_iter();
    while let Some(argument) = argv.next() {
        let Some(option) = argument.strip_prefix("--") else {
            positional.push(argument);
            continue;
        };
        let (name, value) = match option.split_once('=') {
            Some((name, value)) => (name.to_owned(), value.to_owned()),
            None => {
                let value = argv.next().ok_or_else(|| format!("--{option} needs a value"))?;
                (option.to_owned(), value)
            }
        };
        match name.as_str() {
            "seconds" => seconds = Some(positive(&name, &value)?),
            "deadline" => deadline = positive(&name, &value)?,
            "rate" => rate = Some(positive(&name, &value)?),
            "concurrency" => {
                concurrency = value
                    .parse()
                    .ok()
                    .filter(|&clients| clients > 0)
                    .ok_or_else(|| format!("--concurrency: {value:?} is not a whole number above 0"))?
            }
            _ => return Err(format!("unknown option --{name}")),
        }
    }
    let [mode, url] =
        <[String; 2]>::try_from(positional).map_err(|given| format!("needs a mode and a URL, got {given:?}"))?;
    let mode = match mode.as_str() {
        "closed" => Mode::Closed,
        "open" => Mode::Open,
        _ => return Err(format!("mode {mode:?}: choose closed or open")),
    };
    let seconds = seconds.ok_or("--seconds is required")?;
    if mode == Mode::Open && rate.is_none() {
        return Err("open needs --rate".to_owned());
    }
    Ok(Args { mode, url, seconds, deadline, rate, concurrency })
}

fn positive(name: &str, value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|number| number.is_finite() && *number > 0.0)
        .ok_or_else(|| format!("--{name}: {value:?} is not a number above 0"))
}

/// Where each request goes and its bytes.
pub struct Target {
    pub address: SocketAddr,
    pub request: Vec<u8>,
}

/// `http://host[:port][/path][?query]`; the host is resolved once, here.
pub fn target(url: &str) -> Result<Target, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url:?}: only http:// URLs"))?;
    let rest = rest.split('#').next().unwrap_or_default();
    let (authority, path) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let path = match path {
        "" => "/".to_owned(),
        query if query.starts_with('?') => format!("/{query}"),
        path => path.to_owned(),
    };
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let (host, port) = split_host_port(authority).ok_or_else(|| format!("{url:?}: no host, or a bad port"))?;
    let address = (host, port)
        .to_socket_addrs()
        .map_err(|error| format!("{host}: {error}"))?
        .next()
        .ok_or_else(|| format!("{host}: no address"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n").into_bytes();
    Ok(Target { address, request })
}

/// ("127.0.0.1", 8000) from "127.0.0.1:8000", ("::1", 80) from "[::1]".
fn split_host_port(authority: &str) -> Option<(&str, u16)> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed.split_once(']')?;
            (host, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port = match port {
        Some(port) => port.parse().ok()?,
        None => 80,
    };
    (!host.is_empty()).then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn measure_py_command_lines() {
        let open = parse(words("open --seconds 15 --deadline 1 --rate 826 http://127.0.0.1:8000/")).unwrap();
        assert_eq!(
            open,
            Args {
                mode: Mode::Open,
                url: "http://127.0.0.1:8000/".to_owned(),
                seconds: 15.0,
                deadline: 1.0,
                rate: Some(826.0),
                concurrency: 16,
            }
        );
        let closed = parse(words("closed --seconds=3 --concurrency 4 http://127.0.0.1:8000/")).unwrap();
        assert_eq!((closed.mode, closed.concurrency, closed.rate), (Mode::Closed, 4, None));
    }

    #[test]
    fn refusals() {
        assert!(parse(words("open --seconds 15 http://127.0.0.1:1/")).is_err());
        assert!(parse(words("closed http://127.0.0.1:1/")).is_err());
        assert!(parse(words("closed --seconds 0 http://127.0.0.1:1/")).is_err());
        assert!(parse(words("shut --seconds 1 http://127.0.0.1:1/")).is_err());
        assert!(parse(words("closed --seconds 1 --rat 5 http://127.0.0.1:1/")).is_err());
        assert!(parse(words("closed --seconds")).is_err());
    }

    #[test]
    fn requests() {
        let request = |url| String::from_utf8(target(url).unwrap().request).unwrap();
        assert_eq!(
            request("http://127.0.0.1:8000"),
            "GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nConnection: close\r\n\r\n"
        );
        assert!(request("http://127.0.0.1:8000/a/b?c=1#top").starts_with("GET /a/b?c=1 HTTP/1.1\r\n"));
        assert!(request("http://127.0.0.1:8000?c=1").starts_with("GET /?c=1 HTTP/1.1\r\n"));
        assert_eq!(target("http://[::1]:9/").unwrap().address, "[::1]:9".parse().unwrap());
        assert_eq!(target("http://127.0.0.1/").unwrap().address.port(), 80);
        assert!(target("https://127.0.0.1/").is_err());
        assert!(target("http://127.0.0.1:x/").is_err());
    }
}
