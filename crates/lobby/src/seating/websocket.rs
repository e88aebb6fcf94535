//! What a WebSocket's connection, its queue and the worker relaying it share
//! (docs/PROTOCOL.md, section 5): the lobby-wide counts and the going-away signal of a stop,
//! and the link between a WebSocket's
//! connection and its worker. A leaf: it imports nothing of its neighbours.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use bytes::Bytes;
use futures_channel::mpsc;
use tokio::sync::watch;

/// What the lobby knows of WebSockets as a whole.
pub struct WebSockets {
    /// The application is ASGI: its workers said `READY_ASGI` at the start, before the lobby
    /// accepted a connection. From then on every `Upgrade: websocket` request is a WebSocket,
    /// which waits for a seat as any request does, also while no worker is up (a replacement,
    /// a reload). The interface never changes after: a worker of the other one fails to boot
    /// (docs/ASGI.md, "Which interface").
    asgi: Cell<bool>,
    /// WebSockets accepted and not yet closed by their workers (`maitred_websockets_open`).
    open: watch::Sender<usize>,
    /// Turns true when a stop's --graceful-timeout has passed: every open WebSocket closes with
    /// 1001.
    going_away: watch::Sender<bool>,
}

impl Default for WebSockets {
    fn default() -> WebSockets {
        WebSockets { asgi: Cell::new(false), open: watch::Sender::new(0), going_away: watch::Sender::new(false) }
    }
}

impl WebSockets {
    /// Whether the application is ASGI. An `Upgrade: websocket` request is then a WebSocket; a
    /// WSGI application gets it as a plain request, as gunicorn and uvicorn's WSGI interface
    /// pass it. (A fast chunked upload streams to an ASGI application, too: `http1/read.rs`.)
    pub fn asgi(&self) -> bool {
        self.asgi.get()
    }

    /// A worker said `READY_ASGI`: the application is ASGI.
    pub fn asgi_application(&self) {
        self.asgi.set(true);
    }

    /// WebSockets open now.
    pub fn open(&self) -> usize {
        *self.open.borrow()
    }

    /// A WebSocket was accepted; it counts as open until the guard is dropped (its worker's
    /// `WS_CLOSE`, or the worker's loss).
    pub fn opened(self: &Rc<Self>) -> OpenWebSocket {
        self.open.send_modify(|open| *open += 1);
        OpenWebSocket(self.clone())
    }

    /// Tells every open WebSocket to close with 1001 (a stop's --graceful-timeout passed).
    pub fn go_away(&self) {
        self.going_away.send_replace(true);
    }

    /// Resolves once the WebSockets are told to go away.
    pub async fn going_away(&self) {
        let mut going = self.going_away.subscribe();
        // The sender lives as long as `self`.
        let _ = going.wait_for(|going| *going).await;
    }
}

/// An accepted WebSocket's place in `WebSockets::open`.
pub struct OpenWebSocket(Rc<WebSockets>);

impl Drop for OpenWebSocket {
    fn drop(&mut self) {
        self.0.open.send_modify(|open| *open -= 1);
    }
}

/// Ends a WebSocket request's summary (`GET /chat HTTP/1.1 (WebSocket)`) in the log, the
/// scoreboard and the diagnoses, which do not count an open WebSocket as a long request.
pub const SUMMARY_MARK: &str = " (WebSocket)";

/// What goes from a WebSocket's client to its worker.
#[derive(Debug)]
pub struct ClientMessage {
    pub text: bool,
    pub data: Bytes,
}

/// How a WebSocket's client side ended, for `WS_CLOSED`: the close code and reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Closing {
    pub code: u16,
    pub reason: String,
}

/// How many whole client messages wait for the worker's channel at most: the connection reads
/// no more from its client meanwhile (with the message being written, two at most).
const MESSAGES_AHEAD: usize = 1;

/// The connection's end of its link with the worker.
pub struct ToWorker {
    pub messages: mpsc::Sender<ClientMessage>,
    pub closing: Rc<RefCell<Option<Closing>>>,
}

impl ToWorker {
    /// Says how the client side ended and lets go: the worker gets `WS_CLOSED` with it once it
    /// has every message sent before.
    pub fn close(self, closing: Closing) {
        *self.closing.borrow_mut() = Some(closing);
    }
}

/// The worker side of a WebSocket request, in its `Job`.
pub struct WebSocketJob {
    /// Taken by the relay once the worker accepts.
    pub messages: RefCell<Option<mpsc::Receiver<ClientMessage>>>,
    /// Set by the connection before it drops its sender; unset when it ended without saying
    /// (1006).
    pub closing: Rc<RefCell<Option<Closing>>>,
}

impl WebSocketJob {
    /// How the client side ended, once the connection has let go.
    pub fn closing(&self) -> Closing {
        self.closing
            .borrow()
            .clone()
            .unwrap_or_else(|| Closing { code: 1006, reason: "the connection ended without a Close".into() })
    }
}

/// A linked pair: the connection keeps `ToWorker`, the job carries `WebSocketJob`.
pub fn link() -> (ToWorker, WebSocketJob) {
    // A futures channel holds one message per sender beyond its buffer.
    let (sender, receiver) = mpsc::channel(MESSAGES_AHEAD - 1);
    let closing = Rc::new(RefCell::new(None));
    (
        ToWorker { messages: sender, closing: closing.clone() },
        WebSocketJob { messages: RefCell::new(Some(receiver)), closing },
    )
}

/// What a worker sends on an accepted (or refused) WebSocket, for its connection.
#[derive(Debug)]
pub enum WsPart {
    /// `WS_ACCEPT`: answer `101 Switching Protocols` with these.
    Accept { subprotocol: Bytes, headers: Vec<(Bytes, Bytes)> },
    /// `WS_SEND`: one message.
    Send { text: bool, data: Bytes },
    /// `WS_CLOSE`: before the accept, a refusal (403); after it, a Close.
    Close { code: u16, reason: String },
    /// The lobby closes the WebSocket with 1001: its worker retires (a reload) and
    /// --graceful-timeout has passed.
    GoingAway,
}

impl WsPart {
    pub fn is_last(&self) -> bool {
        matches!(self, WsPart::Close { .. })
    }

    /// Bytes it holds in memory, counted against the answer's memory (`spool.rs`).
    pub fn memory(&self) -> usize {
        match self {
            WsPart::Send { data, .. } => data.len(),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_holds_messages_ahead_of_the_worker_and_no_more() {
        let (mut to_worker, websocket) = link();
        let message = || ClientMessage { text: true, data: Bytes::from_static(b"hello") };
        for _ in 0..MESSAGES_AHEAD {
            to_worker.messages.try_send(message()).expect("room for a message ahead");
        }
        let full = to_worker.messages.try_send(message()).expect_err("the link is full");
        assert!(full.is_full(), "{full}");
        let mut messages = websocket.messages.borrow_mut().take().expect("the worker's end");
        assert!(messages.try_recv().is_ok(), "a message waits");
        to_worker.messages.try_send(message()).expect("room again once the worker has taken one");
    }
}
