//! A complete request on its way to a worker: what the queue holds, and what its connection
//! and the worker that takes it share. A leaf: it imports nothing of its neighbours but the
//! answer's spool.

use std::cell::Cell;
use std::fs::File;
use std::rc::Rc;
use std::time::Instant;

use super::spool::AnswerSender;

/// Where a request is in its life, shared by its connection and the worker that takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobState {
    Queued,
    /// Sent ahead to a busy worker (`offer.rs`); still the queue's until that worker takes it.
    Offered,
    Seated,
    /// The connection gave up waiting (`--queue-timeout`); a worker skips it.
    Cancelled,
}

/// One complete request, ready for a worker.
pub struct Job {
    /// The whole `REQUEST` frame, header included.
    pub frame: Vec<u8>,
    /// The body, when it is too large to travel inline; sent with the frame's `FD` flag.
    pub body_file: Option<File>,
    pub state: Rc<Cell<JobState>>,
    pub respond: AnswerSender,
    pub enqueued_at: Instant,
    /// `GET /path HTTP/1.1`, for log lines about this request.
    pub summary: Rc<str>,
    /// For the access log's timing atoms; None when there is no access log.
    pub served: Option<Rc<Served>>,
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
            summary: name.into(),
            served: None,
        };
        (job, receive)
    }
}
