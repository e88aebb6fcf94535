//! The pipe a streamed request body goes through to its worker: made as large as the system
//! lets a pipe be without privilege, filled from the client's socket by `splice(2)`, which moves
//! the socket's pages into the pipe without copying them through the lobby.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::pipe::{PipeFlags, SpliceFlags};

/// A pipe's capacity asked for: 1 MiB, the default of /proc/sys/fs/pipe-max-size.
pub const BODY_PIPE_SIZE: usize = 1 << 20;

/// A close-on-exec pipe, (read end, write end), of up to [`BODY_PIPE_SIZE`] bytes (the default
/// 64 KiB where the system allows less), and its capacity.
pub fn body_pipe() -> io::Result<(OwnedFd, OwnedFd, usize)> {
    let (read, write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    let capacity = match rustix::pipe::fcntl_setpipe_size(&write, BODY_PIPE_SIZE) {
        Ok(size) => size,
        Err(_) => rustix::pipe::fcntl_getpipe_size(&write)?,
    };
    Ok((read, write, capacity))
}

/// Moves up to `len` bytes from `socket` into `pipe`, waiting for neither: `WouldBlock` when
/// the socket has nothing or the pipe no room, `Ok(0)` when the socket's peer has shut its end.
pub fn splice_into_pipe(socket: BorrowedFd<'_>, pipe: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    Ok(rustix::pipe::splice(socket, None, pipe, None, len, SpliceFlags::MOVE | SpliceFlags::NONBLOCK)?)
}

/// After a splice found nothing to do: whether `socket` has input (or its peer has gone) and
/// whether `pipe` has room, looked at without waiting, so that the caller waits for the one
/// that is not ready.
pub fn splice_blocked_on(socket: BorrowedFd<'_>, pipe: BorrowedFd<'_>) -> io::Result<(bool, bool)> {
    use rustix::event::{PollFd, PollFlags};
    let mut polled = [PollFd::new(&socket, PollFlags::IN), PollFd::new(&pipe, PollFlags::OUT)];
    rustix::event::poll(&mut polled, Some(&rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 }))?;
    let gone = PollFlags::HUP | PollFlags::ERR | PollFlags::RDHUP;
    let readable = polled[0].revents().intersects(PollFlags::IN | gone);
    let room = polled[1].revents().intersects(PollFlags::OUT | PollFlags::ERR);
    Ok((readable, room))
}

/// Whether `fd` is a pipe: a worker's request body that streams, where a spooled one is a file.
pub fn is_pipe(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fstat(fd)
        .is_ok_and(|stat| rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Fifo)
}

/// One `read(2)` from a pipe into `buf`, waiting for bytes if it is blocking; `Ok(0)` once its
/// writer has closed it and nothing is left.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    Ok(rustix::io::read(fd, buf)?)
}

/// One `readv(2)` from a pipe into `bufs` in turn: a body record's bytes and the next record's
/// header in one call (maitred_wire's `BodyRecords`).
pub fn read_vectored(fd: BorrowedFd<'_>, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
    Ok(rustix::io::readv(fd, bufs)?)
}

/// Makes a pipe's reads return `WouldBlock` rather than wait: an ASGI worker's loop waits for
/// a streaming body on its own (`read_ready`).
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let status = rustix::fs::fcntl_getfl(fd)?;
    Ok(rustix::fs::fcntl_setfl(fd, status | rustix::fs::OFlags::NONBLOCK)?)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::{body_pipe, is_pipe, splice_blocked_on, splice_into_pipe};

    #[test]
    fn bytes_spliced_from_a_socket_come_out_of_the_pipe_in_order() {
        let (read, write, capacity) = body_pipe().unwrap();
        assert!(capacity >= 64 * 1024, "{capacity}");
        let (mut client, lobby) = UnixStream::pair().unwrap();
        client.write_all(b"a streamed body").unwrap();
        let moved = splice_into_pipe(lobby.as_fd(), write.as_fd(), 1 << 20).unwrap();
        assert_eq!(moved, 15);
        // Nothing more to move: the socket is empty.
        let empty = splice_into_pipe(lobby.as_fd(), write.as_fd(), 1 << 20).unwrap_err();
        assert_eq!(empty.kind(), std::io::ErrorKind::WouldBlock);
        assert_eq!(splice_blocked_on(lobby.as_fd(), write.as_fd()).unwrap(), (false, true));
        drop(client);
        assert_eq!(splice_blocked_on(lobby.as_fd(), write.as_fd()).unwrap(), (true, true));
        assert_eq!(splice_into_pipe(lobby.as_fd(), write.as_fd(), 1 << 20).unwrap(), 0);
        assert!(is_pipe(read.as_fd()) && !is_pipe(lobby.as_fd()));
        drop(write);
        let mut out = Vec::new();
        std::fs::File::from(read).read_to_end(&mut out).unwrap();
        assert_eq!(out, b"a streamed body");
    }
}
