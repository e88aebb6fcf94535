//! Registering descriptors with tokio's reactor.

use std::io;
use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

/// Watches `fd` for readiness in the current tokio runtime.
pub fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: tokio requires the descriptor to stay open, and the same, for the AsyncFd's
    // life. An OwnedFd owns its descriptor, closes it only when dropped (with the AsyncFd, or
    // after `into_inner`), and always reports the same number.
    unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)
}
