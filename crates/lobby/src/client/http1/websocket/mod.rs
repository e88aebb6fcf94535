//! A WebSocket's connection (docs/PROTOCOL.md, section 5): the opening handshake checked
//! before any worker sees it, the `101` once the worker accepts, then the protocol itself with
//! tungstenite (framing, masking, fragments, control frames, UTF-8, the closing handshake) and
//! the lobby's limits: `--ws-max-size`, pings, and the bounds both ways.
//!
//! Towards the worker, one whole message waits at most while the worker's channel is full:
//! meanwhile the client is not read. Towards the client, what the worker sends waits in the
//! answer's spool within the answer's memory (`seating/spool.rs`, never a file): past it, the
//! relay stops reading the worker's frames until the client has taken some.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use maitred_protocol::{write_error_response, RequestHead, Version};
use maitred_wire::FLAG_WEBSOCKET;
use tokio::time::{sleep_until, timeout, Instant};
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};
use tokio_tungstenite::WebSocketStream;

mod deflate;

use deflate::{Deflate, Inflating, Refused};

use super::Connection;
use crate::client::exchange::http_date;
use crate::client::peer::ClientStream;
use crate::client::states::ConnectionState;
use crate::log::{self, debug};
use crate::seating::job::Job;
use crate::seating::spool::{AnswerReceiver, ResponsePart};
use crate::seating::websocket::{link, ClientMessage, Closing, ToWorker, WsPart, SUMMARY_MARK};

/// How long the lobby waits for the client's Close once it has sent its own, before it closes
/// the connection anyway (RFC 6455, 7.1.1 lets the server close first).
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The bytes reserved to read each WebSocket's frames into (see `session`): a message this
/// small is read in one read, a larger one through `deflate::Ahead`.
const WEBSOCKET_READ_BUFFER: usize = 512;

/// Whether a request asks to become a WebSocket: `Upgrade` names `websocket`.
pub(super) fn asks_websocket(head: &RequestHead) -> bool {
    fields(head, b"upgrade").any(|value| has_token(value, b"websocket"))
}

/// A WebSocket handshake refused before any worker sees it.
struct BadHandshake {
    status: u16,
    reason: &'static str,
}

/// Checks an opening handshake (RFC 6455, 4.2.1) and returns its `Sec-WebSocket-Accept`.
fn check_handshake(head: &RequestHead, body_len: u64) -> Result<String, BadHandshake> {
    let bad = |reason| Err(BadHandshake { status: 400, reason });
    if head.method.as_ref() != b"GET" {
        return bad("a WebSocket handshake must be a GET");
    }
    if head.version != Version::Http11 {
        return bad("a WebSocket handshake must be HTTP/1.1");
    }
    if body_len > 0 {
        return bad("a WebSocket handshake has no body");
    }
    if !fields(head, b"connection").any(|value| has_token(value, b"upgrade")) {
        return bad("a WebSocket handshake needs 'Connection: Upgrade'");
    }
    let versions: Vec<&[u8]> = fields(head, b"sec-websocket-version").collect();
    if versions != [b"13"] {
        return Err(BadHandshake { status: 426, reason: "this server speaks WebSocket version 13 only" });
    }
    let keys: Vec<&[u8]> = fields(head, b"sec-websocket-key").collect();
    match keys.as_slice() {
        [key] if is_nonce(key) => Ok(derive_accept_key(key)),
        _ => bad("a WebSocket handshake needs one Sec-WebSocket-Key: 16 bytes in base64"),
    }
}

/// The values of every field named `name` (lower case).
fn fields<'a>(head: &'a RequestHead, name: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    head.headers.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_ref())
}

/// Whether a comma-separated field value holds `token`, in any case.
fn has_token(value: &[u8], token: &[u8]) -> bool {
    value.split(|&b| b == b',').any(|item| item.trim_ascii().eq_ignore_ascii_case(token))
}

/// Whether `key` is 16 bytes in base64: 22 characters of the alphabet, the last carrying 4
/// zero bits, then `==`.
fn is_nonce(key: &[u8]) -> bool {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let index = |c: &u8| ALPHABET.iter().position(|a| a == c);
    key.len() == 24
        && key.ends_with(b"==")
        && key[..22].iter().all(|c| index(c).is_some())
        && index(&key[21]).is_some_and(|i| i & 0x0f == 0)
}

/// A handshake the lobby checked: what its `101` will say.
pub(super) struct Handshake {
    accept_key: String,
    /// The permessage-deflate agreed to, with `--ws-per-message-deflate`.
    deflate: Option<Deflate>,
}

/// The `101 Switching Protocols` for an accepted WebSocket.
fn switching_protocols(handshake: &Handshake, subprotocol: &[u8], headers: &[(Bytes, Bytes)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n");
    out.extend_from_slice(b"Sec-WebSocket-Accept: ");
    out.extend_from_slice(handshake.accept_key.as_bytes());
    out.extend_from_slice(b"\r\n");
    if let Some(deflate) = &handshake.deflate {
        deflate.response_field(&mut out);
    }
    if !subprotocol.is_empty() {
        out.extend_from_slice(b"Sec-WebSocket-Protocol: ");
        out.extend_from_slice(subprotocol);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Date: ");
    out.extend_from_slice(&http_date());
    out.extend_from_slice(b"\r\nServer: maitred\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// How the WebSocket's session ended, for the log and the worker.
fn closing(code: u16, reason: &str) -> Closing {
    Closing { code, reason: reason.into() }
}

/// Makes `job` a WebSocket's (the `WEBSOCKET` flag, its link) and returns the connection's end
/// of the link.
pub(super) fn link_job(job: &mut Job) -> ToWorker {
    let (to_worker, websocket) = link();
    job.frame[1] |= FLAG_WEBSOCKET;
    job.websocket = Some(Box::new(websocket));
    job.summary = format!("{}{SUMMARY_MARK}", job.summary).into();
    to_worker
}

impl<S: ClientStream> Connection<S> {
    /// With an ASGI application, whether the request is a WebSocket handshake: what its 101
    /// will say. A bad one is refused here, before a worker sees it (Err: the connection closes).
    pub(super) async fn websocket_handshake(
        &mut self,
        head: &RequestHead,
        body_len: u64,
    ) -> Result<Option<Handshake>, ()> {
        if !self.context.websockets.asgi() || !asks_websocket(head) {
            return Ok(None);
        }
        match check_handshake(head, body_len) {
            Ok(accept_key) => {
                let deflate = self.context.settings().websocket.per_message_deflate.then(|| Deflate::negotiate(head));
                Ok(Some(Handshake { accept_key, deflate: deflate.flatten() }))
            }
            Err(bad) => {
                self.refuse_handshake(bad).await;
                Err(())
            }
        }
    }

    /// Refuses a bad handshake, with a log line; no worker sees it.
    async fn refuse_handshake(&mut self, bad: BadHandshake) {
        log::info_limited!("{} to {}: {}", bad.status, self.peer.display(), bad.reason);
        self.context.counts.refused(bad.status);
        let mut out = Vec::new();
        write_error_response(&mut out, bad.status, bad.reason, &http_date(), false, None);
        if bad.status == 426 {
            // RFC 6455, 4.4: the versions the server speaks, right after the status line.
            let at = out.iter().position(|&b| b == b'\n').map_or(out.len(), |at| at + 1);
            out.splice(at..at, b"Sec-WebSocket-Version: 13\r\n".iter().copied());
        }
        let _ = self.write_closing(&out).await;
    }

    /// The worker's first WebSocket part: a refusal (403), or the accept, after which the
    /// session runs until the WebSocket closes. Returns the status for the access log.
    pub(super) async fn websocket(
        &mut self,
        handshake: &Handshake,
        first: WsPart,
        link: ToWorker,
        responses: &AnswerReceiver,
    ) -> u16 {
        let (subprotocol, headers) = match first {
            WsPart::Accept { subprotocol, headers } => (subprotocol, headers),
            WsPart::Close { code, .. } => {
                debug!("the application refused the WebSocket of {} ({code})", self.peer.display());
                let mut out = Vec::new();
                write_error_response(&mut out, 403, "the application refused the WebSocket", &http_date(), false, None);
                let _ = self.write_closing(&out).await;
                return 403;
            }
            WsPart::Send { .. } | WsPart::GoingAway => {
                unreachable!("the relay passes only WS_ACCEPT or WS_CLOSE first (relay::websocket_in_step)")
            }
        };
        self.mark.set(ConnectionState::WebSocket);
        if self.write_all(&switching_protocols(handshake, &subprotocol, &headers)).await.is_err() {
            link.close(closing(1006, "the client left before the 101 was written"));
            return 101;
        }
        let ended = self.session(link, responses, handshake.deflate).await;
        debug!("WebSocket of {} closed ({}: {})", self.peer.display(), ended.code, ended.reason);
        101
    }

    /// Relays messages both ways until the WebSocket closes; says how it ended. The client is
    /// read while a message is being written to it: a client that sends and reads under one
    /// lock (as the `websockets` library does) would otherwise never read what waits for it.
    ///
    /// A client that breaks the protocol is failed (RFC 6455, 7.1.7) only once every message
    /// it sent before the bad frame has reached the worker, and what the worker sends until it
    /// has heard of the failure has gone out: the client gets the answers to its good messages,
    /// then the Close.
    async fn session(&mut self, link: ToWorker, responses: &AnswerReceiver, deflate: Option<Deflate>) -> Closing {
        let context = self.context.clone();
        let limits = context.settings().websocket;
        let send_timeout = context.settings().send_timeout;
        let peer = self.peer.display();
        // tungstenite reserves `read_buffer_size` for each WebSocket up front (128 KiB by
        // default): 150 KB of lobby memory an open WebSocket at 5,000 of them, against uvicorn's
        // 27 KB; 4 KiB was still 4 of the lobby's 17.4 KB. The buffer grows only for a message
        // larger than it, while it is read, and `Inflating` reads ahead past it.
        let config = WebSocketConfig::default()
            .read_buffer_size(WEBSOCKET_READ_BUFFER)
            .max_message_size(Some(limits.max_size))
            .max_frame_size(Some(limits.max_size));
        // What the client sent right after its handshake is the WebSocket's first bytes.
        let early = std::mem::take(&mut self.buf).to_vec();
        let (stream, early) = Inflating::new(&mut self.stream, deflate, early, limits.max_size);
        let ws = WebSocketStream::from_partially_read(stream, early, Role::Server, Some(config)).await;
        let (sink, mut stream) = ws.split();
        // The writing half, while no message is being written; the message being written owns it
        // meanwhile, and gives it back.
        let mut idle_sink = Some(sink);
        let mut writing: Option<Pin<Box<dyn Future<Output = Written<'_, S>> + '_>>> = None;
        let mut pending: Option<ClientMessage> = None;
        // Taken when the worker is told how the client side ended (`WS_CLOSED` follows the
        // messages sent before it).
        let mut link = Some(link);
        // The client broke the protocol: the Close it gets, and when it gets it at the latest.
        let mut failing: Option<(Closing, Instant)> = None;
        let mut heard = Instant::now();
        // A ping is out: when its pong is due.
        let mut pong_due: Option<Instant> = None;
        let going_away = context.websockets.going_away();
        tokio::pin!(going_away);
        // The lobby (or the worker) closes: the code and reason sent, and what the worker hears.
        let (sent, ended) = loop {
            if let Some((failed, _)) = &failing {
                if pending.is_none() {
                    if let Some(link) = link.take() {
                        link.close(failed.clone());
                    }
                }
            }
            let ping_at = pong_due.unwrap_or(heard + limits.ping_interval);
            let fail_at = failing.as_ref().map(|(_, at)| *at);
            tokio::select! {
                biased;
                (sink, result) = async { writing.as_mut().expect("a write in flight").await }, if writing.is_some() => {
                    writing = None;
                    idle_sink = Some(sink);
                    match result {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => break (None, closing(1006, &format!("could not send: {e}"))),
                        Err(_) => {
                            log::info_limited!(
                                "WebSocket of {peer} cut: the client took no message within --send-timeout ({} s)",
                                send_timeout.as_secs_f64()
                            );
                            break (None, closing(1006, "the client did not read within --send-timeout"));
                        }
                    }
                }
                part = responses.recv(), if idle_sink.is_some() => match part {
                    Some(ResponsePart::WebSocket(WsPart::Send { text, data })) => {
                        let message = match &deflate {
                            Some(deflate) => Message::Frame(deflate.compressed_frame(text, &data)),
                            // The relay checked it (WsData::decode_payload).
                            None if text => Message::Text(Utf8Bytes::try_from(data).expect("checked UTF-8")),
                            None => Message::Binary(data),
                        };
                        let mut sink = idle_sink.take().expect("checked");
                        writing = Some(Box::pin(async move {
                            let result = timeout(send_timeout, sink.send(message)).await;
                            (sink, result)
                        }));
                    }
                    // The worker has ended: it hears nothing more. A failed connection closes
                    // with the failure's code, whatever the worker's.
                    Some(ResponsePart::WebSocket(WsPart::Close { code, reason })) => match failing {
                        Some((failed, _)) => break (Some((failed.code, failed.reason.clone())), failed),
                        None => break (Some(wire_close(&peer, code, reason)), closing(code, "the application closed")),
                    },
                    Some(ResponsePart::WebSocket(WsPart::GoingAway)) => {
                        let reason = "the server is reloading";
                        break (Some((1001, reason.into())), closing(1001, reason));
                    }
                    // The worker was lost (the relay said so in the log): it hears nothing more.
                    _ => {
                        let reason = "the application's worker was lost";
                        break (Some((1011, reason.into())), closing(1011, reason));
                    }
                },
                ready = poll_fn(|cx| link.as_mut().expect("a link").messages.poll_ready(cx)), if pending.is_some() && link.is_some() => {
                    let sent = ready.and_then(|()| {
                        link.as_mut().expect("a link").messages.start_send(pending.take().expect("a pending message"))
                    });
                    // The relay has ended: the worker's last part is on its way.
                    if sent.is_err() {
                        pending = None;
                    }
                }
                message = stream.next(), if pending.is_none() && failing.is_none() => {
                    heard = Instant::now();
                    match message {
                        Some(Ok(Message::Text(text))) => pending = Some(ClientMessage { text: true, data: text.into() }),
                        Some(Ok(Message::Binary(data))) => pending = Some(ClientMessage { text: false, data }),
                        // tungstenite answers pings itself.
                        Some(Ok(Message::Ping(_))) => {}
                        Some(Ok(Message::Pong(_))) => pong_due = None,
                        Some(Ok(Message::Close(frame))) => {
                            // tungstenite has queued the answer to the Close; it goes with the
                            // closing below.
                            break (None, match frame {
                                Some(frame) => closing(frame.code.into(), frame.reason.as_str()),
                                None => closing(1005, ""),
                            });
                        }
                        Some(Ok(Message::Frame(_))) => unreachable!("raw frames only come to a writer"),
                        Some(Err(e)) => match failure(&e) {
                            Some((code, reason)) => {
                                let hint = if code == 1009 { " (--ws-max-size)" } else { "" };
                                log::info_limited!("WebSocket of {peer} closed ({code}): {e}{hint}");
                                failing = Some((closing(code, reason), Instant::now() + CLOSE_WAIT));
                            }
                            None => break (None, closing(1006, "the connection ended without a Close")),
                        },
                        None => break (None, closing(1006, "the connection ended without a Close")),
                    }
                },
                _ = sleep_until(fail_at.unwrap_or(ping_at)), if fail_at.is_some() && idle_sink.is_some() => {
                    let (failed, _) = failing.take().expect("checked");
                    break (Some((failed.code, failed.reason.clone())), failed);
                }
                _ = sleep_until(ping_at), if idle_sink.is_some() && failing.is_none() => {
                    if pong_due.is_some() {
                        log::info_limited!(
                            "WebSocket of {peer} closed (1011): no pong within --ws-ping-timeout ({} s)",
                            limits.ping_timeout.as_secs_f64()
                        );
                        break (Some((1011, "ping timeout".into())), closing(1011, "ping timeout"));
                    }
                    let sink = idle_sink.as_mut().expect("checked");
                    if sink.send(Message::Ping(Bytes::new())).await.is_err() {
                        break (None, closing(1006, "the connection ended without a Close"));
                    }
                    pong_due = Some(Instant::now() + limits.ping_timeout);
                }
                _ = &mut going_away => {
                    let reason = "the server is stopping";
                    break (Some((1001, reason.into())), closing(1001, reason));
                }
            }
        };
        // The worker gets WS_CLOSED with it, after every message sent before (unless it closed
        // itself, or has been told already); meanwhile the client gets the lobby's Close.
        if let Some(link) = link {
            link.close(ended.clone());
        }
        // A message being written finishes first, within the wait for the closing handshake.
        let sink = match (idle_sink, writing) {
            (Some(sink), _) => Some(sink),
            (None, Some(write)) => timeout(CLOSE_WAIT, write).await.ok().map(|(sink, _)| sink),
            (None, None) => None,
        };
        if let Some(Ok(mut ws)) = sink.map(|sink| stream.reunite(sink)) {
            match sent {
                Some((code, reason)) => close(&mut ws, code, &reason).await,
                // The client closed: the answer tungstenite queued goes out.
                None => {
                    let _ = ws.flush().await;
                }
            }
        }
        ended
    }
}

/// The application's close code and reason as a Close may carry them (RFC 6455, 5.5 and 7.4):
/// a code no Close may carry (1005, 1006, 1015, one below 1000 or unassigned) becomes 1011, and a
/// reason past 123 bytes is cut at a character's end; each with a log line.
fn wire_close(peer: &str, code: u16, reason: String) -> (u16, String) {
    const MAX_REASON: usize = 123;
    if !CloseCode::from(code).is_allowed() {
        log::info_limited!(
            "WebSocket of {peer}: the application closed with {code}, which no Close may carry; sent 1011"
        );
        return (1011, String::new());
    }
    if reason.len() <= MAX_REASON {
        return (code, reason);
    }
    log::info_limited!(
        "WebSocket of {peer}: the application's close reason is {} bytes; sent its first {MAX_REASON} at most",
        reason.len()
    );
    let end = (0..=MAX_REASON).rev().find(|&at| reason.is_char_boundary(at)).unwrap_or(0);
    (code, reason[..end].to_string())
}

/// The Close for a client's frames that fail the connection (RFC 6455, 7.4.1): 1007 a text
/// message (or a Close's reason) not UTF-8, 1009 a message over --ws-max-size (inflated, when
/// compressed), 1002 any other breach of the protocol (or of RFC 7692). None when the
/// connection itself is gone: no Close can be sent, and the worker hears 1006 (7.1.5). The
/// reason is short: a Close's must fit in 123 bytes.
fn failure(error: &WsError) -> Option<(u16, &'static str)> {
    match error {
        WsError::Utf8(_) => Some((1007, "invalid UTF-8")),
        WsError::Capacity(_) => Some((1009, "message too big")),
        WsError::Io(e) => match Refused::of(e)? {
            Refused::TooBig => Some((1009, "message too big")),
            Refused::Broken(_) => Some((1002, "protocol error")),
        },
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => None,
        WsError::Protocol(_) => Some((1002, "protocol error")),
        _ => None,
    }
}

/// What writing one message to the client gives back: the writing half, and how it went.
type Written<'a, S> = (
    SplitSink<WebSocketStream<Inflating<&'a mut S>>, Message>,
    Result<Result<(), WsError>, tokio::time::error::Elapsed>,
);

/// Sends a Close and waits, within `CLOSE_WAIT`, for the client's.
async fn close<S: ClientStream>(ws: &mut WebSocketStream<Inflating<&mut S>>, code: u16, reason: &str) {
    let frame = CloseFrame { code: CloseCode::from(code), reason: reason.into() };
    if ws.close(Some(frame)).await.is_err() {
        return;
    }
    let _ = timeout(CLOSE_WAIT, async { while let Some(Ok(_)) = ws.next().await {} }).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: &str, headers: &[(&str, &str)]) -> RequestHead {
        RequestHead {
            method: Bytes::copy_from_slice(method.as_bytes()),
            target: Bytes::from_static(b"/ws"),
            version: Version::Http11,
            headers: headers
                .iter()
                .map(|(n, v)| (Bytes::copy_from_slice(n.as_bytes()), Bytes::copy_from_slice(v.as_bytes())))
                .collect(),
            body: maitred_protocol::BodyLength::Empty,
            keep_alive: true,
            expect_continue: false,
        }
    }

    const GOOD: &[(&str, &str)] = &[
        ("Upgrade", "websocket"),
        ("Connection", "keep-alive, Upgrade"),
        ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];

    fn with(replace: (&'static str, &'static str)) -> Vec<(&'static str, &'static str)> {
        GOOD.iter().map(|&(n, v)| if n == replace.0 { replace } else { (n, v) }).collect()
    }

    #[test]
    fn the_rfc_sample_handshake_gets_its_accept_key() {
        assert!(asks_websocket(&head("GET", GOOD)));
        // RFC 6455, 1.3.
        assert_eq!(check_handshake(&head("GET", GOOD), 0).ok().as_deref(), Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="));
        assert!(!asks_websocket(&head("GET", &[("Upgrade", "h2c")])));
    }

    #[test]
    fn an_applications_close_is_sent_as_a_close_may_carry_it() {
        assert_eq!(wire_close("p", 4000, "asked to".into()), (4000, "asked to".into()));
        for code in [999, 1005, 1006, 1015, 1016, 2999] {
            assert_eq!(wire_close("p", code, "x".into()), (1011, String::new()), "{code}");
        }
        let long = "é".repeat(100);
        let (code, reason) = wire_close("p", 1000, long);
        assert_eq!((code, reason.len()), (1000, 122));
    }

    #[test]
    fn every_bad_handshake_is_refused_with_its_reason() {
        let status = |head: RequestHead, body: u64| check_handshake(&head, body).err().map(|bad| bad.status);
        assert_eq!(status(head("POST", GOOD), 0), Some(400));
        assert_eq!(status(head("GET", GOOD), 5), Some(400));
        assert_eq!(status(head("GET", &with(("Connection", "keep-alive"))), 0), Some(400));
        assert_eq!(status(head("GET", &with(("Sec-WebSocket-Version", "8"))), 0), Some(426));
        for key in ["short==", "dGhlIHNhbXBsZSBub25jZQ", "dGhlIHNhbXBsZSBub25jZR==", "dGhlIHNhbXBsZSBub25j*Q=="] {
            assert_eq!(status(head("GET", &with(("Sec-WebSocket-Key", key))), 0), Some(400), "{key}");
        }
        let mut http10 = head("GET", GOOD);
        http10.version = Version::Http10;
        assert_eq!(status(http10, 0), Some(400));
    }
}
