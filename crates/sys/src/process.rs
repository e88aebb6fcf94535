//! Signals and children: sending, reaping, what survives an exec, and the CPU time they use.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

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

/// The CPU time a process has used, all its threads together, read in nanoseconds (where
/// /proc/PID/stat counts in clock ticks, 10 ms): `clock_getcpuclockid`'s clock, one
/// `clock_gettime` a read. Bound to a pid: once that process has been reaped, a process given
/// the same pid would be read.
pub struct CpuClock(libc::clockid_t);

impl CpuClock {
    /// The clock of process `pid`; fails when there is no such process.
    pub fn of(pid: i32) -> io::Result<CpuClock> {
        let mut clock: libc::clockid_t = 0;
        // SAFETY: clock_getcpuclockid writes one clockid_t to the pointer, which points at a
        // live local of that type.
        let failed = unsafe { libc::clock_getcpuclockid(pid, &mut clock) };
        match failed {
            0 => Ok(CpuClock(clock)),
            errno => Err(io::Error::from_raw_os_error(errno)),
        }
    }

    /// The CPU time used so far; fails once the process has gone.
    pub fn used(&self) -> io::Result<Duration> {
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec to the pointer, which points at a live local
        // of that type.
        if unsafe { libc::clock_gettime(self.0, &mut now) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_child_that_spins_is_seen_using_cpu_and_one_that_sleeps_is_not() {
        let mut spinner = Command::new("sh").args(["-c", "while :; do :; done"]).stdout(Stdio::null()).spawn().unwrap();
        let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
        let spinning = CpuClock::of(spinner.id() as i32).unwrap();
        let sleeping = CpuClock::of(sleeper.id() as i32).unwrap();
        // Waits for the event, not a time: the spinner has used 50 ms of CPU.
        let began = Instant::now();
        while spinning.used().unwrap() < Duration::from_millis(50) {
            assert!(began.elapsed() < Duration::from_secs(60), "the spinner used no CPU in 60 s");
            std::thread::yield_now();
        }
        assert!(sleeping.used().unwrap() < Duration::from_millis(20), "{:?}", sleeping.used());
        for child in [&mut spinner, &mut sleeper] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        assert!(spinning.used().is_err(), "a reaped process's clock cannot be read");
        assert!(CpuClock::of(sleeper.id() as i32).is_err(), "a reaped process has no clock");
    }
}
