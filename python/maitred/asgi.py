"""An ASGI worker: one event loop serves every channel of the worker, a request at a time on
each, so that the lobby, which seats a request only where a channel is free, holds the rest in
its one FIFO (docs/PROTOCOL.md, section 4; docs/ASGI.md).

Each channel is watched by the loop (its socket, and its bell once the lobby has sent it); the
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

from maitred._native import ChannelClosed, ChannelError, ClientDisconnected, WorkerChannel
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


class _Exchange:
    """One request: the application's `receive` and `send`, and where its response stands."""

    __slots__ = ("_body", "_body_left", "_channel", "_seat", "disconnected", "done", "scope")

    def __init__(self, seat: _Seat, scope: Scope, body: Any) -> None:
        self._seat = seat
        self._channel = seat.channel
        self.scope = scope
        self._body = body
        self._body_left = True
        self.done = False
        self.disconnected = False

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
            await self._seat.wait_for_news()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if self.disconnected:
            raise ClientDisconnected(32, "the client has gone away")
        if kind == "http.response.start":
            self._channel.start(_status_line(message["status"]), message.get("headers", ()))
        elif kind == "http.response.body":
            if self.done:
                raise RuntimeError("http.response.body was sent after the response was complete")
            body = message.get("body", b"")
            more = bool(message.get("more_body", False))
            channel = self._channel
            # An empty body is one piece too: it may end the response.
            for start in range(0, len(body), SEND_PIECE) if body else (0,):
                end = start + SEND_PIECE
                channel.send(body[start:end], more or end < len(body))
                if channel.backlogged:
                    await self._seat.drain()
            self.done = not more
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} for an http scope")


class _WebSocket:
    """One WebSocket: the lobby did the handshake and does the framing; here are ASGI's
    `websocket.*` events, whole messages each (docs/PROTOCOL.md, section 5)."""

    __slots__ = ("_channel", "_close_code", "_connected", "_seat", "accepted", "disconnected", "done", "scope")

    def __init__(self, seat: _Seat, scope: Scope) -> None:
        self._seat = seat
        self._channel = seat.channel
        self.scope = scope
        self._connected = False
        self._close_code = 1000
        self.accepted = False
        self.disconnected = False
        self.done = False

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
        while True:
            event = self._channel.ws_receive()
            if event is not None:
                if event["type"] == "websocket.disconnect":
                    self.disconnected = True
                return event
            if self.disconnected:
                # Its client left before the 101 (the lobby's CANCEL): ASGI's abnormal closure.
                return {"type": "websocket.disconnect", "code": 1006, "reason": ""}
            await self._seat.wait_for_news()

    async def send(self, message: Message) -> None:
        kind = message["type"]
        channel = self._channel
        if self.done:
            raise ClientDisconnected(32, "the WebSocket is closed")
        if kind == "websocket.send":
            if self.disconnected:
                raise ClientDisconnected(32, "the client has closed the WebSocket")
            text = message.get("text")
            channel.ws_send(text if text is not None else message.get("bytes") or b"")
            if channel.backlogged:
                await self._seat.drain()
        elif kind == "websocket.accept":
            channel.ws_accept(message.get("subprotocol"), message.get("headers", ()))
            self.accepted = True
            # --timeout runs until a WebSocket is accepted: then it lives as long as it is wanted.
            self._seat.deadline = None
        elif kind == "websocket.close":
            self._close_code = int(message.get("code", 1000))
            channel.ws_close(self._close_code, message.get("reason") or "")
            self.done = True
        elif kind == "websocket.http.response.start" and not self.accepted:
            # ASGI's denial response, in place of the 403 of a refusal.
            channel.start(_status_line(message["status"]), message.get("headers", ()))
        elif kind == "websocket.http.response.body" and not self.accepted:
            more = bool(message.get("more_body", False))
            channel.send(message.get("body", b""), more)
            self.done = not more
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} for a websocket scope")

    def finish(self, code: int = 1000) -> None:
        """The application is done: every WebSocket ends with WS_CLOSE, which frees the seat
        (before websocket.accept, the lobby answers 403)."""
        if not self.done:
            self._channel.ws_close(code, "")
            self.done = True


class _Seat:
    """One channel of the worker: a seat, to the lobby, that takes a request at a time."""

    def __init__(self, worker: _Worker, channel: WorkerChannel) -> None:
        self.worker = worker
        self.channel = channel
        self.exchange: _Exchange | _WebSocket | None = None
        self.task: asyncio.Task[None] | None = None
        # When the request in progress runs past --timeout (time.monotonic()); None: never.
        self.deadline: float | None = None
        self.expired = False
        self._news: asyncio.Future[None] | None = None
        self._socket, self._bell = channel.watched()
        worker.loop.add_reader(self._socket, self.readable)
        channel.ring_later(self.ring_later)

    def ring_later(self) -> bool:
        """An answer was written: True to ring the lobby's bell at once, False when the loop
        rings it at the end of its turn."""
        return self.worker.rings.later(self.channel)

    def readable(self, channel_readable: bool = True) -> None:
        """The channel (or, not channel_readable, the bell) is readable: a request came (when
        idle), or news of the one in progress (a CANCEL, room in the ring, the channel closed)."""
        try:
            if self.exchange is None:
                self.take(channel_readable)
                return
            state = self.channel.look()
        except ChannelError as error:
            self.worker.broken(error)
            return
        if state == 1:
            self.exchange.disconnected = True
        elif state == 2:
            self._unwatch()
        self._tell()

    def _tell(self) -> None:
        if self._news is not None and not self._news.done():
            self._news.set_result(None)

    async def wait_for_news(self) -> None:
        self._news = self.worker.loop.create_future()
        await self._news

    async def drain(self) -> None:
        """Waits until the frames that found the ring full are written."""
        while not self.channel.flush():
            await self.wait_for_news()

    def take(self, channel_readable: bool = False) -> None:
        """Takes the next request, if the lobby has sent one, and starts its task. The channel's
        socket is read only when the loop found it readable: whatever it holds otherwise, the
        loop's watch calls `readable` for."""
        taken = self.channel.receive_scope(self.worker.state, channel_readable)
        if self._bell is None:
            self._watch_bell()
        if taken is None:
            if self.channel.closed:
                self._unwatch()
                self.worker.seat_closed(self)
            return
        scope, body = taken
        exchange = _WebSocket(self, scope) if scope["type"] == "websocket" else _Exchange(self, scope, body)
        self.exchange = exchange
        self.worker.rings.busy_seats += 1
        self.deadline = time.monotonic() + self.worker.options.timeout
        self.expired = False
        self.task = self.worker.loop.create_task(self._run(scope, exchange))

    def expire(self) -> None:
        """Past --timeout: the request's task is cancelled (asyncio.timeout needs Python 3.11,
        and one timer a request costs more than the heartbeat's look)."""
        self.deadline = None
        self.expired = True
        if self.task is not None:
            self.task.cancel()

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

    async def _run(self, scope: Scope, exchange: _Exchange | _WebSocket) -> None:
        channel = self.channel
        worker = self.worker
        try:
            await worker.application(scope, exchange.receive, exchange.send)
            if isinstance(exchange, _WebSocket):
                exchange.finish()
            elif exchange.disconnected and not exchange.done:
                # It heard http.disconnect and stopped, as it should: the answer ends here.
                channel.fail("the client went away")
            elif not exchange.done:
                log("error", f"the application returned without completing its response to {exchange.line}")
                channel.fail("the application returned without completing its response")
        except asyncio.CancelledError:
            if not self.expired:
                raise
            log("error", f"{exchange.line} ran past --timeout ({worker.options.timeout:g} s): its task was cancelled")
            if isinstance(exchange, _WebSocket):
                exchange.finish()
            else:
                channel.timed_out("the request ran past --timeout")
        except ChannelError as error:
            worker.broken(error)
            return
        except Exception as error:  # noqa: BLE001 - the application's failure, whatever it was
            if exchange.disconnected:
                # Whatever the application raised once its client had gone (the OSError of a
                # send, or its own), nobody is left to answer.
                log("info", f"client went away during {exchange.line}; response abandoned")
            else:
                trace = "".join(traceback.format_exception(error)).rstrip()
                log("error", f"Error handling request {exchange.line}\n{trace}")
            if isinstance(exchange, _WebSocket):
                # Accepted, the client hears Close 1011 (internal error); not yet, a 500 in
                # place of the 101.
                if exchange.accepted or exchange.disconnected:
                    exchange.finish(1011)
                else:
                    channel.fail(f"{type(error).__name__}: {error}")
            elif exchange.disconnected:
                channel.fail("the client went away")
            else:
                channel.fail(f"{type(error).__name__}: {error}")
        finally:
            self.deadline = None
        try:
            if channel.backlogged:
                await self.drain()
        except ClientDisconnected:
            pass
        except ChannelError as error:
            worker.broken(error)
            return
        exchange.done = True
        self.exchange = None
        self.worker.rings.busy_seats -= 1
        self.task = None
        self._tell()
        try:
            self.take()
        except ChannelError as error:
            worker.broken(error)


class _Worker:
    """The worker's loop, its seats, and how it ends."""

    def __init__(
        self, channels: list[WorkerChannel], application: Application, options: Options, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.application = application
        self.options = options
        self.loop = loop
        self.channels = channels
        # The lifespan's state, of which every request's scope gets a shallow copy.
        self.state: dict[str, Any] = {}
        self._open = len(channels)
        self._done: asyncio.Future[int] = loop.create_future()
        self.seats: list[_Seat] = []
        # The bells this worker's answers owe the lobby, and its seats in use.
        self.rings = OwedRings(loop, self.broken)

    def start(self) -> None:
        self.seats = [_Seat(self, channel) for channel in self.channels]

    def expire_overdue(self, now: float) -> None:
        """At the loop's heartbeat: cancels the requests past --timeout."""
        for seat in self.seats:
            if seat.deadline is not None and seat.deadline <= now:
                seat.expire()

    def in_progress(self) -> str:
        """The requests in progress, for the watchdog's line: read from its thread while the
        loop is stuck, each seat's exchange once."""
        exchanges = [seat.exchange for seat in self.seats]
        return ", ".join(exchange.line for exchange in exchanges if exchange is not None) or "no request"

    def seat_closed(self, seat: _Seat) -> None:
        self._open -= 1
        if self._open == 0 and not self._done.done():
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


def serve(
    channels: list[WorkerChannel], application: Application, options: Options, boot_failed: Callable[[str], int]
) -> int:
    """Runs the lifespan's startup, says READY on every channel, and serves them until the
    lobby closes them all; then runs the shutdown. Returns the exit code."""
    try:
        loop = new_event_loop(options.loop)
    except ImportError:
        return boot_failed("--loop uvloop: uvloop is not installed (pip install uvloop)")
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(_serve(channels, application, options, boot_failed, loop))
    finally:
        loop.close()


async def _serve(
    channels: list[WorkerChannel],
    application: Application,
    options: Options,
    boot_failed: Callable[[str], int],
    loop: asyncio.AbstractEventLoop,
) -> int:
    lifespan = Lifespan(application, loop)
    failure = await lifespan.startup()
    if failure is not None:
        return boot_failed(f"the application's lifespan startup failed: {failure}")
    worker = _Worker(channels, application, options, loop)
    worker.state = lifespan.state
    for channel in channels:
        channel.ready()
    worker.start()
    watchdog = Watchdog(loop, worker.expire_overdue, worker.rings.while_stalled, worker.in_progress)
    watchdog.beat()
    watchdog.start()
    try:
        code = await worker.finished()
    finally:
        watchdog.stop()
    await lifespan.shutdown(options.graceful_timeout)
    return code
