//! The payload of `READY` (docs/PROTOCOL.md, section 2), which says what the worker takes.

use super::{Reader, WireError, READY_ASGI};

/// The payload of `READY`: the worker's pid and what it takes. A bare 4-byte payload (a worker
/// from before section 5) has no flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ready {
    pub pid: u32,
    pub flags: u8,
}

impl Ready {
    pub const PAYLOAD_LEN: usize = 5;

    pub fn encode_payload(&self) -> [u8; Self::PAYLOAD_LEN] {
        let pid = self.pid.to_le_bytes();
        [pid[0], pid[1], pid[2], pid[3], self.flags]
    }

    pub fn decode_payload(payload: &[u8]) -> Result<Ready, WireError> {
        let mut r = Reader::new(payload);
        let pid = r.u32("pid")?;
        let rest = r.rest();
        match rest.len() {
            0 => Ok(Ready { pid, flags: 0 }),
            1 => Ok(Ready { pid, flags: rest[0] }),
            n => Err(WireError::TrailingBytes(n - 1)),
        }
    }

    /// The worker runs an ASGI application and takes WebSocket requests.
    pub fn asgi(&self) -> bool {
        self.flags & READY_ASGI != 0
    }
}
