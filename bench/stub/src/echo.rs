//! The stub worker's WebSocket echo (`maitred-stub --websocket-echo`): it says `READY_ASGI`,
//! accepts every WebSocket handshake with the first subprotocol the client offers, sends each
//! message back as it came, closes with 1000 when a text message says `close`, and answers the
//! lobby's `WS_CLOSED` with its `WS_CLOSE` (docs/PROTOCOL.md, section 5). A handshake for a path
//! under `/refuse` is refused (`WS_CLOSE` before `WS_ACCEPT`), one under `/deny` gets a denial
//! response (`RESPONSE_HEAD` 401). So the lobby's side of WebSockets can be tested and measured
//! without the Python worker.

use maitred_wire::{
    build_frame, Kind, Request, ResponseHead, WsAccept, WsClosing, WsData, WsOpcode, FLAG_END, HEADER_LEN,
};

/// What a WebSocket request asks of the echo: the subprotocol it accepts with, or a refusal.
pub struct Handshake {
    pub subprotocol: Vec<u8>,
    pub answer: Answer,
}

/// How the echo answers a handshake, by its path.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Accept,
    /// `/refuse…`: `WS_CLOSE` before `WS_ACCEPT`, which the lobby answers 403.
    Refuse,
    /// `/deny…`: a denial response, `401` with a body.
    Deny,
}

impl Handshake {
    /// Reads the subprotocol from a `REQUEST` frame with the `WEBSOCKET` flag: the first one
    /// `Sec-WebSocket-Protocol` offers, or none.
    pub fn of(frame: &[u8], body_in_file: bool) -> Result<Handshake, String> {
        let request = Request::decode_payload(&frame[HEADER_LEN..], body_in_file)
            .map_err(|e| format!("the lobby sent a bad WebSocket REQUEST: {e}"))?;
        let offered = request.headers.iter().find(|(name, _)| name.eq_ignore_ascii_case(b"sec-websocket-protocol"));
        let subprotocol = offered
            .and_then(|(_, value)| value.split(|&b| b == b',').next())
            .map(|first| first.trim_ascii().to_vec())
            .unwrap_or_default();
        let answer = match request.target {
            target if target.starts_with(b"/refuse") => Answer::Refuse,
            target if target.starts_with(b"/deny") => Answer::Deny,
            _ => Answer::Accept,
        };
        Ok(Handshake { subprotocol, answer })
    }

    /// The frame that answers the handshake, and whether the WebSocket is open after it.
    pub fn answer(&self) -> Result<(Vec<u8>, bool), String> {
        match self.answer {
            Answer::Accept => Ok((self.accept()?, true)),
            Answer::Refuse => Ok((close_frame(1008, "refused")?, false)),
            Answer::Deny => {
                let head = ResponseHead {
                    status: 401,
                    reason: b"Unauthorized",
                    headers: vec![(b"Content-Type", b"text/plain")],
                };
                let frame = build_frame(Kind::ResponseHead, FLAG_END, |out| {
                    head.encode_payload(out)?;
                    out.extend_from_slice(b"denied\n");
                    Ok(())
                })
                .map_err(|e| format!("encoding the denial: {e}"))?;
                Ok((frame, false))
            }
        }
    }

    /// The `WS_ACCEPT` frame.
    fn accept(&self) -> Result<Vec<u8>, String> {
        let accept = WsAccept { subprotocol: &self.subprotocol, headers: vec![(b"X-Stub", b"echo")] };
        build_frame(Kind::WsAccept, 0, |out| accept.encode_payload(out)).map_err(|e| format!("encoding WS_ACCEPT: {e}"))
    }
}

/// What the echo answers to a `WS_MESSAGE` payload: the same message, and whether it is the
/// last frame (a `WS_CLOSE` for the text `close`).
pub fn answer_message(payload: &[u8]) -> Result<(Vec<u8>, bool), String> {
    let message = WsData::decode_payload(payload).map_err(|e| format!("the lobby sent a bad WS_MESSAGE: {e}"))?;
    if message.opcode == WsOpcode::Text && message.data == b"close" {
        return Ok((close_frame(1000, "asked to close")?, true));
    }
    let echo = build_frame(Kind::WsSend, 0, |out| {
        message.encode_payload(out);
        Ok(())
    })
    .map_err(|e| format!("encoding WS_SEND: {e}"))?;
    Ok((echo, false))
}

/// The `WS_CLOSE` that answers a `WS_CLOSED` payload: the echo closes with the code the lobby
/// gave.
pub fn answer_closed(payload: &[u8]) -> Result<Vec<u8>, String> {
    let closed = WsClosing::decode_payload(payload).map_err(|e| format!("the lobby sent a bad WS_CLOSED: {e}"))?;
    close_frame(closed.code, "closed")
}

fn close_frame(code: u16, reason: &str) -> Result<Vec<u8>, String> {
    build_frame(Kind::WsClose, FLAG_END, |out| {
        WsClosing { code, reason }.encode_payload(out);
        Ok(())
    })
    .map_err(|e| format!("encoding WS_CLOSE: {e}"))
}
