"""The lobby's bells an ASGI worker owes (docs/PROTOCOL.md, section 4): the answers written in
one turn of the event loop ring them together once the turn has run, and the watchdog's thread
rings them while the loop is blocked.

May import: maitred._native.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from maitred._native import ChannelError, WorkerChannel


class OwedRings:
    """The channels that wrote answers in this turn of the loop and have not rung for them, and
    how many seats have a request in progress."""

    def __init__(self, loop: asyncio.AbstractEventLoop, broken: Callable[[ChannelError], None]) -> None:
        self._loop = loop
        self._broken = broken
        self.busy_seats = 0
        self._owed: list[WorkerChannel] = []

    def later(self, channel: WorkerChannel) -> bool:
        """`channel` wrote an answer. With other requests in progress, its lobby bell is rung
        once the callbacks of this turn of the loop have run, so that the answers one turn
        writes, on every channel, wake the lobby once rather than once each; returns False.
        Alone, no other answer can join it, and a turn more would cost the loop a wait for
        nothing: True, ring at once."""
        if self.busy_seats <= 1:
            return True
        if not self._owed:
            self._loop.call_soon(self._ring)
        self._owed.append(channel)
        return False

    def _ring(self) -> None:
        owed, self._owed = self._owed, []
        for channel in owed:
            try:
                channel.ring()
            except ChannelError as error:
                self._broken(error)

    def while_stalled(self) -> None:
        """From the watchdog's thread, while the loop is late (a turn that blocks it, docs/ASGI.md,
        "Timeouts and a blocked loop"): rings the bells owed now, so that an answer written
        before the block does not wait for its end. Only the loop's thread changes the list of
        bells owed; this reads a copy, and the loop's `_ring` comes later for every one of them
        (`ring` rings a channel's bell only if an answer is still unrung, and unread by the lobby). Each `ring` holds the
        interpreter lock, so the loop's thread cannot enter the channel meanwhile; a channel that
        it holds (sending a large frame on its socket, detached) refuses, and waits for `_ring`;
        a bell that cannot be rung leaves the channel broken, which the loop finds at its next
        use of it."""
        for channel in list(self._owed):
            try:
                channel.ring()
            except (ChannelError, RuntimeError):
                pass
