//! The payloads of the WebSocket frames (docs/PROTOCOL.md, section 5): what the lobby and an
//! ASGI worker say about a WebSocket whose protocol the lobby speaks.

use super::{HeaderPairs, Reader, WireError, Writer};

/// The opcode of a WebSocket data message (RFC 6455, 5.2): what its bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum WsOpcode {
    /// UTF-8 text; the lobby has checked it (from the client) or checks it (to the client).
    Text = 1,
    Binary = 2,
}

/// The payload of `WS_MESSAGE` (client to application) and `WS_SEND` (application to client):
/// the opcode, then the message's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WsData<'a> {
    pub opcode: WsOpcode,
    pub data: &'a [u8],
}

impl<'a> WsData<'a> {
    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        out.push(self.opcode as u8);
        out.extend_from_slice(self.data);
    }

    pub fn decode_payload(payload: &'a [u8]) -> Result<WsData<'a>, WireError> {
        let mut r = Reader::new(payload);
        let opcode = match r.u8("opcode")? {
            1 => WsOpcode::Text,
            2 => WsOpcode::Binary,
            other => return Err(WireError::BadValue("opcode", other)),
        };
        let data = r.rest();
        if opcode == WsOpcode::Text && std::str::from_utf8(data).is_err() {
            return Err(WireError::NotUtf8("text message"));
        }
        Ok(WsData { opcode, data })
    }
}

/// The payload of `WS_CLOSE` (the application closes) and `WS_CLOSED` (the client's connection
/// is closed): a close code (RFC 6455, 7.4), then a UTF-8 reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WsClosing<'a> {
    pub code: u16,
    pub reason: &'a str,
}

impl<'a> WsClosing<'a> {
    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.code.to_le_bytes());
        out.extend_from_slice(self.reason.as_bytes());
    }

    pub fn decode_payload(payload: &'a [u8]) -> Result<WsClosing<'a>, WireError> {
        let mut r = Reader::new(payload);
        let code = r.u16("close code")?;
        let reason = std::str::from_utf8(r.rest()).map_err(|_| WireError::NotUtf8("close reason"))?;
        Ok(WsClosing { code, reason })
    }
}

/// The payload of `WS_ACCEPT`: the subprotocol the application chose (empty: none) and the
/// headers it adds to the `101 Switching Protocols`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WsAccept<'a> {
    pub subprotocol: &'a [u8],
    pub headers: HeaderPairs<'a>,
}

impl<'a> WsAccept<'a> {
    pub fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let mut w = Writer::new(out);
        w.str16("subprotocol", self.subprotocol)?;
        w.headers(&self.headers)
    }

    pub fn decode_payload(payload: &'a [u8]) -> Result<WsAccept<'a>, WireError> {
        let mut r = Reader::new(payload);
        let subprotocol = r.str16("subprotocol")?;
        let headers = r.headers()?;
        match r.rest().len() {
            0 => Ok(WsAccept { subprotocol, headers }),
            n => Err(WireError::TrailingBytes(n)),
        }
    }
}
