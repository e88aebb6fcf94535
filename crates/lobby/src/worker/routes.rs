//! What an ASGI worker's one channel (`mux.rs`) and its requests' relays (`stream.rs`) share:
//! the channel's writer, the route of each request in progress by its id, the counts admission
//! reads, and why the worker was lost. A leaf of the two, so that neither imports the other.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::rc::Rc;

use futures_channel::mpsc;
use futures_util::StreamExt;
use tokio::io::unix::AsyncFd;
use tokio::sync::{watch, Notify};

use super::channel::{send_whole, Frame};
use super::scoreboard::{Card, Phase};
use crate::seating::offer::Offers;

/// Payload bytes routed to one relay that it has not taken yet, past which the channel's task
/// lets the relays run before it reads on: a worker that writes one answer faster than the
/// task yields would otherwise pile it up in the route, out of the spool's sight, before the
/// relay could send `HOLD` (a generated 64 MiB answer to a client that read nothing: 35 MB
/// queued before the first `HOLD`). The spool's own share, as a route is one more place an
/// answer waits.
pub(super) const ROUTE_BACKLOG: usize = crate::seating::spool::MEMORY_PER_ANSWER;

/// The channel's end of a request's route: the frames, and their bytes not yet taken.
#[derive(Clone)]
pub(super) struct Route {
    frames: mpsc::UnboundedSender<Frame>,
    backlog: Rc<Cell<usize>>,
}

/// The relay's end of its route.
pub(super) struct RouteReceiver {
    frames: mpsc::UnboundedReceiver<Frame>,
    backlog: Rc<Cell<usize>>,
}

/// A new route for one request's frames.
pub(super) fn route() -> (Route, RouteReceiver) {
    let (frames, received) = mpsc::unbounded();
    let backlog = Rc::new(Cell::new(0));
    (Route { frames, backlog: backlog.clone() }, RouteReceiver { frames: received, backlog })
}

impl Route {
    /// Queues `frame` for the relay (dropped when the relay has ended); returns the bytes the
    /// relay has yet to take.
    pub(super) fn send(&self, frame: Frame) -> usize {
        let queued = self.backlog.get() + frame.payload.len();
        if self.frames.unbounded_send(frame).is_ok() {
            self.backlog.set(queued);
        }
        self.backlog.get()
    }
}

impl RouteReceiver {
    /// The next frame; None once the channel's task has dropped the route (the worker is lost).
    /// Cancel-safe, as the stream's `next` is: the count is taken down with the frame.
    pub(super) async fn next(&mut self) -> Option<Frame> {
        let frame = self.frames.next().await?;
        self.backlog.set(self.backlog.get() - frame.payload.len());
        Some(frame)
    }
}

/// What the worker's task and its requests' relays share.
pub(super) struct Mux {
    pub(super) pid: i32,
    pub(super) offers: Rc<Offers>,
    /// The channel's socket, for writing: every frame the lobby sends the worker goes through
    /// `send`, one whole frame at a time.
    pub(super) writer: AsyncFd<OwnedFd>,
    /// Held while a frame is being written, so that frames of two requests never interleave.
    pub(super) writing: tokio::sync::Mutex<()>,
    /// The relay of each request in progress, by id: its answer's frames go there.
    pub(super) routes: RefCell<HashMap<u32, Route>>,
    /// Streams the lobby ended at --graceful-timeout (`stream.rs`) whose last frames the
    /// worker has not sent: what it still sends for them is dropped.
    pub(super) dismissed: RefCell<HashSet<u32>>,
    /// Requests whose answers have started (streams), WebSockets included.
    pub(super) streaming: Cell<usize>,
    /// Rung when a request's answer starts or ends: admission may go on.
    pub(super) room: Notify,
    /// Its phase, which a relay watches (a retired worker's WebSockets close at the grace's end).
    pub(super) phase: watch::Receiver<Phase>,
    pub(super) card: Rc<Card>,
    /// Why the worker was lost, once it was: what its relays tell their clients.
    pub(super) lost: RefCell<Option<String>>,
}

impl Mux {
    /// Sends one whole frame, with `fd` attached to its first byte when given.
    pub(super) async fn send(&self, frame: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let _turn = self.writing.lock().await;
        send_whole(&self.writer, frame, fd).await
    }

    /// Bytes the lobby sent that the worker has not read (SIOCOUTQ): a `CANCEL` left unread
    /// says that its event loop is blocked.
    pub(super) fn unread(&self) -> Option<u32> {
        maitred_sys::socket::unsent_bytes(self.writer.get_ref().as_fd())
    }

    /// The lobby has ended request `id`'s stream: its relay ends now, and the worker's frames
    /// for it are dropped until its last.
    pub(super) fn dismiss(&self, id: u32) {
        self.dismissed.borrow_mut().insert(id);
    }

    /// Requests admitted whose answers have not started: what admission counts (the card
    /// holds them, for the scoreboard and the diagnoses).
    pub(super) fn admitted(&self) -> usize {
        self.card.admitted.get()
    }

    /// Request `id`'s answer started: it no longer counts against admission.
    pub(super) fn started(&self, id: u32) {
        self.card.started(id);
        self.streaming.set(self.streaming.get() + 1);
        self.counted();
    }

    /// The card says how many streams are open, and admission looks again.
    fn counted(&self) {
        self.card.streams.set(self.streaming.get());
        self.room.notify_one();
    }

    /// Request `id`'s relay has ended, its answer started (`streamed`) or not.
    pub(super) fn ended(&self, id: u32, streamed: bool) {
        self.routes.borrow_mut().remove(&id);
        self.offers.finished(id);
        if streamed {
            self.streaming.set(self.streaming.get().saturating_sub(1));
        } else {
            self.card.started(id);
        }
        self.counted();
    }
}
