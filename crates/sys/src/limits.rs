//! The process's resource limits and the system's constants.

use std::io;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// The soft and hard limits on open descriptors (RLIMIT_NOFILE); None stands for unlimited.
pub fn open_files() -> (Option<u64>, Option<u64>) {
    let limit = getrlimit(Resource::Nofile);
    (limit.current, limit.maximum)
}

/// Sets the soft limit on open descriptors, keeping the hard one.
pub fn set_open_files(soft: u64) -> io::Result<()> {
    let maximum = getrlimit(Resource::Nofile).maximum;
    setrlimit(Resource::Nofile, Rlimit { current: Some(soft), maximum }).map_err(io::Error::from)
}

/// The size of a memory page.
pub fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

/// The kernel's clock ticks per second, the unit of the CPU times in /proc/PID/stat.
pub fn clock_ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second()
}

/// CLOCK_MONOTONIC in microseconds: the clock systemd compares `MONOTONIC_USEC` with.
pub fn monotonic_usec() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000
}

/// Gives the memory allocator's free memory back to the system (glibc's malloc_trim).
pub fn trim_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases memory the allocator holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}
