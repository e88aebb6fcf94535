//! `Channel`'s reading of a worker's answer frames: from the answer ring of its shared region,
//! or, where a ring record says `ON_CHANNEL`, from its channel (docs/PROTOCOL.md, section 3).
//! The lobby sleeps on its own bell, an eventfd the worker rings only after the lobby has said
//! in the region that it sleeps, and on the channel, whose end of file says the worker has gone.
//! Before the lobby's thread parks, it looks once more at the rings of the seats asleep
//! (`look_before_parking`).

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::rc::Rc;

use maitred_wire::{FrameHeader, Kind, HEADER_LEN};
use tokio::sync::Notify;

use super::channel::{invalid, AnswerReader, Channel, Frame};
use crate::seating::offer::Offers;

thread_local! {
    /// The seats whose tasks sleep in `next_answer` until their worker rings.
    static ASLEEP: RefCell<Vec<Asleep>> = const { RefCell::new(Vec::new()) };
}

/// A seat asleep in `next_answer`: its region, and how its task is woken without the bell.
struct Asleep {
    offers: Rc<Offers>,
    woken: Rc<Notify>,
}

/// Run by the lobby's runtime just before its thread parks (tokio's `on_thread_park`): a seat
/// asleep whose worker has written an answer and not rung yet is woken now, and its flag in the
/// region cleared, so that the worker's ring is not sent and the lobby does not park only to be
/// woken for that answer. An ASGI worker rings once its loop's turn has run (docs/PROTOCOL.md,
/// section 4), so while its loop renders one answer, those written before it in the same turn
/// are read here, when the lobby would otherwise sleep.
pub fn look_before_parking() {
    ASLEEP.with_borrow_mut(|asleep| {
        asleep.retain(|seat| {
            if !seat.offers.has_answer() {
                return true;
            }
            seat.offers.woke();
            seat.woken.notify_one();
            false
        });
    });
}

/// A seat on the `ASLEEP` list while its task sleeps, off it however the sleep ends: the bell,
/// the look before parking, the channel, or the caller dropping `next_answer`.
struct OnTheList(Rc<Notify>);

impl OnTheList {
    fn new(offers: &Rc<Offers>, woken: &Rc<Notify>) -> OnTheList {
        ASLEEP.with_borrow_mut(|asleep| asleep.push(Asleep { offers: offers.clone(), woken: woken.clone() }));
        OnTheList(woken.clone())
    }
}

impl Drop for OnTheList {
    fn drop(&mut self) {
        // `try_with`: a task dropped as the thread ends finds the list gone, and nothing to do.
        // The list's order means nothing, so the seat's place is filled by the last.
        let _ = ASLEEP.try_with(|asleep| {
            let mut asleep = asleep.borrow_mut();
            if let Some(at) = asleep.iter().position(|seat| Rc::ptr_eq(&seat.woken, &self.0)) {
                asleep.swap_remove(at);
            }
        });
    }
}

impl AnswerReader {
    /// Waits until the worker rings, and silences the bell.
    async fn rung(&self) -> io::Result<()> {
        loop {
            let mut ready = self.bell.readable().await?;
            let rang = maitred_sys::bell::silence(self.bell.get_ref().as_fd())?;
            // The counter is 0 again either way: the next ring is a new edge.
            ready.clear_ready();
            if rang {
                return Ok(());
            }
        }
    }
}

impl Channel {
    /// The lobby's bell, to be sent to the worker with `LOBBY_BELL`.
    pub(super) fn lobby_bell(&self) -> BorrowedFd<'_> {
        self.answers.bell.get_ref().as_fd()
    }

    /// The next frame of the answer to request `id`. None: the worker closed its channel (it
    /// has gone). A frame for another request, a bad record, or a frame on the channel that the
    /// ring did not announce is an `InvalidData` error: the worker broke the protocol.
    pub(super) async fn next_answer(&mut self, offers: &Rc<Offers>, id: u32) -> io::Result<Option<Frame>> {
        match self.next_record(offers).await? {
            Some((answers, _)) if answers != id => {
                Err(invalid(format!("an answer for request {answers} while it answers request {id}")))
            }
            next => Ok(next.map(|(_, frame)| frame)),
        }
    }

    /// The next answer frame, of whichever request, with the id of the request it answers. None:
    /// the worker closed its channel. A bad record, a frame on the channel the ring did not
    /// announce, or an answer for a request the worker does not hold is an `InvalidData` error.
    pub(super) async fn next_record(&mut self, offers: &Rc<Offers>) -> io::Result<Option<(u32, Frame)>> {
        loop {
            if let Some(id) = self.answers.on_channel {
                let frame = self.read_frame().await?;
                self.answers.on_channel = None;
                return Ok(frame.map(|frame| (id, frame)));
            }
            let buf = &mut self.answers.buf;
            buf.clear();
            if let Some(answer) = offers.next_answer(buf)? {
                let id = answer.id;
                let header = FrameHeader::decode(buf[..HEADER_LEN].try_into().expect("a frame header"))
                    .map_err(|e| invalid(format!("an answer record holds a bad frame: {e}")))?;
                if header.kind == Kind::OnChannel {
                    if header.len != 0 || header.flags != 0 {
                        return Err(invalid("an ON_CHANNEL record with flags or a payload"));
                    }
                    self.answers.on_channel = Some(id);
                    continue;
                }
                if header.has_fd() {
                    return Err(invalid(format!(
                        "a {:?} frame in the answer ring says it carries a descriptor",
                        header.kind
                    )));
                }
                let payload = buf.split_off(HEADER_LEN).freeze();
                // A frame read from the ring costs no wait: a worker that writes faster than
                // the lobby passes its answer on (into a spill file) would otherwise keep the
                // relay's loop from yielding for the whole answer, up to --max-spill (issue 46's
                // list). tokio's budget makes it yield every so many frames.
                tokio::task::coop::consume_budget().await;
                return Ok(Some((id, Frame { header, payload, fd: None })));
            }
            if !offers.prepare_to_sleep() {
                continue;
            }
            let woken = self.answers.woken.clone();
            let on_the_list = OnTheList::new(offers, &woken);
            let channel_ready = tokio::select! {
                rang = self.answers.rung() => { rang?; false }
                () = woken.notified() => false,
                ready = self.closed_while_idle() => { ready?; true }
            };
            drop(on_the_list);
            offers.woke();
            if channel_ready && !offers.has_answer() {
                // The worker announces in the ring every frame it sends on the channel, before
                // sending it: with the ring empty, what the channel holds is its end of file,
                // or a breach.
                return match self.read_frame().await? {
                    None => Ok(None),
                    Some(frame) => Err(invalid(format!(
                        "a {:?} frame on the channel that the ring did not announce",
                        frame.header.kind
                    ))),
                };
            }
        }
    }
}
