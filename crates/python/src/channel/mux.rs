//! An event loop's one channel carries any number of requests at once (docs/PROTOCOL.md,
//! section 4): each request taken from a slot becomes an [`Exchange`], which holds what the
//! channel holds for the request in progress (its response, its body, its line). The event
//! loop enters an exchange into the channel for each call about it, and leaves it after, so the
//! rest of the channel's code serves one request at a time as it always did. What the lobby
//! sends about a request (`CANCEL`, `HOLD`, `GO`, `WS_MESSAGE`, `WS_CLOSED`) names it, and is
//! kept here, in the request's [`News`], until the request's task asks.
//!
//! Imports the type from `mod.rs`, `errors` and `receive` (the buffered frames, the read) of
//! the channel's files; `body` and `response` of this crate.

use std::collections::{HashMap, VecDeque};
use std::mem;

use maitred_wire::{decode_cancel, split_request_id, FrameHeader, Kind, HEADER_LEN};
use pyo3::prelude::*;

use super::errors::{channel_error, ChannelError};
use super::receive::Received;
use super::WorkerChannel;
use crate::body::RequestBody;
use crate::response::Response;

/// Messages a WebSocket's application has not received yet, past which the worker asks the
/// lobby to stop reading its client (`WS_HOLD`), and under which it asks it to go on (`WS_GO`).
/// Each message is at most --ws-max-size bytes, so a WebSocket holds at most this many of them.
pub(super) const WS_QUEUE_HOLD: usize = 16;
const WS_QUEUE_GO: usize = WS_QUEUE_HOLD / 2;

/// What the lobby has said about one request in progress, not yet heard by its task.
#[derive(Default)]
pub(super) struct News {
    /// Its client has gone (`CANCEL`), or it ran past --timeout.
    pub(super) cancelled: bool,
    /// Its answer waits for a slow client: its `send` waits for `GO` (`HOLD`).
    pub(super) held: bool,
    /// A WebSocket's `WS_MESSAGE` and `WS_CLOSED` payloads (after the id), oldest first.
    pub(super) ws: VecDeque<(Kind, Vec<u8>)>,
    /// `WS_HOLD` was sent for it, and no `WS_GO` since.
    pub(super) ws_holding: bool,
}

/// The requests of an evented channel in progress, by id.
pub(super) type Exchanges = HashMap<u32, News>;

/// One request in progress on an evented channel: what the channel holds for it while it is
/// entered (`WorkerChannel.enter`), kept here while it is not.
#[pyclass(module = "maitred._native")]
pub struct Exchange {
    pub(super) state: RequestState,
    /// Its fields are in the channel now, and `state` holds the channel's idle ones.
    pub(super) entered: bool,
}

#[pymethods]
impl Exchange {
    /// The lobby's id of the request: what its frames name.
    #[getter]
    fn id(&self) -> PyResult<u32> {
        if self.entered {
            return Err(pyo3::exceptions::PyRuntimeError::new_err("the id of an exchange entered is the channel's"));
        }
        Ok(self.state.request_id)
    }
}

/// The fields of `WorkerChannel` that belong to the request in progress.
pub(super) struct RequestState {
    pub(super) request_id: u32,
    pub(super) websocket: bool,
    pub(super) response: Response,
    pub(super) body: Option<Py<RequestBody>>,
    pub(super) method: Vec<u8>,
    pub(super) target: Vec<u8>,
    pub(super) http_version: u8,
}

impl RequestState {
    /// Nothing in progress: the state a channel has between requests.
    pub(super) fn idle() -> RequestState {
        RequestState {
            request_id: 0,
            websocket: false,
            response: Response::new(),
            body: None,
            method: Vec::new(),
            target: Vec::new(),
            http_version: 1,
        }
    }
}

impl WorkerChannel {
    /// Swaps the channel's request fields with `state`: entering an exchange, or leaving it.
    pub(super) fn swap_request(&mut self, state: &mut RequestState) {
        mem::swap(&mut self.request_id, &mut state.request_id);
        mem::swap(&mut self.websocket, &mut state.websocket);
        mem::swap(&mut self.response, &mut state.response);
        mem::swap(&mut self.body, &mut state.body);
        mem::swap(&mut self.method, &mut state.method);
        mem::swap(&mut self.target, &mut state.target);
        mem::swap(&mut self.http_version, &mut state.http_version);
    }

    /// The request just taken leaves the channel as a new exchange, and gets its news.
    pub(super) fn new_exchange(&mut self) -> Exchange {
        let mut state = RequestState::idle();
        self.swap_request(&mut state);
        self.exchanges.insert(state.request_id, News::default());
        Exchange { state, entered: false }
    }

    /// The request has ended: its news goes, and its body is released. Frames that still name
    /// it are dropped as they come.
    pub(super) fn end_exchange(&mut self, py: Python<'_>, exchange: &mut Exchange) {
        self.exchanges.remove(&exchange.state.request_id);
        if let Some(body) = exchange.state.body.take() {
            if let Ok(mut body) = body.bind(py).try_borrow_mut() {
                body.release();
            }
        }
    }

    /// The news of the request entered, if it is still in progress.
    pub(super) fn news(&mut self) -> Option<&mut News> {
        self.exchanges.get_mut(&self.request_id)
    }

    /// Sorts what the channel holds (`sort_news`); returns the ids that got news since the last
    /// call, and whether the lobby has closed the channel.
    pub(super) fn route_news(&mut self, py: Python<'_>) -> PyResult<(Vec<u32>, bool)> {
        self.sort_news(py)?;
        Ok((mem::take(&mut self.told), self.closed))
    }

    /// Reads what the channel holds, without waiting, and sorts the frames about requests into
    /// their news (the ids told are kept for `route`). A `REQUEST` on the channel stops the
    /// sorting: it waits for its place in the slots.
    pub(super) fn sort_news(&mut self, py: Python<'_>) -> PyResult<()> {
        if !self.closed {
            if let Received::Closed = self.read_available()? {
                self.closed = true;
            }
        }
        while let Some((header, end)) = self.buffered_frame()? {
            if header.kind == Kind::Request {
                break;
            }
            self.route_frame(py, &header, end)?;
            self.consume_through(end);
        }
        Ok(())
    }

    /// One frame of the lobby's, not a `REQUEST`, whole in the inbox before `end`: the request
    /// it names, when that request is in progress and has news.
    pub(super) fn route_frame(&mut self, py: Python<'_>, header: &FrameHeader, end: usize) -> PyResult<Option<u32>> {
        if matches!(header.kind, Kind::Region | Kind::Bell | Kind::LobbyBell) {
            self.take_setup(header)?;
            return Ok(None);
        }
        let payload = &self.inbox[end - header.len as usize..end];
        let (id, rest) = match header.kind {
            Kind::Cancel | Kind::Hold | Kind::Go => {
                if header.flags != 0 {
                    return Err(ChannelError::new_err(format!(
                        "the lobby sent a {:?} frame with flags {}",
                        header.kind, header.flags
                    )));
                }
                let id = decode_cancel(payload)
                    .map_err(|error| channel_error(&format!("the lobby sent a bad {:?} frame", header.kind), error))?;
                (id, &[][..])
            }
            Kind::WsMessage | Kind::WsClosed => {
                let (id, rest) = split_request_id(payload)
                    .map_err(|error| channel_error(&format!("the lobby sent a bad {:?} frame", header.kind), error))?;
                (id, rest)
            }
            other => {
                return Err(ChannelError::new_err(format!(
                    "the lobby sent a {other:?} frame; an event loop's channel receives REQUEST, CANCEL, HOLD, GO, \
                     WS_MESSAGE, WS_CLOSED and its setup"
                )))
            }
        };
        // A frame for a request that has ended crossed its end: nothing is left to tell.
        let rest = rest.to_vec();
        let Some(news) = self.exchanges.get_mut(&id) else { return Ok(None) };
        let mut hold = false;
        match header.kind {
            Kind::Cancel => news.cancelled = true,
            Kind::Hold => news.held = true,
            Kind::Go => news.held = false,
            kind => {
                news.ws.push_back((kind, rest));
                hold = news.ws.len() >= WS_QUEUE_HOLD && !news.ws_holding;
                news.ws_holding |= hold;
            }
        }
        if hold {
            self.send_for(py, id, Kind::WsHold)?;
        }
        if !self.told.contains(&id) {
            self.told.push(id);
        }
        Ok(Some(id))
    }

    /// A WebSocket's message was received by its application: past the low mark again, the
    /// lobby may read its client again (`WS_GO`).
    pub(super) fn ws_received(&mut self, py: Python<'_>) -> PyResult<()> {
        let id = self.request_id;
        let go = match self.news() {
            Some(news) if news.ws_holding && news.ws.len() <= WS_QUEUE_GO => {
                news.ws_holding = false;
                true
            }
            _ => false,
        };
        if go {
            self.send_for(py, id, Kind::WsGo)?;
        }
        Ok(())
    }

    /// An empty answer frame of `kind` for request `id`, whichever request is entered.
    fn send_for(&mut self, py: Python<'_>, id: u32, kind: Kind) -> PyResult<()> {
        let entered = mem::replace(&mut self.request_id, id);
        let frame = FrameHeader { kind, flags: 0, len: 0 }.encode();
        let sent = self.send_answer(py, &[&frame[..HEADER_LEN]], super::ring::Aside::No);
        self.request_id = entered;
        sent
    }
}
