"""The ASGI twin of bench/soak_app.py for the soak's second maitred: the same routes, bodies and
held-requests log, plus a WebSocket echo.

    WS /ws?id=SESSION-ID   accepts, sends the text "pid PID" (the worker holding the session),
                           then sends every message back as it came; the session is held
                           (its "+ID" in the log) from its accept to its end.
"""

from __future__ import annotations

import asyncio
import os
from urllib.parse import parse_qs

from asgi_apps import _lifespan
from soak_app import HELD, IO_SECONDS, SLOW_SECONDS, STREAM_BYTES, STREAM_CHUNK, hoard, payload, upload_answer


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    request_id = query.get("id", ["-"])[0]
    if scope["type"] == "websocket":
        await _echo(request_id, receive, send)
        return
    path = scope["path"]
    if path == "/":
        await _answer(send, 200, b"ok")
        return
    HELD.note("+", request_id)
    try:
        if path == "/stream":
            body = payload(request_id, STREAM_BYTES)
            await _start(send, 200, len(body))
            for at in range(0, len(body), STREAM_CHUNK):
                await send({"type": "http.response.body", "body": body[at : at + STREAM_CHUNK], "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        body = await _body(path, request_id, query, receive)
        if body is None:
            await _answer(send, 404, b"no such route\n")
        else:
            await _answer(send, 200, body)
    finally:
        HELD.note("-", request_id)


async def _body(path: str, request_id: str, query: dict[str, list[str]], receive) -> bytes | None:
    """The answer of every route but /stream; None for an unknown path."""
    if path == "/fast":
        return f"fast {request_id}\n".encode()
    if path == "/io":
        await asyncio.sleep(IO_SECONDS)
        return f"io {request_id}\n".encode()
    if path == "/slow":
        await asyncio.sleep(SLOW_SECONDS)
        return f"slow {request_id}\n".encode()
    if path == "/upload":
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        return upload_answer(request_id, b"".join(parts))
    if path == "/hog":
        hoard(int(query["mb"][0]))
        return f"hog {request_id}\n".encode()
    return None


async def _echo(session_id: str, receive, send) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    HELD.note("+", session_id)
    try:
        await send({"type": "websocket.send", "text": f"pid {os.getpid()}"})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is not None:
                await send({"type": "websocket.send", "text": message["text"]})
            else:
                await send({"type": "websocket.send", "bytes": message["bytes"]})
    finally:
        HELD.note("-", session_id)


async def _start(send, status: int, length: int) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/octet-stream"),
                (b"content-length", str(length).encode()),
                (b"x-soak-pid", str(os.getpid()).encode()),
            ],
        }
    )


async def _answer(send, status: int, body: bytes) -> None:
    await _start(send, status, len(body))
    await send({"type": "http.response.body", "body": body})
