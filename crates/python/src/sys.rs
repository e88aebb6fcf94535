//! The few system calls the worker's channel needs, as safe functions over raw descriptors.
//!
//! Nothing here touches Python: callers decide whether to detach from the interpreter around a
//! call that may block, and what to do with `EINTR` (they must run Python's signal handlers).
//!
//! Imports no module of this crate.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{OwnedFd, RawFd};

pub use maitred_sys::fdpass::{send, send_with_fd, RecvError};

/// One `recvmsg` appended to `buf`, with any descriptors that came along appended to `fds`
/// (see `maitred_sys::fdpass::recv_with_fds`). `Ok(0)` is end-of-file.
pub fn recv_into(
    fd: RawFd,
    buf: &mut Vec<u8>,
    fds: &mut VecDeque<OwnedFd>,
    flags: libc::c_int,
) -> Result<usize, RecvError> {
    let n = maitred_sys::fdpass::recv_with_fds(fd, buf.spare_capacity_mut(), fds, flags)?;
    // SAFETY: the kernel initialised the first n bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// Waits until `channel`, or `offers` when given, has input (or has been closed), and says
/// which of the two; with `wait` false, only looks. The worker waits in poll(2), not in
/// recvmsg(2): a thread blocked in recvmsg on a Unix socket sleeps on the socket's one wait
/// queue, where the peer reading what this side sent earlier wakes it too (room to write
/// again), for nothing: once per request, as the lobby reads each response while the worker
/// waits for the next request (docs/PERFORMANCE.md).
pub fn wait_readable(channel: RawFd, offers: Option<RawFd>, wait: bool) -> io::Result<(bool, bool)> {
    // poll(2) skips an entry whose descriptor is negative.
    let mut polled = [
        libc::pollfd { fd: channel, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: offers.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: `polled` is an array of two live pollfds.
    if unsafe { libc::poll(polled.as_mut_ptr(), 2, if wait { -1 } else { 0 }) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((polled[0].revents != 0, polled[1].revents != 0))
}

/// One `pread` into `buf` at `offset`; `Ok(0)` is end-of-file.
pub fn pread(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), offset as libc::off_t) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Makes `fd` blocking and close-on-exec: the channel waits in blocking calls (detached
/// from the interpreter), and programs the application runs must not inherit it.
pub fn prepare_channel(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor number has no memory effects.
    unsafe {
        let status = libc::fcntl(fd, libc::F_GETFL);
        if status < 0 || libc::fcntl(fd, libc::F_SETFL, status & !libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Fails with `EBADF` unless `fd` is an open descriptor.
pub fn check_open(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor number has no memory effects.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
