//! Every raw system call maitred makes, each behind a safe function.
//!
//! This is the one crate of maitred with `unsafe` code. The lobby declares
//! `#![forbid(unsafe_code)]` and the Python extension `#![deny(unsafe_code)]` (PyO3's macros
//! allow unsafe code in their expansions, which `forbid` would reject), so whatever touches raw
//! descriptors, uninitialised memory or libc comes here. Where rustix covers a call safely it is
//! used; the rest are libc calls, each function with one `unsafe` block and a `SAFETY` comment
//! saying why it cannot break memory safety (clippy's `undocumented_unsafe_blocks` holds every
//! block to that). Callers decide how to wait and what an error means:
//! nothing here owns a task, a clock or a policy.
//!
//! It imports nothing of maitred's.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod bell;
pub mod fd;
pub mod fdpass;
pub mod ids;
pub mod limits;
pub mod pipe;
pub mod process;
pub mod reactor;
pub mod shared_memory;
pub mod sleepers;
pub mod socket;
pub mod stack;
