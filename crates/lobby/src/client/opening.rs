//! A plain connection's first bytes, which say the protocol it speaks (docs/HTTP2.md, "Where it
//! is spoken"): HTTP/2's preface, or an HTTP/1.x request; where only HTTP/2 is spoken, anything
//! else is an invalid preface, answered with HTTP/2's connection error.

use bytes::BytesMut;

use super::h2;
use super::h2::reasons::Http2Refusal;
use super::peer::{ClientStream, ProxyStage};
use super::states::ConnectionState;
use super::{Connection, Stop};
use crate::log;

/// Of a plain connection's first bytes that are no protocol maitred speaks, how many its log
/// line shows.
const SHOWN_OF_A_BAD_PREFACE: usize = 32;

/// Where only HTTP/2 is spoken, whether a plain connection's first bytes, not the preface,
/// are an HTTP/1.x request (its first line ends with its version), to be answered in HTTP/1.1;
/// anything else is an invalid preface. None until the first line has come, or
/// `LONGEST_FIRST_LINE` bytes without it (then it is no HTTP/1.x client's).
fn is_http1_request_line(first: &[u8]) -> Option<bool> {
    let Some(end) = first.iter().position(|&byte| byte == b'\n') else {
        return (first.len() >= LONGEST_FIRST_LINE).then_some(false);
    };
    let line = first[..end].strip_suffix(b"\r").unwrap_or(&first[..end]);
    Some(line.ends_with(b" HTTP/1.1") || line.ends_with(b" HTTP/1.0"))
}

/// A request line longer than this is refused by every HTTP/1.x server (gunicorn's
/// `--limit-request-line` is at most 8190).
const LONGEST_FIRST_LINE: usize = 8192;

/// What a plain connection speaks, from its first bytes.
pub(super) enum Opening {
    Http1,
    Http2,
    /// Neither HTTP/2's preface nor an HTTP/1.x request, where only HTTP/2 is spoken.
    InvalidPreface,
}

impl<S: ClientStream> Connection<S> {
    /// What a plain connection speaks, from the bytes already read: HTTP/2 if it opens with
    /// HTTP/2's preface. None when more must be read first (`opening`): its PROXY header is
    /// due, or its first bytes could still be the preface's first four, or (HTTP/2 only) its
    /// first line, which tells an HTTP/1.x request from bytes of neither protocol, has not come.
    pub(super) fn protocol_chosen(&self) -> Option<Result<Opening, Stop>> {
        if self.peer.proxy == ProxyStage::Awaited || self.undecided() {
            return None;
        }
        Some(self.chosen())
    }

    fn undecided(&self) -> bool {
        (self.buf.len() < 4 && h2::PREFACE.starts_with(&self.buf))
            || (!self.lobby.config.http.http1
                && !h2::opens_with_preface(&self.buf)
                && is_http1_request_line(&self.buf).is_none())
    }

    /// `protocol_chosen`, once the PROXY header and enough bytes have been read.
    pub(super) async fn opening(&mut self) -> Result<Opening, Stop> {
        if self.peer.proxy == ProxyStage::Awaited {
            self.read_proxy_header().await?;
        }
        let deadline = tokio::time::Instant::now() + self.lobby.settings().header_timeout;
        while self.undecided() {
            match tokio::time::timeout_at(deadline, self.read_more()).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return Err(Stop::Quietly),
            }
        }
        self.chosen()
    }

    /// HTTP/2 for its preface; HTTP/1.x otherwise. Where `--http-protocols` leaves HTTP/1.x out,
    /// an HTTP/1.x request is refused in HTTP/1.1 (505, which its client understands), and
    /// anything else is an invalid HTTP/2 preface.
    fn chosen(&self) -> Result<Opening, Stop> {
        let protocols = &self.lobby.config.http;
        if protocols.http2 && h2::opens_with_preface(&self.buf) {
            return Ok(Opening::Http2);
        }
        if !protocols.http1 {
            if is_http1_request_line(&self.buf) == Some(false) {
                return Ok(Opening::InvalidPreface);
            }
            return Err(Stop::Refuse(
                505,
                "this server speaks HTTP/2 only (--http-protocols h2): open with the HTTP/2 preface \
                 (curl --http2-prior-knowledge)"
                    .into(),
            ));
        }
        Ok(Opening::Http1)
    }

    /// A connection error for an invalid preface (RFC 9113 3.4), with one log line: the server's
    /// preface and GOAWAY (PROTOCOL_ERROR), then the close.
    pub(super) async fn refuse_preface(&mut self) {
        self.mark.set(ConnectionState::Writing);
        let shown = self.buf.len().min(SHOWN_OF_A_BAD_PREFACE);
        log::info_limited!(
            "HTTP/2 connection from {} refused: it opened with {:?}, neither the HTTP/2 preface nor an HTTP/1.x \
             request (--http-protocols h2); GOAWAY PROTOCOL_ERROR, connection closed",
            self.peer.display(),
            String::from_utf8_lossy(&self.buf[..shown])
        );
        self.lobby.metrics.http2_refused(Http2Refusal::InvalidPreface);
        self.buf = BytesMut::new();
        if self.write_closing(&h2::invalid_preface_answer()).await.is_ok() {
            self.linger().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http1_request_line_is_told_from_an_invalid_preface() {
        assert_eq!(is_http1_request_line(b"GET / HTTP/1.1\r\nHost: a\r\n"), Some(true));
        assert_eq!(is_http1_request_line(b"GET / HTTP/1.0\n"), Some(true));
        assert_eq!(is_http1_request_line(b"INVALID CONNECTION PREFACE\r\n\r\n"), Some(false));
        assert_eq!(is_http1_request_line(b"GET / HTTP/1.1"), None);
        assert_eq!(is_http1_request_line(&[b'x'; LONGEST_FIRST_LINE]), Some(false));
    }
}
