//! An epoll set of the lobby's own, for connections that wait outside tokio (hibernation).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::event::epoll;

/// Makes a close-on-exec epoll instance.
pub fn create() -> io::Result<OwnedFd> {
    epoll::create(epoll::CreateFlags::CLOEXEC).map_err(io::Error::from)
}

/// Watches `socket` for input or its peer's close, level-triggered, under `key`.
pub fn watch(set: BorrowedFd<'_>, socket: BorrowedFd<'_>, key: u64) -> io::Result<()> {
    let flags = epoll::EventFlags::IN | epoll::EventFlags::RDHUP;
    epoll::add(set, socket, epoll::EventData::new_u64(key), flags).map_err(io::Error::from)
}

/// Stops watching `socket`.
pub fn unwatch(set: BorrowedFd<'_>, socket: impl AsFd) -> io::Result<()> {
    epoll::delete(set, socket).map_err(io::Error::from)
}

/// The keys of the sockets ready now, at most `keys`' spare capacity of them; never waits.
pub fn ready(set: BorrowedFd<'_>, keys: &mut Vec<u64>, max: usize) -> io::Result<usize> {
    let mut events = Vec::with_capacity(max);
    let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
    epoll::wait(set, rustix::buffer::spare_capacity(&mut events), Some(&zero)).map_err(io::Error::from)?;
    keys.extend(events.iter().map(|event| event.data.u64()));
    Ok(events.len())
}
