//! Writing an answer at the client's pace: the head and body the worker sent, framed for the
//! client (Content-Length or chunked), files with sendfile(2), and never a write that waits
//! longer than `--send-timeout` for a client that takes nothing.

use std::fs::File;
use std::future::poll_fn;
use std::io;
use std::os::fd::AsFd;

use bytes::Bytes;
use maitred_protocol::{
    one_part_answer_capacity, write_chunk, write_error_response, write_response_head, Framing, ResponseContext,
    LAST_CHUNK,
};
use tokio::io::Interest;

use super::Connection;
use crate::client::exchange::http_date;
use crate::client::peer::{ClientStream, StreamKind};
use crate::client::tls::encrypted;
use crate::log;
use crate::seating::spool::{AnswerReceiver, ResponsePart};

impl<S: ClientStream> Connection<S> {
    /// Writes one part; returns whether the connection may stay open after this answer.
    pub(super) async fn write_part(
        &mut self,
        answer: &mut Answer,
        part: ResponsePart,
        responses: &AnswerReceiver,
    ) -> io::Result<bool> {
        let mut out = Vec::new();
        let end = match part {
            ResponsePart::Head { status, reason, headers, body, end } => {
                // A shutdown that began while the request waited closes the connection after it.
                answer.context.keep_alive &= !self.closes_when_answered();
                let known = end.then_some(body.len() as u64);
                let date = http_date();
                out.reserve(one_part_answer_capacity(&reason, &headers, &date, body.len()));
                let (framing, keep_alive) =
                    write_response_head(&mut out, &answer.context, status, &reason, &headers, known, &date);
                answer.started(status, framing, keep_alive);
                answer.body(&mut out, &body);
                // Kept for an access log that writes response headers; they hold the frame
                // they came in (and its first body bytes), so only then.
                if log::access_log_enabled() && self.context.settings().access_log_format.uses_response_headers() {
                    answer.headers = headers;
                }
                end
            }
            ResponsePart::Body { data, end } => {
                answer.body(&mut out, &data);
                end
            }
            ResponsePart::File { file, offset, count: available, end, spilled } => {
                let count = answer.file_part(&mut out, available);
                self.write_all(&out).await?;
                out.clear();
                if count > 0 {
                    self.send_file(&file, offset, count).await?;
                }
                if spilled {
                    responses.spilled_sent(available);
                }
                if count > 0 && answer.framing == Framing::Chunked {
                    out.extend_from_slice(b"\r\n");
                }
                end
            }
            // A WebSocket's parts go to its session (`websocket/`); one past the first
            // cannot follow an HTTP answer.
            ResponsePart::Abort | ResponsePart::WebSocket(_) => return Ok(false),
            ResponsePart::Refused { status, detail, retry_after } => {
                // A 503 is the queue refusing a request it could not serve in time: the
                // connection is healthy, and the client may try again after Retry-After.
                let keep_alive = answer.context.keep_alive && status == 503 && !self.closes_when_answered();
                write_error_response(&mut out, status, &detail, &http_date(), keep_alive, retry_after);
                answer.status = status;
                answer.keep_alive = keep_alive;
                true
            }
        };
        if end {
            answer.finish(&mut out);
        }
        let keep_open = answer.keep_alive && !answer.broken;
        if end && !keep_open {
            self.write_closing(&out).await?;
        } else {
            self.write_all(&out).await?;
        }
        Ok(keep_open)
    }

    /// Writes everything, giving up only on a client that takes nothing for `--send-timeout`:
    /// a client that keeps reading, however slowly, is never cut.
    pub(super) async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        self.send_all(data, false).await
    }

    /// `send(2)`s all of `data` (with MSG_MORE when `more`), each call as soon as the client
    /// can take bytes.
    async fn send_all(&mut self, mut data: &[u8], more: bool) -> io::Result<()> {
        if S::ENCRYPTED {
            return encrypted::send(&mut self.stream, data, self.context.settings().send_timeout).await;
        }
        let fd = self.stream.as_fd();
        while !data.is_empty() {
            let sent = self.write_when_ready(|| maitred_sys::socket::send(fd, data, more).map(|n| n as u64));
            data = &data[sent.await? as usize..];
        }
        Ok(())
    }

    /// Writes the last bytes before the connection closes (or shuts down writing). TCP holds
    /// them back (MSG_MORE) and the close that follows sends them with its FIN, in one
    /// segment: per connection one packet fewer for both kernels to process and one wake-up
    /// fewer for the client (T2).
    pub(super) async fn write_closing(&mut self, data: &[u8]) -> io::Result<()> {
        self.send_all(data, matches!(S::KIND, StreamKind::Tcp)).await
    }

    /// Copies `count` bytes of `file` from `offset` to the client inside the kernel.
    async fn send_file(&mut self, file: &File, mut offset: u64, mut count: u64) -> io::Result<()> {
        if S::ENCRYPTED {
            return encrypted::send_file(&mut self.stream, file, offset, count, self.context.settings().send_timeout)
                .await;
        }
        let (out_fd, in_fd) = (self.stream.as_fd(), file.as_fd());
        while count > 0 {
            let sent = self.write_when_ready(|| {
                let chunk = count.min(1 << 30) as usize;
                let mut at = offset;
                maitred_sys::socket::sendfile(out_fd, in_fd, &mut at, chunk).map(|n| n as u64)
            });
            match sent.await? {
                0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file is shorter than announced")),
                n => {
                    offset += n;
                    count -= n;
                }
            }
        }
        Ok(())
    }

    /// Runs one non-blocking write as soon as the client can take bytes, and returns how many
    /// it took; gives up on a client that takes nothing for `--send-timeout`.
    ///
    /// Progress is the kernel's queue of unsent bytes shrinking, not the socket becoming
    /// writable: with megabytes queued, a socket turns writable only once half of them are
    /// gone, which a client reading a few KiB a second takes minutes to do.
    async fn write_when_ready(&self, mut write: impl FnMut() -> io::Result<u64>) -> io::Result<u64> {
        // Usually the client's socket has room: the write needs no wait, nor the size of the
        // queue, which costs an ioctl (one per request under H1-hop before this look).
        match self.stream.try_io(Interest::WRITABLE, &mut write) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            result => return result,
        }
        let limit = self.context.settings().send_timeout;
        let mut unsent = maitred_sys::socket::unsent_bytes(self.stream.as_fd());
        loop {
            let attempt = async {
                loop {
                    poll_fn(|cx| self.stream.poll_write_ready(cx)).await?;
                    match self.stream.try_io(Interest::WRITABLE, &mut write) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        result => return result,
                    }
                }
            };
            if let Ok(result) = tokio::time::timeout(limit, attempt).await {
                return result;
            }
            let now = maitred_sys::socket::unsent_bytes(self.stream.as_fd());
            match (unsent, now) {
                (Some(before), Some(now)) if now < before => unsent = Some(now),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client took no byte of its answer for {} s (--send-timeout)", limit.as_secs_f64()),
                    ))
                }
            }
        }
    }
}

/// The state of one answer being written: its framing and how much of the body went out.
pub(super) struct Answer {
    pub(super) context: ResponseContext,
    pub(super) status: u16,
    pub(super) framing: Framing,
    pub(super) keep_alive: bool,
    /// Body bytes still owed under a Content-Length.
    pub(super) remaining: u64,
    pub(super) body_bytes: u64,
    /// The application's header fields, when the access log writes some (`{name}o`).
    pub(super) headers: Vec<(Bytes, Bytes)>,
    /// The application sent more or fewer bytes than it announced: the framing is broken
    /// and the connection must close after this answer.
    pub(super) broken: bool,
}

impl Answer {
    pub(super) fn new(context: &ResponseContext) -> Answer {
        Answer {
            context: *context,
            status: 0,
            framing: Framing::NoBody,
            keep_alive: false,
            remaining: 0,
            body_bytes: 0,
            headers: Vec::new(),
            broken: false,
        }
    }

    fn started(&mut self, status: u16, framing: Framing, keep_alive: bool) {
        self.status = status;
        self.framing = framing;
        self.keep_alive = keep_alive;
        if let Framing::Length(n) = framing {
            self.remaining = n;
        }
    }

    fn body(&mut self, out: &mut Vec<u8>, data: &[u8]) {
        match self.framing {
            Framing::NoBody => {}
            Framing::Length(_) => {
                let take = data.len().min(self.remaining as usize);
                out.extend_from_slice(&data[..take]);
                self.remaining -= take as u64;
                self.body_bytes += take as u64;
                if take < data.len() {
                    self.overrun();
                }
            }
            Framing::Chunked => {
                write_chunk(out, data);
                self.body_bytes += data.len() as u64;
            }
            Framing::UntilClose => {
                out.extend_from_slice(data);
                self.body_bytes += data.len() as u64;
            }
        }
    }

    /// Writes what precedes `count` file bytes and returns how many of them to send.
    fn file_part(&mut self, out: &mut Vec<u8>, count: u64) -> u64 {
        let count = match self.framing {
            Framing::NoBody => 0,
            Framing::Length(_) => {
                let take = count.min(self.remaining);
                self.remaining -= take;
                if take < count {
                    self.overrun();
                }
                take
            }
            Framing::Chunked => {
                if count > 0 {
                    out.extend_from_slice(format!("{count:x}\r\n").as_bytes());
                }
                count
            }
            Framing::UntilClose => count,
        };
        self.body_bytes += count;
        count
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        match self.framing {
            Framing::Chunked => out.extend_from_slice(LAST_CHUNK),
            Framing::Length(_) if self.remaining > 0 => {
                log::warning_limited!(
                    "the application sent {} bytes fewer than its Content-Length; closing the connection",
                    self.remaining
                );
                self.broken = true;
            }
            _ => {}
        }
    }

    fn overrun(&mut self) {
        if !self.broken {
            log::warning_limited!("the application sent more bytes than its Content-Length; the excess was dropped");
        }
        self.broken = true;
    }
}
