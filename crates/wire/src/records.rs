//! A streaming body of unknown length (a chunked upload to an ASGI worker) as it travels in
//! its pipe: records, each a `u32` length (little-endian) and that many bytes of the body, and
//! a record of length 0 for the end (docs/PROTOCOL.md, section 2). A pipe that closes before
//! the end record is a body cut short: its client went. A body of known length needs none of
//! this: its pipe carries the bytes bare, and the worker counts them.
//!
//! The reader never copies the body: each read is planned (`BodyRecords::plan`) as the body's
//! bytes, into the caller's buffer, then the next record's header, into the reader's own, so
//! that one `readv(2)` takes a record's last bytes and the header after them. A pipe holds the
//! lobby's whole write of a record (header and bytes, one `writev(2)`), so a record usually
//! takes one read.

/// The bytes of a record's header.
pub const RECORD_HEADER_LEN: usize = 4;

/// A record's header, before its `len` bytes.
pub fn record_header(len: u32) -> [u8; RECORD_HEADER_LEN] {
    len.to_le_bytes()
}

/// The record that ends a body.
pub const END_RECORD: [u8; RECORD_HEADER_LEN] = [0; RECORD_HEADER_LEN];

/// Where a reader is in a body's records.
#[derive(Debug, Default)]
pub struct BodyRecords {
    /// The bytes of the current record not read yet.
    left: u32,
    /// The next record's header, `have` bytes of it read.
    header: [u8; RECORD_HEADER_LEN],
    have: usize,
    ended: bool,
}

impl BodyRecords {
    /// How the next read of at most `room` body bytes is split: how many go to the caller's
    /// buffer (the current record's), and the header room after them (`header_room`), which
    /// the read fills only once the record is read. (0, 0) once the body has ended.
    pub fn plan(&self, room: usize) -> (usize, usize) {
        if self.ended {
            return (0, 0);
        }
        let data = room.min(self.left as usize);
        if data < self.left as usize {
            return (data, 0);
        }
        (data, RECORD_HEADER_LEN - self.have)
    }

    /// Where the planned read puts the header's bytes: `len`, the plan's second figure.
    pub fn header_room(&mut self, len: usize) -> &mut [u8] {
        &mut self.header[self.have..self.have + len]
    }

    /// Takes account of a read of `read` bytes, as planned with `data` for the caller's buffer
    /// first: returns how many of them are the body's.
    pub fn read(&mut self, data: usize, read: usize) -> usize {
        let body = read.min(data);
        self.left -= body as u32;
        let header = read - body;
        if header > 0 {
            self.have += header;
            if self.have == RECORD_HEADER_LEN {
                self.have = 0;
                self.left = u32::from_le_bytes(self.header);
                self.ended = self.left == 0;
            }
        }
        body
    }

    /// Whether the end record has been read: the body is whole.
    pub fn ended(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records of a body sent as `pieces`, with its end.
    fn encoded(pieces: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in pieces {
            out.extend_from_slice(&record_header(piece.len() as u32));
            out.extend_from_slice(piece);
        }
        out.extend_from_slice(&END_RECORD);
        out
    }

    /// Reads `parts` in turn as a pipe would give them, at most `most` bytes a read and
    /// `room` body bytes a read: the body, and whether its end was read.
    fn read_all(parts: &[&[u8]], most: usize, room: usize) -> (Vec<u8>, bool) {
        let (mut records, mut body) = (BodyRecords::default(), Vec::new());
        for (i, part) in parts.iter().enumerate() {
            let mut at = 0;
            while at < part.len() {
                assert!(!records.ended(), "the end record came before the stream's end");
                let (data, header) = records.plan(room);
                assert!(data + header > 0, "a read was planned for nothing before the end");
                let read = (data + header).min(most).min(part.len() - at);
                let into_data = read.min(data);
                body.extend_from_slice(&part[at..at + into_data]);
                let into_header = &mut records.header_room(header)[..read - into_data];
                into_header.copy_from_slice(&part[at + into_data..at + read]);
                assert_eq!(records.read(data, read), into_data, "part {i}, byte {at}");
                at += read;
            }
        }
        (body, records.ended())
    }

    #[test]
    fn reads_a_body_whole_byte_by_byte_and_split_at_every_offset() {
        let pieces: [&[u8]; 3] = [b"hello, ", b"w", b"orld, in three records"];
        let stream = encoded(&pieces);
        let whole = (pieces.concat(), true);
        assert_eq!(read_all(&[&stream], usize::MAX, usize::MAX), whole);
        assert_eq!(read_all(&[&stream], 1, usize::MAX), whole);
        for room in 1..whole.0.len() {
            assert_eq!(read_all(&[&stream], usize::MAX, room), whole, "room {room}");
        }
        for split in 0..=stream.len() {
            assert_eq!(
                read_all(&[&stream[..split], &stream[split..]], usize::MAX, usize::MAX),
                whole,
                "split at {split}"
            );
        }
    }

    #[test]
    fn an_empty_body_is_its_end_record_alone() {
        assert_eq!(read_all(&[&END_RECORD], usize::MAX, usize::MAX), (Vec::new(), true));
    }

    #[test]
    fn a_stream_cut_short_has_no_end() {
        let stream = encoded(&[b"abcdef"]);
        for cut in 0..stream.len() {
            let (body, ended) = read_all(&[&stream[..cut]], usize::MAX, usize::MAX);
            assert!(!ended, "cut at {cut}");
            assert_eq!(body, &b"abcdef"[..cut.saturating_sub(RECORD_HEADER_LEN).min(6)]);
        }
    }

    #[test]
    fn plans_nothing_once_ended() {
        let mut records = BodyRecords::default();
        records.header_room(RECORD_HEADER_LEN).copy_from_slice(&END_RECORD);
        records.read(0, RECORD_HEADER_LEN);
        assert!(records.ended());
        assert_eq!(records.plan(100), (0, 0));
    }
}
