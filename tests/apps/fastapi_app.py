"""A FastAPI application for tests/test_asgi.py: lifespan state, a streamed response, an upload
hashed as it arrives, a wait for the client to leave, a request that outlives --timeout, a
handler that blocks its event loop, requests held until the test lets them go, and the worker's
pid.

FASTAPI_EVENTS names a file each worker appends a line to at lifespan startup and shutdown,
when a handler sees its client leave, and when a held request begins; FASTAPI_RELEASE names the
file whose creation lets held requests go."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import PlainTextResponse, StreamingResponse

EVENTS = os.environ.get("FASTAPI_EVENTS")
RELEASE = os.environ.get("FASTAPI_RELEASE")


def record(event: str) -> None:
    if EVENTS:
        with open(EVENTS, "a") as events:
            events.write(f"{event} {os.getpid()}\n")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, str]]:
    if os.environ.get("FASTAPI_FAIL_STARTUP"):
        raise RuntimeError("the database is unreachable")
    record("startup")
    yield {"greeting": "hello from lifespan"}
    record("shutdown")


app = FastAPI(lifespan=lifespan)


@app.get("/state")
async def state(request: Request) -> dict[str, object]:
    return {
        "greeting": request.state.greeting,
        "pid": os.getpid(),
        "scheme": request.url.scheme,
        "root_path": request.scope["root_path"],
        "client": request.client.host if request.client else None,
    }


@app.get("/stream")
async def stream(count: int = 5) -> StreamingResponse:
    async def pieces() -> AsyncIterator[bytes]:
        for number in range(count):
            yield f"piece {number}\n".encode()
            await asyncio.sleep(0)

    return StreamingResponse(pieces(), media_type="text/plain")


@app.get("/open-stream")
async def open_stream() -> StreamingResponse:
    """One piece, then an open stream that sends nothing more for a minute."""

    async def pieces() -> AsyncIterator[bytes]:
        yield b"open\n"
        await asyncio.sleep(60)

    return StreamingResponse(pieces(), media_type="text/plain")


@app.post("/upload")
async def upload(request: Request) -> dict[str, object]:
    digest = hashlib.sha256()
    size = 0
    pieces = 0
    async for piece in request.stream():
        digest.update(piece)
        size += len(piece)
        pieces += 1
    return {"size": size, "sha256": digest.hexdigest(), "pieces": pieces}


@app.get("/wait-for-leave")
async def wait_for_leave(request: Request) -> PlainTextResponse:
    for _ in range(600):
        if await request.is_disconnected():
            record("client-left")
            return PlainTextResponse("gone")
        await asyncio.sleep(0.05)
    return PlainTextResponse("still here")


@app.get("/sleep")
async def sleep(seconds: float = 1.0) -> PlainTextResponse:
    await asyncio.sleep(seconds)
    return PlainTextResponse(f"slept {seconds}")


@app.get("/held")
async def held(number: int) -> PlainTextResponse:
    """Says that request `number` began, then answers once the file FASTAPI_RELEASE exists."""
    record(f"began {number}")
    while RELEASE is None or not os.path.exists(RELEASE):
        await asyncio.sleep(0.02)
    return PlainTextResponse(f"released {number}")


@app.get("/block")
async def block(seconds: float = 1.5) -> PlainTextResponse:
    time.sleep(seconds)  # noqa: ASYNC251 - the mistake the watchdog names: a blocking call in async def
    return PlainTextResponse(f"blocked {seconds}")


@app.get("/pid")
async def pid() -> PlainTextResponse:
    return PlainTextResponse(str(os.getpid()))


@app.websocket("/echo")
async def echo(websocket: WebSocket) -> None:
    offered = websocket.scope["subprotocols"]
    await websocket.accept(subprotocol=offered[0] if offered else None)
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                record(f"ws-closed-{message['code']}")
                return
            if message.get("text") == "close":
                await websocket.close(code=4000, reason="asked to")
                return
            if message.get("text") is not None:
                await websocket.send_text(message["text"])
            else:
                await websocket.send_bytes(message["bytes"])
    except WebSocketDisconnect as gone:
        record(f"ws-closed-{gone.code}")


@app.websocket("/refuse")
async def refuse(websocket: WebSocket) -> None:
    await websocket.close(code=1008)


@app.websocket("/late-accept")
async def late_accept(websocket: WebSocket) -> None:
    await websocket.receive()  # websocket.connect
    record("late-connected")
    # Not accepted yet: the client leaves before its 101.
    message = await websocket.receive()
    record(f"late-{message['type']}-{message.get('code')}")
