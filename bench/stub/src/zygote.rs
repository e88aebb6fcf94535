//! The stub zygote: it speaks the control channel as python/maitred/zygote.py does
//! (docs/PROTOCOL.md, section 1), and starts this binary as each worker it is asked for.
//!
//! It sleeps in poll(2) on the control channel and on one pidfd a worker, so that a worker's
//! exit is reported as soon as it happens, with no signal handler and no timer.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use maitred_wire::zygote::{Exit, Order, Report};
use rustix::event::{PollFd, PollFlags};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use rustix::process::{Pid, PidfdFlags};

/// Messages from the lobby are a few dozen bytes.
const MAX_MESSAGE: usize = 512;
/// How long workers have to exit once the lobby has gone (their channels closed), before they
/// are killed, so that nothing outlives the server.
const WORKERS_EXIT_WAIT: Duration = Duration::from_secs(10);

/// A worker this zygote started and has not reaped yet.
struct Worker {
    child: Child,
    /// Readable once the worker has exited.
    pidfd: OwnedFd,
}

/// Serves the control channel until the lobby closes it, then waits for the workers; returns
/// the exit code.
pub fn run(control: OwnedFd, cpu: Option<usize>, echo: bool) -> Result<i32, String> {
    // This process was given the descriptor to keep across its exec; its workers must not get
    // it, or the channel would not close when the lobby lets go of it.
    maitred_sys::fd::set_blocking_cloexec(control.as_fd()).map_err(|e| format!("control channel: {e}"))?;
    if let Some(cpu) = cpu {
        let mut set = rustix::thread::CpuSet::new();
        set.set(cpu);
        rustix::thread::sched_setaffinity(None, &set).map_err(|e| format!("cannot move to CPU {cpu}: {e}"))?;
    }
    let program = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut workers: Vec<Worker> = Vec::new();
    let mut lobby_gone = false;
    while !lobby_gone {
        let fds: Vec<&OwnedFd> = std::iter::once(&control).chain(workers.iter().map(|w| &w.pidfd)).collect();
        let ready = readable(&fds, None).map_err(|e| format!("poll: {e}"))?;
        let control_ready = ready[0];
        for (pid, how) in reap(&mut workers, &indexes(&ready[1..])) {
            if send(&control, &Report::Exited { pid, how }, &[]).is_err() {
                lobby_gone = true;
            }
        }
        if control_ready && !lobby_gone {
            match receive(&control) {
                Some(message) => lobby_gone = !obey(&control, &message, &program, echo, &mut workers)?,
                None => lobby_gone = true,
            }
        }
    }
    wait_for_workers(workers);
    Ok(0)
}

/// Waits until one of `fds` is readable (or closed), or `timeout` passes; which of them are.
fn readable(fds: &[&OwnedFd], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut polled: Vec<PollFd<'_>> = fds.iter().map(|fd| PollFd::new(*fd, PollFlags::IN)).collect();
    let timeout = timeout.map(|t| rustix::time::Timespec::try_from(t).expect("a timeout of seconds"));
    match rustix::event::poll(&mut polled, timeout.as_ref()) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(polled.iter().map(|fd| !fd.revents().is_empty()).collect())
}

/// The indexes of the `true`s.
fn indexes(flags: &[bool]) -> Vec<usize> {
    flags.iter().enumerate().filter(|(_, set)| **set).map(|(i, _)| i).collect()
}

/// Reaps the workers at `exited` (indexes into `workers`) that have exited, and returns their
/// pids, each with how it ended.
fn reap(workers: &mut Vec<Worker>, exited: &[usize]) -> Vec<(i32, Exit)> {
    let mut reaped = Vec::new();
    for &index in exited.iter().rev() {
        if let Ok(Some(status)) = workers[index].child.try_wait() {
            let worker = workers.swap_remove(index);
            reaped.push((worker.child.id() as i32, how(status)));
        }
    }
    reaped
}

fn how(status: ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(signal)) => Exit::Signal(signal),
        (None, None) => Exit::Code(255),
    }
}

/// The next message, or None when the lobby has closed the channel.
fn receive(control: &OwnedFd) -> Option<Vec<u8>> {
    let mut buf = Vec::with_capacity(MAX_MESSAGE);
    let mut fds = VecDeque::new();
    match maitred_sys::fdpass::recv_into(control.as_raw_fd(), &mut buf, &mut fds, 0) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(buf),
    }
}

/// Sends one report, with `fds` attached (`spawned` carries one per thread).
fn send(control: &OwnedFd, report: &Report, fds: &[OwnedFd]) -> io::Result<()> {
    let message = report.encode();
    let parts = [IoSlice::new(message.as_bytes())];
    if fds.is_empty() {
        maitred_sys::fdpass::send(control.as_raw_fd(), &parts, 0)?;
        return Ok(());
    }
    let borrowed: Vec<_> = fds.iter().map(|fd| fd.as_fd()).collect();
    let mut space = vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(borrowed.len()))];
    let mut control_buffer = SendAncillaryBuffer::new(&mut space);
    if !control_buffer.push(SendAncillaryMessage::ScmRights(&borrowed)) {
        return Err(io::Error::other("the descriptors do not fit the control buffer"));
    }
    rustix::net::sendmsg(control, &parts, &mut control_buffer, SendFlags::empty())?;
    Ok(())
}

/// Does what one message says. False when the lobby has gone (a report could not be sent).
fn obey(
    control: &OwnedFd,
    message: &[u8],
    program: &Path,
    echo: bool,
    workers: &mut Vec<Worker>,
) -> Result<bool, String> {
    let order = match Order::decode(message) {
        Ok(order) => order,
        Err(malformed) => {
            eprintln!("maitred-stub zygote: ignoring {malformed}");
            return Ok(true);
        }
    };
    match order {
        // A channel per thread; the stub's WebSocket echo stands for an ASGI worker, which has
        // one channel whatever its --worker-connections (docs/PROTOCOL.md, section 4).
        Order::Spawn { slot, threads, .. } => {
            let threads = if echo { 1 } else { threads.max(1) };
            let (worker, lobby_ends) = match spawn(program, threads, echo) {
                Ok(spawned) => spawned,
                Err(error) => {
                    // The protocol's one way to say "I cannot make workers": `failed`, then exit.
                    let why = format!("cannot start a stub worker: {error}");
                    let _ = send(control, &Report::Failed(why.clone()), &[]);
                    return Err(why);
                }
            };
            let pid = worker.child.id() as i32;
            // Recorded before `spawned` is sent and reaped only after it, so `exited` follows it.
            workers.push(worker);
            // The zygote keeps no channel end: end-of-file must reach the worker when the lobby
            // lets go of its end; `lobby_ends` close here.
            Ok(send(control, &Report::Spawned { slot, pid }, &lobby_ends).is_ok())
        }
        Order::Kill { pid, signal } => {
            // A worker is forgotten only once reaped, so its pid cannot have been reused.
            if workers.iter().any(|worker| worker.child.id() as i32 == pid) {
                let _ = maitred_sys::process::kill(pid, signal);
            }
            Ok(true)
        }
        Order::Reopen | Order::Level(_) => Ok(true),
    }
}

/// Starts one worker: this program, told to serve the worker's ends of `threads` new channels,
/// one thread each. Returns it and the lobby's ends.
fn spawn(program: &Path, threads: usize, echo: bool) -> io::Result<(Worker, Vec<OwnedFd>)> {
    let mut lobby_ends = Vec::with_capacity(threads);
    let mut worker_ends = Vec::with_capacity(threads);
    for _ in 0..threads {
        let (lobby_end, worker_end) = UnixStream::pair()?;
        lobby_ends.push(OwnedFd::from(lobby_end));
        worker_ends.push(worker_end);
    }
    let fds: Vec<_> = worker_ends.iter().map(|end| end.as_raw_fd()).collect();
    let mut command = Command::new(PathBuf::from(program));
    command.arg("worker").arg(fds.iter().map(|fd| fd.to_string()).collect::<Vec<_>>().join(","));
    if echo {
        command.arg(crate::ECHO_FLAG);
    }
    command.stdin(Stdio::null());
    maitred_sys::process::keep_across_exec(&mut command, fds);
    let mut child = command.spawn()?;
    drop(worker_ends);
    match rustix::process::pidfd_open(Pid::from_child(&child), PidfdFlags::empty()) {
        Ok(pidfd) => Ok((Worker { child, pidfd }, lobby_ends)),
        Err(error) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(error.into())
        }
    }
}

/// After the lobby has gone: its workers exit on end-of-file of their channels. Those still
/// running after `WORKERS_EXIT_WAIT` are killed.
fn wait_for_workers(mut workers: Vec<Worker>) {
    let deadline = Instant::now() + WORKERS_EXIT_WAIT;
    while !workers.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            eprintln!("maitred-stub zygote: killing {} worker(s) still running after the lobby left", workers.len());
            for worker in &mut workers {
                let _ = worker.child.kill();
                let _ = worker.child.wait();
            }
            return;
        }
        // Nothing is read from the closed channel: only the pidfds are of interest.
        let pidfds: Vec<&OwnedFd> = workers.iter().map(|worker| &worker.pidfd).collect();
        let exited = match readable(&pidfds, Some(left)) {
            Ok(ready) => indexes(&ready),
            Err(_) => (0..workers.len()).collect(),
        };
        reap(&mut workers, &exited);
    }
}
