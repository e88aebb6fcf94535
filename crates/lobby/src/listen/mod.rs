//! Listening and accepting: the listen sockets, bound with the backlog the operator asked for
//! and reported with what the kernel granted (`bind.rs`, S2); one accept(2) per connection
//! under `--max-connections` (`accept.rs`, S1, S3); and the cap itself (`cap.rs`).
//!
//! It hands each accepted connection to the client connections (`client`), with their context;
//! it may import them, the logs and the settings, and nothing that imports it.

pub(crate) mod accept;
pub(crate) mod bind;
pub(crate) mod cap;
