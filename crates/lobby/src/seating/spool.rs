//! An answer on its way from a worker to its client, held within bounds.
//!
//! The worker's relay (`worker/relay.rs`) pushes each part as soon as the worker sends it, so that a
//! worker is free once it has produced its answer, whatever its client's pace; the connection
//! (`client/http1/write.rs`, `client/h2/send.rs`) takes the parts at the client's pace. In between, at most
//! [`MEMORY_PER_ANSWER`] bytes of body wait in memory. The rest is appended to an unlinked
//! temporary file, as a large request body is (and as nginx's proxy_temp does), and goes to
//! the client from there with sendfile: the bytes sit in the page cache, not in the lobby.
//!
//! Spilled bytes are capped per answer (`--max-spill`) and for the whole lobby
//! (`--max-spill-total`). Past the answer's cap the relay stops reading from the worker until
//! the client has taken every spilled byte, and the file starts again empty; past the lobby's,
//! until the total is back under it. Meanwhile the worker waits on its socket, as it would
//! behind nginx once proxy_max_temp_file_size is reached.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fs::File;
use std::future::poll_fn;
use std::io;
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::body_files::close_shared_later;
use super::websocket::WsPart;

/// Body bytes of one answer held in the lobby's memory; the rest spills to a file.
pub const MEMORY_PER_ANSWER: usize = 256 * 1024;

/// The largest spill file truncated on the event loop: freeing 8 MiB of pages takes about
/// 0.6 ms here (512 MiB took 35-45 ms, 2026-12-07).
const TRUNCATE_IN_PLACE_MOST: u64 = 8 << 20;

/// How often a relay held back by the lobby-wide cap looks again (that cap is shared by every
/// answer, so no one answer's progress can wake the right relay; it is rarely reached).
const TOTAL_CAP_RECHECK: Duration = Duration::from_millis(50);

/// What a worker's answer (or the lobby's own, on its behalf) becomes for the connection.
#[derive(Debug)]
pub enum ResponsePart {
    Head {
        status: u16,
        reason: Bytes,
        headers: Vec<(Bytes, Bytes)>,
        body: Bytes,
        end: bool,
    },
    Body {
        data: Bytes,
        end: bool,
    },
    /// Bytes of a file: one the application passed (`wsgi.file_wrapper`), or the spool's own
    /// spill file (`spilled`), whose bytes the connection reports sent with
    /// [`AnswerReceiver::spilled_sent`].
    File {
        file: Rc<File>,
        offset: u64,
        count: u64,
        end: bool,
        spilled: bool,
    },
    /// The response broke after its head was sent: the connection must be cut.
    Abort,
    /// The lobby answers instead of the application (502, 504, 503 for a request it will not
    /// serve), with Retry-After when the client may try again.
    Refused {
        status: u16,
        detail: String,
        retry_after: Option<u64>,
    },
    /// What the worker sends on a WebSocket request (`websocket.rs`).
    WebSocket(WsPart),
}

impl ResponsePart {
    pub fn is_last(&self) -> bool {
        match self {
            ResponsePart::Head { end, .. } | ResponsePart::Body { end, .. } | ResponsePart::File { end, .. } => *end,
            ResponsePart::Abort | ResponsePart::Refused { .. } => true,
            ResponsePart::WebSocket(part) => part.is_last(),
        }
    }

    /// Body bytes this part holds in memory.
    fn memory(&self) -> usize {
        match self {
            ResponsePart::Head { body, .. } => body.len(),
            ResponsePart::Body { data, .. } => data.len(),
            ResponsePart::WebSocket(part) => part.memory(),
            _ => 0,
        }
    }
}

/// The lobby-wide count of spilled bytes not yet sent, against `--max-spill-total`.
pub struct SpillBudget {
    waiting: Cell<u64>,
    limit: u64,
}

impl SpillBudget {
    pub fn new(limit: u64) -> SpillBudget {
        SpillBudget { waiting: Cell::new(0), limit }
    }

    pub fn waiting(&self) -> u64 {
        self.waiting.get()
    }

    fn exhausted(&self) -> bool {
        self.waiting.get() >= self.limit
    }
}

/// Why a relay stopped reading from its worker, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The answer's own spill reached `--max-spill`.
    AnswerCap,
    /// All answers' spills reached `--max-spill-total`.
    TotalCap,
}

struct Spool {
    parts: VecDeque<ResponsePart>,
    in_memory: usize,
    /// The spill file, and its place under --max-connections (it is a descriptor).
    spill: Option<(Rc<File>, OwnedSemaphorePermit)>,
    /// No place was free for a spill file: this answer keeps to its memory share, as with
    /// `--max-spill 0`, until the client has taken it.
    no_file: bool,
    /// Where the next spilled bytes go in the file: its size.
    spill_end: u64,
    /// Spilled bytes the client has not taken yet.
    spill_waiting: u64,
    /// Set when the answer's cap is reached; the relay waits until the file is drained.
    draining: bool,
    reader: Option<Waker>,
    writer: Option<Waker>,
    reader_gone: bool,
    writer_gone: bool,
}

struct Shared {
    spool: RefCell<Spool>,
    budget: Rc<SpillBudget>,
    /// `--max-spill`, or 0 once the answer is to keep to its memory (`keep_in_memory`).
    cap: Cell<u64>,
    descriptors: Arc<Semaphore>,
}

impl Shared {
    fn may_spill(&self, spool: &Spool) -> bool {
        self.cap.get() > 0 && !spool.no_file
    }

    fn held(&self, spool: &Spool) -> Option<Held> {
        if spool.reader_gone {
            // Nobody is left to catch up: what the worker still sends is dropped, not held. (An
            // answer kept in memory stays over its share once its client has gone: held, its
            // relay sent HOLD and GO to the worker in a loop, both busy at 100% of a core.)
            None
        } else if spool.draining || (!self.may_spill(spool) && spool.in_memory >= MEMORY_PER_ANSWER) {
            Some(Held::AnswerCap)
        } else if spool.spill_waiting > 0 && self.budget.exhausted() {
            Some(Held::TotalCap)
        } else {
            None
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let spool = self.spool.get_mut();
        self.budget.waiting.set(self.budget.waiting.get() - spool.spill_waiting);
        spool.parts.clear();
        if let Some((file, _)) = spool.spill.take() {
            close_shared_later(file);
        }
    }
}

/// A spill file the client has taken every byte of starts again empty. Truncating it frees its
/// pages, which for a large one (up to --max-spill, 1 GiB by default) is the closer's work
/// (`body_files.rs`): such a file is replaced by a new one. A small one is truncated in place.
fn emptied(file: &mut Rc<File>, size: u64) {
    if size > TRUNCATE_IN_PLACE_MOST {
        if let Ok(fresh) = tempfile::tempfile() {
            close_shared_later(std::mem::replace(file, Rc::new(fresh)));
            return;
        }
    }
    // Only the file's length changes; a failure leaves it longer, not wrong.
    let _ = file.set_len(0);
}

/// The relay's end: pushes parts, waits for room, learns when the client is gone.
pub struct AnswerSender(Rc<Shared>);

/// The connection's end: takes parts in order.
pub struct AnswerReceiver(Rc<Shared>);

/// A new, empty answer spool with the answer's cap `cap` (`--max-spill`) under `budget`; a
/// spill file takes a place from `descriptors` (--max-connections).
pub fn answer_channel(
    budget: Rc<SpillBudget>,
    cap: u64,
    descriptors: Arc<Semaphore>,
) -> (AnswerSender, AnswerReceiver) {
    let spool = Spool {
        parts: VecDeque::new(),
        in_memory: 0,
        spill: None,
        no_file: false,
        spill_end: 0,
        spill_waiting: 0,
        draining: false,
        reader: None,
        writer: None,
        reader_gone: false,
        writer_gone: false,
    };
    let shared = Rc::new(Shared { spool: RefCell::new(spool), budget, cap: Cell::new(cap), descriptors });
    (AnswerSender(shared.clone()), AnswerReceiver(shared))
}

impl AnswerSender {
    /// Queues `part` for the client: in memory, or its body bytes in the spill file once the
    /// answer's memory is full. A part for a client that has gone is dropped. An error means
    /// the spill file could not be written; nothing was queued.
    pub fn send(&self, part: ResponsePart) -> io::Result<()> {
        let shared = &*self.0;
        let mut spool = shared.spool.borrow_mut();
        if spool.reader_gone {
            return Ok(());
        }
        let part = match part {
            ResponsePart::Body { data, end }
                if shared.may_spill(&spool)
                    && !data.is_empty()
                    && spool.in_memory + data.len() > MEMORY_PER_ANSWER
                    && spool.has_file(&shared.descriptors) =>
            {
                spool.spill(&data, end, &shared.budget)?;
                if spool.spill_waiting >= shared.cap.get() {
                    spool.draining = true;
                }
                if let Some(reader) = spool.reader.take() {
                    reader.wake();
                }
                return Ok(());
            }
            part => part,
        };
        spool.in_memory += part.memory();
        spool.parts.push_back(part);
        if let Some(reader) = spool.reader.take() {
            reader.wake();
        }
        Ok(())
    }

    /// Waits until the answer may take more from its worker. Returns what held it, if
    /// anything did (for the log).
    pub async fn room(&self) -> Option<Held> {
        let held = self.held()?;
        loop {
            let check = poll_fn(|cx| {
                let mut spool = self.0.spool.borrow_mut();
                if spool.reader_gone || self.0.held(&spool).is_none() {
                    return Poll::Ready(());
                }
                spool.writer = Some(cx.waker().clone());
                Poll::Pending
            });
            match self.held() {
                Some(Held::TotalCap) => {
                    let _ = tokio::time::timeout(TOTAL_CAP_RECHECK, check).await;
                }
                Some(Held::AnswerCap) => check.await,
                None => return Some(held),
            }
            if self.0.spool.borrow().reader_gone {
                return Some(held);
            }
        }
    }

    /// From now on the answer spills nothing: past its memory share, the relay holds its
    /// worker's sends until the client has taken some. For an answer whose sender waits for
    /// free (an ASGI coroutine), where the spill file is for a WSGI thread, which a slow client
    /// would otherwise hold for the whole answer.
    pub fn keep_in_memory(&self) {
        self.0.cap.set(0);
    }

    /// What holds the relay now, if anything: `room` would wait.
    pub fn held(&self) -> Option<Held> {
        self.0.held(&self.0.spool.borrow())
    }

    /// Spilled bytes of this answer not yet taken by the client.
    pub fn spill_waiting(&self) -> u64 {
        self.0.spool.borrow().spill_waiting
    }

    /// Resolves once the connection has gone (the client left, or the answer was abandoned).
    pub async fn closed(&self) {
        poll_fn(|cx| {
            let mut spool = self.0.spool.borrow_mut();
            if spool.reader_gone {
                Poll::Ready(())
            } else {
                spool.writer = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

impl Drop for AnswerSender {
    fn drop(&mut self) {
        let mut spool = self.0.spool.borrow_mut();
        spool.writer_gone = true;
        if let Some(reader) = spool.reader.take() {
            reader.wake();
        }
    }
}

impl AnswerReceiver {
    /// The next part, once there is one; None when the relay is gone and every part is taken.
    pub async fn recv(&self) -> Option<ResponsePart> {
        poll_fn(|cx| {
            let mut spool = self.0.spool.borrow_mut();
            if let Some(part) = spool.parts.pop_front() {
                spool.in_memory -= part.memory();
                if let Some(writer) = spool.writer.take() {
                    writer.wake();
                }
                return Poll::Ready(Some(part));
            }
            if spool.writer_gone {
                return Poll::Ready(None);
            }
            spool.reader = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// The client has taken `count` spilled bytes. Once it has taken all of them, the file
    /// starts again from empty and a relay held by the answer's cap may go on.
    pub fn spilled_sent(&self, count: u64) {
        let shared = &*self.0;
        let mut spool = shared.spool.borrow_mut();
        spool.spill_waiting -= count;
        shared.budget.waiting.set(shared.budget.waiting.get() - count);
        if spool.spill_waiting == 0 {
            spool.draining = false;
            let size = std::mem::take(&mut spool.spill_end);
            if let Some((file, _)) = &mut spool.spill {
                emptied(file, size);
            }
        }
        if let Some(writer) = spool.writer.take() {
            writer.wake();
        }
    }
}

impl Drop for AnswerReceiver {
    fn drop(&mut self) {
        let mut spool = self.0.spool.borrow_mut();
        spool.reader_gone = true;
        spool.parts.clear();
        if let Some(writer) = spool.writer.take() {
            writer.wake();
        }
    }
}

impl Spool {
    /// Whether the answer has its spill file, making it (with its place under
    /// --max-connections) if it can; if no place is free, it never will.
    fn has_file(&mut self, descriptors: &Arc<Semaphore>) -> bool {
        if self.spill.is_none() {
            match descriptors.clone().try_acquire_owned() {
                Ok(place) => match tempfile::tempfile() {
                    Ok(file) => self.spill = Some((Rc::new(file), place)),
                    // Kept in memory instead; the relay waits for the client past the share.
                    Err(_) => self.no_file = true,
                },
                Err(_) => self.no_file = true,
            }
        }
        self.spill.is_some()
    }

    /// Appends `data` to the spill file and queues it, joined to the part before when that
    /// part is the file's bytes just before these.
    fn spill(&mut self, data: &[u8], end: bool, budget: &SpillBudget) -> io::Result<()> {
        let file = self.spill.as_ref().expect("has_file made it").0.clone();
        let offset = self.spill_end;
        file.write_all_at(data, offset)?;
        let count = data.len() as u64;
        self.spill_end += count;
        self.spill_waiting += count;
        budget.waiting.set(budget.waiting.get() + count);
        if let Some(ResponsePart::File { spilled: true, offset: o, count: c, end: e, .. }) = self.parts.back_mut() {
            if *o + *c == offset && !*e {
                *c += count;
                *e = end;
                return Ok(());
            }
        }
        self.parts.push_back(ResponsePart::File { file, offset, count, end, spilled: true });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(100))
    }

    fn body(byte: u8, len: usize, end: bool) -> ResponsePart {
        ResponsePart::Body { data: Bytes::from(vec![byte; len]), end }
    }

    fn run<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(future)
    }

    /// Reads what a part carries, as the connection would send it.
    fn content(part: &ResponsePart) -> Vec<u8> {
        match part {
            ResponsePart::Body { data, .. } => data.to_vec(),
            ResponsePart::File { file, offset, count, .. } => {
                let mut out = vec![0; *count as usize];
                file.read_exact_at(&mut out, *offset).unwrap();
                out
            }
            other => panic!("unexpected part {other:?}"),
        }
    }

    #[test]
    fn past_the_memory_share_bytes_spill_in_order_and_are_sent_from_the_file() {
        run(async {
            let budget = Rc::new(SpillBudget::new(u64::MAX));
            let (tx, rx) = answer_channel(budget.clone(), u64::MAX, places());
            let mut expected = Vec::new();
            for i in 0..10u8 {
                tx.send(body(i, 64 * 1024, i == 9)).unwrap();
                expected.extend(vec![i; 64 * 1024]);
            }
            assert_eq!(tx.0.spool.borrow().in_memory, MEMORY_PER_ANSWER);
            assert_eq!(budget.waiting(), 6 * 64 * 1024);
            let mut received = Vec::new();
            loop {
                let part = rx.recv().await.unwrap();
                received.extend(content(&part));
                if let ResponsePart::File { count, spilled: true, .. } = part {
                    rx.spilled_sent(count);
                }
                if part.is_last() {
                    break;
                }
            }
            assert_eq!(received, expected);
            // The six spilled parts were joined into one.
            assert_eq!(budget.waiting(), 0);
        });
    }

    #[test]
    fn the_answer_cap_holds_the_relay_until_the_file_is_drained() {
        run(async {
            let budget = Rc::new(SpillBudget::new(u64::MAX));
            let (tx, rx) = answer_channel(budget, 128 * 1024, places());
            for _ in 0..4 {
                tx.send(body(1, 64 * 1024, false)).unwrap();
            }
            assert_eq!(tx.room().await, None);
            tx.send(body(2, 64 * 1024, false)).unwrap();
            tx.send(body(3, 64 * 1024, false)).unwrap();
            assert_eq!(tx.held(), Some(Held::AnswerCap));
            for _ in 0..4 {
                rx.recv().await.unwrap();
            }
            let ResponsePart::File { count, .. } = rx.recv().await.unwrap() else { panic!("expected the spill") };
            assert_eq!(count, 128 * 1024);
            assert_eq!(tx.held(), Some(Held::AnswerCap));
            rx.spilled_sent(count);
            assert_eq!(tx.room().await, None);
            assert_eq!(tx.0.spool.borrow().spill.as_ref().unwrap().0.metadata().unwrap().len(), 0);
        });
    }

    #[test]
    fn a_large_drained_spill_file_is_replaced_and_the_old_one_freed_by_the_closer() {
        run(async {
            let budget = Rc::new(SpillBudget::new(u64::MAX));
            let (tx, rx) = answer_channel(budget, 64 << 20, places());
            // The memory share, then 9 MiB spilled: past what is truncated in place.
            for _ in 0..1 + 36 {
                tx.send(body(1, 256 * 1024, false)).unwrap();
            }
            let mut spilled = None;
            while spilled.is_none() {
                if let ResponsePart::File { file, count, .. } = rx.recv().await.unwrap() {
                    spilled = Some((Rc::downgrade(&file), count));
                }
            }
            let (old, count) = spilled.unwrap();
            assert_eq!(count, 36 * 256 * 1024);
            assert!(count > TRUNCATE_IN_PLACE_MOST);
            rx.spilled_sent(count);
            // The old file went to the closer; the next spill starts a new, empty one.
            assert!(old.upgrade().is_none());
            assert_eq!(tx.0.spool.borrow().spill.as_ref().unwrap().0.metadata().unwrap().len(), 0);
        });
    }

    #[test]
    fn an_answer_kept_in_memory_holds_the_relay_at_its_share_and_spills_nothing() {
        run(async {
            let budget = Rc::new(SpillBudget::new(u64::MAX));
            let (tx, rx) = answer_channel(budget, u64::MAX, places());
            tx.keep_in_memory();
            for _ in 0..4 {
                assert_eq!(tx.held(), None);
                tx.send(body(1, 64 * 1024, false)).unwrap();
            }
            assert_eq!(tx.held(), Some(Held::AnswerCap));
            // A frame the worker wrote before it read HOLD is kept, in memory.
            tx.send(body(2, 64 * 1024, false)).unwrap();
            assert!(tx.0.spool.borrow().spill.is_none());
            rx.recv().await.unwrap();
            assert_eq!(tx.held(), Some(Held::AnswerCap));
            rx.recv().await.unwrap();
            assert_eq!(tx.held(), None);
        });
    }

    #[test]
    fn an_answer_whose_client_has_gone_holds_nothing() {
        run(async {
            let budget = Rc::new(SpillBudget::new(u64::MAX));
            let (tx, rx) = answer_channel(budget, u64::MAX, places());
            tx.keep_in_memory();
            for _ in 0..4 {
                tx.send(body(1, 64 * 1024, false)).unwrap();
            }
            assert_eq!(tx.held(), Some(Held::AnswerCap));
            drop(rx);
            assert_eq!(tx.held(), None);
            assert_eq!(tx.room().await, None);
        });
    }

    #[test]
    fn the_total_cap_holds_only_answers_that_spill() {
        run(async {
            let budget = Rc::new(SpillBudget::new(64 * 1024));
            let (spilling, _rx) = answer_channel(budget.clone(), u64::MAX, places());
            for _ in 0..5 {
                spilling.send(body(1, 64 * 1024, false)).unwrap();
            }
            assert_eq!(spilling.held(), Some(Held::TotalCap));
            let (small, _rx2) = answer_channel(budget, u64::MAX, places());
            small.send(body(1, 1024, false)).unwrap();
            assert_eq!(small.held(), None);
        });
    }

    #[test]
    fn a_gone_client_releases_the_budget_and_wakes_the_relay() {
        run(async {
            let budget = Rc::new(SpillBudget::new(u64::MAX));
            let (tx, rx) = answer_channel(budget.clone(), 64 * 1024, places());
            for _ in 0..6 {
                tx.send(body(1, 64 * 1024, false)).unwrap();
            }
            assert_eq!(budget.waiting(), 2 * 64 * 1024);
            drop(rx);
            tx.closed().await;
            // Nothing holds an answer whose client has gone.
            assert_eq!(tx.room().await, None);
            tx.send(body(1, 64 * 1024, false)).unwrap();
            drop(tx);
            assert_eq!(budget.waiting(), 0);
        });
    }

    #[test]
    fn a_spill_file_takes_a_place_and_without_one_the_memory_share_holds_the_relay() {
        run(async {
            let places = Arc::new(Semaphore::new(1));
            let budget = Rc::new(SpillBudget::new(u64::MAX));
            let (first, _first_rx) = answer_channel(budget.clone(), u64::MAX, places.clone());
            for _ in 0..5 {
                first.send(body(1, 64 * 1024, false)).unwrap();
            }
            assert_eq!(places.available_permits(), 0);
            let (second, second_rx) = answer_channel(budget, u64::MAX, places.clone());
            for _ in 0..5 {
                second.send(body(1, 64 * 1024, false)).unwrap();
            }
            assert_eq!(second.held(), Some(Held::AnswerCap));
            second_rx.recv().await.unwrap();
            second_rx.recv().await.unwrap();
            assert_eq!(second.room().await, None);
            drop(first);
            drop(_first_rx);
            assert_eq!(places.available_permits(), 1);
        });
    }

    #[test]
    fn without_a_file_the_memory_share_holds_the_relay() {
        run(async {
            let budget = Rc::new(SpillBudget::new(u64::MAX));
            let (tx, rx) = answer_channel(budget, 0, places());
            for _ in 0..4 {
                tx.send(body(1, 64 * 1024, false)).unwrap();
            }
            assert_eq!(tx.held(), Some(Held::AnswerCap));
            rx.recv().await.unwrap();
            assert_eq!(tx.room().await, None);
        });
    }
}
