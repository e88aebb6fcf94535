//! Descriptors as numbers: taking one over that this process was given, putting a file in the
//! place of another, waiting on one, and writing to one whatever its mode.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use rustix::event::{PollFd, PollFlags};

/// Takes ownership of descriptor `fd`, which this process was handed to own (by its parent, a
/// service manager, or an operator's fd://N), once it has checked that it is open.
pub fn adopt(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(F_GETFD) only reads the descriptor's flags; if it is open, it is this
    // process's to own: callers adopt each inherited descriptor once, and nothing else of this
    // process holds it.
    unsafe {
        if libc::fcntl(fd, libc::F_GETFD) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Fails with `EBADF` unless `fd` is an open descriptor.
pub fn check_open(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl(F_GETFD) only reads the flags of a descriptor number, open or not.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A close-on-exec copy of descriptor `fd` (`F_DUPFD_CLOEXEC`), which stays open when the
/// caller closes `fd`; `EBADF` when `fd` is not open.
pub fn duplicate(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) reads nothing but the descriptor number, open or not, and
    // the descriptor it returns is new: this process holds it nowhere else.
    unsafe {
        let copy = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0);
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(copy))
    }
}

/// Makes `fd` blocking and close-on-exec.
pub fn set_blocking_cloexec(fd: BorrowedFd<'_>) -> io::Result<()> {
    let status = rustix::fs::fcntl_getfl(fd)?;
    rustix::fs::fcntl_setfl(fd, status - rustix::fs::OFlags::NONBLOCK)?;
    let flags = rustix::io::fcntl_getfd(fd)?;
    rustix::io::fcntl_setfd(fd, flags | rustix::io::FdFlags::CLOEXEC)?;
    Ok(())
}

/// One `pread(2)` into `buf` at `offset`; `Ok(0)` is end-of-file.
pub fn pread(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes, which pread writes at most.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), offset as libc::off_t) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Waits until `first`, or `second` when given, has input (or has been closed), and says which
/// of the two; with `wait` false, only looks.
pub fn wait_readable_either(first: RawFd, second: Option<RawFd>, wait: bool) -> io::Result<(bool, bool)> {
    // poll(2) skips an entry whose descriptor is negative.
    let mut polled = [
        libc::pollfd { fd: first, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: second.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: `polled` is an array of two live pollfds, which poll reads and writes.
    if unsafe { libc::poll(polled.as_mut_ptr(), 2, if wait { -1 } else { 0 }) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((polled[0].revents != 0, polled[1].revents != 0))
}

/// Puts `file` in the place of descriptor `fd` (dup3), keeping `fd`'s close-on-exec flag:
/// whoever writes to `fd` writes to `file` from the next write on.
pub fn replace(fd: BorrowedFd<'_>, file: BorrowedFd<'_>) -> io::Result<()> {
    let cloexec = rustix::io::fcntl_getfd(fd).map_err(io::Error::from)?.contains(rustix::io::FdFlags::CLOEXEC);
    // SAFETY: dup3 acts on descriptor numbers: it closes `fd` and makes it a copy of `file`,
    // atomically; both are borrowed, so open, and `fd` stays open with its number.
    if unsafe { libc::dup3(file.as_raw_fd(), fd.as_raw_fd(), if cloexec { libc::O_CLOEXEC } else { 0 }) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes all of `bytes`, waiting as long as it takes, also when the descriptor was made
/// non-blocking by another process that shares it.
pub fn write_all_waiting(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => bytes = &bytes[written..],
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => {
                wait_for(fd, PollFlags::OUT, None)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Writes as much of `bytes` as goes within `timeout`, waiting for room no longer than that in
/// all; an error if not all of it went.
pub fn write_all_within(fd: BorrowedFd<'_>, mut bytes: &[u8], timeout: std::time::Duration) -> io::Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => bytes = &bytes[written..],
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() || !wait_for(fd, PollFlags::OUT, Some(left))? {
                    return Err(io::ErrorKind::TimedOut.into());
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Waits until `fd` can be read, or `timeout` passes (None: however long it takes); returns
/// whether it can.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<std::time::Duration>) -> io::Result<bool> {
    wait_for(fd, PollFlags::IN, timeout)
}

fn wait_for(fd: BorrowedFd<'_>, flags: PollFlags, timeout: Option<std::time::Duration>) -> io::Result<bool> {
    let timeout =
        timeout.map(|t| rustix::time::Timespec { tv_sec: t.as_secs() as i64, tv_nsec: t.subsec_nanos() as i64 });
    let mut polled = [PollFd::new(&fd, flags)];
    match rustix::event::poll(&mut polled, timeout.as_ref()) {
        Ok(ready) => Ok(ready > 0),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn a_duplicate_outlives_the_descriptor_it_copies() {
        let path = std::env::temp_dir().join(format!("maitred-duplicate-{}", std::process::id()));
        let mut file = std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file.write_all(b"kept").unwrap();
        let copy = duplicate(file.as_raw_fd()).unwrap();
        drop(file);
        let mut kept = std::fs::File::from(copy);
        kept.rewind().unwrap();
        let mut text = String::new();
        kept.read_to_string(&mut text).unwrap();
        assert_eq!(text, "kept");
        assert_eq!(duplicate(-1).unwrap_err().raw_os_error(), Some(libc::EBADF));
    }
}
