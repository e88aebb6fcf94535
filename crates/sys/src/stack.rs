//! Where another thread of this process is: the return addresses on its stack, taken by a
//! signal handler that runs on that thread. The lobby's watchdog asks it of the event loop's
//! thread when the loop has stopped turning (crates/lobby/src/process/watchdog.rs), so that
//! the log can say what the thread was doing, whether it spins or blocks.
//!
//! The handler walks the stack with the `backtrace` crate's unsynchronized trace, which
//! allocates nothing and takes no lock of Rust's, into a fixed array of atomics; naming the
//! addresses (`backtrace::resolve`) happens afterwards, on the asking thread. One capture at a
//! time: the process is about to end when it is asked for.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The most frames kept.
const MAX_FRAMES: usize = 96;

static FRAMES: [AtomicUsize; MAX_FRAMES] = [const { AtomicUsize::new(0) }; MAX_FRAMES];
static COUNT: AtomicUsize = AtomicUsize::new(0);

const IDLE: u8 = 0;
const ASKED: u8 = 1;
const TAKEN: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(IDLE);

/// The signal the capture uses: a real-time one, which nothing else of the lobby's process
/// handles (a worker's stack signal is `SIGRTMIN + 2`, in another process).
pub fn capture_signal() -> i32 {
    libc::SIGRTMIN() + 4
}

/// The calling thread's id (`gettid`), for `frames_of`.
pub fn thread_id() -> i32 {
    rustix::thread::gettid().as_raw_nonzero().get()
}

/// Installs the handler that takes a stack for `frames_of`. Once, before any capture.
pub fn install_capture() -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction is valid; it is filled with a handler of the signature
    // SA_SIGINFO calls for and an empty mask, and sigaction only reads it.
    let installed = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_capture_signal as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(capture_signal(), &action, std::ptr::null_mut())
    };
    if installed == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

extern "C" fn on_capture_signal(_signal: libc::c_int, _info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    if STATE.load(Ordering::Acquire) != ASKED {
        return;
    }
    let mut count = 0;
    // SAFETY: the unsynchronized trace only reads this thread's stack through the unwinder; the
    // closure stores into atomics and allocates nothing. Only one capture runs at a time (STATE).
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            FRAMES[count].store(frame.ip() as usize, Ordering::Relaxed);
            count += 1;
            count < MAX_FRAMES
        });
    }
    COUNT.store(count, Ordering::Relaxed);
    STATE.store(TAKEN, Ordering::Release);
}

/// The return addresses on thread `thread`'s stack (innermost first), taken by signalling it
/// (`install_capture` must have run); None if its handler did not run within `within` (a thread
/// in an uninterruptible wait, or one that blocks the signal).
pub fn frames_of(thread: i32, within: Duration) -> Option<Vec<usize>> {
    if STATE.compare_exchange(IDLE, ASKED, Ordering::AcqRel, Ordering::Acquire).is_err() {
        return None;
    }
    // SAFETY: tgkill only sends a signal to a thread of this process, whose handler is ours.
    let sent = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), thread, capture_signal()) };
    let deadline = Instant::now() + within;
    let mut taken = sent == 0;
    while taken && STATE.load(Ordering::Acquire) != TAKEN {
        if Instant::now() >= deadline {
            taken = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let frames =
        taken.then(|| FRAMES[..COUNT.load(Ordering::Relaxed)].iter().map(|ip| ip.load(Ordering::Relaxed)).collect());
    // A handler that runs late finds the state idle and does nothing.
    STATE.store(IDLE, Ordering::Release);
    frames
}

/// Ends the process at once with `code`: no destructor, no atexit handler, no flush of stdio
/// (the caller has flushed what must be written). For a process whose main thread cannot be
/// trusted to finish anything.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the process; nothing of it runs afterwards.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn spin_until(stop: &std::sync::atomic::AtomicBool, spinning: &std::sync::atomic::AtomicBool) {
        spinning.store(true, Ordering::Release);
        while !stop.load(Ordering::Relaxed) {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn takes_the_stack_of_a_thread_that_spins() {
        install_capture().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinning = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let spinner = {
            let (stop, spinning) = (stop.clone(), spinning.clone());
            std::thread::spawn(move || {
                tid_tx.send(thread_id()).unwrap();
                spin_until(&stop, &spinning);
            })
        };
        let tid = tid_rx.recv().unwrap();
        // Asked while it was still in `send`'s wake of this thread (a futex call), the stack
        // would be that call's, without the spin (1 run in a few under load): it is asked once
        // it spins.
        while !spinning.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let frames = frames_of(tid, Duration::from_secs(5)).expect("the spinning thread's stack");
        stop.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
        assert!(frames.len() > 2, "{frames:?}");
        let mut names = Vec::new();
        for ip in frames {
            backtrace::resolve(ip as *mut std::ffi::c_void, |symbol| {
                if let Some(name) = symbol.name() {
                    names.push(name.to_string());
                }
            });
        }
        assert!(names.iter().any(|name| name.contains("spin_until")), "{names:?}");
    }
}
