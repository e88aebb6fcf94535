//! Hibernation: a keep-alive connection that stays idle gives up its task and its place in the
//! event loop, and waits as a descriptor and a few words of state until the client speaks.
//!
//! A connection task, with its futures and its registration in tokio, costs about 3 KB; a
//! hibernating connection costs about a tenth of that (M1). Moving in and out costs four
//! system calls (the two epoll registrations), so only a connection idle for `HIBERNATE_AFTER`
//! moves: a busy keep-alive connection (T1) never does.
//!
//! The sleepers are watched by one epoll instance of their own, level-triggered, whose
//! descriptor is registered with tokio like any socket. Here the sleepers and their set; the
//! watcher is `wake.rs`. Its tick also closes
//! sleepers whose `--keep-alive` (or, before a first request, `--header-timeout`) has passed,
//! and, once a shutdown has begun, those that have been answered: after waking the ones whose
//! client has spoken, so that a request sent before the shutdown is answered.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use rustls::ServerConnection;
use tokio::io::unix::AsyncFd;
use tokio::sync::OwnedSemaphorePermit;

use super::h2::kept::Http2Sleep;
use super::peer::{Peer, ProxyStage, Site, StreamKind};
use crate::log::{debug, warning_limited};

/// How often the watcher looks for sleepers whose time is up. It is also the lobby's
/// heartbeat: tokio interrupts its event loop (a write to an eventfd) whenever a new timer is
/// due sooner than every timer it has, and with this one always due soon, the deadlines set
/// for each request (keep-alive, --timeout) never are (docs/PERFORMANCE.md).
pub(super) const TICK: Duration = Duration::from_millis(250);
/// Sleepers polled at once.
pub(super) const EVENTS_PER_WAIT: usize = 64;
/// After many connections went to sleep, freed task memory is handed back to the system: a
/// burst of connections that then idle would otherwise keep the burst's peak. That is done
/// once this many went to sleep, or once a smaller wave of at least `TRIM_SETTLED` has
/// settled (none went to sleep in the last tick).
const TRIM_AFTER: usize = 1024;
const TRIM_SETTLED: usize = 64;

/// A hibernating connection: everything its task would need to start again.
pub struct Sleeper {
    pub socket: OwnedFd,
    pub kind: StreamKind,
    pub peer: Peer,
    pub site: Rc<Site>,
    pub permit: OwnedSemaphorePermit,
    pub answered: u64,
    /// When it closes if the client says nothing.
    pub deadline: Instant,
    /// A TLS connection's session: its keys and sequence numbers, its buffers empty.
    pub tls: Option<Box<ServerConnection>>,
    /// An HTTP/2 connection's state, for a new h2 connection to go on from (`h2/sleep.rs`).
    pub http2: Option<Http2Sleep>,
}

impl Sleeper {
    /// Whether a new maitred can take this connection at a binary upgrade. A TLS connection
    /// cannot (its keys are in this lobby), nor one under `--proxy-protocol` (the client its
    /// header named does not travel with the descriptor, and the new lobby would take the next
    /// request's first bytes for a header): such a connection stays here, is answered here with
    /// `Connection: close`, and closes at its `--keep-alive` or when this lobby's
    /// `--graceful-timeout` ends (docs/SIGNALS.md).
    ///
    /// Nor an HTTP/2 connection, whose state is this lobby's too: at a shutdown or an upgrade it
    /// is woken to say GOAWAY (`take_http2_ending`).
    pub fn can_move(&self) -> bool {
        self.http2.is_none() && can_move(self.tls.is_some(), &self.peer)
    }
}

/// A new maitred taking this one's idle connections during a binary upgrade
/// (`process/upgrade/handover.rs`): it is given each connection that `Sleeper::can_move`.
pub(crate) trait TakesIdleConnections {
    fn hand_over(&self, sleeper: Sleeper);
}

/// `Sleeper::can_move`, for a connection still in its task.
pub fn can_move(encrypted: bool, peer: &Peer) -> bool {
    !encrypted && peer.proxy == ProxyStage::Off
}

pub struct Hibernation {
    pub(super) epoll: AsyncFd<OwnedFd>,
    sleepers: RefCell<Slots<Sleeper>>,
    /// Connections put to sleep since memory was last handed back, and as of the last tick.
    put_since_trim: Cell<usize>,
    put_at_last_tick: Cell<usize>,
}

impl Hibernation {
    pub fn new() -> io::Result<Hibernation> {
        let epoll = maitred_sys::reactor::register(maitred_sys::sleepers::create()?)?;
        Ok(Hibernation {
            epoll,
            sleepers: RefCell::new(Slots::default()),
            put_since_trim: Cell::new(0),
            put_at_last_tick: Cell::new(0),
        })
    }

    /// Puts a connection to sleep. If the kernel will not watch it, it is closed.
    pub fn put(&self, sleeper: Sleeper) {
        let mut sleepers = self.sleepers.borrow_mut();
        let key = sleepers.insert(sleeper);
        let socket = sleepers.get(key).map(|sleeper| sleeper.socket.as_fd()).expect("just inserted");
        if let Err(e) = maitred_sys::sleepers::watch(self.epoll.get_ref().as_fd(), socket, key as u64) {
            debug!("closing an idle connection that cannot hibernate: {e}");
            sleepers.remove(key);
            return;
        }
        drop(sleepers);
        self.put_since_trim.set(self.put_since_trim.get() + 1);
    }

    pub fn sleeping(&self) -> usize {
        self.sleepers.borrow().len()
    }

    /// Takes the sleepers the kernel reports readable (a request, or the client closing), at
    /// most `EVENTS_PER_WAIT`; says how many keys the kernel reported.
    ///
    /// Every key names a sleeper: no sleeper leaves the set without its registration being
    /// removed first (`unwatch`). A close does not remove it when the socket is still open
    /// elsewhere (a child that inherited it, a debugger): a registration left so stayed
    /// readable under a key that named nobody, and 64 of them kept the watcher's loop from
    /// ever yielding (issue 46). A key that names nobody is a bug, said once a minute.
    pub(super) fn take_woken(&self, woken: &mut Vec<Sleeper>) -> io::Result<usize> {
        let mut keys = Vec::with_capacity(EVENTS_PER_WAIT);
        let n = maitred_sys::sleepers::ready(self.epoll.get_ref().as_fd(), &mut keys, EVENTS_PER_WAIT)?;
        let mut sleepers = self.sleepers.borrow_mut();
        for key in keys {
            let Some(sleeper) = sleepers.remove(key as usize) else {
                warning_limited!(
                    "a hibernating connection's key {key} names no connection: its registration outlived it"
                );
                continue;
            };
            self.unwatch(&sleeper);
            woken.push(sleeper);
        }
        Ok(n)
    }

    /// Takes every sleeper a new maitred can take (SIGUSR2) out of the watch. The descriptor is
    /// removed from the epoll set explicitly: the new lobby's copy keeps the socket open, and
    /// with it the registration closing ours would otherwise have removed.
    pub(super) fn take_movable(&self) -> Vec<Sleeper> {
        let taken = self.sleepers.borrow_mut().take_where(Sleeper::can_move);
        for sleeper in &taken {
            self.unwatch(sleeper);
        }
        taken
    }

    fn unwatch(&self, sleeper: &Sleeper) {
        let _ = maitred_sys::sleepers::unwatch(self.epoll.get_ref().as_fd(), &sleeper.socket);
    }

    /// Takes the HTTP/2 sleepers whose time is up, or all of them once the lobby stops (a shutdown
    /// or an upgrade): woken, each says GOAWAY before it closes, as one awake would.
    pub(super) fn take_http2_ending(&self, now: Instant, stopping: bool) -> Vec<Sleeper> {
        let taken = self
            .sleepers
            .borrow_mut()
            .take_where(|sleeper| sleeper.http2.is_some() && (stopping || sleeper.deadline <= now));
        for sleeper in &taken {
            self.unwatch(sleeper);
        }
        taken
    }

    /// Closes the sleepers whose deadline has passed, and, once the lobby is closing (a
    /// shutdown, not an upgrade), every sleeper that has been answered (one that has not yet
    /// sent its first request may still send it).
    pub(super) fn close_expired(&self, now: Instant, closing: bool) -> usize {
        let expired = self
            .sleepers
            .borrow_mut()
            .take_where(|sleeper| sleeper.deadline <= now || (closing && sleeper.answered > 0));
        // Unwatched before they close: a close takes a socket out of the epoll set only when no
        // other descriptor of it is open anywhere (`take_woken`).
        for sleeper in &expired {
            self.unwatch(sleeper);
        }
        expired.len()
    }

    /// Hands freed memory back to the system after many connections went to sleep.
    pub(super) fn trim_memory(&self) {
        let put = self.put_since_trim.get();
        let settled = put == self.put_at_last_tick.get();
        self.put_at_last_tick.set(put);
        if put < TRIM_AFTER && !(settled && put >= TRIM_SETTLED) {
            return;
        }
        self.put_since_trim.set(0);
        self.put_at_last_tick.set(0);
        maitred_sys::limits::trim_memory();
    }
}

/// A vector of optional entries with a free list: stable keys for the epoll data word.
struct Slots<T> {
    entries: Vec<Option<T>>,
    free: Vec<usize>,
    len: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots { entries: Vec::new(), free: Vec::new(), len: 0 }
    }
}

impl<T> Slots<T> {
    fn insert(&mut self, value: T) -> usize {
        self.len += 1;
        match self.free.pop() {
            Some(key) => {
                self.entries[key] = Some(value);
                key
            }
            None => {
                self.entries.push(Some(value));
                self.entries.len() - 1
            }
        }
    }

    fn get(&self, key: usize) -> Option<&T> {
        self.entries.get(key)?.as_ref()
    }

    fn remove(&mut self, key: usize) -> Option<T> {
        let value = self.entries.get_mut(key)?.take()?;
        self.free.push(key);
        self.len -= 1;
        Some(value)
    }

    /// Takes out the entries `chosen` picks; their keys become free.
    fn take_where(&mut self, mut chosen: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut taken = Vec::new();
        for (key, entry) in self.entries.iter_mut().enumerate() {
            if entry.as_ref().is_some_and(&mut chosen) {
                taken.extend(entry.take());
                self.free.push(key);
            }
        }
        self.len -= taken.len();
        taken
    }

    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    use tokio::sync::Semaphore;

    use super::*;

    fn sleeper(socket: UnixStream, deadline: Instant) -> Sleeper {
        Sleeper {
            socket: socket.into(),
            kind: StreamKind::Unix,
            peer: Peer::new(None, false),
            site: Rc::new(Site { server_name: "t".into(), server_port: 0, tls: false }),
            permit: Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap(),
            answered: 1,
            deadline,
            tls: None,
            http2: None,
        }
    }

    /// Issue 46: 100 sleepers whose sockets are also open elsewhere expire, then their clients
    /// speak. Closed without being unwatched, they stayed in the set under keys that named
    /// nobody, and the watcher met a full batch of them at every look.
    #[test]
    fn an_expired_sleeper_leaves_the_set_even_when_its_socket_is_open_elsewhere() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let hibernation = Hibernation::new().unwrap();
            let now = Instant::now();
            let mut clients = Vec::new();
            let mut elsewhere = Vec::new();
            for _ in 0..100 {
                let (ours, client) = UnixStream::pair().unwrap();
                elsewhere.push(ours.try_clone().unwrap());
                hibernation.put(sleeper(ours, now));
                clients.push(client);
            }
            assert_eq!(hibernation.sleeping(), 100);
            assert_eq!(hibernation.close_expired(now, false), 100);
            for client in &mut clients {
                client.write_all(b"GET").unwrap();
            }
            let mut woken = Vec::new();
            assert_eq!(hibernation.take_woken(&mut woken).unwrap(), 0);
            assert!(woken.is_empty());
        });
    }

    #[test]
    fn a_sleeper_whose_client_speaks_is_taken_once() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let hibernation = Hibernation::new().unwrap();
            let (ours, mut client) = UnixStream::pair().unwrap();
            let _elsewhere = ours.try_clone().unwrap();
            hibernation.put(sleeper(ours, Instant::now() + Duration::from_secs(60)));
            client.write_all(b"GET").unwrap();
            let mut woken = Vec::new();
            assert_eq!(hibernation.take_woken(&mut woken).unwrap(), 1);
            assert_eq!(woken.len(), 1);
            // Taken out of the set: readable still, it is not reported again.
            assert_eq!(hibernation.take_woken(&mut woken).unwrap(), 0);
            assert_eq!(hibernation.sleeping(), 0);
        });
    }

    #[test]
    fn slots_reuse_keys_and_count() {
        let mut slots = Slots::default();
        let a = slots.insert("a");
        let b = slots.insert("b");
        assert_eq!(slots.remove(a), Some("a"));
        assert_eq!(slots.remove(a), None);
        let c = slots.insert("c");
        assert_eq!(c, a);
        assert_eq!(slots.len(), 2);
        assert_eq!(slots.take_where(|v| *v == "b"), vec!["b"]);
        assert_eq!(slots.remove(b), None);
        assert_eq!(slots.len(), 1);
        assert_eq!(slots.remove(99), None);
        let e = slots.insert("e");
        assert_eq!(slots.take_where(|v| *v == "c"), vec!["c"]);
        assert_eq!(slots.len(), 1);
        assert_eq!(slots.insert("d"), a);
        assert_eq!(slots.take_where(|_| true), vec!["d", "e"]);
        assert_eq!(slots.remove(e), None);
        assert_eq!(slots.len(), 0);
    }
}
