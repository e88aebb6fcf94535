//! The region's sizes and where each field stands (the tables in the crate's documentation).

/// The region's first 8 bytes, as a little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"MAITRED\x01");
/// The layout's version.
pub const VERSION: u32 = 1;
/// Bytes before the first slot: the header block.
pub const REGION_HEADER_SIZE: usize = 4096;
/// Bytes of a slot's header, before its frame.
pub const SLOT_HEADER_SIZE: usize = 64;
/// The id of a padding record in the answer ring; no request has it.
pub const PADDING_ID: u32 = u32::MAX;

/// Bytes of an answer record's own header: its length and id.
pub(crate) const RECORD_HEADER_SIZE: usize = 8;
/// Bytes of a wire frame's header (crates/wire's `HEADER_LEN`), whose bytes 4..8 are the
/// payload's length.
pub(crate) const FRAME_HEADER_SIZE: usize = 8;

// Offsets in the header block. The words both sides write stand on lines of their own.
pub(crate) const MAGIC_AT: usize = 0;
pub(crate) const VERSION_AT: usize = 8;
pub(crate) const SLOTS_AT: usize = 12;
pub(crate) const SLOT_SIZE_AT: usize = 16;
pub(crate) const RING_SIZE_AT: usize = 20;
pub(crate) const LOBBY_WAITING_AT: usize = 64;
pub(crate) const WORKER_WAITING_AT: usize = 128;
pub(crate) const RING_HEAD_AT: usize = 192;
pub(crate) const RING_TAIL_AT: usize = 256;
pub(crate) const LOOP_BEATS_AT: usize = 320;
pub(crate) const LOOP_LAG_AT: usize = 384;

// Offsets in a slot's header.
pub(crate) const SLOT_STATE_AT: usize = 0;
pub(crate) const SLOT_LEN_AT: usize = 4;
pub(crate) const SLOT_ID_AT: usize = 8;
pub(crate) const SLOT_SEQ_AT: usize = 16;

const MAX_SLOTS: u32 = 1024;
/// A slot of 128 bytes holds a frame of 64: a whole frame header, rounded to a cache line.
const MIN_SLOT_SIZE: u32 = 128;
const MAX_SLOT_SIZE: u32 = 16 << 20;
/// The smallest ring takes a 24-byte answer frame; small rings are for tests.
const MIN_RING_SIZE: u32 = 64;
const MAX_RING_SIZE: u32 = 1 << 30;
/// Bounds the whole mapping, so that no layout read from a file maps more than this.
pub(crate) const MAX_REGION_SIZE: u64 = 2 << 30;

/// How a region is cut: `slots` request slots of `slot_size` bytes each, and an answer ring of
/// `ring_size` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub slots: u32,
    pub slot_size: u32,
    pub ring_size: u32,
}

impl Layout {
    /// 4 slots of 64 KiB and a 1 MiB ring.
    pub const DEFAULT: Layout = Layout { slots: 4, slot_size: 64 << 10, ring_size: 1 << 20 };

    /// Why these sizes cannot make a region, if they cannot.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.slots == 0 || self.slots > MAX_SLOTS {
            return Err("slots must be 1 to 1024");
        }
        if self.slot_size < MIN_SLOT_SIZE || self.slot_size > MAX_SLOT_SIZE {
            return Err("slot_size must be 128 bytes to 16 MiB");
        }
        // Every slot header then starts on a cache line of its own, and every frame on a word.
        if !self.slot_size.is_multiple_of(SLOT_HEADER_SIZE as u32) {
            return Err("slot_size must be a multiple of 64");
        }
        if !self.ring_size.is_power_of_two() || self.ring_size < MIN_RING_SIZE || self.ring_size > MAX_RING_SIZE {
            return Err("ring_size must be a power of two from 64 bytes to 1 GiB");
        }
        if self.region_size() > MAX_REGION_SIZE {
            return Err("the region would be larger than 2 GiB");
        }
        Ok(())
    }

    /// Bytes of the whole region: header block, slots and ring. Exact for any field values
    /// (at most 2^64 - 2^32 + 4097), meaningful for a layout that passes [`Layout::check`].
    pub fn region_size(&self) -> u64 {
        REGION_HEADER_SIZE as u64 + u64::from(self.slots) * u64::from(self.slot_size) + u64::from(self.ring_size)
    }

    /// The longest request frame a slot holds.
    pub fn max_request_frame(&self) -> usize {
        self.slot_size as usize - SLOT_HEADER_SIZE
    }

    /// The longest answer frame the ring takes: its record may be at most half the ring.
    pub fn max_answer_frame(&self) -> usize {
        self.ring_size as usize / 2 - RECORD_HEADER_SIZE
    }

    pub(crate) fn slot_at(&self, slot: usize) -> usize {
        REGION_HEADER_SIZE + slot * self.slot_size as usize
    }

    pub(crate) fn ring_at(&self) -> usize {
        self.slot_at(self.slots as usize)
    }
}

/// Bytes of the record that carries a frame of `frame_len` bytes.
pub(crate) fn record_len(frame_len: usize) -> usize {
    (RECORD_HEADER_SIZE + frame_len).next_multiple_of(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_a_valid_layout_of_whole_pages() {
        assert_eq!(Layout::DEFAULT.check(), Ok(()));
        assert_eq!(Layout::DEFAULT.region_size(), 4096 + 4 * 65536 + (1 << 20));
        assert_eq!(Layout::DEFAULT.region_size() % 4096, 0);
        assert_eq!(Layout::DEFAULT.max_request_frame(), 65536 - 64);
        assert_eq!(Layout::DEFAULT.max_answer_frame(), (1 << 19) - 8);
    }

    #[test]
    fn the_magic_reads_as_its_bytes() {
        assert_eq!(MAGIC.to_le_bytes(), *b"MAITRED\x01");
    }

    #[test]
    fn slots_and_ring_follow_the_header_block() {
        let layout = Layout { slots: 3, slot_size: 256, ring_size: 1024 };
        assert_eq!(layout.slot_at(0), 4096);
        assert_eq!(layout.slot_at(2), 4096 + 512);
        assert_eq!(layout.ring_at(), 4096 + 768);
        assert_eq!(layout.region_size(), 4096 + 768 + 1024);
    }

    #[test]
    fn the_hot_words_stand_on_lines_of_their_own() {
        let lines = [MAGIC_AT, LOBBY_WAITING_AT, WORKER_WAITING_AT, RING_HEAD_AT, RING_TAIL_AT].map(|at| at / 64);
        assert_eq!(lines, [0, 1, 2, 3, 4]);
        const { assert!(RING_TAIL_AT + 8 <= REGION_HEADER_SIZE) };
        const { assert!(SLOT_SEQ_AT + 8 <= SLOT_HEADER_SIZE) };
    }

    #[test]
    fn records_are_padded_to_words() {
        assert_eq!(record_len(8), 16);
        assert_eq!(record_len(9), 24);
        assert_eq!(record_len(16), 24);
    }

    #[test]
    fn bad_layouts_say_why() {
        let good = Layout { slots: 2, slot_size: 128, ring_size: 64 };
        assert_eq!(good.check(), Ok(()));
        let cases = [
            (Layout { slots: 0, ..good }, "slots"),
            (Layout { slots: 1025, ..good }, "slots"),
            (Layout { slot_size: 64 + 8, ..good }, "slot_size must be 128"),
            (Layout { slot_size: 192 + 8, ..good }, "multiple of 64"),
            (Layout { slot_size: u32::MAX, ..good }, "slot_size must be 128"),
            (Layout { ring_size: 96, ..good }, "power of two"),
            (Layout { ring_size: 32, ..good }, "power of two"),
            (Layout { ring_size: 1 << 31, ..good }, "power of two"),
            (Layout { slots: 1024, slot_size: 16 << 20, ring_size: 64 }, "2 GiB"),
        ];
        for (layout, reason) in cases {
            let said = layout.check().expect_err(&format!("{layout:?} passed"));
            assert!(said.contains(reason), "{layout:?}: {said}");
        }
    }

    #[test]
    fn region_size_cannot_overflow() {
        let largest = Layout { slots: u32::MAX, slot_size: u32::MAX, ring_size: u32::MAX };
        assert_eq!(largest.region_size(), 4096 + (u64::from(u32::MAX)).pow(2) + u64::from(u32::MAX));
    }
}
