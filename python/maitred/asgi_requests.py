"""The requests of an ASGI worker's channel (asgi.py): what an HTTP exchange and a WebSocket
share (the native exchange entered for each call, the task, --timeout, the lobby's news), and
each one's ASGI events (docs/ASGI.md)."""

from __future__ import annotations

import asyncio
import http
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from maitred._native import ClientDisconnected, Exchange, UnsendablePath
from maitred.log import log

if TYPE_CHECKING:
    from maitred.asgi import _Mux

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]

# A request body reaches the application in pieces of at most this many bytes, read from the
# lobby's spool (memory or a file) as the application asks for them, never whole.
BODY_PIECE = 64 * 1024

# A body that streams from its client through a pipe reaches it in pieces of up to this many
# bytes: as many as one read of the lobby's brings (crates/lobby's client/body.rs,
# BODY_READ_MOST). Each read of the pipe frees room that wakes the lobby to refill it, so at
# 64 KiB four chunked 512 MiB uploads to two workers (BODY-UP-ASGI-CHUNKED-4) made 56,000-69,000
# system calls per GiB; at 256 KiB, 24,000.
STREAMED_PIECE = 256 * 1024

# A response body is handed to the channel in pieces of at most this many bytes, so that what
# waits for room in the ring while a client reads slowly is one piece, not the whole body.
SEND_PIECE = 256 * 1024

# A request's sends that have not waited look for the lobby's news (its HOLD) once per this many
# bytes: one non-blocking read of the channel. So what the worker writes after the lobby sent
# HOLD is one piece, not the whole answer (docs/LIMITS.md, "A slow reader of an ASGI answer").
LOOK_EVERY = SEND_PIECE


_STATUS_LINES: dict[int, str] = {}


def status_line(status: object) -> str:
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


class Request:
    """What an HTTP exchange and a WebSocket share: the native exchange, entered into the channel
    for each call about it, its task, its --timeout and the news the lobby sends about it."""

    __slots__ = (
        "_news",
        "_unlooked",
        "deadline",
        "disconnected",
        "done",
        "expired",
        "held",
        "mux",
        "native",
        "scope",
        "task",
    )

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
        self._news: list[asyncio.Future[None]] = []
        # Bytes sent since this request's task last looked for news, or waited for it.
        self._unlooked = 0

    def call(self, method: Callable[..., Any], *args: Any) -> Any:
        """`method` of the channel, with this request entered."""
        channel = self.mux.channel
        channel.enter(self.native)
        try:
            return method(*args)
        finally:
            channel.leave(self.native)

    def tell(self) -> None:
        """The lobby said something about this request, or its state changed: every task
        waiting on it looks."""
        if not self._news:
            return
        waiting, self._news = self._news, []
        for news in waiting:
            if not news.done():
                news.set_result(None)

    async def wait_for_news(self) -> None:
        """Until `tell`. Several tasks may wait on one request at once: a framework's send and
        the receive it keeps waiting for `http.disconnect` (Django's, Quart's). One future for
        all, replaced by each wait, left the one waiting first unwoken for ever: a send held for
        a slow client never heard its GO."""
        news = self.mux.worker.loop.create_future()
        self._news.append(news)
        self._unlooked = 0
        await news

    def sent(self, size: int) -> None:
        """`size` bytes went to the channel: past LOOK_EVERY since the last look, the news is
        read now, so that a HOLD holds this send."""
        self._unlooked += size
        if self._unlooked >= LOOK_EVERY:
            self._unlooked = 0
            self.mux.look()

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


class HttpRequest(Request):
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
            try:
                piece = self._body.read(BODY_PIECE) if self._body.pipe is None else await self._arriving()
            except ClientDisconnected:
                # A streaming body cut short: the lobby stopped it, its client gone.
                self._body_left = False
                return {"type": "http.disconnect"}
            self._body_left = self._body.more
            return {"type": "http.request", "body": piece, "more_body": self._body_left}
        # The body is read: what comes next is the end, when the client goes or the response
        # is complete (ASGI's http.disconnect).
        while not (self.disconnected or self.done):
            await self.wait_for_news()
        return {"type": "http.disconnect"}

    async def _arriving(self) -> bytes:
        """The next piece of a body that streams from its client through a pipe (docs/ASGI.md,
        "Fast uploads stream"), awaited on the loop: the worker's other requests go on."""
        body, loop = self._body, asyncio.get_running_loop()
        while (piece := body.read_ready(STREAMED_PIECE)) is None:
            readable = loop.create_future()
            loop.add_reader(body.pipe, _settle, readable)
            try:
                await readable
            finally:
                loop.remove_reader(body.pipe)
        return piece

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if self.disconnected:
            raise ClientDisconnected(32, "the client has gone away")
        channel = self.mux.channel
        if kind == "http.response.start":
            self.call(channel.start, status_line(message["status"]), message.get("headers", ()))
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
                self.sent(min(end, len(body)) - start)
                self.deadline = None
                if channel.backlogged or self.held:
                    await self.drain()
            self.done = not more
        elif kind == "http.response.pathsend":
            await self._send_path(message["path"])
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} for an http scope")

    async def _send_path(self, path: object) -> None:
        """ASGI's Path Send: the file goes to the lobby as a descriptor, which it sends with
        sendfile(2), as wsgi.file_wrapper's; none of its bytes cross the worker. A relative path
        is the worker's working directory's, as for the application's own open()."""
        channel = self.mux.channel
        try:
            self.call(channel.send_path, path)
        except UnsendablePath as error:
            # The application named a file the server cannot send: its client gets a 500 and
            # the log one line; the application's send returns, its answer being complete.
            log("error", f"http.response.pathsend for {self.line}: {error}; answered 500")
            self.call(channel.fail, str(error))
        self.done = True
        self.deadline = None
        if channel.backlogged or self.held:
            await self.drain()


class WebSocketRequest(Request):
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
            data = text if text is not None else message.get("bytes") or b""
            self.call(channel.ws_send, data)
            self.sent(len(data))
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
            self.call(channel.start, status_line(message["status"]), message.get("headers", ()))
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


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
