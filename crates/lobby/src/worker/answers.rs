//! `Channel`'s reading of a worker's answer frames: from the answer ring of its shared region,
//! or, where a ring record says `ON_CHANNEL`, from its channel (docs/PROTOCOL.md, section 3).
//! The lobby sleeps on its own bell, an eventfd the worker rings only after the lobby has said
//! in the region that it sleeps, and on the channel, whose end of file says the worker has gone.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use maitred_wire::{FrameHeader, Kind, HEADER_LEN};

use super::channel::{invalid, AnswerReader, Channel, Frame};
use crate::seating::offer::Offers;

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
    pub(super) async fn next_answer(&mut self, offers: &Offers, id: u32) -> io::Result<Option<Frame>> {
        loop {
            if self.answers.on_channel {
                let frame = self.read_frame().await?;
                self.answers.on_channel = false;
                return Ok(frame);
            }
            let buf = &mut self.answers.buf;
            buf.clear();
            if let Some(answer) = offers.next_answer(buf)? {
                if answer.id != id {
                    return Err(invalid(format!("an answer for request {} while it answers request {id}", answer.id)));
                }
                let header = FrameHeader::decode(buf[..HEADER_LEN].try_into().expect("a frame header"))
                    .map_err(|e| invalid(format!("an answer record holds a bad frame: {e}")))?;
                if header.kind == Kind::OnChannel {
                    if header.len != 0 || header.flags != 0 {
                        return Err(invalid("an ON_CHANNEL record with flags or a payload"));
                    }
                    self.answers.on_channel = true;
                    continue;
                }
                if header.has_fd() {
                    return Err(invalid(format!(
                        "a {:?} frame in the answer ring says it carries a descriptor",
                        header.kind
                    )));
                }
                let payload = buf.split_off(HEADER_LEN).freeze();
                return Ok(Some(Frame { header, payload, fd: None }));
            }
            if !offers.prepare_to_sleep() {
                continue;
            }
            let channel_ready = tokio::select! {
                rang = self.answers.rung() => { rang?; false }
                ready = self.closed_while_idle() => { ready?; true }
            };
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
