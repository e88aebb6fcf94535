//! The payloads of a worker's answer frames (docs/PROTOCOL.md, section 3): `RESPONSE_HEAD`
//! and `RESPONSE_FILE`.

use super::{Reader, WireError, Writer};

/// The head of a `RESPONSE_HEAD` frame; the rest of the payload is the first body bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead<'a> {
    pub status: u16,
    pub reason: &'a [u8],
    pub headers: Vec<(&'a [u8], &'a [u8])>,
}

impl<'a> ResponseHead<'a> {
    /// Appends the head fields; the caller appends the first body bytes after them.
    pub fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let mut w = Writer::new(out);
        w.u16(self.status);
        w.str16("reason", self.reason)?;
        w.headers(&self.headers)?;
        Ok(())
    }

    /// Decodes the head fields and returns them with the body bytes that follow.
    pub fn decode_payload(payload: &'a [u8]) -> Result<(ResponseHead<'a>, &'a [u8]), WireError> {
        let mut r = Reader::new(payload);
        let status = r.u16("status")?;
        let reason = r.str16("reason")?;
        let headers = r.headers()?;
        Ok((ResponseHead { status, reason, headers }, r.rest()))
    }
}

/// The payload of a `RESPONSE_FILE` frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileRange {
    pub offset: u64,
    pub count: u64,
}

impl FileRange {
    pub const PAYLOAD_LEN: usize = 16;

    pub fn encode_payload(&self) -> [u8; Self::PAYLOAD_LEN] {
        let mut out = [0u8; Self::PAYLOAD_LEN];
        out[..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..].copy_from_slice(&self.count.to_le_bytes());
        out
    }

    pub fn decode_payload(payload: &[u8]) -> Result<FileRange, WireError> {
        let mut r = Reader::new(payload);
        let range = FileRange { offset: r.u64("file offset")?, count: r.u64("file count")? };
        match r.rest().len() {
            0 => Ok(range),
            n => Err(WireError::TrailingBytes(n)),
        }
    }
}
