//! The streams of ASGI workers open in the lobby as a whole (HTTP answers that have started and
//! not ended; WebSockets are counted in `websocket.rs`), and a stop's end of --graceful-timeout,
//! at which each of them ends cleanly for its client (docs/SIGNALS.md). A leaf: it imports
//! nothing of its neighbours.

use std::rc::Rc;

use tokio::sync::watch;

/// What the lobby knows of its open streams.
pub struct Streams {
    /// Streams open now.
    open: watch::Sender<usize>,
    /// Turns true when a stop's --graceful-timeout has passed: every open stream ends.
    ending: watch::Sender<bool>,
}

impl Default for Streams {
    fn default() -> Streams {
        Streams { open: watch::Sender::new(0), ending: watch::Sender::new(false) }
    }
}

impl Streams {
    /// Streams open now.
    pub fn open(&self) -> usize {
        *self.open.borrow()
    }

    /// An answer started; it counts as open until the guard is dropped (its end, however it
    /// came).
    pub fn opened(self: &Rc<Self>) -> OpenStream {
        self.open.send_modify(|open| *open += 1);
        OpenStream(self.clone())
    }

    /// Tells every open stream to end (a stop's --graceful-timeout passed).
    pub fn end_all(&self) {
        self.ending.send_replace(true);
    }

    /// Resolves once the streams are told to end.
    pub async fn ending(&self) {
        let mut ending = self.ending.subscribe();
        // The sender lives as long as `self`.
        let _ = ending.wait_for(|ending| *ending).await;
    }
}

/// An open stream's place in `Streams::open`.
pub struct OpenStream(Rc<Streams>);

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.open.send_modify(|open| *open -= 1);
    }
}
