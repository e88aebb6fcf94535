"""An ASGI worker: one event loop serves the worker's one channel, which carries any number of
requests at once, each named by the id the lobby gave it; the lobby admits requests to the
worker while they wait for their answers to start, and holds the rest in its one FIFO
(docs/PROTOCOL.md, section 4; docs/ASGI.md).

The channel is watched by the loop (its socket, and its bell once the lobby has sent it); the
native channel never waits: where a WSGI worker sleeps in poll(2), it says that it sleeps and
returns, and the loop calls back when the lobby rings. What is left here is the ASGI part:
the scope's events, the lifespan, the request's task and its --timeout, and the watchdog that
names the call that blocks the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from maitred._native import ChannelClosed, ChannelError, ClientDisconnected, WorkerChannel
from maitred.asgi_requests import HttpRequest, Message, Request, Scope, WebSocketRequest
from maitred.lifespan import Lifespan
from maitred.log import log
from maitred.rings import OwedRings
from maitred.watchdog import Watchdog

Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Application = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_asgi(application: object) -> bool:
    """ASGI 3 by its signature: a coroutine function of (scope, receive, send), or an object
    whose __call__ is one. A WSGI application is a plain callable of (environ, start_response)."""
    call = application if inspect.isroutine(application) else getattr(application, "__call__", None)  # noqa: B004
    if call is None:
        return False
    if inspect.iscoroutinefunction(call):
        return True
    # Wrapped callables (functools.partial, a decorator that hides the coroutine) by their
    # parameters: three required is ASGI 3, two is WSGI.
    try:
        parameters = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [
        p for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(required) == 3


@dataclass(frozen=True)
class Options:
    """What an ASGI worker takes from the settings."""

    loop: str  # auto, asyncio or uvloop (--loop)
    timeout: float  # --timeout: a request's task is cancelled past it
    graceful_timeout: float  # how long lifespan's shutdown may take


def new_event_loop(choice: str) -> asyncio.AbstractEventLoop:
    """The event loop --loop asks for: uvloop when installed (auto) or asked for, else asyncio's."""
    if choice in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class _Mux:
    """The worker's one channel to the lobby, carrying every request it runs at once, each by
    the id the lobby gave it (docs/PROTOCOL.md, section 4)."""

    def __init__(self, worker: _Worker, channel: WorkerChannel) -> None:
        self.worker = worker
        self.channel = channel
        self.requests: dict[int, Request] = {}
        self._socket, self._bell = channel.watched()
        worker.loop.add_reader(self._socket, self.readable)
        channel.ring_later(self.ring_later)

    def ring_later(self) -> bool:
        """An answer was written: True to ring the lobby's bell at once, False when the loop
        rings it at the end of its turn."""
        return self.worker.rings.later(self.channel)

    def readable(self, channel_readable: bool = True) -> None:
        """The channel (or, not channel_readable, the bell) is readable: requests came, news of
        those in progress (a CANCEL, HOLD/GO, WebSocket messages, room in the ring), or the
        channel closed."""
        try:
            # News first: a look at the channel takes back the flag that says the worker sleeps,
            # which the look for requests then sets again when none is queued.
            told, closed = self.channel.route()
            more, closed = self._take(channel_readable)
        except ChannelError as error:
            self.worker.broken(error)
            return
        self._tell(told + more)
        requests = self.requests
        # Room in the ring (the bell) is news to every request with frames waiting.
        if self.channel.backlogged or not channel_readable:
            for request in requests.values():
                request.tell()
        if closed:
            self._unwatch()
            if not requests:
                self.worker.channel_closed()

    def look(self) -> None:
        """Reads what the channel holds now, for a task whose sends have not waited: the loop
        reads the channel only once a task waits, and a coroutine that sends a generated answer
        as fast as the lobby reads the ring may never wait, nor read its `HOLD`. It is the
        loop's own reading (`readable`), so that nothing it reads is left unseen: a new worker's
        bell, which arrives while its first request runs (read and not watched, it left that
        request waiting for room in the ring for ever), a request on the channel, its end."""
        self.readable()

    def take(self) -> None:
        """Takes every request the lobby has queued, starts a task for each, and tells the
        requests in progress the news the look read off the channel."""
        told, _closed = self._take(False)
        self._tell(told)

    def _tell(self, told: list[int]) -> None:
        requests = self.requests
        for request_id in told:
            request = requests.get(request_id)
            if request is not None:
                request.heard()
                request.tell()

    def _take(self, channel_readable: bool) -> tuple[list[int], bool]:
        """Takes every request the lobby has queued, and starts a task for each. The look for a
        request on the channel may have read news (the rest of a large WS_MESSAGE, which the
        socket no longer shows as readable): the ids it is for, sorted, and whether the lobby
        has closed the channel."""
        channel = self.channel
        while True:
            taken = channel.receive_scope(self.worker.state, channel_readable)
            channel_readable = False
            if self._bell is None:
                self._watch_bell()
            if taken is None:
                return channel.route_after_take()
            scope, body, native = taken
            request: Request = (
                WebSocketRequest(self, scope, native)
                if scope["type"] == "websocket"
                else HttpRequest(self, scope, body, native)
            )
            self.requests[native.id] = request
            self.worker.rings.busy_seats += 1
            request.deadline = time.monotonic() + self.worker.options.timeout
            request.task = self.worker.loop.create_task(self._run(request))

    def _watch_bell(self) -> None:
        """The bell comes after READY, with the shared region: watched from the first look on."""
        bell = self.channel.watched()[1]
        if bell is not None:
            self._bell = bell
            self.worker.loop.add_reader(bell, self.bell_rang)

    def bell_rang(self) -> None:
        try:
            self.channel.bell_rang()
        except ChannelError as error:
            self.worker.broken(error)
            return
        self.readable(channel_readable=False)

    def _unwatch(self) -> None:
        loop = self.worker.loop
        loop.remove_reader(self._socket)
        if self._bell is not None:
            loop.remove_reader(self._bell)
            self._bell = None

    async def _run(self, request: Request) -> None:
        channel = self.channel
        worker = self.worker
        try:
            await worker.application(request.scope, request.receive, request.send)  # type: ignore[attr-defined]
            if isinstance(request, WebSocketRequest):
                request.finish()
            elif request.disconnected and not request.done:
                # It heard http.disconnect and stopped, as it should: the answer ends here.
                request.call(channel.fail, "the client went away")
            elif not request.done:
                log("error", f"the application returned without completing its response to {request.line}")  # type: ignore[attr-defined]
                request.call(channel.fail, "the application returned without completing its response")
        except asyncio.CancelledError:
            if not request.expired:
                raise
            log("error", f"{request.line} ran past --timeout ({worker.options.timeout:g} s): its task was cancelled")  # type: ignore[attr-defined]
            if isinstance(request, WebSocketRequest):
                request.finish()
            else:
                request.call(channel.timed_out, "the request ran past --timeout")
        except ChannelError as error:
            worker.broken(error)
            return
        except Exception as error:  # noqa: BLE001 - the application's failure, whatever it was
            line = request.line  # type: ignore[attr-defined]
            if request.disconnected:
                # Whatever the application raised once its client had gone (the OSError of a
                # send, or its own), nobody is left to answer.
                log("info", f"client went away during {line}; response abandoned")
            else:
                trace = "".join(traceback.format_exception(error)).rstrip()
                log("error", f"Error handling request {line}\n{trace}")
            if isinstance(request, WebSocketRequest):
                # Accepted, the client hears Close 1011 (internal error); not yet, a 500 in
                # place of the 101.
                if request.accepted or request.disconnected:
                    request.finish(1011)
                else:
                    request.call(channel.fail, f"{type(error).__name__}: {error}")
            elif request.disconnected:
                request.call(channel.fail, "the client went away")
            else:
                request.call(channel.fail, f"{type(error).__name__}: {error}")
        finally:
            request.deadline = None
        try:
            if channel.backlogged:
                while not request.call(channel.flush):
                    await request.wait_for_news()
                self.take()
        except ClientDisconnected:
            pass
        except ChannelError as error:
            worker.broken(error)
            return
        request.done = True
        channel.end(request.native)
        del self.requests[request.native.id]
        worker.rings.busy_seats -= 1
        request.task = None
        if channel.closed and not self.requests:
            self._unwatch()
            worker.channel_closed()


class _Worker:
    """The worker's loop, its channel, and how it ends."""

    def __init__(
        self, channel: WorkerChannel, application: Application, options: Options, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.application = application
        self.options = options
        self.loop = loop
        self.channel = channel
        # The lifespan's state, of which every request's scope gets a shallow copy.
        self.state: dict[str, Any] = {}
        self._done: asyncio.Future[int] = loop.create_future()
        self.mux: _Mux | None = None
        # The bells this worker's answers owe the lobby, and its requests in progress.
        self.rings = OwedRings(loop, self.broken)

    def start(self) -> None:
        self.mux = _Mux(self, self.channel)

    def beat(self, now: float, lag: float) -> None:
        """At the loop's heartbeat: publishes its lag for the lobby's admission, and cancels
        the requests past --timeout whose answers have not started."""
        self.channel.beat(lag)
        self.expire_overdue(now)

    def expire_overdue(self, now: float) -> None:
        if self.mux is None:
            return
        for request in list(self.mux.requests.values()):
            if request.deadline is not None and request.deadline <= now:
                request.expire()

    def in_progress(self) -> str:
        """The requests in progress, for the watchdog's line: read from its thread while the
        loop is stuck."""
        requests = list(self.mux.requests.values()) if self.mux is not None else []
        lines = [request.line for request in requests[:10]]  # type: ignore[attr-defined]
        if len(requests) > 10:
            lines.append(f"{len(requests) - 10} more")
        return ", ".join(lines) or "no request"

    def channel_closed(self) -> None:
        if not self._done.done():
            self._done.set_result(0)

    def broken(self, error: ChannelError) -> None:
        if isinstance(error, ChannelClosed):
            log("debug", f"worker {os.getpid()}: {error}")
            code = 0
        else:
            log("error", f"worker {os.getpid()}: {error}")
            code = 1
        if not self._done.done():
            self._done.set_result(code)

    async def finished(self) -> int:
        return await self._done


def serve(channel: WorkerChannel, application: Application, options: Options, boot_failed: Callable[[str], int]) -> int:
    """Runs the lifespan's startup, says READY on the channel, and serves it until the lobby
    closes it; then runs the shutdown. Returns the exit code."""
    try:
        loop = new_event_loop(options.loop)
    except ImportError:
        return boot_failed("--loop uvloop: uvloop is not installed (pip install uvloop)")
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(_serve(channel, application, options, boot_failed, loop))
    finally:
        loop.close()


async def _serve(
    channel: WorkerChannel,
    application: Application,
    options: Options,
    boot_failed: Callable[[str], int],
    loop: asyncio.AbstractEventLoop,
) -> int:
    lifespan = Lifespan(application, loop)
    failure = await lifespan.startup()
    if failure is not None:
        return boot_failed(f"the application's lifespan startup failed: {failure}")
    worker = _Worker(channel, application, options, loop)
    worker.state = lifespan.state
    channel.ready()
    worker.start()
    watchdog = Watchdog(loop, worker.beat, worker.rings.while_stalled, worker.in_progress)
    watchdog.beat()
    watchdog.start()
    try:
        code = await worker.finished()
    finally:
        watchdog.stop()
    await lifespan.shutdown(options.graceful_timeout)
    return code
