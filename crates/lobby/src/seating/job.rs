//! A complete request on its way to a worker: what the queue holds, and what its connection
//! and the worker that takes it share. A leaf: it imports nothing of its neighbours but the
//! answer's spool and a WebSocket's link.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::body_files::BodyFile;
use super::spool::AnswerSender;
use super::websocket::WebSocketJob;

/// Where a request is in its life, shared by its connection and the worker that takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    Queued,
    /// Sent ahead to a busy worker (`offer.rs`); still the queue's until that worker takes it.
    Offered,
    Seated,
    /// Not to be served: its client left, or it was refused (`--queue-timeout`, overload); a
    /// worker skips it.
    Cancelled,
}

/// One complete request, ready for a worker.
pub struct Job {
    /// The whole `REQUEST` frame, header included.
    pub frame: Vec<u8>,
    /// The body, when it is too large to travel inline; sent with the frame's `FD` flag.
    pub body_file: Option<BodyFile>,
    pub state: Rc<Cell<JobState>>,
    pub respond: AnswerSender,
    pub enqueued_at: Instant,
    /// How long it had waited in front of this server before (`X-Request-Start` from a trusted
    /// proxy); zero when unknown.
    pub upstream: Duration,
    /// `GET /path HTTP/1.1`, for log lines about this request.
    pub summary: Rc<str>,
    /// For the access log's timing atoms; None when there is no access log.
    pub served: Option<Rc<Served>>,
    /// A WebSocket handshake (`REQUEST` with the `WEBSOCKET` flag): its link with its connection.
    pub websocket: Option<Box<WebSocketJob>>,
    /// It came as an HTTP/2 stream: an answer that breaks after its head resets the stream
    /// (RST_STREAM), where HTTP/1.1 cuts the connection.
    pub http2: bool,
}

impl Job {
    /// How long it has waited for an answer at `now`: in the queue, and upstream before.
    pub fn age(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.enqueued_at) + self.upstream
    }

    /// What the client gets of an answer that breaks after its head, for the log.
    pub fn cut_short(&self) -> &'static str {
        if self.http2 {
            "its HTTP/2 stream reset (INTERNAL_ERROR)"
        } else {
            "its connection cut"
        }
    }
}

/// Which worker took a request, when, and when its answer had come whole: what the worker
/// relay tells the connection for the access log.
#[derive(Default)]
pub struct Served {
    pub seated: Cell<Option<Instant>>,
    pub answered: Cell<Option<Instant>>,
    pub worker: Cell<Option<i32>>,
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::seating::spool::{answer_channel, AnswerReceiver, SpillBudget};

    pub(crate) fn job(name: &str) -> (Job, AnswerReceiver) {
        let (respond, receive) =
            answer_channel(Rc::new(SpillBudget::new(u64::MAX)), u64::MAX, Arc::new(tokio::sync::Semaphore::new(1)));
        let job = Job {
            frame: name.as_bytes().to_vec(),
            body_file: None,
            state: Rc::new(Cell::new(JobState::Queued)),
            respond,
            enqueued_at: Instant::now(),
            upstream: Duration::ZERO,
            summary: name.into(),
            served: None,
            websocket: None,
            http2: false,
        };
        (job, receive)
    }
}
