"""The watchdog of an ASGI worker's event loop (docs/ASGI.md, "Timeouts and a blocked loop"): the
loop beats every BEAT, and a thread of its own says, within a second, when it has stopped: one
diagnosis line naming the call that blocks it, with the loop's stack.

May import: maitred.log.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

from maitred.log import log

# The heartbeat's period, and how long the loop may miss it before it counts as blocked.
BEAT = 0.1
BLOCKED_AFTER = 0.5
# How long the loop may go without a beat before `on_stall` runs: a beat late.
STALLED_AFTER = 2 * BEAT


class Watchdog(threading.Thread):
    """Started from the loop's thread. `on_beat(now, lag)` runs in the loop at every beat, `lag`
    the seconds by which the beat came later than due (the loop's lag); from the
    watchdog's thread, `on_stall` runs at each of its looks while the loop is late, and
    `in_progress`, once the loop is stuck, names the requests that wait."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_beat: Callable[[float, float], None],
        on_stall: Callable[[], None],
        in_progress: Callable[[], str],
    ) -> None:
        super().__init__(name="maitred-watchdog", daemon=True)
        self._loop = loop
        self._on_beat = on_beat
        self._on_stall = on_stall
        self._in_progress = in_progress
        self._loop_thread = threading.get_ident()
        self.last_beat = time.monotonic()
        self._due = self.last_beat
        self._stopped = threading.Event()

    def beat(self) -> None:
        self.last_beat = now = time.monotonic()
        lag = max(0.0, now - self._due)
        self._due = now + BEAT
        self._on_beat(now, lag)
        self._loop.call_later(BEAT, self.beat)

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        reported = 0.0
        while not self._stopped.wait(BEAT):
            last = self.last_beat
            stalled = time.monotonic() - last
            if stalled >= STALLED_AFTER:
                self._on_stall()
            if stalled < BLOCKED_AFTER or last == reported:
                continue
            reported = last
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None:
                continue
            stack = "".join(traceback.format_stack(frame)).rstrip()
            where = traceback.extract_stack(frame, limit=1)[-1]
            log(
                "warning",
                f"diagnosis S2 (blocked_event_loop): worker {os.getpid()}'s event loop has not run for "
                f"{stalled:.1f} s, blocked in {where.name} ({where.filename}:{where.lineno}) during "
                f"{self._in_progress()}; every request of this worker waits meanwhile; fix: await the call's "
                f"async form, or run it with `await asyncio.to_thread(...)`\n{stack}",
            )
