//! The answer ring of the shared region (docs/PROTOCOL.md, section 3): every answer frame goes
//! there, as a record naming its request, and the lobby's bell is rung only when the lobby has
//! said that it sleeps. A frame with a descriptor, or larger than the ring takes, goes on the
//! socket, announced in the ring by an `ON_CHANNEL` record, so that the lobby reads every
//! answer frame in order from the ring alone. While the ring is full the worker sleeps in
//! poll(2) on its bell and its channel, so that a `CANCEL` still reaches it; an event loop's
//! frames wait in the backlog instead, a socket's frame with its `ON_CHANNEL` record.
//!
//! Imports the type from `mod.rs` and `errors` of the channel's files; it asks `ready_region`,
//! waits with `wait_and_read` and looks for a `CANCEL` with `check_cancel` (all in `receive`),
//! and writes to the socket through `link`.

use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use maitred_shm::{AnswerError, Awaiting};
use maitred_wire::{FrameHeader, Kind, MAX_BODY_PER_FRAME};
use pyo3::prelude::*;

use super::errors::{channel_error, socket_error, ChannelClosed, ChannelError};
use super::receive::Received;
use super::{Waiting, WorkerChannel};

/// The record that stands for a frame sent on the socket.
const ON_CHANNEL: [u8; maitred_wire::HEADER_LEN] = FrameHeader { kind: Kind::OnChannel, flags: 0, len: 0 }.encode();

/// What travels on the socket rather than in the ring.
pub(super) enum Aside {
    No,
    /// The frame is larger than the ring takes.
    TooLarge,
    /// The frame carries this descriptor.
    Passing(RawFd),
}

impl WorkerChannel {
    /// The most body bytes one frame carries: what the ring takes, within the protocol's bound.
    pub(super) fn max_body_per_frame(&self) -> usize {
        let ring = self.region.as_ref().map_or(MAX_BODY_PER_FRAME, |region| region.layout().max_answer_frame());
        MAX_BODY_PER_FRAME.min(ring - maitred_wire::HEADER_LEN)
    }

    /// Writes one answer frame, the bytes of `parts` one after the other, for the request taken
    /// last.
    pub(super) fn send_answer(&mut self, py: Python<'_>, parts: &[&[u8]], aside: Aside) -> PyResult<()> {
        let Some(region) = self.ready_region() else {
            return Err(ChannelError::new_err("an answer before the lobby sent the shared region and its bells"));
        };
        let len = parts.iter().map(|part| part.len()).sum::<usize>();
        let aside = match aside {
            Aside::No if len > region.layout().max_answer_frame() => Aside::TooLarge,
            aside => aside,
        };
        match aside {
            Aside::No => self.write_record(py, parts).map(drop),
            Aside::TooLarge => {
                if !self.write_record(py, &[&ON_CHANNEL])? {
                    self.wait_behind(parts.concat(), None);
                    return Ok(());
                }
                let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|part| IoSlice::new(part)).collect();
                self.link.write_all(py, &mut slices)
            }
            Aside::Passing(fd) => {
                if !self.write_record(py, &[&ON_CHANNEL])? {
                    // Kept open for the frame: the caller may close its descriptor on return.
                    // Failing (EMFILE), it is this answer's OSError, not the channel's.
                    let copy = maitred_sys::fd::duplicate(fd)?;
                    self.wait_behind(parts.concat(), Some(copy));
                    return Ok(());
                }
                self.link.write_with_fd(py, &parts.concat(), fd)
            }
        }
    }

    /// Evented: the frame whose `ON_CHANNEL` record has just joined the backlog waits there
    /// with it. Sent now, the lobby could find it on the socket with the ring empty, before
    /// the record that announces it: a frame the ring did not announce, a breach that ends
    /// the worker.
    fn wait_behind(&mut self, frame: Vec<u8>, fd: Option<OwnedFd>) {
        let waiting = self.backlog.back_mut().expect("the record that write_record put in the backlog");
        waiting.on_channel = Some((frame, fd));
    }

    /// Writes one record into the ring, waiting for room as long as it takes, and rings the
    /// lobby's bell if it sleeps, or has the event loop ring it at the end of its turn
    /// (`ring_later`). False: evented, the record waits in the backlog instead.
    fn write_record(&mut self, py: Python<'_>, parts: &[&[u8]]) -> PyResult<bool> {
        if self.evented && !self.backlog.is_empty() {
            // Frames go in order: this one waits behind those already waiting.
            self.backlog.push_back(Waiting { id: self.request_id, record: parts.concat(), on_channel: None });
            return Ok(false);
        }
        let len = parts.iter().map(|part| part.len()).sum::<usize>();
        loop {
            let region = self.region.as_mut().expect("the region, checked by send_answer");
            match region.write_answer(self.request_id, parts) {
                Ok(()) => break,
                Err(AnswerError::NoRoom) if self.evented => {
                    // An event loop must not wait here: the frame waits in the backlog, which
                    // the worker flushes once the lobby has made room (`flush_backlog`).
                    self.backlog.push_back(Waiting { id: self.request_id, record: parts.concat(), on_channel: None });
                    return Ok(false);
                }
                Err(AnswerError::NoRoom) => self.wait_for_room(py, len)?,
                Err(error) => return Err(channel_error("writing an answer into the shared region failed", error)),
            }
        }
        match &self.ring_later {
            Some(_) if self.ring_owed => {}
            Some(callback) => {
                if callback.call0(py)?.extract::<bool>(py)? {
                    self.ring_lobby_if_asleep()?;
                } else {
                    self.ring_owed = true;
                }
            }
            None => self.ring_lobby_if_asleep()?,
        }
        Ok(true)
    }

    /// After an answer was written: rings the lobby's bell if it said that it sleeps.
    pub(super) fn ring_lobby_if_asleep(&self) -> PyResult<()> {
        let region = self.region.as_ref().expect("the region");
        if region.wake_lobby() {
            let bell = self.lobby_bell.as_ref().expect("the lobby's bell, checked by send_answer");
            maitred_sys::bell::ring(bell.as_fd())
                .map_err(|error| socket_error("ringing the lobby's bell failed", error))?;
        }
        Ok(())
    }

    /// Evented: writes the backlog's frames into the ring while it has room, and the socket's
    /// after their records. True when the backlog is empty; false when the ring is full, the
    /// worker having said that it sleeps until the lobby made room (the event loop waits for
    /// the bell or the channel).
    pub(super) fn write_backlog(&mut self, py: Python<'_>) -> PyResult<bool> {
        let mut wrote = false;
        while let Some(waiting) = self.backlog.front() {
            let region = self.region.as_mut().expect("a backlog is only written with the region");
            match region.write_answer(waiting.id, &[&waiting.record]) {
                Ok(()) => {
                    let waiting = self.backlog.pop_front().expect("the front");
                    wrote = true;
                    if let Some((frame, fd)) = waiting.on_channel {
                        // The lobby reads the frame once it has read its record: it must be
                        // woken for the record before the write can wait for it.
                        self.ring_lobby_if_asleep()?;
                        match fd {
                            Some(fd) => self.link.write_with_fd(py, &frame, fd.as_raw_fd())?,
                            None => self.link.write_all(py, &mut [IoSlice::new(&frame)])?,
                        }
                    }
                }
                Err(AnswerError::NoRoom) => {
                    region.prepare_to_sleep(Awaiting::Room);
                    match region.room_for(waiting.record.len()) {
                        Ok(false) => {
                            self.asleep = true;
                            break;
                        }
                        Ok(true) => {
                            region.sleep_cancelled();
                        }
                        Err(error) => return Err(channel_error("the shared region is corrupt", error)),
                    }
                }
                Err(error) => return Err(channel_error("writing an answer into the shared region failed", error)),
            }
        }
        if wrote {
            self.ring_lobby_if_asleep()?;
        }
        Ok(self.backlog.is_empty())
    }

    /// Sleeps until the lobby has made room for a frame of `len` bytes, or sent a `CANCEL`
    /// for this request (then `ClientDisconnected`), or closed the channel.
    fn wait_for_room(&mut self, py: Python<'_>, len: usize) -> PyResult<()> {
        let region = self.region.as_ref().expect("the region");
        region.prepare_to_sleep(Awaiting::Room);
        let room = region.room_for(len).map_err(|error| channel_error("the shared region is corrupt", error));
        if !matches!(room, Ok(false)) {
            region.sleep_cancelled();
            return room.map(drop);
        }
        let received = self.wait_and_read(py, true);
        self.region.as_ref().expect("the region").sleep_cancelled();
        if let Received::Closed = received? {
            return Err(ChannelClosed::new_err(
                "the lobby closed the channel while the worker waited for room to answer",
            ));
        }
        self.check_cancel()
    }
}
