"""What one process waking another costs on this machine: two processes ping-pong through two
eventfds, each asleep in epoll_wait until the other rings, as the lobby and a worker do at one
client. Run unpinned (the kernel puts a woken process on an idle CPU: a wake across CPUs) and
with both on one CPU (a switch on the same CPU). docs/PERFORMANCE.md quotes it.

    python3 bench/wake_cost.py [ROUND_TRIPS]
"""

from __future__ import annotations

import os
import select
import sys
import time


def ping_pong(round_trips: int, cpu: int | None) -> float:
    """Microseconds per round trip; both processes on `cpu` when it is given."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    to_child, to_parent = os.eventfd(0, os.EFD_NONBLOCK), os.eventfd(0, os.EFD_NONBLOCK)
    child = os.fork()
    if child == 0:
        sleeper = select.epoll()
        sleeper.register(to_child, select.EPOLLIN)
        for _ in range(round_trips):
            sleeper.poll()
            os.eventfd_read(to_child)
            os.eventfd_write(to_parent, 1)
        os._exit(0)
    sleeper = select.epoll()
    sleeper.register(to_parent, select.EPOLLIN)
    started = time.perf_counter()
    for _ in range(round_trips):
        os.eventfd_write(to_child, 1)
        sleeper.poll()
        os.eventfd_read(to_parent)
    took = time.perf_counter() - started
    os.waitpid(child, 0)
    for bell in (to_child, to_parent):
        os.close(bell)
    if cpu is not None:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    return took / round_trips * 1e6


def main() -> int:
    round_trips = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    for _ in range(2):
        print(f"unpinned (a wake across CPUs): {ping_pong(round_trips, None):.1f} us per round trip")
        print(f"both on CPU 0 (a switch on one CPU): {ping_pong(round_trips, 0):.1f} us per round trip")
    return 0


if __name__ == "__main__":
    sys.exit(main())
