//! The stats listener (`--stats`): `/metrics` for Prometheus (docs/METRICS.md, written by the
//! `prometheus` library in the text format `promtool check metrics` checks), `/status.json`,
//! and the live page at `/`, answered by the lobby itself so that a scrape never waits for a
//! worker.

use std::borrow::Cow;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use super::Observed;
use super::{page, status};
use crate::listen::bind::Listener;
use crate::log::{debug, info_limited};

/// The most a stats request's head may be, and how long it may take to arrive.
const MAX_HEAD: usize = 8 * 1024;
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Stats connections open at once: a scraper, a page or two, `maitred top`; more are refused.
const MAX_STATS_CONNECTIONS: usize = 64;

/// Serves the stats listener until the lobby stops: one request per connection, at most
/// `MAX_STATS_CONNECTIONS` at once (those past it are closed at once).
pub async fn serve(observed: Rc<Observed>, listener: Listener, max_connections: usize) {
    let std_listener: std::os::fd::OwnedFd = listener.socket.into();
    let open = Arc::new(Semaphore::new(MAX_STATS_CONNECTIONS));
    if listener.unix_path.is_some() {
        let Ok(accepting) = tokio::net::UnixListener::from_std(std_listener.into()) else { return };
        loop {
            match accepting.accept().await {
                Ok((stream, _)) => spawn_answer(&observed, stream, &open, max_connections),
                Err(e) => accept_failed(e).await,
            }
        }
    } else {
        let Ok(accepting) = tokio::net::TcpListener::from_std(std_listener.into()) else { return };
        loop {
            match accepting.accept().await {
                Ok((stream, _)) => spawn_answer(&observed, stream, &open, max_connections),
                Err(e) => accept_failed(e).await,
            }
        }
    }
}

async fn accept_failed(e: io::Error) {
    info_limited!("the stats listener could not accept a connection: {e}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn spawn_answer<S>(observed: &Rc<Observed>, stream: S, open: &Arc<Semaphore>, max_connections: usize)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let Ok(permit) = open.clone().try_acquire_owned() else {
        info_limited!("the stats listener has {MAX_STATS_CONNECTIONS} connections open; closing another");
        return;
    };
    let observed = observed.clone();
    tokio::task::spawn_local(async move {
        if let Err(e) = answer(&observed, stream, max_connections).await {
            debug!("stats request: {e}");
        }
        drop(permit);
    });
}

/// Reads one request head and answers it, then closes.
async fn answer<S>(observed: &Observed, mut stream: S, max_connections: usize) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut head = Vec::with_capacity(1024);
    let read = tokio::time::timeout(HEAD_TIMEOUT, async {
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = stream.read(&mut chunk).await?;
            if n == 0 || head.len() + n > MAX_HEAD {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "no complete request head"));
            }
            head.extend_from_slice(&chunk[..n]);
        }
        Ok(())
    })
    .await;
    let (status, content_type, body) = match read {
        Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "the request head took too long")),
        Ok(Err(e)) => (400, "text/plain; charset=utf-8", format!("bad request: {e}\n").into_bytes().into()),
        Ok(Ok(())) => route(observed, &head, max_connections),
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Internal Server Error",
    };
    // no-cache: the live page's files change with the binary, and every other answer is of now.
    let mut response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: \
         no-cache\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(&body);
    stream.write_all(&response).await?;
    stream.shutdown().await
}

fn route(observed: &Observed, head: &[u8], max_connections: usize) -> (u16, &'static str, Cow<'static, [u8]>) {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    let text = "text/plain; charset=utf-8";
    if method != b"GET" {
        return (405, text, b"the stats listener answers GET only\n"[..].into());
    }
    match path {
        b"/metrics" => match status::metrics(observed) {
            Ok(exposition) => (200, prometheus::TEXT_FORMAT, exposition.into_bytes().into()),
            Err(_) => (500, text, b"the metrics could not be written\n"[..].into()),
        },
        b"/status.json" => (200, "application/json", status::status(observed, max_connections).into_bytes().into()),
        _ => match page::file(path) {
            Some((content_type, body)) => (200, content_type, body.into()),
            None => (
                404,
                text,
                b"not found: the stats listener serves / (a live page), /metrics and /status.json\n"[..].into(),
            ),
        },
    }
}
