//! The frames about one request of a channel that carries many (docs/PROTOCOL.md, sections 2
//! and 4): `CANCEL`, `HOLD` and `GO` are its id alone; `WS_MESSAGE` and `WS_CLOSED` lead with it.

use crate::{FrameHeader, Kind, WireError, HEADER_LEN};

/// Bytes of the request id that leads `CANCEL`, `HOLD`, `GO`, `WS_MESSAGE` and `WS_CLOSED`.
pub const ID_LEN: usize = 4;

/// A whole `CANCEL` frame for request `id`.
pub fn cancel_frame(id: u32) -> [u8; HEADER_LEN + 4] {
    id_frame(Kind::Cancel, id)
}

/// A whole frame of `kind` (`CANCEL`, `HOLD`, `GO`) whose payload is request `id` alone.
pub fn id_frame(kind: Kind, id: u32) -> [u8; HEADER_LEN + ID_LEN] {
    let mut frame = [0u8; HEADER_LEN + ID_LEN];
    frame[..HEADER_LEN].copy_from_slice(&FrameHeader { kind, flags: 0, len: ID_LEN as u32 }.encode());
    frame[HEADER_LEN..].copy_from_slice(&id.to_le_bytes());
    frame
}

/// The request id that leads a `WS_MESSAGE` or `WS_CLOSED` payload, and the rest of it.
pub fn split_request_id(payload: &[u8]) -> Result<(u32, &[u8]), WireError> {
    if payload.len() < ID_LEN {
        return Err(WireError::Truncated("request id"));
    }
    let (id, rest) = payload.split_at(ID_LEN);
    Ok((u32::from_le_bytes(id.try_into().expect("4 bytes")), rest))
}

/// The request id a `CANCEL` frame's payload names.
pub fn decode_cancel(payload: &[u8]) -> Result<u32, WireError> {
    let id: [u8; 4] = payload.try_into().map_err(|_| WireError::BadLength("CANCEL", payload.len()))?;
    Ok(u32::from_le_bytes(id))
}
