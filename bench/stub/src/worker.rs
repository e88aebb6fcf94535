//! A stub worker: it speaks the worker channel and the shared region as a real worker does
//! (docs/PROTOCOL.md, sections 2 and 3; crates/python/src/channel/ is the real one), but answers
//! every request at once with the same `200 OK` and `Hello, world!\n`, one `RESPONSE_HEAD` frame
//! with `END`, and reads nothing of the request. So the lobby, not the worker, is what a load on
//! it measures. With `--websocket-echo` it is an ASGI worker too, and echoes WebSockets
//! (`echo.rs`), any number at once on its one channel, each frame naming its WebSocket
//! (docs/PROTOCOL.md, section 5).

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use maitred_shm::{AnswerError, Awaiting, Region, WorkerEnd};
use maitred_sys::fdpass::RecvError;
use maitred_wire::{
    build_frame, FrameHeader, Kind, Ready, ResponseHead, FLAG_END, FLAG_WEBSOCKET, HEADER_LEN, READY_ASGI,
};

use crate::echo::{self, Handshake};

/// The body of every answer; the lobby adds its Content-Length, as it does for any answer that
/// comes whole in one frame.
const BODY: &[u8] = b"Hello, world!\n";
/// Bytes asked of each read of the channel: a request sent on the channel is at most a slot's
/// worth larger than that, and comes in a few reads.
const READ_SIZE: usize = 64 << 10;

/// What a look at the channel found.
enum Received {
    Bytes,
    Nothing,
    Closed,
}

struct Stub {
    channel: OwnedFd,
    /// Received bytes; those before `start` are consumed.
    inbox: Vec<u8>,
    start: usize,
    /// Received descriptors not yet given to a frame, oldest first.
    fds: VecDeque<OwnedFd>,
    region: Option<WorkerEnd>,
    bell: Option<OwnedFd>,
    lobby_bell: Option<OwnedFd>,
    /// The slot taken last held `ON_CHANNEL`: the request with this id comes next on the channel.
    on_channel: Option<u32>,
    /// Where a request taken from a slot is copied (and then ignored).
    slot_frame: Vec<u8>,
    /// The one answer, encoded once.
    answer: Vec<u8>,
    /// `--websocket-echo`: it takes WebSocket requests.
    echo: bool,
    /// The request ids of the WebSockets it has accepted and not closed.
    websockets: HashSet<u32>,
    /// WebSockets whose client reads slowly (`HOLD`): their messages wait here, unanswered,
    /// until `GO`; past `WS_QUEUE_HOLD` of them the lobby is asked to stop reading the client
    /// (`WS_HOLD`), and told to go on (`WS_GO`) once they are answered.
    held: HashMap<u32, Held>,
}

/// Messages a held WebSocket keeps before it asks for `WS_HOLD` (the Python worker's bound,
/// crates/python/src/channel/mux.rs).
const WS_QUEUE_HOLD: usize = 16;

/// A held WebSocket's waiting `WS_MESSAGE` and `WS_CLOSED` payloads, and whether it sent
/// `WS_HOLD`.
#[derive(Default)]
struct Held {
    waiting: VecDeque<(Kind, Vec<u8>)>,
    ws_holding: bool,
}

/// Serves the channel until the lobby closes it; returns the exit code.
pub fn run(channel: OwnedFd, echo: bool) -> Result<i32, String> {
    maitred_sys::fd::set_blocking_cloexec(channel.as_fd()).map_err(|e| format!("channel: {e}"))?;
    let head = ResponseHead { status: 200, reason: b"OK", headers: vec![(b"Content-Type", b"text/plain")] };
    let answer = build_frame(Kind::ResponseHead, FLAG_END, |out| {
        head.encode_payload(out)?;
        out.extend_from_slice(BODY);
        Ok(())
    })
    .map_err(|e| format!("encoding the answer: {e}"))?;
    let mut stub = Stub {
        channel,
        inbox: Vec::new(),
        start: 0,
        fds: VecDeque::new(),
        region: None,
        bell: None,
        lobby_bell: None,
        on_channel: None,
        slot_frame: Vec::new(),
        answer,
        echo,
        websockets: HashSet::new(),
        held: HashMap::new(),
    };
    let ready = Ready { pid: std::process::id(), flags: if echo { READY_ASGI } else { 0 } };
    let ready = build_frame(Kind::Ready, 0, |out| {
        out.extend_from_slice(&ready.encode_payload());
        Ok(())
    })
    .map_err(|e| format!("encoding READY: {e}"))?;
    maitred_sys::fd::write_all_waiting(stub.channel.as_fd(), &ready).map_err(|e| format!("sending READY: {e}"))?;
    stub.serve()
}

impl Stub {
    /// The worker's loop (crates/python/src/channel/receive.rs, `next_request`, is the real
    /// one's): frames on the channel, then the slots, then sleep until the bell or the channel.
    fn serve(&mut self) -> Result<i32, String> {
        loop {
            while let Some((header, end)) = self.buffered_frame()? {
                match header.kind {
                    Kind::Request => match self.on_channel.take() {
                        Some(id) => {
                            // A body in a file: it goes unread, as the rest of the request.
                            if header.has_fd() {
                                self.fds.pop_front().ok_or("a REQUEST with the FD flag but no descriptor")?;
                            }
                            let handshake = self.handshake(&header, &self.inbox[self.start..end])?;
                            self.consume_through(end);
                            if !self.answer_request(id, handshake)? {
                                return Ok(0);
                            }
                            continue;
                        }
                        // Its place in the slots has not been taken yet.
                        None => break,
                    },
                    // Every answer is whole by the time a CANCEL can come: there is nothing to stop.
                    Kind::Cancel => {}
                    Kind::Hold | Kind::Go => {
                        let payload = &self.inbox[self.start + HEADER_LEN..end];
                        let id = maitred_wire::decode_cancel(payload)
                            .map_err(|e| format!("a {:?} frame: {e}", header.kind))?;
                        let kind = header.kind;
                        self.consume_through(end);
                        if !self.hold_or_go(kind, id)? {
                            return Ok(0);
                        }
                        continue;
                    }
                    Kind::WsMessage | Kind::WsClosed => {
                        let payload = self.inbox[self.start + HEADER_LEN..end].to_vec();
                        self.consume_through(end);
                        if !self.websocket_frame(header.kind, &payload)? {
                            return Ok(0);
                        }
                        continue;
                    }
                    Kind::Region => {
                        let file = self.setup_descriptor(&header, self.region.is_some())?;
                        let region = Region::open(file).map_err(|e| format!("the shared region: {e}"))?;
                        self.region = Some(WorkerEnd::new(region));
                    }
                    Kind::Bell => self.bell = Some(self.setup_descriptor(&header, self.bell.is_some())?),
                    Kind::LobbyBell => {
                        self.lobby_bell = Some(self.setup_descriptor(&header, self.lobby_bell.is_some())?)
                    }
                    other => return Err(format!("the lobby sent a {other:?} frame")),
                }
                self.consume_through(end);
            }
            if self.on_channel.is_some() {
                // The request whose place was taken is on the channel, whole or still coming.
                match self.wait_and_read()? {
                    Received::Closed => return Err("the lobby closed the channel before a request it had sent".into()),
                    Received::Bytes | Received::Nothing => continue,
                }
            }
            if let Some(id) = self.take_from_slot()? {
                let header = self.slot_frame.first_chunk::<HEADER_LEN>().map(FrameHeader::decode);
                let handshake = match header {
                    Some(Ok(header)) => self.handshake(&header, &self.slot_frame)?,
                    _ => None,
                };
                if !self.answer_request(id, handshake)? {
                    return Ok(0);
                }
                continue;
            }
            if self.on_channel.is_some() {
                continue;
            }
            // Nothing to do: say so, look once more, and sleep until the bell or the channel.
            if let Some(region) = self.ready_region() {
                region.prepare_to_sleep(Awaiting::Request);
                if region.has_request() {
                    region.sleep_cancelled();
                    continue;
                }
            }
            let received = self.wait_and_read()?;
            if let Some(region) = self.ready_region() {
                region.sleep_cancelled();
            }
            if let Received::Closed = received {
                if self.start == self.inbox.len() {
                    return Ok(0);
                }
                return Err("the lobby closed the channel inside a frame".into());
            }
        }
    }

    /// The region, once both bells have come too.
    fn ready_region(&self) -> Option<&WorkerEnd> {
        self.region.as_ref().filter(|_| self.bell.is_some() && self.lobby_bell.is_some())
    }

    /// The id of the request in the oldest queued slot, taken; when the slot holds the place of
    /// a request on the channel, sets `on_channel` instead.
    fn take_from_slot(&mut self) -> Result<Option<u32>, String> {
        if self.ready_region().is_none() {
            return Ok(None);
        }
        let region = self.region.as_ref().expect("the region, ready");
        self.slot_frame.clear();
        let Some(taken) = region.take_next(&mut self.slot_frame).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let header = self.slot_frame.first_chunk::<HEADER_LEN>().map(FrameHeader::decode).transpose();
        match header.map_err(|e| format!("the lobby queued a bad frame: {e}"))? {
            Some(header) if header.kind == Kind::Request => Ok(Some(taken.id)),
            Some(header) if header.kind == Kind::OnChannel => {
                self.on_channel = Some(taken.id);
                Ok(None)
            }
            _ => Err(format!("the lobby queued {} bytes that are no REQUEST or ON_CHANNEL", self.slot_frame.len())),
        }
    }

    /// A WebSocket request's handshake, when the stub echoes WebSockets and `frame` is one.
    fn handshake(&self, header: &FrameHeader, frame: &[u8]) -> Result<Option<Handshake>, String> {
        if !self.echo || header.flags & FLAG_WEBSOCKET == 0 {
            return Ok(None);
        }
        Handshake::of(frame, header.has_fd()).map(Some)
    }

    /// Answers request `id`: the one answer, or, for a WebSocket, its accept. False: the lobby
    /// closed the channel meanwhile.
    fn answer_request(&mut self, id: u32, handshake: Option<Handshake>) -> Result<bool, String> {
        let Some(handshake) = handshake else {
            let answer = std::mem::take(&mut self.answer);
            let answered = self.answer(id, &answer);
            self.answer = answer;
            return answered;
        };
        let (frame, open) = handshake.answer()?;
        if open {
            self.websockets.insert(id);
        }
        self.answer(id, &frame)
    }

    /// `HOLD` or `GO` for WebSocket `id`: its answers wait, or those that waited are sent.
    /// False: the lobby closed the channel meanwhile.
    fn hold_or_go(&mut self, kind: Kind, id: u32) -> Result<bool, String> {
        if !self.websockets.contains(&id) {
            return Ok(true);
        }
        if kind == Kind::Hold {
            self.held.entry(id).or_default();
            return Ok(true);
        }
        let Some(held) = self.held.remove(&id) else { return Ok(true) };
        for (kind, payload) in held.waiting {
            if !self.answer_websocket(kind, id, &payload)? {
                return Ok(false);
            }
        }
        if held.ws_holding && self.websockets.contains(&id) {
            return self.answer(id, &FrameHeader { kind: Kind::WsGo, flags: 0, len: 0 }.encode());
        }
        Ok(true)
    }

    /// Answers a `WS_MESSAGE` or `WS_CLOSED` of an open WebSocket, or keeps it while the
    /// WebSocket is held; one for a WebSocket it has closed is dropped. False: the lobby closed
    /// the channel meanwhile.
    fn websocket_frame(&mut self, kind: Kind, payload: &[u8]) -> Result<bool, String> {
        let (id, payload) = maitred_wire::split_request_id(payload).map_err(|e| format!("a {kind:?} frame: {e}"))?;
        if !self.websockets.contains(&id) {
            return Ok(true);
        }
        if let Some(held) = self.held.get_mut(&id) {
            held.waiting.push_back((kind, payload.to_vec()));
            if held.waiting.len() >= WS_QUEUE_HOLD && !held.ws_holding {
                held.ws_holding = true;
                return self.answer(id, &FrameHeader { kind: Kind::WsHold, flags: 0, len: 0 }.encode());
            }
            return Ok(true);
        }
        self.answer_websocket(kind, id, payload)
    }

    /// Echoes a message of WebSocket `id`, or answers its client's close.
    fn answer_websocket(&mut self, kind: Kind, id: u32, payload: &[u8]) -> Result<bool, String> {
        let (frame, last) = match kind {
            Kind::WsMessage => echo::answer_message(payload)?,
            _ => (echo::answer_closed(payload)?, true),
        };
        if last {
            self.websockets.remove(&id);
            self.held.remove(&id);
        }
        self.answer(id, &frame)
    }

    /// Writes `frame`, an answer to request `id`, into the ring, waiting for room as long as it
    /// takes, and rings the lobby's bell if it sleeps; a frame larger than the ring takes goes
    /// on the channel, announced by an `ON_CHANNEL` record. False: the lobby closed the channel
    /// meanwhile.
    fn answer(&mut self, id: u32, frame: &[u8]) -> Result<bool, String> {
        let most = self.region.as_ref().ok_or("a request before the shared region")?.layout().max_answer_frame();
        let on_channel = frame.len() > most;
        let announce = FrameHeader { kind: Kind::OnChannel, flags: 0, len: 0 }.encode();
        let record: &[u8] = if on_channel { &announce } else { frame };
        loop {
            let region = self.region.as_mut().ok_or("a request before the shared region")?;
            match region.write_answer(id, &[record]) {
                Ok(()) => break,
                Err(AnswerError::NoRoom) => {
                    if !self.wait_for_room(record.len())? {
                        return Ok(false);
                    }
                }
                Err(e) => return Err(format!("writing an answer: {e}")),
            }
        }
        if on_channel {
            maitred_sys::fd::write_all_waiting(self.channel.as_fd(), frame)
                .map_err(|e| format!("sending an answer frame on the channel: {e}"))?;
        }
        let region = self.ready_region().ok_or("a request before both bells")?;
        if region.wake_lobby() {
            let bell = self.lobby_bell.as_ref().expect("the lobby's bell, checked");
            maitred_sys::bell::ring(bell.as_fd()).map_err(|e| format!("ringing the lobby's bell: {e}"))?;
        }
        Ok(true)
    }

    /// Sleeps until the lobby has consumed answers (its ring of the bell). False: the lobby
    /// closed the channel instead.
    fn wait_for_room(&mut self, frame_len: usize) -> Result<bool, String> {
        let region = self.ready_region().ok_or("a request before both bells")?;
        region.prepare_to_sleep(Awaiting::Room);
        if region.room_for(frame_len).map_err(|e| e.to_string())? {
            region.sleep_cancelled();
            return Ok(true);
        }
        let received = self.wait_and_read()?;
        self.ready_region().expect("the region").sleep_cancelled();
        Ok(!matches!(received, Received::Closed))
    }

    /// Waits in poll(2) until the channel or the bell is readable, silences the bell, and reads
    /// what the channel holds.
    fn wait_and_read(&mut self) -> Result<Received, String> {
        let bell = self.bell.as_ref().map(|bell| bell.as_raw_fd());
        let (channel_ready, bell_ready) =
            match maitred_sys::fd::wait_readable_either(self.channel.as_raw_fd(), bell, true) {
                Ok(ready) => ready,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(Received::Nothing),
                Err(e) => return Err(format!("poll: {e}")),
            };
        if let (true, Some(bell)) = (bell_ready, &self.bell) {
            maitred_sys::bell::silence(bell.as_fd()).map_err(|e| format!("silencing the bell: {e}"))?;
        }
        if !channel_ready {
            return Ok(Received::Nothing);
        }
        if self.start > 0 {
            self.inbox.drain(..self.start);
            self.start = 0;
        }
        self.inbox.reserve(READ_SIZE);
        let fd = self.channel.as_raw_fd();
        match maitred_sys::fdpass::recv_into(fd, &mut self.inbox, &mut self.fds, libc::MSG_DONTWAIT) {
            Ok(0) => Ok(Received::Closed),
            Ok(_) => Ok(Received::Bytes),
            Err(RecvError::Os(e))
                if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) =>
            {
                Ok(Received::Nothing)
            }
            // The lobby gave up on this worker with bytes of it unread.
            Err(RecvError::Os(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(Received::Closed),
            Err(e) => Err(format!("reading the channel: {e}")),
        }
    }

    /// The first unconsumed frame, when all of it has arrived: its header and where it ends.
    fn buffered_frame(&self) -> Result<Option<(FrameHeader, usize)>, String> {
        let Some(bytes) = self.inbox[self.start..].first_chunk::<HEADER_LEN>() else { return Ok(None) };
        let header = FrameHeader::decode(bytes).map_err(|e| format!("the lobby sent a bad frame: {e}"))?;
        let end = self.start + HEADER_LEN + header.len as usize;
        Ok((end <= self.inbox.len()).then_some((header, end)))
    }

    fn consume_through(&mut self, end: usize) {
        self.start = end;
        if self.start == self.inbox.len() {
            self.inbox.clear();
            self.start = 0;
        }
    }

    /// The descriptor a `REGION`, `BELL` or `LOBBY_BELL` frame brings: it has one, no payload,
    /// and comes once.
    fn setup_descriptor(&mut self, header: &FrameHeader, again: bool) -> Result<OwnedFd, String> {
        let fd = match (header.has_fd(), header.len, again) {
            (true, 0, false) => self.fds.pop_front(),
            _ => None,
        };
        fd.ok_or_else(|| format!("a {:?} frame without a descriptor, with a payload, or a second time", header.kind))
    }
}
