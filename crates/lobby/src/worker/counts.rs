//! What the workers' tasks count as it happens: each count one observation on a histogram
//! that `observe/metrics.rs` registers and shows.

use std::time::Duration;

use prometheus::Histogram;

#[derive(Clone)]
pub(crate) struct Counts {
    /// `maitred_queue_wait_seconds`.
    pub queue_wait: Histogram,
    /// `maitred_request_duration_seconds`.
    pub duration: Histogram,
}

impl Counts {
    /// How long a request waited in the queue before a worker took it.
    pub fn waited(&self, wait: Duration) {
        self.queue_wait.observe(wait.as_secs_f64());
    }

    /// How long a worker took over a request, from its seating to the end of its answer.
    pub fn served(&self, took: Duration) {
        self.duration.observe(took.as_secs_f64());
    }
}
