//! The spin gate: whether a worker that has nothing to take may spin, looking for its next
//! request, instead of sleeping on its bell (issue 18, "spin only where it helps").
//!
//! A worker that finds nothing to take would sleep, and the next request would then cost a ring
//! of its bell and a wake-up. Spinning a moment first saves both when the request comes soon,
//! but a spinner takes a core: on a busy machine it takes it from the lobby or from a worker
//! with work to do. Go's scheduler lets threads spin only while the spinning ones plus the busy
//! ones stay below the processors; this gate keeps the same rule for the lobby's workers.
//!
//! One page, shared by the lobby and all its workers: a memfd the lobby creates, sizes, seals and
//! passes to each worker with `GATE`. Its one live word, on a cache line of its own, is the
//! budget: the cores left, a signed count.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic, `b"MAITGATE"` as a `u64` |
//! | 8 | 4 | `most`, an `i32`: the cores less the lobby's own thread, the budget's bound |
//! | 64 | 4 | `budget`, an `i32`: `most` less the units the workers hold |
//!
//! A worker holds one unit from the request it takes while holding none ([`Gate::take`]) until
//! it has nothing left to take. Then it keeps the unit, to spin, when the budget has not gone
//! below zero (the busy workers and the spinning ones, itself included, fit in the cores), and
//! gives it back otherwise ([`Gate::keep_to_spin`]); a spinner that finds a request keeps its
//! unit for it, and one that finds none gives it back ([`Gate::give_back`]) and sleeps. So the
//! busy workers always count, even past the cores (the budget goes negative), and a worker spins
//! only in a core that nothing else of maitred's needs.
//!
//! A worker marks in its own region whether it holds a unit (after taking, before giving back).
//! The lobby gives back the unit of a worker it lost with the mark set; a death between taking
//! and marking loses a unit at worst, never makes one, and the budget never exceeds `most`. A
//! worker may write anything here: it can make the others spin more or less, not harm the lobby.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, Ordering};

use maitred_sys::shared_memory::SharedMapping;

use crate::region::{open_sealed, sealed_memfd};

/// The gate's first 8 bytes, as a little-endian `u64`.
const GATE_MAGIC: u64 = u64::from_le_bytes(*b"MAITGATE");
const MOST_AT: usize = 8;
const BUDGET_AT: usize = 64;
/// Bytes of the gate's file: one page.
pub const GATE_SIZE: usize = 4096;

/// A mapping of the spin gate.
pub struct Gate {
    map: SharedMapping,
    /// The most the budget may be: the cores less the lobby's own. A worker reads it from the
    /// gate, so a worker can only spoil the workers' giving back, never the lobby's.
    most: i32,
}

impl Gate {
    /// The lobby's part: a new gate for a machine whose lobby may run on `cores` cores. The
    /// descriptor is for the workers ([`Gate::open`]).
    pub fn create(cores: usize) -> io::Result<(Gate, OwnedFd)> {
        let file = sealed_memfd("maitred-gate", GATE_SIZE as u64)?;
        let map = SharedMapping::new(&file, GATE_SIZE)?;
        map.words(0, 1)[0].store(GATE_MAGIC, Ordering::Relaxed);
        let most = i32::try_from(cores.saturating_sub(1)).unwrap_or(i32::MAX);
        map.word32(MOST_AT).store(most as u32, Ordering::Relaxed);
        let gate = Gate { map, most };
        gate.budget().store(most as u32, Ordering::SeqCst);
        Ok((gate, file))
    }

    /// A worker's part: maps the gate `file` holds, once it has checked it is one.
    pub fn open(file: OwnedFd) -> io::Result<Gate> {
        let map = open_sealed(&file, "spin gate", |size| size == GATE_SIZE as u64)?;
        if map.words(0, 1)[0].load(Ordering::Relaxed) != GATE_MAGIC {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "spin gate: not a gate (its magic)"));
        }
        let most = map.word32(MOST_AT).load(Ordering::Relaxed) as i32;
        Ok(Gate { map, most })
    }

    /// The budget now.
    pub fn tokens(&self) -> i32 {
        self.budget().load(Ordering::SeqCst) as i32
    }

    /// A worker: it takes a request while holding no unit. The budget may go below zero: a
    /// busy worker counts whatever the cores.
    pub fn take(&self) {
        self.budget().fetch_sub(1, Ordering::SeqCst);
    }

    /// A worker holding a unit has nothing left to take: true when it keeps the unit and may
    /// spin (the budget is not below zero), false when it gave the unit back.
    pub fn keep_to_spin(&self) -> bool {
        let kept = self.budget().fetch_update(Ordering::SeqCst, Ordering::SeqCst, |budget| {
            ((budget as i32) < 0).then(|| budget.wrapping_add(1))
        });
        kept.is_err()
    }

    /// Gives back a unit: a spinner that found nothing, or the lobby for a worker it lost
    /// holding one. Never above `most`, whatever a worker wrote.
    pub fn give_back(&self) {
        let most = self.most;
        let _ = self.budget().fetch_update(Ordering::SeqCst, Ordering::SeqCst, |budget| {
            ((budget as i32) < most).then(|| budget.wrapping_add(1))
        });
    }

    fn budget(&self) -> &AtomicU32 {
        self.map.word32(BUDGET_AT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_spins_only_where_the_busy_and_the_spinning_leave_a_core() {
        // 4 cores: the lobby's and 3 for the workers.
        let (lobby, file) = Gate::create(4).unwrap();
        let gate = Gate::open(file).unwrap();
        assert_eq!(gate.tokens(), 3);
        // Four busy workers: one more than the cores left.
        (0..4).for_each(|_| gate.take());
        assert_eq!(gate.tokens(), -1);
        assert!(!gate.keep_to_spin(), "the first to finish gives its core back: 3 busy fill them");
        assert!(gate.keep_to_spin(), "the next keeps it: 2 busy and 1 spinning fit");
        assert_eq!(gate.tokens(), 0);
        // The spinner found nothing: it gives its unit back and sleeps.
        gate.give_back();
        assert_eq!(gate.tokens(), 1);
        // The lobby gives back the unit of a worker lost holding one; never past the most.
        (0..5).for_each(|_| lobby.give_back());
        assert_eq!(lobby.tokens(), 3);
    }

    #[test]
    fn one_core_leaves_none_to_spin() {
        let (_lobby, file) = Gate::create(1).unwrap();
        let gate = Gate::open(file).unwrap();
        gate.take();
        assert!(!gate.keep_to_spin());
        assert_eq!(gate.tokens(), 0);
        let (lobby, _file) = Gate::create(0).unwrap();
        assert_eq!(lobby.tokens(), 0);
    }

    #[test]
    fn open_refuses_what_is_not_a_gate() {
        let (_region, region_file) = crate::Region::create(crate::Layout::DEFAULT).unwrap();
        let error = Gate::open(region_file).err().unwrap();
        assert!(error.to_string().contains("spin gate"), "{error}");
        let zeros = sealed_memfd("not-a-gate", GATE_SIZE as u64).unwrap();
        let error = Gate::open(zeros).err().unwrap();
        assert!(error.to_string().contains("magic"), "{error}");
    }
}
