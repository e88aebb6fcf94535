//! Signals and children: sending, reaping, and what survives an exec.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use rustix::process::{Pid, Signal, WaitOptions};

/// Sends `signal` (a named signal's number, libc::SIGKILL and the like) to process `pid`.
pub fn kill(pid: i32, signal: i32) -> io::Result<()> {
    let invalid = || io::Error::from(io::ErrorKind::InvalidInput);
    let pid = Pid::from_raw(pid).ok_or_else(invalid)?;
    let signal = Signal::from_named_raw(signal).ok_or_else(invalid)?;
    rustix::process::kill_process(pid, signal).map_err(io::Error::from)
}

/// Whether the child `pid` has exited, reaping it if so; never waits. A pid that is not a
/// child (reaped already) counts as exited.
pub fn reaped(pid: i32) -> bool {
    match Pid::from_raw(pid) {
        Some(pid) => !matches!(rustix::process::waitpid(Some(pid), WaitOptions::NOHANG), Ok(None)),
        None => true,
    }
}

/// Waits until the child `pid` exits, and reaps it.
pub fn wait(pid: i32) {
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
    }
}

/// Makes the process `command` starts keep `inherited` open across its exec: they are
/// close-on-exec here, so that no other child gets them.
pub fn keep_across_exec(command: &mut Command, inherited: Vec<RawFd>) {
    // SAFETY: between fork and exec only fcntl runs, which is async-signal-safe, and it
    // allocates nothing; the descriptors are open in the child (inherited from this process).
    unsafe {
        command.pre_exec(move || {
            for &fd in &inherited {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Blocks `signals` in the calling thread only: they go to the process's other threads.
pub fn block_in_this_thread(signals: &[i32]) {
    // SAFETY: a sigset_t is plain data, filled by sigemptyset; pthread_sigmask changes only
    // this thread's mask and reads the set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Restores `signal`'s default action in the whole process.
pub fn default_action(signal: i32) {
    // SAFETY: SIG_DFL installs no handler: nothing of this process runs for the signal.
    unsafe { libc::signal(signal, libc::SIG_DFL) };
}
