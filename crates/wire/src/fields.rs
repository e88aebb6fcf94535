//! The encodings of a frame's payload fields (docs/PROTOCOL.md, section 2): little-endian
//! integers, strings with a 16-bit length, byte strings with a 32-bit one, and header lists.

use crate::WireError;

/// Writes payload fields in the protocol's encodings.
pub struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> Writer<'a> {
        Writer { out }
    }

    pub fn u8(&mut self, value: u8) {
        self.out.push(value);
    }

    pub fn u16(&mut self, value: u16) {
        self.out.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u32(&mut self, value: u32) {
        self.out.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u64(&mut self, value: u64) {
        self.out.extend_from_slice(&value.to_le_bytes());
    }

    pub fn str16(&mut self, field: &'static str, value: &[u8]) -> Result<(), WireError> {
        let len = u16::try_from(value.len()).map_err(|_| WireError::FieldTooLong(field, value.len()))?;
        self.u16(len);
        self.out.extend_from_slice(value);
        Ok(())
    }

    pub fn bytes32(&mut self, field: &'static str, value: &[u8]) -> Result<(), WireError> {
        let len = u32::try_from(value.len()).map_err(|_| WireError::FieldTooLong(field, value.len()))?;
        self.u32(len);
        self.out.extend_from_slice(value);
        Ok(())
    }

    pub fn raw(&mut self, value: &[u8]) {
        self.out.extend_from_slice(value);
    }

    /// A `u16` count, then each header as `str16` name and `bytes32` value.
    pub fn headers(&mut self, headers: &[(&[u8], &[u8])]) -> Result<(), WireError> {
        let count = u16::try_from(headers.len()).map_err(|_| WireError::FieldTooLong("header count", headers.len()))?;
        self.u16(count);
        for (name, value) in headers {
            self.str16("header name", name)?;
            self.bytes32("header value", value)?;
        }
        Ok(())
    }
}

/// Header names and values as [`Reader::headers`] returns them, borrowed from the payload.
pub type HeaderPairs<'a> = Vec<(&'a [u8], &'a [u8])>;

/// Reads payload fields in the protocol's encodings, borrowing from the payload.
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(payload: &'a [u8]) -> Reader<'a> {
        Reader { rest: payload }
    }

    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], WireError> {
        if self.rest.len() < n {
            return Err(WireError::Truncated(field));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    pub fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.take(field, 1)?[0])
    }

    pub fn u16(&mut self, field: &'static str) -> Result<u16, WireError> {
        let b = self.take(field, 2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        let b = self.take(field, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        let b = self.take(field, 8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub fn str16(&mut self, field: &'static str) -> Result<&'a [u8], WireError> {
        let len = self.u16(field)? as usize;
        self.take(field, len)
    }

    pub fn bytes32(&mut self, field: &'static str) -> Result<&'a [u8], WireError> {
        let len = self.u32(field)? as usize;
        self.take(field, len)
    }

    /// What [`Writer::headers`] wrote.
    pub fn headers(&mut self) -> Result<HeaderPairs<'a>, WireError> {
        let count = self.u16("header count")? as usize;
        let mut headers = Vec::with_capacity(count);
        for _ in 0..count {
            let name = self.str16("header name")?;
            let value = self.bytes32("header value")?;
            headers.push((name, value));
        }
        Ok(headers)
    }

    /// Everything not read yet.
    pub fn rest(self) -> &'a [u8] {
        self.rest
    }
}
