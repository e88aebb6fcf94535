"""The long-lived streams' application (issue 47: LL-SSE, LL-SSE-60, LL-WS, LL-TOKENS): plain ASGI 3,
no framework, so that the application's own cost is the same under every server.

    GET /                      hello (13 bytes): the paced prober's request beside the streams
    GET /sse?n=N&every=S       Server-Sent Events: N events, the first at once, then one every S
                               seconds (default 15 and 1); each "data: I\\n\\n", I from 0
    GET /tokens?n=N&gap=S      a token stream as a language model's answer is streamed: N chunks
                               (default 40), the first at once, then one every S seconds (default
                               0.025); each "data: tok I\\n\\n"
    WS  any path               accepts, then sends every message back as it came

Streams have no Content-Length (each server frames them as it does, chunked in HTTP/1.1). The app
answers the lifespan protocol, so that every server runs it the same way whatever its default.
"""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs

from asgi_apps import HELLO_BODY, _lifespan

SSE_EVENTS = 15
SSE_EVERY = 1.0
TOKENS = 40
TOKEN_GAP = 0.025

_HELLO_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(HELLO_BODY)).encode())],
}
_HELLO_BODY = {"type": "http.response.body", "body": HELLO_BODY}
_STREAM_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_NOT_FOUND = {
    "type": "http.response.start",
    "status": 404,
    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"0")],
}


async def app(scope, receive, send):
    kind = scope["type"]
    if kind == "http":
        path = scope["path"]
        if path == "/":
            await send(_HELLO_START)
            await send(_HELLO_BODY)
        elif path == "/sse":
            query = _query(scope)
            await _stream(
                send, b"data: %d\n\n", _number(query, "n", SSE_EVENTS, int), _number(query, "every", SSE_EVERY, float)
            )
        elif path == "/tokens":
            query = _query(scope)
            await _stream(
                send, b"data: tok %d\n\n", _number(query, "n", TOKENS, int), _number(query, "gap", TOKEN_GAP, float)
            )
        else:
            await send(_NOT_FOUND)
            await send({"type": "http.response.body", "body": b""})
    elif kind == "websocket":
        await _echo(receive, send)
    elif kind == "lifespan":
        await _lifespan(receive, send)
    else:
        raise ValueError(f"ll_app: unsupported ASGI scope type {kind!r}")


async def _stream(send, template: bytes, count: int, gap: float) -> None:
    """count pieces, gap seconds apart, each timed from the stream's start so that a late wake-up
    does not push every later piece back."""
    await send({"type": "http.response.start", "status": 200, "headers": _STREAM_HEADERS})
    loop = asyncio.get_running_loop()
    began = loop.time()
    for index in range(count):
        if index:
            await asyncio.sleep(max(0.0, began + index * gap - loop.time()))
        await send({"type": "http.response.body", "body": template % index, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _echo(receive, send) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("text") is not None:
            await send({"type": "websocket.send", "text": message["text"]})
        else:
            await send({"type": "websocket.send", "bytes": message.get("bytes") or b""})


def _query(scope) -> dict[str, list[str]]:
    return parse_qs(scope.get("query_string", b"").decode("latin-1"))


def _number(query: dict[str, list[str]], name: str, default, kind):
    try:
        return kind(query[name][0])
    except (KeyError, ValueError):
        return default
