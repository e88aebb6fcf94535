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
import http
import inspect
import os
import time
import traceback
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from maitred._native import ChannelClosed, ChannelError, ClientDisconnected, Exchange, WorkerChannel
from maitred.lifespan import Lifespan
from maitred.log import log
from maitred.rings import OwedRings
from maitred.watchdog import Watchdog

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Application = Callable[[Scope, Receive, Send], Awaitable[None]]

# A request body reaches the application in pieces of at most this many bytes, read from the
# lobby's spool (memory or a file) as the application asks for them, never whole.
BODY_PIECE = 64 * 1024

# A response body is handed to the channel in pieces of at most this many bytes, so that what
# waits for room in the ring while a client reads slowly is one piece, not the whole body.
SEND_PIECE = 256 * 1024


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


_STATUS_LINES: dict[int, str] = {}


def _status_line(status: object) -> str:
    """`200` as `"200 OK"`, the form the channel checks (an unknown code gets no reason)."""
    if type(status) is not int:
        raise TypeError(f"the response status must be an int, not {type(status).__name__}")
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            line = f"{status} {http.HTTPStatus(status).phrase}"
        except ValueError:
            line = str(status)
        if len(_STATUS_LINES) < 1000:
            _STATUS_LINES[status] = line
    return line


class _Request:
    """What an HTTP exchange and a WebSocket share: the native exchange, entered into the channel
    for each call about it, its task, its --timeout and the news the lobby sends about it."""

    __slots__ = ("_news", "deadline", "disconnected", "done", "expired", "held", "mux", "native", "scope", "task")

    def __init__(self, mux: _Mux, scope: Scope, native: Exchange) -> None:
        self.mux = mux
        self.native = native
        self.scope = scope
        self.done = False
        self.disconnected = False
        # The lobby holds its answer for a slow client (HOLD): its sends wait for GO.
        self.held = False
        self.task: asyncio.Task[None] | None = None
        # When it runs past --timeout (time.monotonic()); None: never (an answer that has
        # started streams as long as it likes: docs/ASGI.md).
        self.deadline: float | None = None
        self.expired = False
        self._news: asyncio.Future[None] | None = None

    def call(self, method: Callable[..., Any], *args: Any) -> Any:
        """`method` of the channel, with this request entered."""
        channel = self.mux.channel
        channel.enter(self.native)
        try:
            return method(*args)
        finally:
            channel.leave(self.native)

    def tell(self) -> None:
        """The lobby said something about this request, or its state changed: its task looks."""
        if self._news is not None and not self._news.done():
            self._news.set_result(None)

    async def wait_for_news(self) -> None:
        self._news = self.mux.worker.loop.create_future()
        await self._news

    def heard(self) -> None:
        """After news: a CANCEL is the client gone; HOLD and GO hold and free its sends."""
        channel = self.mux.channel
        channel.enter(self.native)
        try:
            self.disconnected |= channel.cancelled
            self.held = channel.held
        finally:
            channel.leave(self.native)

    async def drain(self) -> None:
        """Waits until the frames that found the ring full are written, and while the lobby
        holds this answer for a slow client (HOLD, until GO)."""
        channel = self.mux.channel
        if channel.backlogged:
            while not self.call(channel.flush):
                await self.wait_for_news()
            # The flush took back the flag that says the worker sleeps: the look for requests
            # sets it again, so that the lobby rings for the next one.
            self.mux.take()
        while self.held and not self.disconnected:
            await self.wait_for_news()
        if self.disconnected:
            raise ClientDisconnected(32, "the client has gone away")

    def expire(self) -> None:
        """Past --timeout: the request's task is cancelled (asyncio.timeout needs Python 3.11,
        and one timer a request costs more than the heartbeat's look)."""
        self.deadline = None
        self.expired = True
        if self.task is not None:
            self.task.cancel()


class _Exchange(_Request):
    """One HTTP request: the application's `receive` and `send`."""

    __slots__ = ("_body", "_body_left")

    def __init__(self, mux: _Mux, scope: Scope, body: Any, native: Exchange) -> None:
        super().__init__(mux, scope, native)
        self._body = body
        self._body_left = True

    @property
    def line(self) -> str:
        """The request, for the log: its method and target."""
        return f"{self.scope['method']} {self.scope['raw_path'].decode('latin-1')}"

    async def receive(self) -> Message:
        if self._body_left and not self.disconnected:
            piece = self._body.read(BODY_PIECE)
            self._body_left = self._body.remaining > 0
            return {"type": "http.request", "body": piece, "more_body": self._body_left}
        # The body is read: what comes next is the end, when the client goes or the response
        # is complete (ASGI's http.disconnect).
        while not (self.disconnected or self.done):
            await self.wait_for_news()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if self.disconnected:
            raise ClientDisconnected(32, "the client has gone away")
        channel = self.mux.channel
        if kind == "http.response.start":
            self.call(channel.start, _status_line(message["status"]), message.get("headers", ()))
            # The answer starts when its head goes: from then on it is a stream, which --timeout
            # does not cut (docs/ASGI.md, "Streams").
        elif kind == "http.response.body":
            if self.done:
                raise RuntimeError("http.response.body was sent after the response was complete")
            body = message.get("body", b"")
            more = bool(message.get("more_body", False))
            # An empty body is one piece too: it may end the response.
            for start in range(0, len(body), SEND_PIECE) if body else (0,):
                end = start + SEND_PIECE
                self.call(channel.send, body[start:end], more or end < len(body))
                self.deadline = None
                if channel.backlogged or self.held:
                    await self.drain()
            self.done = not more
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} for an http scope")


class _WebSocket(_Request):
    """One WebSocket: the lobby did the handshake and does the framing; here are ASGI's
    `websocket.*` events, whole messages each (docs/PROTOCOL.md, section 5)."""

    __slots__ = ("_close_code", "_connected", "accepted")

    def __init__(self, mux: _Mux, scope: Scope, native: Exchange) -> None:
        super().__init__(mux, scope, native)
        self._connected = False
        self._close_code = 1000
        self.accepted = False

    @property
    def line(self) -> str:
        return f"WebSocket {self.scope['raw_path'].decode('latin-1')}"

    async def receive(self) -> Message:
        if not self._connected:
            self._connected = True
            return {"type": "websocket.connect"}
        if self.done:
            # The application closed it (or refused it): what is left to receive is the end,
            # as a framework that keeps receiving until it sees one expects (Channels).
            return {"type": "websocket.disconnect", "code": self._close_code, "reason": ""}
        channel = self.mux.channel
        while True:
            event = self.call(channel.ws_receive)
            if event is not None:
                if event["type"] == "websocket.disconnect":
                    self.disconnected = True
                return event
            await self.wait_for_news()

    async def send(self, message: Message) -> None:
        kind = message["type"]
        channel = self.mux.channel
        if self.done:
            raise ClientDisconnected(32, "the WebSocket is closed")
        if kind == "websocket.send":
            if self.disconnected:
                raise ClientDisconnected(32, "the client has closed the WebSocket")
            text = message.get("text")
            self.call(channel.ws_send, text if text is not None else message.get("bytes") or b"")
            if channel.backlogged or self.held:
                await self.drain()
        elif kind == "websocket.accept":
            self.call(channel.ws_accept, message.get("subprotocol"), message.get("headers", ()))
            self.accepted = True
            # --timeout runs until a WebSocket is accepted: then it lives as long as it is wanted.
            self.deadline = None
        elif kind == "websocket.close":
            self._close_code = int(message.get("code", 1000))
            self.call(channel.ws_close, self._close_code, message.get("reason") or "")
            self.done = True
        elif kind == "websocket.http.response.start" and not self.accepted:
            # ASGI's denial response, in place of the 403 of a refusal.
            self.call(channel.start, _status_line(message["status"]), message.get("headers", ()))
        elif kind == "websocket.http.response.body" and not self.accepted:
            more = bool(message.get("more_body", False))
            self.call(channel.send, message.get("body", b""), more)
            self.done = not more
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} for a websocket scope")

    def finish(self, code: int = 1000) -> None:
        """The application is done: every WebSocket ends with WS_CLOSE (before
        websocket.accept, the lobby answers 403)."""
        if not self.done:
            self.call(self.mux.channel.ws_close, code, "")
            self.done = True


class _Mux:
    """The worker's one channel to the lobby, carrying every request it runs at once, each by
    the id the lobby gave it (docs/PROTOCOL.md, section 4)."""

    def __init__(self, worker: _Worker, channel: WorkerChannel) -> None:
        self.worker = worker
        self.channel = channel
        self.requests: dict[int, _Request] = {}
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
            self.take(channel_readable)
            # The look for a request on the channel may have read the rest of a frame of news
            # (a large WS_MESSAGE) that the socket no longer shows as readable: sorted now.
            more, closed = self.channel.route_after_take()
            told += more
        except ChannelError as error:
            self.worker.broken(error)
            return
        requests = self.requests
        for request_id in told:
            request = requests.get(request_id)
            if request is not None:
                request.heard()
                request.tell()
        # Room in the ring (the bell) is news to every request with frames waiting.
        if self.channel.backlogged or not channel_readable:
            for request in requests.values():
                request.tell()
        if closed:
            self._unwatch()
            if not requests:
                self.worker.channel_closed()

    def take(self, channel_readable: bool = False) -> None:
        """Takes every request the lobby has queued, and starts a task for each."""
        channel = self.channel
        while True:
            taken = channel.receive_scope(self.worker.state, channel_readable)
            channel_readable = False
            if self._bell is None:
                self._watch_bell()
            if taken is None:
                return
            scope, body, native = taken
            request: _Request = (
                _WebSocket(self, scope, native)
                if scope["type"] == "websocket"
                else _Exchange(self, scope, body, native)
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

    async def _run(self, request: _Request) -> None:
        channel = self.channel
        worker = self.worker
        try:
            await worker.application(request.scope, request.receive, request.send)  # type: ignore[attr-defined]
            if isinstance(request, _WebSocket):
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
            if isinstance(request, _WebSocket):
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
            if isinstance(request, _WebSocket):
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
