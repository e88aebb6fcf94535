//! The mapping: creating the memfd, mapping it, checking a mapped one, and the atomic words
//! every other module reads and writes it through. The mapping itself, the crate's only need for
//! `unsafe`, is crates/sys's [`SharedMapping`].

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};

use maitred_sys::shared_memory::SharedMapping;

use crate::layout::*;

/// The page size of the machines maitred runs on (x86-64 and arm64 Linux with 4 KiB pages; a
/// larger page is touched more than once, which costs nothing).
const PAGE: usize = 4096;

/// One mapping of a worker's region, with the layout it was made or checked with. The lobby and
/// the worker each have one; [`crate::LobbyEnd`] and [`crate::WorkerEnd`] wrap it.
pub struct Region {
    map: SharedMapping,
    layout: Layout,
}

impl Region {
    /// The lobby's part: a new memfd of `layout`'s size, zero-filled, sealed against growing
    /// and shrinking, mapped, with its header written. The descriptor is for the worker
    /// ([`Region::open`]); the mapping does not need it.
    pub fn create(layout: Layout) -> io::Result<(Region, OwnedFd)> {
        layout
            .check()
            .map_err(|reason| io::Error::new(io::ErrorKind::InvalidInput, format!("region layout: {reason}")))?;
        let file = rustix::fs::memfd_create("maitred-shm", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&file, layout.region_size())?;
        // SEAL too: the worker shares the file, and may not take the size seals off (it cannot
        // anyway) nor add a write seal the lobby would not expect.
        rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let region = Region { map: SharedMapping::new(&file, layout.region_size() as usize)?, layout };
        region.write_header();
        // Still all zeros, and the lobby's alone: a store of 0 makes each page.
        region.ring_pages().for_each(|word| word.store(0, Ordering::Relaxed));
        Ok((region, file))
    }

    /// The worker's part: maps the region `file` holds, once it has checked that the file cannot
    /// change size, and that its header is this version's and describes exactly its size.
    pub fn open(file: OwnedFd) -> io::Result<Region> {
        let refuse = |why: String| io::Error::new(io::ErrorKind::InvalidData, format!("shared region: {why}"));
        let seals = rustix::fs::fcntl_get_seals(&file).map_err(|e| refuse(format!("the file's seals: {e}")))?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(refuse("the file is not sealed against shrinking and growing".into()));
        }
        let size = rustix::fs::fstat(&file)?.st_size as u64;
        if size < REGION_HEADER_SIZE as u64 || size > MAX_REGION_SIZE {
            return Err(refuse(format!("a file of {size} bytes")));
        }
        let map = SharedMapping::new(&file, size as usize)?;
        let magic = map.words(MAGIC_AT, 1)[0].load(Ordering::Relaxed);
        if magic != MAGIC {
            return Err(refuse(format!("magic {:?}", magic.to_le_bytes().escape_ascii().to_string())));
        }
        let version = map.word32(VERSION_AT).load(Ordering::Relaxed);
        if version != VERSION {
            return Err(refuse(format!("version {version}, where this build reads {VERSION}")));
        }
        let layout = Layout {
            slots: map.word32(SLOTS_AT).load(Ordering::Relaxed),
            slot_size: map.word32(SLOT_SIZE_AT).load(Ordering::Relaxed),
            ring_size: map.word32(RING_SIZE_AT).load(Ordering::Relaxed),
        };
        layout.check().map_err(|reason| refuse(format!("{layout:?}: {reason}")))?;
        if layout.region_size() != size {
            return Err(refuse(format!("{layout:?} makes {} bytes, the file has {size}", layout.region_size())));
        }
        let region = Region { map, layout };
        region.ring_pages().for_each(|word| {
            std::hint::black_box(word.load(Ordering::Relaxed));
        });
        Ok(region)
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The first word of each page of the answer ring. Both ends touch them when the region is
    /// made, so that the ring's memory is counted from the start: the worker writes through the
    /// whole ring before it wraps, and otherwise both processes' resident memory grew by the
    /// ring, twice, during their first few thousand answers. Measured with a 256 KiB ring and 2
    /// workers: M1, which counts the growth while it opens 10,000 connections that each send a
    /// request, went from 0.19-0.21 to 0.26 KB per connection.
    fn ring_pages(&self) -> impl Iterator<Item = &AtomicU64> {
        let (start, len) = (self.layout.ring_at(), self.layout.ring_size as usize);
        (start..start + len).step_by(PAGE).map(|at| &self.map.words(at, 1)[0])
    }

    fn write_header(&self) {
        self.map.words(MAGIC_AT, 1)[0].store(MAGIC, Ordering::Relaxed);
        self.map.word32(VERSION_AT).store(VERSION, Ordering::Relaxed);
        self.map.word32(SLOTS_AT).store(self.layout.slots, Ordering::Relaxed);
        self.map.word32(SLOT_SIZE_AT).store(self.layout.slot_size, Ordering::Relaxed);
        self.map.word32(RING_SIZE_AT).store(self.layout.ring_size, Ordering::Relaxed);
    }

    pub(crate) fn lobby_waiting(&self) -> &AtomicU32 {
        self.map.word32(LOBBY_WAITING_AT)
    }

    pub(crate) fn worker_waiting(&self) -> &AtomicU32 {
        self.map.word32(WORKER_WAITING_AT)
    }

    pub(crate) fn ring_head(&self) -> &AtomicU64 {
        &self.map.words(RING_HEAD_AT, 1)[0]
    }

    pub(crate) fn ring_tail(&self) -> &AtomicU64 {
        &self.map.words(RING_TAIL_AT, 1)[0]
    }

    pub(crate) fn loop_beats(&self) -> &AtomicU64 {
        &self.map.words(LOOP_BEATS_AT, 1)[0]
    }

    pub(crate) fn loop_lag(&self) -> &AtomicU64 {
        &self.map.words(LOOP_LAG_AT, 1)[0]
    }

    pub(crate) fn slot_state(&self, slot: usize) -> &AtomicU32 {
        self.map.word32(self.slot_field(slot, SLOT_STATE_AT))
    }

    pub(crate) fn slot_len(&self, slot: usize) -> &AtomicU32 {
        self.map.word32(self.slot_field(slot, SLOT_LEN_AT))
    }

    pub(crate) fn slot_id(&self, slot: usize) -> &AtomicU32 {
        self.map.word32(self.slot_field(slot, SLOT_ID_AT))
    }

    pub(crate) fn slot_seq(&self, slot: usize) -> &AtomicU64 {
        &self.map.words(self.slot_field(slot, SLOT_SEQ_AT), 1)[0]
    }

    /// The words that hold a frame of `len` bytes in `slot`.
    pub(crate) fn slot_frame(&self, slot: usize, len: usize) -> &[AtomicU64] {
        self.map.words(self.slot_field(slot, SLOT_HEADER_SIZE), len.div_ceil(8))
    }

    /// `count` words of the ring, from byte `at` of it.
    pub(crate) fn ring_words(&self, at: usize, count: usize) -> &[AtomicU64] {
        assert!(at + count * 8 <= self.layout.ring_size as usize, "ring words {at}+{count}x8");
        self.map.words(self.layout.ring_at() + at, count)
    }

    fn slot_field(&self, slot: usize, field_at: usize) -> usize {
        assert!(slot < self.layout.slots as usize, "slot {slot} of {}", self.layout.slots);
        self.layout.slot_at(slot) + field_at
    }
}

/// Copies `bytes` into `words`, little-endian, the last word's tail zero.
pub(crate) fn copy_in(words: &[AtomicU64], bytes: &[u8]) {
    debug_assert_eq!(words.len(), bytes.len().div_ceil(8));
    for (word, chunk) in words.iter().zip(bytes.chunks(8)) {
        let mut padded = [0u8; 8];
        padded[..chunk.len()].copy_from_slice(chunk);
        word.store(u64::from_le_bytes(padded), Ordering::Relaxed);
    }
}

/// Copies the bytes of `parts`, one after the other, into `words`, little-endian, the last
/// word's tail zero: a frame whose header and payload lie apart, without joining them first.
pub(crate) fn copy_in_parts(words: &[AtomicU64], parts: &[&[u8]]) {
    debug_assert_eq!(words.len(), parts.iter().map(|part| part.len()).sum::<usize>().div_ceil(8));
    // The next word to store, and the bytes of it gathered so far when a part ended inside it.
    let mut next = 0;
    let mut pending = [0u8; 8];
    let mut filled = 0;
    for mut part in parts.iter().copied() {
        if filled > 0 {
            let take = part.len().min(8 - filled);
            pending[filled..filled + take].copy_from_slice(&part[..take]);
            filled += take;
            part = &part[take..];
            if filled < 8 {
                continue;
            }
            words[next].store(u64::from_le_bytes(pending), Ordering::Relaxed);
            next += 1;
        }
        let whole = part.len() / 8;
        copy_in(&words[next..next + whole], &part[..whole * 8]);
        next += whole;
        filled = part.len() - whole * 8;
        pending = [0u8; 8];
        pending[..filled].copy_from_slice(&part[whole * 8..]);
    }
    if filled > 0 {
        words[next].store(u64::from_le_bytes(pending), Ordering::Relaxed);
    }
}

/// Fills `out` from `words`, which hold its bytes little-endian.
pub(crate) fn copy_out(words: &[AtomicU64], out: &mut [u8]) {
    debug_assert_eq!(words.len(), out.len().div_ceil(8));
    for (word, chunk) in words.iter().zip(out.chunks_mut(8)) {
        chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes()[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn small() -> Layout {
        Layout { slots: 2, slot_size: 128, ring_size: 64 }
    }

    /// A region made with `small()`, whose file got `bytes` at `offset` before the worker opens it.
    fn open_after_writing(offset: u64, bytes: &[u8]) -> io::Result<Region> {
        let (_lobby, file) = Region::create(small()).unwrap();
        std::fs::File::from(file.try_clone().unwrap()).write_all_at(bytes, offset).unwrap();
        Region::open(file)
    }

    fn refusal(result: io::Result<Region>) -> String {
        let error = result.err().expect("the region was opened");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        error.to_string()
    }

    #[test]
    fn the_worker_maps_what_the_lobby_created() {
        let (lobby, file) = Region::create(Layout::DEFAULT).unwrap();
        let worker = Region::open(file).unwrap();
        assert_eq!(worker.layout(), Layout::DEFAULT);
        lobby.ring_head().store(42, Ordering::SeqCst);
        assert_eq!(worker.ring_head().load(Ordering::SeqCst), 42);
        worker.slot_state(3).store(7, Ordering::SeqCst);
        assert_eq!(lobby.slot_state(3).load(Ordering::SeqCst), 7);
    }

    #[test]
    fn the_file_is_sealed_and_close_on_exec() {
        let (_region, file) = Region::create(small()).unwrap();
        let seals = rustix::fs::fcntl_get_seals(&file).unwrap();
        assert!(seals.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL));
        assert!(rustix::io::fcntl_getfd(&file).unwrap().contains(rustix::io::FdFlags::CLOEXEC));
        assert!(rustix::fs::ftruncate(&file, 4096).is_err());
    }

    #[test]
    fn a_bad_layout_is_not_created() {
        let error = Region::create(Layout { ring_size: 100, ..small() }).err().unwrap();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        assert!(error.to_string().contains("power of two"), "{error}");
    }

    #[test]
    fn open_refuses_a_file_that_is_not_a_region() {
        assert!(refusal(open_after_writing(0, b"MAITRED\x02")).contains("magic"));
        assert!(refusal(open_after_writing(8, &2u32.to_le_bytes())).contains("version 2"));
        // 4 slots of 64 bytes: the same size, but no slot holds a frame header's worth.
        let mut sizes = [0u8; 12];
        sizes[..4].copy_from_slice(&4u32.to_le_bytes());
        sizes[4..8].copy_from_slice(&64u32.to_le_bytes());
        sizes[8..].copy_from_slice(&64u32.to_le_bytes());
        assert!(refusal(open_after_writing(12, &sizes)).contains("slot_size"));
        // 1 slot: a valid layout, but of another size than the file's.
        assert!(refusal(open_after_writing(12, &1u32.to_le_bytes())).contains("the file has"));
        assert!(refusal(open_after_writing(20, &3u32.to_le_bytes())).contains("power of two"));
    }

    #[test]
    fn open_refuses_files_without_seals_or_of_wrong_sizes() {
        let file = rustix::fs::memfd_create("test", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&file, small().region_size()).unwrap();
        let unsealed = file.try_clone().unwrap();
        assert!(refusal(Region::open(unsealed)).contains("sealed"));
        let tiny = rustix::fs::memfd_create("test", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::fs::ftruncate(&tiny, 100).unwrap();
        rustix::fs::fcntl_add_seals(&tiny, SealFlags::SHRINK | SealFlags::GROW).unwrap();
        assert!(refusal(Region::open(tiny)).contains("a file of 100 bytes"));
    }

    #[test]
    fn open_refuses_a_descriptor_that_has_no_seals() {
        let socket = std::os::unix::net::UnixStream::pair().unwrap().0;
        assert!(refusal(Region::open(socket.into())).contains("the file's seals"));
    }

    #[test]
    fn parts_copy_as_one_whatever_their_boundaries() {
        let (region, _file) = Region::create(small()).unwrap();
        let whole = b"0123456789abcdefghijklmnopq";
        for first in 0..=whole.len() {
            for second in first..=whole.len() {
                let words = region.ring_words(8, whole.len().div_ceil(8));
                words.iter().for_each(|word| word.store(u64::MAX, Ordering::Relaxed));
                copy_in_parts(words, &[&whole[..first], &whole[first..second], &whole[second..]]);
                let mut out = [0u8; 27];
                copy_out(words, &mut out);
                assert_eq!(&out, whole, "split at {first} and {second}");
                assert_eq!(words[3].load(Ordering::Relaxed) >> 24, 0, "the tail is zero");
            }
        }
    }

    #[test]
    fn words_copy_both_ways_with_zero_padding() {
        let (region, _file) = Region::create(small()).unwrap();
        let words = region.ring_words(8, 2);
        words[1].store(u64::MAX, Ordering::Relaxed);
        copy_in(words, b"0123456789");
        assert_eq!(words[1].load(Ordering::Relaxed), u64::from_le_bytes(*b"89\0\0\0\0\0\0"));
        let mut out = [0u8; 10];
        copy_out(words, &mut out);
        assert_eq!(&out, b"0123456789");
    }
}
