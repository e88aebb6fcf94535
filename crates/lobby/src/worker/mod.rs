//! The workers, seen from the lobby, and what keeps them healthy: each worker's channel
//! (`channel.rs`), the task that seats requests at it (`serve.rs`) and relays its answers
//! (`relay.rs`), read from its answer ring (`answers.rs`), the seat it shares with the supervisor (`seat.rs`), its health (`health.rs`:
//! stopped, wedged, past --timeout), recycling (`recycle.rs`) and its line on the scoreboard
//! (`scoreboard.rs`); a worker with several threads, a seat each (`threads.rs`), each given a
//! request only while the worker has CPU to spare (`gate.rs`); an ASGI worker's
//! one channel, carrying any number of requests at once (`mux.rs`), and each of its requests'
//! relay, an accepted WebSocket's messages both ways included (`stream.rs`).
//!
//! It may import the queue (`seating`), the zygote that signals a worker (`process/zygote.rs`),
//! the logs and the settings, each task handed them in `context.rs` with its counts
//! (`counts.rs`); never the client connections, which it meets only through the queue, nor the
//! supervisor, which drives it.

mod answers;
pub(crate) mod channel;
pub(crate) mod context;
pub(crate) mod counts;
mod gate;
pub(crate) mod health;
mod mux;
pub(crate) mod recycle;
mod relay;
mod routes;
pub(crate) mod scoreboard;
pub(crate) mod seat;
pub(crate) mod serve;
mod stream;
pub(crate) mod threads;

pub use answers::look_before_parking;
