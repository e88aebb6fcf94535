//! Calls on sockets that neither std, tokio nor socket2 offers: sends with flags, sendfile, the
//! kernel's queues, a peek.

use std::io;
use std::os::fd::BorrowedFd;

use rustix::net::{RecvFlags, SendFlags};

/// One `send(2)`, never raising SIGPIPE (a peer that is gone is an error). `more`: MSG_MORE,
/// TCP holds the bytes back for what follows (a close sends them with its FIN).
pub fn send(socket: BorrowedFd<'_>, data: &[u8], more: bool) -> io::Result<usize> {
    let flags = if more { SendFlags::NOSIGNAL | SendFlags::MORE } else { SendFlags::NOSIGNAL };
    rustix::net::send(socket, data, flags).map_err(io::Error::from)
}

/// One `sendfile(2)` of up to `count` bytes of `file` from `offset`, which moves on by what was
/// sent; returns that.
pub fn sendfile(socket: BorrowedFd<'_>, file: BorrowedFd<'_>, offset: &mut u64, count: usize) -> io::Result<usize> {
    rustix::fs::sendfile(socket, file, Some(offset), count).map_err(io::Error::from)
}

/// Whether a byte is waiting to be read, without taking it: Ok(0) at end-of-file, WouldBlock
/// when nothing is there.
pub fn peek(socket: BorrowedFd<'_>) -> io::Result<usize> {
    let mut byte = [0u8; 1];
    rustix::net::recv(socket, &mut byte, RecvFlags::PEEK | RecvFlags::DONTWAIT)
        .map(|(read, _)| read)
        .map_err(io::Error::from)
}

/// Bytes written to the socket that its peer has not taken yet (SIOCOUTQ), if the kernel says.
pub fn unsent_bytes(socket: BorrowedFd<'_>) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let mut unsent: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one c_int through the pointer, which points at a live
    // c_int; the descriptor is borrowed, so open.
    match unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut unsent) } {
        0 => u32::try_from(unsent).ok(),
        _ => None,
    }
}

/// Sets SO_RCVLOWAT: the socket polls readable only once `bytes` have come, or its peer has
/// closed or failed.
pub fn set_receive_low_water(socket: BorrowedFd<'_>, bytes: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: the option's value is one c_int, passed by pointer with its size; the descriptor
    // is borrowed, so open.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How many connections wait in a TCP listener's accept queue (what `ss -l` shows as Recv-Q).
pub fn listen_queue_depth(listener: BorrowedFd<'_>) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: an all-zero tcp_info is a valid value of this plain C struct; getsockopt writes
    // at most `len` bytes into it, which it has; the descriptor is borrowed, so open.
    let (result, info) = unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let result = libc::getsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        (result, info)
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    // Only what getsockopt wrote is an answer: qemu-user (7.2) passes TCP options through as
    // an int and writes 4 bytes, and the zeroes left in tcpi_unacked would read as an empty
    // queue, so that the lobby would wait for an event while connections queue.
    let unacked_end = std::mem::offset_of!(libc::tcp_info, tcpi_unacked) + std::mem::size_of::<u32>();
    if (len as usize) < unacked_end {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("TCP_INFO returned {len} bytes, no tcpi_unacked"),
        ));
    }
    // For a listener the kernel reports the accept queue's length in tcpi_unacked.
    Ok(info.tcpi_unacked)
}
