//! Signals and children: sending, reaping, and what survives an exec.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus};
use std::sync::Mutex;

use rustix::process::{Pid, Signal, WaitOptions};

/// Sends `signal` (a named signal's number, libc::SIGKILL and the like) to process `pid`.
pub fn kill(pid: i32, signal: i32) -> io::Result<()> {
    let invalid = || io::Error::from(io::ErrorKind::InvalidInput);
    let pid = Pid::from_raw(pid).ok_or_else(invalid)?;
    let signal = Signal::from_named_raw(signal).ok_or_else(invalid)?;
    rustix::process::kill_process(pid, signal).map_err(io::Error::from)
}

/// The children whose owners wait for them by pid (the zygotes, a new maitred of SIGUSR2), and
/// the exit statuses `reap_any` took from them: when the lobby is PID 1 it reaps every child
/// that exits, and these statuses are its owners' still.
struct Owned {
    waited_for: HashSet<i32>,
    exited: HashMap<i32, i32>,
}

static OWNED: Mutex<Option<Owned>> = Mutex::new(None);

fn owned<T>(with: impl FnOnce(&mut Owned) -> T) -> T {
    let mut owned = OWNED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    with(owned.get_or_insert_with(|| Owned { waited_for: HashSet::new(), exited: HashMap::new() }))
}

/// Says that the child `pid` is waited for by pid (`reaped`, `wait`, `exit_status`): `reap_any`
/// keeps its exit status for them.
pub fn waited_for(pid: i32) {
    owned(|owned| owned.waited_for.insert(pid));
}

/// Says that nothing here waits for the child `pid` any more: `reap_any` reaps it as any other.
pub fn not_waited_for(pid: i32) {
    owned(|owned| {
        owned.waited_for.remove(&pid);
        owned.exited.remove(&pid);
    });
}

/// The exit status `reap_any` took from the child `pid`, taken once.
fn taken_status(pid: i32) -> Option<i32> {
    owned(|owned| {
        let status = owned.exited.remove(&pid)?;
        owned.waited_for.remove(&pid);
        Some(status)
    })
}

/// Reaps every child that has exited, never waiting: what an init does for the orphans it
/// adopts. The status of a child waited for by pid is kept for its owner. Returns how many
/// others were reaped.
pub fn reap_any() -> usize {
    let mut others = 0;
    while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
        let pid = pid.as_raw_nonzero().get();
        let kept = owned(|owned| {
            let waited_for = owned.waited_for.contains(&pid);
            if waited_for {
                owned.exited.insert(pid, status.as_raw());
            }
            waited_for
        });
        if !kept {
            others += 1;
        }
    }
    others
}

/// The exit status of the child `pid` if it has exited, reaping it; never waits. None while it
/// runs, and for a pid that is not a child (reaped already).
pub fn exit_status(pid: i32) -> Option<ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    if let Some(status) = taken_status(pid) {
        return Some(ExitStatus::from_raw(status));
    }
    match rustix::process::waitpid(Some(Pid::from_raw(pid)?), WaitOptions::NOHANG) {
        Ok(Some((_, status))) => {
            not_waited_for(pid);
            Some(ExitStatus::from_raw(status.as_raw()))
        }
        _ => None,
    }
}

/// Whether the child `pid` has exited, reaping it if so; never waits. A pid that is not a
/// child (reaped already) counts as exited.
pub fn reaped(pid: i32) -> bool {
    if taken_status(pid).is_some() {
        return true;
    }
    let exited = match Pid::from_raw(pid) {
        Some(pid) => !matches!(rustix::process::waitpid(Some(pid), WaitOptions::NOHANG), Ok(None)),
        None => true,
    };
    if exited {
        not_waited_for(pid);
    }
    exited
}

/// Waits until the child `pid` exits, and reaps it.
pub fn wait(pid: i32) {
    if taken_status(pid).is_some() {
        return;
    }
    if let Some(pid) = Pid::from_raw(pid) {
        let _ = rustix::process::waitpid(Some(pid), WaitOptions::empty());
    }
    not_waited_for(pid);
}

/// Whether this process is the init of its PID namespace: the kernel gives it the orphans.
pub fn is_init() -> bool {
    rustix::process::getpid().is_init()
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
