//! The bell that wakes a worker sleeping with nothing to do: an eventfd the lobby rings and the
//! worker polls beside its channel (crates/shm's wake protocol says when it is rung).

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::event::EventfdFlags;

/// A new bell, close-on-exec and non-blocking: the lobby must never wait to ring it, and the
/// worker reads it only after poll(2) said it rang.
pub fn new() -> io::Result<OwnedFd> {
    Ok(rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?)
}

/// Rings the bell. Rings before it is heard add up in the counter and wake the sleeper once.
pub fn ring(bell: BorrowedFd<'_>) -> io::Result<()> {
    rustix::io::write(bell, &1u64.to_ne_bytes())?;
    Ok(())
}

/// Silences the bell after it rang, so that the next poll sleeps again; false when it had not
/// rung.
pub fn silence(bell: BorrowedFd<'_>) -> io::Result<bool> {
    let mut count = [0u8; 8];
    match rustix::io::read(bell, &mut count) {
        Ok(_) => Ok(true),
        Err(rustix::io::Errno::AGAIN) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    #[test]
    fn a_bell_rung_twice_is_heard_once() {
        let bell = super::new().unwrap();
        assert!(!super::silence(bell.as_fd()).unwrap());
        super::ring(bell.as_fd()).unwrap();
        super::ring(bell.as_fd()).unwrap();
        assert!(super::silence(bell.as_fd()).unwrap());
        assert!(!super::silence(bell.as_fd()).unwrap());
    }
}
