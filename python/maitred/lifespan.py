"""ASGI's lifespan protocol, as an ASGI worker runs it (docs/ASGI.md, "Lifespan"): startup before
the worker takes a request, shutdown when it leaves.

May import: maitred.log, maitred._native.
"""

from __future__ import annotations

import asyncio
import os
import traceback
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from maitred import _native
from maitred.log import log

Message = MutableMapping[str, Any]
Application = Callable[..., Awaitable[None]]

# ASGI's version, as every scope says it (crates/python/src/scope.rs builds the others), and the
# lifespan specification's own, 2.0 (startup.failed and shutdown.failed), not the HTTP one's.
ASGI_VERSIONS = {"version": _native.ASGI_VERSION, "spec_version": "2.0"}


class Lifespan:
    """ASGI's lifespan protocol: startup before the worker takes a request, shutdown when it
    leaves. An application that raises at once on a lifespan scope does not support it, and is
    served without (as uvicorn's `--lifespan auto`)."""

    def __init__(self, application: Application, loop: asyncio.AbstractEventLoop) -> None:
        self._application = application
        self._loop = loop
        self.state: dict[str, Any] = {}
        self._events: asyncio.Queue[Message] = asyncio.Queue()
        self._answers: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._supported = True

    async def startup(self) -> str | None:
        """Runs startup; returns why it failed, or None."""
        scope = {"type": "lifespan", "asgi": ASGI_VERSIONS, "state": self.state}
        self._task = self._loop.create_task(self._run(scope))
        await self._events.put({"type": "lifespan.startup"})
        answer = await self._answers.get()
        if answer["type"] == "lifespan.startup.complete":
            return None
        if answer["type"] == "unsupported":
            self._supported = False
            return None
        # Frameworks send the whole traceback as the message (Starlette does): the boot
        # failure's line takes its last line, and the rest is for --log-level debug.
        message = str(answer.get("message") or "").strip()
        if "\n" in message:
            log("debug", f"worker {os.getpid()}: lifespan startup failed:\n{message}")
        return message.splitlines()[-1] if message else "lifespan.startup.failed"

    async def shutdown(self, within: float) -> None:
        if not self._supported or self._task is None or self._task.done():
            return
        await self._events.put({"type": "lifespan.shutdown"})
        try:
            answer = await asyncio.wait_for(self._answers.get(), within)
        except asyncio.TimeoutError:
            log("warning", f"worker {os.getpid()}: lifespan shutdown did not finish within {within:g} s")
            self._task.cancel()
            return
        if answer["type"] == "lifespan.shutdown.failed":
            log("error", f"worker {os.getpid()}: lifespan shutdown failed: {answer.get('message', '')}")

    async def _run(self, scope: Message) -> None:
        started = False

        async def receive() -> Message:
            return await self._events.get()

        async def send(message: Message) -> None:
            nonlocal started
            kind = message.get("type")
            if kind not in (
                "lifespan.startup.complete",
                "lifespan.startup.failed",
                "lifespan.shutdown.complete",
                "lifespan.shutdown.failed",
            ):
                raise RuntimeError(f"unexpected ASGI lifespan message {kind!r}")
            started = True
            await self._answers.put(message)

        try:
            await self._application(scope, receive, send)
        except BaseException as error:
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            if not started:
                # Raised before a word on the lifespan: it has none (Django's ASGIHandler raises
                # on any scope but http).
                log("debug", f"worker {os.getpid()}: the application does not support lifespan: {error!r}")
                await self._answers.put({"type": "unsupported"})
                return
            # After its answer (Starlette re-raises what made startup fail): that answer said it.
            trace = "".join(traceback.format_exception(error)).rstrip()
            log("debug", f"worker {os.getpid()}: the lifespan raised after its answer\n{trace}")
        else:
            if not started:
                await self._answers.put({"type": "unsupported"})
