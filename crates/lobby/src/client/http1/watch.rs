//! Watching a connection's client while its request waits and while its answer streams: a
//! client that leaves has its request dropped, if no worker has begun it, or its worker told
//! (the relay's `CANCEL`); `--queue-timeout` withdraws a request no worker took in time.

use std::cell::Cell;
use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::time::sleep_until;

use super::Connection;
use crate::client::exchange;
use crate::client::peer::ClientStream;
use crate::log::debug;
use crate::seating::job::JobState;
use crate::seating::spool::{AnswerReceiver, ResponsePart};

/// What a connection keeps of its request while it waits for the answer.
pub(super) struct Waiting {
    pub(super) state: Rc<Cell<JobState>>,
    pub(super) enqueued_at: Instant,
    pub(super) upstream: Duration,
    /// When its client begins to be watched for leaving.
    pub(super) watch_after: Duration,
}

impl<S: ClientStream> Connection<S> {
    /// The next part of an answer that streams. While the worker has not sent it, a client
    /// that leaves (`client_left`) ends the connection: None comes back, and the relay tells
    /// the worker (CANCEL), whose application hears it at once (ASGI's `http.disconnect`).
    /// A part that is there already is taken without a look at the client; the first look may
    /// cost a peek (the socket's readiness left from reading the request), later ones nothing
    /// until the client does something. A client that sends more (a pipelined request) is not
    /// watched further: `watching` turns false.
    pub(super) async fn next_part(&self, responses: &AnswerReceiver, watching: &mut bool) -> Option<ResponsePart> {
        if !*watching {
            return responses.recv().await;
        }
        tokio::select! {
            biased;
            part = responses.recv() => part,
            left = self.client_left() => {
                if left {
                    debug!("the client {} left while its answer streamed; its worker is told", self.peer.display());
                    return None;
                }
                *watching = false;
                responses.recv().await
            }
        }
    }

    /// The first part of the answer. Meanwhile the wait is watched:
    /// - past `--queue-timeout`, a request still waiting for a worker (in the queue, or offered
    ///   to a busy worker that has not taken it) is withdrawn and answered 503;
    /// - from `WATCH_AFTER` on (`WATCH_SERVED_AFTER` for a request an idle worker took at
    ///   once), a client that leaves has its request dropped (`abandon`), and
    ///   None comes back: the connection ends.
    pub(super) async fn first_part(&self, responses: &AnswerReceiver, waiting: &Waiting) -> Option<ResponsePart> {
        // Turned off once a withdrawal fails: the worker has the request (an offer it took,
        // which the lobby has not yet seen), and the timer, due already, would fire again at
        // every turn of this loop until the lobby sees it (issue 46's class).
        let mut queue_timeout = self.context.settings().queue_timeout;
        let watch_from = tokio::time::Instant::from_std(waiting.enqueued_at + waiting.watch_after);
        let mut watching = true;
        loop {
            let unseated = matches!(waiting.state.get(), JobState::Queued | JobState::Offered);
            let timeout = queue_timeout.filter(|_| unseated);
            let timed_out = waiting.enqueued_at + timeout.unwrap_or_default();
            tokio::select! {
                part = responses.recv() => return part,
                _ = sleep_until(timed_out.into()), if timeout.is_some() => {
                    let Some(limit) = timeout else { continue };
                    if let Some(refused) = exchange::time_out(&self.context.seating, &waiting.state, limit) {
                        return Some(refused);
                    }
                    queue_timeout = None;
                }
                left = async { sleep_until(watch_from).await; self.client_left().await }, if watching => {
                    if left {
                        self.abandon(waiting);
                        return None;
                    }
                    watching = false;
                }
            }
        }
    }

    /// Waits until the client does something while its request waits, and says whether it
    /// left: it closed or reset the connection or, under `--half-close abandon`, shut its
    /// sending side (which looks the same as a close until the answer is written). False when it
    /// sent more (a pipelined request) or half-closed under `--half-close serve`: it is still
    /// there to read the answer, and is not watched further.
    ///
    /// Input the stream holds itself (a TLS session's decrypted plaintext, or its client's
    /// close_notify) counts as more sent: the socket would show nothing, and asking it again
    /// while the stream says it is ready made a loop that never yielded (issue 46). A TLS
    /// client that sent close_notify while it waits is served, as under `--half-close serve`.
    async fn client_left(&self) -> bool {
        loop {
            if self.stream.holds_input() {
                return false;
            }
            if poll_fn(|cx| self.stream.poll_read_ready(cx)).await.is_err() {
                return true;
            }
            let fd = self.stream.as_fd();
            match self.stream.try_io(Interest::READABLE, || maitred_sys::socket::peek(fd)) {
                Ok(0) => return self.context.settings().half_close_leaves,
                Ok(_) => return false,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return true,
            }
        }
    }

    /// The client left while its request waited: a request no worker has begun is dropped, and
    /// counted (its wait teaches the queue how long clients wait, `overload.rs`); one a worker
    /// has is stopped as the connection ends (its relay tells the worker, CANCEL).
    fn abandon(&self, waiting: &Waiting) {
        let now = Instant::now();
        let waited = now.saturating_duration_since(waiting.enqueued_at) + waiting.upstream;
        if exchange::withdraw(&self.context.seating, &waiting.state) {
            self.context.seating.overload.left(now, waited);
            debug!(
                "the client {} left after {:.3} s; its request is dropped",
                self.peer.display(),
                waited.as_secs_f64()
            );
        } else {
            debug!("the client {} left while its request was served; its worker is told", self.peer.display());
        }
    }
}
