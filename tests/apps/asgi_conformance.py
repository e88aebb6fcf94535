"""A plain ASGI 3 application, no framework in between, for tests/test_asgi_conformance.py: what
the ASGI specification asks of a server, seen from the application.

- `/scope` answers with the HTTP scope described (`describe`), `/lifespan-scope` with the
  lifespan scope this worker's startup was given; a WebSocket to `/scope` sends its own scope
  described, then closes.
- `/hop-by-hop` streams Server-Sent Events with the hop-by-hop headers such endpoints send
  (`connection: keep-alive`, `transfer-encoding: chunked`, `keep-alive`); `/hop-close` says
  `connection: close`.
- `/first-then-wait` sends one chunk, then awaits `receive()`: what comes, and when
  (`time.monotonic()`, one clock for every process), goes to the events file.
- `/stubborn` catches the cancellation of its task and awaits `STUBBORN_FOR` s more; `/sleep`
  awaits, `/block` blocks its event loop with `time.sleep`; `/pid` is the worker's pid.

ASGI_EVENTS names the events file: one line per event, `name pid value`.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

EVENTS = os.environ.get("ASGI_EVENTS")
# How long /stubborn goes on once its task is cancelled.
STUBBORN_FOR = 3.0
# How long /first-then-wait waits for its receive() before it gives up on the server.
PATIENCE = 10.0

lifespan_scope: dict[str, Any] = {}


def record(event: str, value: object = "") -> None:
    if EVENTS:
        with open(EVENTS, "a") as events:
            events.write(f"{event} {os.getpid()} {value}\n")


def describe(value: object) -> object:
    """`value` as JSON that keeps its Python types: `[type name, described contents]`."""
    if isinstance(value, dict):
        return ["dict", {str(key): describe(item) for key, item in value.items()}]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [describe(item) for item in value]]
    if isinstance(value, bytes):
        return ["bytes", value.decode("latin-1")]
    if value is None or isinstance(value, (str, int, float, bool)):
        return [type(value).__name__, value]
    return [type(value).__name__, repr(value)]


async def answer(send: Send, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": headers or [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


async def lifespan(scope: Scope, receive: Receive, send: Send) -> None:
    lifespan_scope.update(describe(dict(scope))[1])
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            scope["state"]["greeting"] = "from lifespan"
            record("startup")
            await send({"type": "lifespan.startup.complete"})
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return


async def websocket(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": json.dumps(describe(dict(scope))[1])})
    await send({"type": "websocket.close", "code": 1000})


async def first_then_wait(send: Send, receive: Receive) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
    record("first-sent", time.monotonic())

    async def past_the_body() -> MutableMapping[str, Any]:
        while (message := await receive())["type"] == "http.request":
            pass
        return message

    try:
        message = await asyncio.wait_for(past_the_body(), PATIENCE)
    except asyncio.TimeoutError:
        record("no-message")
        return
    record(message["type"], time.monotonic())
    try:
        await send({"type": "http.response.body", "body": b"second\n", "more_body": True})
    except OSError as error:
        record("send-raised", type(error).__name__)
    else:
        record("send-returned")


async def stubborn(send: Send) -> None:
    record("stubborn-started", time.monotonic())
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        record("stubborn-cancelled", time.monotonic())
        await asyncio.sleep(STUBBORN_FOR)
        record("stubborn-done", time.monotonic())
        raise
    await answer(send, b"not cancelled\n")


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        return await lifespan(scope, receive, send)
    if scope["type"] == "websocket":
        return await websocket(scope, receive, send)
    path = scope["path"]
    query = {key: values[0] for key, values in parse_qs(scope["query_string"].decode()).items()}
    seconds = float(query.get("seconds", "1"))
    if path == "/scope":
        await answer(send, json.dumps(describe(dict(scope))[1]).encode(), [(b"content-type", b"application/json")])
    elif path == "/lifespan-scope":
        await answer(send, json.dumps(lifespan_scope).encode(), [(b"content-type", b"application/json")])
    elif path == "/hop-by-hop":
        headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"connection", b"keep-alive"),
            (b"transfer-encoding", b"chunked"),
            (b"keep-alive", b"timeout=5"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: 2\n\n"})
    elif path == "/hop-close":
        await answer(send, b"bye\n", [(b"content-type", b"text/plain"), (b"connection", b"close")])
    elif path == "/first-then-wait":
        await first_then_wait(send, receive)
    elif path == "/stubborn":
        await stubborn(send)
    elif path == "/sleep":
        await asyncio.sleep(seconds)
        await answer(send, f"{os.getpid()} slept {seconds}\n".encode())
    elif path == "/block":
        time.sleep(seconds)  # noqa: ASYNC251 - the mistake under test: a blocking call in async code
        await answer(send, f"{os.getpid()} blocked {seconds}\n".encode())
    elif path == "/pid":
        await answer(send, f"{os.getpid()}\n".encode())
    else:
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"not found\n"})
