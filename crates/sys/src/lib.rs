//! Every raw system call maitred makes, each behind a safe function.
//!
//! This is the one crate of maitred with `unsafe` code: the lobby declares
//! `#![forbid(unsafe_code)]` and the Python extension `#![deny(unsafe_code)]`, so whatever
//! touches raw descriptors, pointers or libc goes through here. Each function does one call
//! (or a short fixed sequence of them), has one `unsafe` block, and says in a `SAFETY` comment
//! why the call cannot break memory safety. Callers decide how to wait and what an error
//! means: nothing here owns a task, a clock or a policy.
//!
//! It imports nothing of maitred's.

pub mod fdpass;
