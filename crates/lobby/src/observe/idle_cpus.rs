//! How the machine's idle CPUs wait for work, said once at start when it slows light load
//! (docs/TUNING.md, "Virtual machines: how an idle CPU waits").
//!
//! In a KVM guest, Linux's cpuidle-haltpoll driver lets an idle virtual CPU poll for work up to
//! `guest_halt_poll_ns` before it halts (the kernel's default is 200 µs, adapted to how soon
//! work comes). A provider can turn the polling off on the kernel's command line. A halted
//! vCPU is then woken through the hypervisor: 35-40 µs a wake on this project's 2-vCPU
//! Firecracker VM, against a few µs for a switch on a running CPU (`perf sched timehist`,
//! docs/PERFORMANCE.md, "One client on this machine"). At one client, the hand-off to a worker
//! and the answer's way back each wake one, which a server without the hop does not: A1-c1 (ASGI
//! hello, `wrk -t1 -c1`, bench/results/asgi-c1-halt and -poll) was 0.68 of uvicorn with the polling
//! off and 1.17 with the kernel's default, minutes apart.

use crate::log::info;

const DRIVER: &str = "/sys/devices/system/cpu/cpuidle/current_driver";
const POLL_NS: &str = "/sys/module/haltpoll/parameters/guest_halt_poll_ns";

/// Logs a line when this machine's idle CPUs halt without polling first; nothing otherwise,
/// nor where the files do not exist (no cpuidle, not a haltpoll guest).
pub(crate) fn note_at_start() {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    if halts_without_polling(&read(DRIVER), &read(POLL_NS)) {
        info!(
            "this machine's idle CPUs halt without polling first (cpuidle driver haltpoll, \
             haltpoll.guest_halt_poll_ns 0): at light load each hand-off between the lobby and a worker waits \
             for a CPU to wake, tens of microseconds on a VM; docs/TUNING.md (\"Virtual machines\") says how to let \
             them poll"
        );
    }
}

/// Whether the haltpoll driver is in use with its polling turned off, from the two files' text.
fn halts_without_polling(driver: &str, poll_ns: &str) -> bool {
    driver.trim() == "haltpoll" && poll_ns.trim() == "0"
}

#[cfg(test)]
mod tests {
    use super::halts_without_polling;

    #[test]
    fn only_the_haltpoll_driver_with_its_polling_off_is_noted() {
        assert!(halts_without_polling("haltpoll\n", "0\n"));
        assert!(!halts_without_polling("haltpoll\n", "200000\n"));
        // Bare metal and guests without the driver: nothing this lobby can tell of the wake.
        assert!(!halts_without_polling("intel_idle\n", ""));
        assert!(!halts_without_polling("acpi_idle\n", "0\n"));
        assert!(!halts_without_polling("", ""));
    }
}
