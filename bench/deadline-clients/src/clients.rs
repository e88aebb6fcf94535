//! The requests, each on its own connection and given up at its deadline, and the two ways of
//! starting them: a closed loop (a client sends its next request when its last one is over) and
//! an open loop (requests start at their due times whatever the earlier ones are doing).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};

use crate::alarm::Alarm;
use crate::cli::Target;
use crate::response::Response;

/// How one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// 200 within the deadline.
    Good,
    /// 503 within the deadline: the server refused it quickly.
    Shed,
    /// Another status (or a status line without one) within the deadline.
    OtherStatus,
    /// No complete answer within the deadline: given up.
    Late,
    /// The connection was refused.
    Refused,
    /// Any other failure to connect, or the connection reset or closed before a complete answer
    /// (a malformed answer included).
    Reset,
}

pub struct Outcome {
    pub started: Instant,
    /// Open loop: how long after its due time the request started.
    pub lateness: Option<Duration>,
    pub ending: Ending,
    /// When it ended: for a good answer, when the whole of it was in.
    pub ended: Instant,
}

/// One request: a new connection, `GET`, one whole response; given up (its socket closed) at
/// `deadline` after its start, which covers the connect too: a SYN that the server's full
/// accept queue dropped is sent again only after 1 s, which a user with a 1 s deadline never
/// sees answered.
async fn request(target: &Target, deadline: Duration, due: Option<Instant>) -> Outcome {
    let started = Instant::now();
    let ending = match timeout_at(started + deadline, exchange(target)).await {
        Err(_elapsed) => Ending::Late,
        Ok(ending) => ending,
    };
    Outcome { started, lateness: due.map(|due| started.saturating_duration_since(due)), ending, ended: Instant::now() }
}

/// Connects, sends the request and reads the response; the socket is closed when this returns
/// or is dropped at the deadline.
async fn exchange(target: &Target) -> Ending {
    let mut stream = match TcpStream::connect(target.address).await {
        Ok(stream) => stream,
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => return Ending::Refused,
        Err(_) => return Ending::Reset,
    };
    match answer(&mut stream, &target.request).await {
        Ok(Some(status)) if status == "200" => Ending::Good,
        Ok(Some(status)) if status == "503" => Ending::Shed,
        Ok(Some(_)) => Ending::OtherStatus,
        Ok(None) | Err(_) => Ending::Reset,
    }
}

/// The status code of the response to `request`, None if the connection ended before all of it
/// was in or it was no HTTP.
async fn answer(stream: &mut TcpStream, request: &[u8]) -> io::Result<Option<String>> {
    stream.write_all(request).await?;
    let mut response = Response::default();
    // Answers here are a head and a few bytes of body; the buffer is part of each request's task,
    // which is copied when it is spawned, so it is kept small.
    let mut buffer = [0; 1024];
    loop {
        let count = stream.read(&mut buffer).await?;
        if count == 0 {
            return Ok(response.closed());
        }
        match response.received(&buffer[..count]) {
            Ok(None) => {}
            Ok(Some(status)) => return Ok(Some(status)),
            Err(_malformed) => return Ok(None),
        }
    }
}

/// `concurrency` clients, each starting a request when its last one is over, until `end`.
pub async fn closed(target: Arc<Target>, deadline: Duration, concurrency: usize, end: Instant) -> Vec<Outcome> {
    let clients: Vec<_> = (0..concurrency)
        .map(|_| {
            let target = Arc::clone(&target);
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                while Instant::now() < end {
                    outcomes.push(request(&target, deadline, None).await);
                }
                outcomes
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for client in clients {
        outcomes.extend(client.await.expect("a client task panicked"));
    }
    outcomes
}

/// Starts request i at `began` + i / `rate`, whatever the earlier ones are doing, for `count`
/// requests; returns once each has ended, which its deadline bounds. Fails only if the timer
/// cannot be made or set.
pub async fn open(
    target: Arc<Target>,
    deadline: Duration,
    rate: f64,
    count: u64,
    began: Instant,
) -> io::Result<Vec<Outcome>> {
    let alarm = Alarm::new()?;
    let mut in_flight = Vec::with_capacity(count as usize);
    for number in 0..count {
        let due = began + Duration::from_secs_f64(number as f64 / rate);
        alarm.sleep_until(due).await?;
        let target = Arc::clone(&target);
        in_flight.push(tokio::spawn(async move { request(&target, deadline, Some(due)).await }));
    }
    let mut outcomes = Vec::with_capacity(in_flight.len());
    for request in in_flight {
        outcomes.push(request.await.expect("a request task panicked"));
    }
    Ok(outcomes)
}
