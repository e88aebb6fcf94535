//! Observation: what the lobby counts (`metrics.rs`), the diagnoses it makes of itself
//! (`diagnosis.rs`, kept in `findings.rs`), and the stats listener that shows them
//! (`server.rs`: `/metrics`, `/status.json` from `status.rs`, and the live page of `page.rs`),
//! and, once at start, how the machine's idle CPUs wait (`idle_cpus.rs`).
//!
//! It may read everything the lobby keeps: the shared context, the listeners, the connection
//! counts, the scoreboard. Nothing imports it but the shared context (which holds `Metrics` and
//! `Diagnoses`) and the lobby's start (`run.rs`), which starts the watch and the listener.

pub(crate) mod diagnosis;
pub(crate) mod findings;
pub(crate) mod idle_cpus;
pub(crate) mod metrics;
mod page;
pub(crate) mod server;
mod status;
