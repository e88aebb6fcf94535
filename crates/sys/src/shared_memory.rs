//! A file mapped shared read-write into this process, read and written only through atomic
//! words: the shared-memory region between the lobby and a worker (crates/shm) sits on it. Both
//! processes may write any word at any time, so nothing here hands out a plain reference into
//! the memory; a word the other side wrote is just a value the caller must check.

use std::io;
use std::os::fd::AsFd;
use std::ptr::{self, NonNull};
use std::slice;
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::mm::{MapFlags, ProtFlags};

/// A mapping of a region's file, shared read-write; unmapped when dropped.
pub struct SharedMapping {
    base: NonNull<u8>,
    len: usize,
}

impl SharedMapping {
    pub fn new(file: impl AsFd, len: usize) -> io::Result<SharedMapping> {
        // SAFETY: a new mapping at an address the kernel chooses replaces nothing of this
        // process's memory; the pointer it returns is owned by the SharedMapping, which unmaps it
        // once, when dropped.
        let base = unsafe {
            rustix::mm::mmap(ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, file, 0)?
        };
        let base = NonNull::new(base.cast()).ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(SharedMapping { base, len })
    }

    /// The `count` 8-byte words from byte `offset`.
    ///
    /// # Panics
    ///
    /// When they are not inside the mapping or `offset` is not a multiple of 8: every offset
    /// comes from a checked layout or a checked record, so that is a bug of the caller.
    pub fn words(&self, offset: usize, count: usize) -> &[AtomicU64] {
        assert!(offset.is_multiple_of(8) && count <= (self.len.saturating_sub(offset)) / 8, "words {offset}+{count}x8");
        // SAFETY: the words are inside the mapping (checked above), which lives as long as
        // `self`, and aligned: the mapping starts on a page and `offset` is a multiple of 8.
        // AtomicU64 may be changed behind a shared reference, as the other process does; every
        // access to the region from this process is atomic, so none races with a plain one.
        unsafe { slice::from_raw_parts(self.base.as_ptr().add(offset).cast::<AtomicU64>(), count) }
    }

    /// The 4-byte word at byte `offset`.
    ///
    /// # Panics
    ///
    /// As [`SharedMapping::words`], for a 4-byte word.
    pub fn word32(&self, offset: usize) -> &AtomicU32 {
        assert!(
            offset.is_multiple_of(4) && offset.checked_add(4).is_some_and(|end| end <= self.len),
            "word32 {offset}"
        );
        // SAFETY: as in `words`: inside the mapping, aligned to 4, only ever accessed atomically.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU32>() }
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is this SharedMapping's; no reference into it outlives it (they all
        // borrow it), so nothing touches the memory after it is gone. An error could only
        // leave it mapped, which nothing would notice.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

// SAFETY: a SharedMapping is its memory's owner, and that memory is only accessed through atomics, so
// moving the SharedMapping to another thread, or sharing it, is as safe as sharing the atomics.
unsafe impl Send for SharedMapping {}
// SAFETY: as for Send.
unsafe impl Sync for SharedMapping {}
