//! Hibernation for HTTP/2 (docs/HTTP2.md, "Idle connections"). The h2 crate holds about 20 KB
//! for a connection whatever it carries (its buffers: 16 KiB to write, 8 KiB to read, 4 KiB of
//! HPACK), and cannot give it back. So a connection without a stream for `HIBERNATE_AFTER`
//! drops its h2 connection and sleeps as an HTTP/1.1 one does (`asleep.rs`), keeping only what
//! a new h2 connection needs to go on where the old one stopped: the client's settings, what is
//! left of its connection window, and its last stream. When the client speaks, the task starts
//! a new h2 connection on the same socket and feeds it, before the client's bytes, the preface
//! and the client's settings again (`preamble`), a WINDOW_UPDATE that gives it the window the
//! client had left, and the ACK of its own settings, which the client has had in force all along.
//!
//! What makes that sound:
//! - **HPACK.** Before it sleeps, an idle connection sends SETTINGS with HEADER_TABLE_SIZE 0,
//!   and waits for the client's ACK (which the h2 crate, which did not send it, never sees): the
//!   client then drops its encoder's table, and the next header block it sends says so first,
//!   so the new decoder's empty table is the client's. (A connection starts with the usual 4,096
//!   bytes: busy connections compress as well as ever, and h2spec's table size updates are
//!   taken.) The other way, the new encoder starts empty; the client's decoder still holds the
//!   old one's entries, and as entries are added it drops the old ones first: the indexes the
//!   new encoder uses stay the same.
//! - **Settings.** The new connection sends its SETTINGS (the old one's), answers the replayed
//!   SETTINGS with an ACK the client never asked for, and sends the WINDOW_UPDATE that opens its
//!   own receive window once more: the client has all three already. They are kept off the wire
//!   (`Unsent`), and the new connection's settings are in force at once: a client's stream may
//!   send its body within the window it knows, before any round trip.
//! - **Windows.** The client's window for answers is what it granted minus what it was sent,
//!   followed frame by frame (`Ledger`); a connection whose window is below HTTP/2's initial
//!   65,535 stays awake, as a new connection cannot start below it. The client's window for
//!   bodies, which the new connection takes to be the full `CONNECTION_WINDOW`, must be at least
//!   half of it, so that the new connection's WINDOW_UPDATEs (sent once a third is used) come.
//! - **Quiet.** Only a connection that is between frames both ways, has nothing waiting to be
//!   written and has had its SETTINGS acknowledged sleeps.
//!
//! Frames for streams the old connection ended (a late WINDOW_UPDATE or RST_STREAM) would be
//! frames on idle streams to the new one, a connection error: `Ledger::hides` names them,
//! and `guard.rs` passes them by.

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::kept::{Http2Settings as Settings, Http2Sleep as Asleep, HTTP2_SETTINGS};
use super::{ACK, CONNECTION_WINDOW, DATA, HEADERS, PREFACE, PRIORITY, RST_STREAM, SETTINGS, WINDOW_UPDATE};

/// A connection's flow-control window when it starts (RFC 9113 6.9.2).
const INITIAL_WINDOW: i64 = 65_535;
const MAX_WINDOW: i64 = (1 << 31) - 1;
const SETTING_SIZE: usize = 6;
/// SETTINGS with HEADER_TABLE_SIZE (1) 0: the client's encoder is to keep no table.
pub(super) const NO_TABLE: [u8; 15] = [0, 0, 6, SETTINGS, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
/// The highest setting identifier kept (`Http2Settings`).
const KNOWN_SETTINGS: u16 = HTTP2_SETTINGS as u16;

impl Asleep {
    /// What the new h2 connection reads before the client's bytes: the preface, the client's
    /// settings, and the window it has left for answers past the initial one.
    pub(super) fn preamble(&self) -> BytesMut {
        let said = self.settings.said();
        let mut out = BytesMut::with_capacity(PREFACE.len() + 2 * 9 + said.clone().count() * SETTING_SIZE + 4);
        out.put_slice(PREFACE);
        put_header(&mut out, said.clone().count() * SETTING_SIZE, SETTINGS, 0, 0);
        for (id, value) in said {
            out.put_u16(id);
            out.put_u32(value);
        }
        let grown = i64::from(self.send_window) - INITIAL_WINDOW;
        if grown > 0 {
            put_header(&mut out, 4, WINDOW_UPDATE, 0, 0);
            out.put_u32(grown as u32);
        }
        put_header(&mut out, 0, SETTINGS, ACK, 0);
        out
    }

    pub(super) fn last_stream(&self) -> u32 {
        self.last_stream
    }
}

impl Settings {
    fn set(&mut self, id: u16, value: u32) {
        if (1..=KNOWN_SETTINGS).contains(&id) {
            self.values[usize::from(id - 1)] = value;
            self.said |= 1 << (id - 1);
        }
    }

    fn said(&self) -> impl Iterator<Item = (u16, u32)> + Clone + '_ {
        (1..=KNOWN_SETTINGS)
            .filter(|id| self.said & 1 << (id - 1) != 0)
            .map(|id| (id, self.values[usize::from(id - 1)]))
    }
}

fn put_header(out: &mut BytesMut, length: usize, kind: u8, flags: u8, stream: u32) {
    out.put_slice(&(length as u32).to_be_bytes()[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream);
}

/// What the frames going by say of a connection's state, for `Asleep` (kept by `guard.rs`).
pub(super) struct Ledger {
    settings: Settings,
    /// The kind of the frame whose payload is being read, if it is kept, and its entry so far.
    reading: Option<u8>,
    read: Entry,
    /// Whether the frame being written is the connection's WINDOW_UPDATE, and its increment.
    writing_window_update: bool,
    written: Entry,
    /// The client's window for answers, and the lobby's for bodies as the client knows it.
    send_window: i64,
    receive_window: i64,
    settings_sent: u32,
    settings_acked: u32,
    last_stream: u32,
    /// Streams up to this were the previous h2 connection's: their frames are passed by.
    stale_up_to: u32,
    table: Table,
}

/// Where the client's HPACK encoder table stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Table {
    /// The client may index fields in it, as it may from the start.
    Used,
    /// `NO_TABLE` was sent, and its ACK has not come.
    Dropping,
    /// The client acknowledged `NO_TABLE`: it keeps none.
    None,
}

impl Ledger {
    pub(super) fn new(woken: Option<&Asleep>) -> Ledger {
        Ledger {
            settings: Settings::default(),
            reading: None,
            read: Entry::default(),
            writing_window_update: false,
            written: Entry::default(),
            send_window: INITIAL_WINDOW,
            // The new connection's own WINDOW_UPDATE is not sent (`Unsent`): the client's view
            // of the window is the one it had.
            receive_window: woken.map_or(INITIAL_WINDOW, |asleep| i64::from(asleep.receive_window)),
            // A woken connection's SETTINGS are left out, and acknowledged by its preamble.
            settings_sent: u32::from(woken.is_some()),
            settings_acked: 0,
            last_stream: 0,
            stale_up_to: woken.map_or(0, Asleep::last_stream),
            // A client keeps its settings across the lobby's hibernation.
            table: if woken.is_some() { Table::None } else { Table::Used },
        }
    }

    /// A frame header read: whether its payload is wanted (`read_payload`).
    pub(super) fn read_header(&mut self, kind: u8, flags: u8, stream: u32, length: usize) -> bool {
        self.read = Entry::default();
        self.reading = None;
        match kind {
            SETTINGS if flags & ACK != 0 => self.settings_acked += 1,
            SETTINGS => self.reading = Some(SETTINGS),
            WINDOW_UPDATE if stream == 0 => self.reading = Some(WINDOW_UPDATE),
            HEADERS => self.last_stream = self.last_stream.max(stream),
            // DATA's length counts against the window, padding included (RFC 9113 6.9.1).
            DATA => self.receive_window -= length as i64,
            _ => {}
        }
        self.reading.is_some()
    }

    pub(super) fn read_payload(&mut self, mut payload: &[u8]) {
        let Some(kind) = self.reading else { return };
        let size = if kind == SETTINGS { SETTING_SIZE } else { 4 };
        while let Some([a, b, c, d, e, f]) = self.read.fill(&mut payload, size) {
            if kind == SETTINGS {
                self.settings.set(u16::from_be_bytes([a, b]), u32::from_be_bytes([c, d, e, f]));
            } else {
                self.send_window += i64::from(u32::from_be_bytes([a, b, c, d]) & 0x7fff_ffff);
            }
        }
    }

    /// A frame header written: whether its payload is wanted (`wrote_payload`).
    pub(super) fn wrote_header(&mut self, kind: u8, flags: u8, stream: u32, length: usize) -> bool {
        self.written = Entry::default();
        self.writing_window_update = kind == WINDOW_UPDATE && stream == 0;
        match kind {
            DATA => self.send_window -= length as i64,
            SETTINGS if flags & ACK == 0 => self.settings_sent += 1,
            _ => {}
        }
        self.writing_window_update
    }

    pub(super) fn wrote_payload(&mut self, mut payload: &[u8]) {
        if !self.writing_window_update {
            return;
        }
        while let Some([a, b, c, d, ..]) = self.written.fill(&mut payload, 4) {
            self.receive_window += i64::from(u32::from_be_bytes([a, b, c, d]) & 0x7fff_ffff);
        }
    }

    /// Whether the h2 crate must not see a frame the client sent: the ACK of `NO_TABLE`, which
    /// it did not send, or one for a stream of the connection before it slept, which the new one
    /// would take for a frame on an idle stream.
    pub(super) fn hides(&mut self, kind: u8, flags: u8, stream: u32) -> bool {
        // ACKs come in the order of the SETTINGS: `NO_TABLE` is sent when the crate's are acked.
        if kind == SETTINGS && flags & ACK != 0 && self.table == Table::Dropping {
            self.table = Table::None;
            return true;
        }
        stream != 0 && stream <= self.stale_up_to && matches!(kind, WINDOW_UPDATE | RST_STREAM | PRIORITY)
    }

    /// Whether frames are to be hidden now (`hides`).
    pub(super) fn hiding(&self) -> bool {
        self.stale_up_to > 0 || self.table == Table::Dropping
    }

    /// Whether `NO_TABLE` is to be sent now: the client may still keep a table, and every
    /// SETTINGS the h2 crate sent has been acknowledged. It is then taken as sent.
    pub(super) fn drop_table(&mut self) -> bool {
        let now = self.table == Table::Used && self.settings_sent == self.settings_acked;
        if now {
            self.table = Table::Dropping;
        }
        now
    }

    /// What the connection keeps to sleep, if it can: its SETTINGS acknowledged, and the
    /// windows within what a new connection can take up.
    pub(super) fn asleep(&self) -> Option<Asleep> {
        let windows = (INITIAL_WINDOW..=MAX_WINDOW).contains(&self.send_window)
            && self.receive_window >= i64::from(CONNECTION_WINDOW) / 2;
        (windows && self.table == Table::None && self.settings_sent == self.settings_acked).then(|| Asleep {
            settings: self.settings,
            send_window: self.send_window as u32,
            receive_window: self.receive_window.min(MAX_WINDOW) as u32,
            last_stream: self.last_stream.max(self.stale_up_to),
        })
    }
}

/// A SETTINGS entry or a window increment, as its bytes come, cut anywhere.
#[derive(Default)]
struct Entry {
    bytes: [u8; SETTING_SIZE],
    have: usize,
}

impl Entry {
    /// Takes bytes from `payload` towards an entry of `size`: the entry once whole.
    fn fill(&mut self, payload: &mut &[u8], size: usize) -> Option<[u8; SETTING_SIZE]> {
        let n = (size - self.have).min(payload.len());
        self.bytes[self.have..self.have + n].copy_from_slice(&payload[..n]);
        self.have += n;
        *payload = &payload[n..];
        if self.have < size {
            return None;
        }
        self.have = 0;
        Some(self.bytes)
    }
}

/// The three frames a woken connection's h2 connection writes first that the client must not
/// get: its SETTINGS, the ACK of the replayed ones, and the connection's WINDOW_UPDATE
/// (`guard.rs` leaves them out).
#[derive(Default)]
pub(super) struct Unsent {
    settings: bool,
    ack: bool,
    window_update: bool,
}

impl Unsent {
    pub(super) fn for_woken() -> Unsent {
        Unsent { settings: true, ack: true, window_update: true }
    }

    pub(super) fn any(&self) -> bool {
        self.settings || self.ack || self.window_update
    }

    fn awaited(&mut self, kind: u8, flags: u8, stream: u32) -> Option<&mut bool> {
        match kind {
            _ if stream != 0 => None,
            SETTINGS if flags & ACK != 0 => Some(&mut self.ack),
            SETTINGS => Some(&mut self.settings),
            WINDOW_UPDATE => Some(&mut self.window_update),
            _ => None,
        }
    }

    /// Whether the frame with this header is one of them.
    pub(super) fn is_unsent(&mut self, kind: u8, flags: u8, stream: u32) -> bool {
        self.awaited(kind, flags, stream).is_some_and(|awaited| *awaited)
    }

    /// One of them was left out: it is no longer awaited.
    pub(super) fn left_out(&mut self, kind: u8, flags: u8) {
        if let Some(awaited) = self.awaited(kind, flags, 0) {
            *awaited = false;
        }
    }
}

/// The connection's stream, lent to the h2 crate: the task takes it back to hibernate (the
/// crate gives no way to).
pub(super) struct Lent<T>(Rc<RefCell<Option<T>>>);

impl<T> Lent<T> {
    pub(super) fn new(io: T) -> (Lent<T>, Rc<RefCell<Option<T>>>) {
        let slot = Rc::new(RefCell::new(Some(io)));
        (Lent(slot.clone()), slot)
    }
}

fn taken() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the connection went to sleep")
}

impl<T: AsyncRead + Unpin> AsyncRead for Lent<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.0.borrow_mut().as_mut() {
            Some(io) => Pin::new(io).poll_read(cx, buf),
            None => Poll::Ready(Err(taken())),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Lent<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        match self.0.borrow_mut().as_mut() {
            Some(io) => Pin::new(io).poll_write(cx, data),
            None => Poll::Ready(Err(taken())),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.0.borrow_mut().as_mut() {
            Some(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            None => Poll::Ready(Err(taken())),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.0.borrow().as_ref().is_some_and(AsyncWrite::is_write_vectored)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.0.borrow_mut().as_mut() {
            Some(io) => Pin::new(io).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.0.borrow_mut().as_mut() {
            Some(io) => Pin::new(io).poll_shutdown(cx),
            None => Poll::Ready(Ok(())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ACK;
    use super::*;

    /// A ledger after a client's opening: its SETTINGS (two known entries and an unknown one),
    /// and a WINDOW_UPDATE of the connection, each payload given in pieces of `size` bytes.
    fn opened(size: usize, increment: u32) -> Ledger {
        let mut ledger = Ledger::new(None);
        let mut settings = Vec::new();
        for (id, value) in [(4u16, 1_000_000u32), (0x99, 7), (5, 32_768), (4, 2_000_000)] {
            settings.extend_from_slice(&id.to_be_bytes());
            settings.extend_from_slice(&value.to_be_bytes());
        }
        assert!(ledger.read_header(SETTINGS, 0, 0, settings.len()));
        settings.chunks(size).for_each(|piece| ledger.read_payload(piece));
        assert!(ledger.read_header(WINDOW_UPDATE, 0, 0, 4));
        increment.to_be_bytes().chunks(size).for_each(|piece| ledger.read_payload(piece));
        assert!(!ledger.read_header(HEADERS, 0x5, 1, 20));
        // The lobby's SETTINGS, acknowledged, and its window for bodies; an answer of 100 bytes.
        ledger.wrote_header(SETTINGS, 0, 0, 6);
        assert!(ledger.wrote_header(WINDOW_UPDATE, 0, 0, 4));
        ledger.wrote_payload(&(CONNECTION_WINDOW - 65_535).to_be_bytes());
        ledger.read_header(SETTINGS, ACK, 0, 0);
        ledger.wrote_header(DATA, 0x1, 1, 100);
        ledger
    }

    #[test]
    fn a_clients_settings_and_window_are_kept_whole_from_payloads_cut_anywhere() {
        for size in 1..=7 {
            let mut ledger = opened(size, 1 << 20);
            // The client's table first: NO_TABLE goes out, its ACK is hidden from the crate.
            assert!(ledger.asleep().is_none());
            assert!(ledger.drop_table());
            assert!(ledger.hiding());
            assert!(ledger.hides(SETTINGS, ACK, 0));
            let asleep = ledger.asleep().expect("quiet, acknowledged, windows open");
            assert_eq!(asleep.settings.said().collect::<Vec<_>>(), [(4, 2_000_000), (5, 32_768)], "pieces of {size}");
            assert_eq!(asleep.send_window, 65_535 + (1 << 20) - 100);
            assert_eq!(asleep.last_stream(), 1);
        }
    }

    #[test]
    fn the_preamble_replays_the_settings_the_window_and_acknowledges_the_lobbys() {
        let mut ledger = opened(6, 1 << 20);
        ledger.drop_table();
        ledger.hides(SETTINGS, ACK, 0);
        let preamble = ledger.asleep().unwrap().preamble();
        let (preface, frames) = preamble.split_at(PREFACE.len());
        assert_eq!(preface, PREFACE);
        let settings = [0, 0, 12, SETTINGS, 0, 0, 0, 0, 0, 0, 4, 0, 0x1e, 0x84, 0x80, 0, 5, 0, 0, 0x80, 0];
        let window = [0, 0, 4, WINDOW_UPDATE, 0, 0, 0, 0, 0];
        let grown = ((1u32 << 20) - 100).to_be_bytes();
        let ack = [0, 0, 0, SETTINGS, ACK, 0, 0, 0, 0];
        assert_eq!(frames, [&settings[..], &window, &grown, &ack].concat());
        // Woken, the ledger knows the table is gone, and the crate's SETTINGS left out.
        let woken = Ledger::new(Some(&ledger.asleep().unwrap()));
        assert!(woken.table == Table::None && woken.settings_sent == 1 && woken.hiding());
    }

    #[test]
    fn a_connection_whose_client_left_its_window_below_the_initial_one_stays_awake() {
        let mut ledger = opened(6, 0);
        ledger.drop_table();
        ledger.hides(SETTINGS, ACK, 0);
        assert!(ledger.asleep().is_none(), "65,435 bytes of window: a new connection would assume 65,535");
        // Bodies: the client's view of the lobby's window must leave room for its updates.
        let mut ledger = opened(6, 1 << 20);
        ledger.drop_table();
        ledger.hides(SETTINGS, ACK, 0);
        ledger.read_header(DATA, 0, 3, 600_000);
        assert!(ledger.asleep().is_none());
        ledger.wrote_header(WINDOW_UPDATE, 0, 0, 4);
        ledger.wrote_payload(&600_000u32.to_be_bytes());
        assert!(ledger.asleep().is_some());
    }

    #[test]
    fn stale_frames_are_those_of_the_old_connections_streams() {
        let mut ledger = opened(6, 1 << 20);
        ledger.drop_table();
        ledger.hides(SETTINGS, ACK, 0);
        let woken = &mut Ledger::new(Some(&ledger.asleep().unwrap()));
        assert!(woken.hides(WINDOW_UPDATE, 0, 1) && woken.hides(RST_STREAM, 0, 1) && woken.hides(PRIORITY, 0, 1));
        assert!(!woken.hides(WINDOW_UPDATE, 0, 0) && !woken.hides(HEADERS, 0x5, 3) && !woken.hides(RST_STREAM, 0, 3));
    }

    #[test]
    fn a_woken_connection_leaves_out_its_first_settings_ack_and_window_update_once_each() {
        let mut unsent = Unsent::for_woken();
        for (kind, flags) in [(SETTINGS, 0), (SETTINGS, ACK), (WINDOW_UPDATE, 0)] {
            assert!(!unsent.is_unsent(kind, flags, 1));
            assert!(unsent.is_unsent(kind, flags, 0));
            unsent.left_out(kind, flags);
            assert!(!unsent.is_unsent(kind, flags, 0));
        }
        assert!(!unsent.any());
    }
}
