//! The few system calls the worker's channel needs, as safe functions over raw descriptors.
//!
//! Nothing here touches Python: callers decide whether to detach from the interpreter around a
//! call that may block, and what to do with `EINTR` (they must run Python's signal handlers).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::mem;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::ptr;

/// Room for this many descriptors in one `recvmsg`. The lobby attaches at most one to a frame
/// and sends one request at a time, so more than one per read means something is wrong; the
/// margin only keeps such a surplus from being silently truncated.
const MAX_FDS_PER_READ: usize = 8;

/// One `sendmsg` of `bufs`, never raising `SIGPIPE`. `flags` adds e.g. `MSG_DONTWAIT`.
pub fn send(fd: RawFd, bufs: &[IoSlice<'_>], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is valid; IoSlice is guaranteed ABI-compatible with iovec.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len() as _;
    // SAFETY: msg points at live buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(fd, &msg, flags | libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// One blocking `sendmsg` of `bufs` carrying `passed` in `SCM_RIGHTS`. When it returns `Ok(n)`
/// with `n > 0` the descriptor went with the first byte; the rest is sent with [`send`].
pub fn send_with_fd(fd: RawFd, bufs: &[IoSlice<'_>], passed: RawFd) -> io::Result<usize> {
    let fd_len = mem::size_of::<RawFd>() as u32;
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_len) } as usize;
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(mem::size_of::<u64>())];
    // SAFETY: an all-zero msghdr is valid; IoSlice is guaranteed ABI-compatible with iovec.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len() as _;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer has room for one cmsghdr with one descriptor, as sized above.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_len) as _;
        ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), passed);
    }
    // SAFETY: msg points at live buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Why a `recvmsg` could not be taken as is.
#[derive(Debug)]
pub enum RecvError {
    Os(io::Error),
    /// The kernel dropped descriptors that did not fit the control buffer.
    DescriptorsTruncated,
}

/// One `recvmsg` into the spare capacity of `buf`, appending what arrived to `buf` and any
/// descriptors, in arrival order and close-on-exec, to `fds`. `Ok(0)` is end-of-file. `flags`
/// adds e.g. `MSG_DONTWAIT`.
pub fn recv_with_fds(
    fd: RawFd,
    buf: &mut Vec<u8>,
    fds: &mut VecDeque<OwnedFd>,
    flags: libc::c_int,
) -> Result<usize, RecvError> {
    let fd_len = (MAX_FDS_PER_READ * mem::size_of::<RawFd>()) as u32;
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(fd_len) } as usize;
    let mut control = [0u64; 16];
    debug_assert!(space <= mem::size_of_val(&control));
    let spare = buf.spare_capacity_mut();
    let mut iov = libc::iovec { iov_base: spare.as_mut_ptr().cast(), iov_len: spare.len() };
    // SAFETY: an all-zero msghdr is valid.
    let mut msg: libc::msghdr = unsafe { mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: iov covers the vector's spare capacity; the kernel writes at most iov_len bytes.
    let n = unsafe { libc::recvmsg(fd, &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(RecvError::Os(io::Error::last_os_error()));
    }
    // SAFETY: the kernel initialised the first n bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n as usize) };
    // SAFETY: walking the control messages the kernel wrote, with the libc accessors.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let count =
                    ((*cmsg).cmsg_len as usize - (data as usize - cmsg as usize)) / mem::size_of::<RawFd>();
                for i in 0..count {
                    let received = ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push_back(OwnedFd::from_raw_fd(received));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(RecvError::DescriptorsTruncated);
    }
    Ok(n as usize)
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
