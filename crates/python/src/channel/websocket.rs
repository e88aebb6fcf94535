//! A WebSocket request in progress (docs/PROTOCOL.md, section 5): the lobby did the handshake
//! and does the framing; the worker sees whole messages as ASGI events and answers with
//! `WS_ACCEPT`, `WS_SEND` and, always last, `WS_CLOSE`.
//!
//! Imports the type from `mod.rs` and `errors` of the channel's files (the request's news, kept
//! by `mux`, through the type's methods); `response` of this crate, for the phase and the headers' checks.

use maitred_wire::{FrameHeader, Kind, WsClosing, WsData, WsOpcode, FLAG_END, HEADER_LEN};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};

use super::errors::{channel_error, client_disconnected, wire_error};
use super::ring::Aside;
use super::WorkerChannel;
use crate::response::{encode_asgi_headers, Phase};

/// The close code ASGI's `websocket.disconnect` carries when the client left before the
/// worker accepted (RFC 6455's "abnormal closure").
const LEFT_BEFORE_ACCEPT: u16 = 1006;

impl WorkerChannel {
    fn check_websocket(&self) -> PyResult<()> {
        if !self.websocket || self.response.phase == Phase::Complete {
            return Err(PyRuntimeError::new_err("no WebSocket is in progress on this channel"));
        }
        Ok(())
    }

    /// The next `WS_MESSAGE` or `WS_CLOSED` (or the `CANCEL` of a WebSocket not accepted yet),
    /// as an ASGI event; None when nothing has come.
    pub(super) fn next_ws_event<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.check_websocket()?;
        // What the loop's watch has sorted into this request's news; never a read here
        // (`check_cancel` says why).
        let accepted = self.response.phase == Phase::HeadSent;
        let Some(news) = self.news() else { return Ok(None) };
        let event = PyDict::new(py);
        let Some((kind, payload)) = news.ws.pop_front() else {
            if news.cancelled && !accepted {
                self.response.phase = Phase::Cancelled;
                event.set_item(intern!(py, "type"), intern!(py, "websocket.disconnect"))?;
                event.set_item(intern!(py, "code"), LEFT_BEFORE_ACCEPT)?;
                event.set_item(intern!(py, "reason"), intern!(py, ""))?;
                return Ok(Some(event));
            }
            return Ok(None);
        };
        if kind == Kind::WsMessage {
            let message = WsData::decode_payload(&payload)
                .map_err(|error| channel_error("the lobby sent a bad WS_MESSAGE", error))?;
            event.set_item(intern!(py, "type"), intern!(py, "websocket.receive"))?;
            match message.opcode {
                WsOpcode::Text => {
                    // Checked to be UTF-8 by the decoder.
                    let text = std::str::from_utf8(message.data).expect("UTF-8, checked");
                    event.set_item(intern!(py, "text"), PyString::new(py, text))?;
                }
                WsOpcode::Binary => event.set_item(intern!(py, "bytes"), PyBytes::new(py, message.data))?,
            }
        } else {
            let closing = WsClosing::decode_payload(&payload)
                .map_err(|error| channel_error("the lobby sent a bad WS_CLOSED", error))?;
            event.set_item(intern!(py, "type"), intern!(py, "websocket.disconnect"))?;
            event.set_item(intern!(py, "code"), closing.code)?;
            event.set_item(intern!(py, "reason"), closing.reason)?;
        }
        self.ws_received(py)?;
        Ok(Some(event))
    }

    pub(super) fn accept_ws(&mut self, py: Python<'_>, subprotocol: &str, headers: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check_websocket()?;
        if self.response.phase != Phase::AwaitingStart {
            return Err(PyRuntimeError::new_err("websocket.accept came after the WebSocket was accepted or refused"));
        }
        let mut payload = Vec::new();
        let mut writer = maitred_wire::Writer::new(&mut payload);
        writer
            .str16("subprotocol", subprotocol.as_bytes())
            .map_err(|error| PyTypeError::new_err(format!("the subprotocol: {error}")))?;
        encode_asgi_headers(headers, &mut payload)?;
        self.send_frame(py, Kind::WsAccept, 0, &payload)?;
        self.response.phase = Phase::HeadSent;
        Ok(())
    }

    pub(super) fn send_ws(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check_websocket()?;
        match self.response.phase {
            Phase::HeadSent => {}
            Phase::Cancelled => return Err(client_disconnected()),
            _ => return Err(PyRuntimeError::new_err("websocket.send came before websocket.accept")),
        }
        let (opcode, bytes) = if let Ok(text) = data.cast::<PyString>() {
            (WsOpcode::Text, text.to_str()?.as_bytes())
        } else if let Ok(bytes) = data.cast::<PyBytes>() {
            (WsOpcode::Binary, bytes.as_bytes())
        } else {
            let kind = data.get_type().name()?;
            return Err(PyTypeError::new_err(format!("a WebSocket message is str or bytes, not {kind}")));
        };
        let mut frame = Vec::with_capacity(HEADER_LEN + 1 + bytes.len());
        frame.extend_from_slice(&[0; HEADER_LEN]);
        WsData { opcode, data: bytes }.encode_payload(&mut frame);
        let header = FrameHeader::new(Kind::WsSend, 0, frame.len() - HEADER_LEN).map_err(wire_error)?;
        frame[..HEADER_LEN].copy_from_slice(&header.encode());
        self.send_answer(py, &[&frame], Aside::No)
    }

    pub(super) fn close_ws(&mut self, py: Python<'_>, code: u16, reason: &str) -> PyResult<()> {
        self.check_websocket()?;
        let mut payload = Vec::new();
        WsClosing { code, reason }.encode_payload(&mut payload);
        self.send_frame(py, Kind::WsClose, FLAG_END, &payload)?;
        self.response.phase = Phase::Complete;
        Ok(())
    }
}
