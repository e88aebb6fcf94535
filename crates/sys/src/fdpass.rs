//! Unix-socket messages that carry file descriptors (`SCM_RIGHTS`).
//!
//! maitred passes descriptors in four places: the zygote hands the lobby each new worker's
//! channel, the lobby hands a worker its offer sockets and a request body spilled to a file
//! (on the channel or in an offer), and a worker hands the lobby the file behind
//! `wsgi.file_wrapper`. Both sides use these calls, and `send` for the messages that carry
//! none. They are single system calls over raw descriptors: callers decide how to wait (an event loop's readiness, a
//! blocking call outside the Python interpreter) and what to do with `EINTR`.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::mem::{self, MaybeUninit};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::ptr;

use bytes::BufMut;

/// Room for this many descriptors in one received message: the zygote's `spawned` carries one
/// channel per thread of the worker, up to `--threads`' maximum, 64; every other sender
/// attaches at most one.
const MAX_FDS_PER_RECV: usize = 64;

/// The received control message's room, in u64 words (which keep it aligned for cmsghdr): a
/// cmsghdr, two words on 64-bit Linux, and the descriptors, two to a word. `recv_with_fds`
/// checks it against CMSG_SPACE in debug builds.
const CONTROL_WORDS: usize = 2 + MAX_FDS_PER_RECV / 2;

/// Why a `recvmsg` could not be taken as is.
#[derive(Debug)]
pub enum RecvError {
    Os(io::Error),
    /// The kernel dropped descriptors that did not fit the control buffer.
    DescriptorsTruncated,
}

impl std::fmt::Display for RecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecvError::Os(e) => e.fmt(f),
            RecvError::DescriptorsTruncated => f.write_str("more file descriptors arrived than expected"),
        }
    }
}

impl std::error::Error for RecvError {}

impl From<RecvError> for io::Error {
    fn from(e: RecvError) -> io::Error {
        match e {
            RecvError::Os(e) => e,
            RecvError::DescriptorsTruncated => io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
        }
    }
}

/// One `sendmsg` of `bufs` with no descriptor, never raising `SIGPIPE` (a peer that is gone is
/// an error); `flags` adds e.g. `MSG_DONTWAIT`.
pub fn send(socket: RawFd, bufs: &[IoSlice<'_>], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: an all-zero msghdr is valid; IoSlice is guaranteed ABI-compatible with iovec, and
    // `bufs` outlives the call, which only reads them.
    let sent = unsafe {
        let mut msg: libc::msghdr = mem::zeroed();
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len() as _;
        libc::sendmsg(socket, &msg, flags | libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

/// One `sendmsg` of `bufs` carrying `passed`, never raising `SIGPIPE`; `flags` adds e.g.
/// `MSG_DONTWAIT`. When it returns `Ok(n)` with `n > 0` the descriptor went with the first
/// byte; the caller sends the rest as plain bytes.
pub fn send_with_fd(socket: RawFd, bufs: &[IoSlice<'_>], passed: RawFd, flags: libc::c_int) -> io::Result<usize> {
    let fd_len = mem::size_of::<RawFd>() as u32;
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 4];
    // SAFETY: CMSG_SPACE only computes a size, which the control buffer has room for (checked
    // below in debug builds); an all-zero msghdr is valid; IoSlice is guaranteed ABI-compatible
    // with iovec; the one cmsghdr with its one descriptor is written inside the control buffer
    // with libc's accessors; every buffer outlives the call, which only reads them.
    let sent = unsafe {
        let space = libc::CMSG_SPACE(fd_len) as usize;
        debug_assert!(space <= mem::size_of_val(&control));
        let mut msg: libc::msghdr = mem::zeroed();
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len() as _;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(fd_len) as _;
        ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), passed);
        libc::sendmsg(socket, &msg, flags | libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

/// One `recvmsg` into `buf` (typically a buffer's spare capacity), appending any descriptors
/// that came along, in arrival order and close-on-exec, to `fds`. Returns how many bytes of
/// `buf` the kernel wrote; `Ok(0)` is end-of-file. `flags` adds e.g. `MSG_DONTWAIT`.
pub fn recv_with_fds(
    socket: RawFd,
    buf: &mut [MaybeUninit<u8>],
    fds: &mut VecDeque<OwnedFd>,
    flags: libc::c_int,
) -> Result<usize, RecvError> {
    let fd_len = (MAX_FDS_PER_RECV * mem::size_of::<RawFd>()) as u32;
    let mut control = [0u64; CONTROL_WORDS];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: CMSG_SPACE only computes a size, which the control buffer has room for (checked
    // below in debug builds); an all-zero msghdr is valid; the iovec covers `buf`, of which the
    // kernel writes at most iov_len bytes; the control messages are walked with libc's
    // accessors inside the length the kernel wrote, and each descriptor in them is new to this
    // process (MSG_CMSG_CLOEXEC), so it is owned once, here.
    let (received, truncated) = unsafe {
        let space = libc::CMSG_SPACE(fd_len) as usize;
        debug_assert!(space <= mem::size_of_val(&control));
        let mut msg: libc::msghdr = mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        // Never more than the buffer holds, whatever CMSG_SPACE says.
        msg.msg_controllen = space.min(mem::size_of_val(&control)) as _;
        let received = libc::recvmsg(socket, &mut msg, flags | libc::MSG_CMSG_CLOEXEC);
        if received < 0 {
            return Err(RecvError::Os(io::Error::last_os_error()));
        }
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let count = ((*cmsg).cmsg_len as usize - (data as usize - cmsg as usize)) / mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push_back(OwnedFd::from_raw_fd(ptr::read_unaligned(data.cast::<RawFd>().add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        (received, msg.msg_flags & libc::MSG_CTRUNC != 0)
    };
    if truncated {
        return Err(RecvError::DescriptorsTruncated);
    }
    Ok(received as usize)
}

/// `recv_with_fds` into the spare capacity of `buf` (a `Vec<u8>` or a `BytesMut`), whose
/// length grows by what arrived. The caller reserves the room first.
pub fn recv_into(
    socket: RawFd,
    buf: &mut impl BufMut,
    fds: &mut VecDeque<OwnedFd>,
    flags: libc::c_int,
) -> Result<usize, RecvError> {
    // SAFETY: recvmsg writes into the spare room, and `advance_mut` counts as written only the
    // `received` bytes it initialised.
    unsafe {
        let received = recv_with_fds(socket, buf.chunk_mut().as_uninit_slice_mut(), fds, flags)?;
        buf.advance_mut(received);
        Ok(received)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_descriptor_travels_with_its_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"payload").unwrap();
        let sent = send_with_fd(a.as_raw_fd(), &[IoSlice::new(b"fr"), IoSlice::new(b"ame")], file.as_raw_fd(), 0);
        assert_eq!(sent.unwrap(), 5);
        let mut buf = [MaybeUninit::<u8>::uninit(); 16];
        let mut fds = VecDeque::new();
        let n = recv_with_fds(b.as_raw_fd(), &mut buf, &mut fds, 0).unwrap();
        // SAFETY: recvmsg initialised the first n bytes.
        let bytes: Vec<u8> = buf[..n].iter().map(|b| unsafe { b.assume_init() }).collect();
        assert_eq!(bytes, b"frame");
        let mut received = std::fs::File::from(fds.pop_front().unwrap());
        received.rewind().unwrap();
        let mut text = String::new();
        received.read_to_string(&mut text).unwrap();
        assert_eq!(text, "payload");
    }

    #[test]
    fn nothing_to_read_is_would_block_with_dontwait() {
        let (_a, b) = UnixStream::pair().unwrap();
        let mut buf = [MaybeUninit::<u8>::uninit(); 4];
        match recv_with_fds(b.as_raw_fd(), &mut buf, &mut VecDeque::new(), libc::MSG_DONTWAIT) {
            Err(RecvError::Os(e)) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn end_of_file_is_zero() {
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        let mut buf = [MaybeUninit::<u8>::uninit(); 4];
        assert_eq!(recv_with_fds(b.as_raw_fd(), &mut buf, &mut VecDeque::new(), 0).unwrap(), 0);
    }
}
