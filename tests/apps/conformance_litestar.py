"""tests/apps/conformance.py's routes, in Litestar."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from conformance import CHUNKS, CLOSE_CODE, CLOSE_REASON, EVENTS, HELLO, SUBPROTOCOL, record
from litestar import Litestar, Request, WebSocket, get, post, websocket
from litestar.datastructures import State
from litestar.response import ServerSentEvent, Stream


@asynccontextmanager
async def lifespan(app: Litestar) -> AsyncIterator[None]:
    record("startup")
    app.state.started = True
    yield
    record("shutdown")


@get("/hello", media_type="text/plain")
async def hello() -> str:
    return HELLO


@post("/echo", media_type="application/octet-stream", status_code=200)
async def echo(request: Request) -> bytes:
    return await request.body()


@get("/stream")
async def stream() -> Stream:
    async def chunks() -> AsyncIterator[str]:
        for chunk in CHUNKS:
            yield chunk

    return Stream(chunks(), media_type="text/plain")


@get("/sse")
async def events() -> ServerSentEvent:
    # Litestar's own SSE response: it sends Connection: keep-alive itself.
    async def data() -> AsyncIterator[str]:
        for event in EVENTS:
            yield event

    return ServerSentEvent(data())


@get("/lifespan", media_type="text/plain")
async def started(state: State) -> str:
    return "started" if state.get("started") else "not started"


@websocket("/ws")
async def ws(socket: WebSocket) -> None:
    offered = socket.scope["subprotocols"]
    await socket.accept(subprotocols=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    while True:
        message = await socket.receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("text") == "close":
            await socket.close(code=CLOSE_CODE, reason=CLOSE_REASON)
            return
        if message.get("text") is not None:
            await socket.send_data(message["text"], mode="text")
        else:
            await socket.send_data(message["bytes"], mode="binary")


app = Litestar(route_handlers=[hello, echo, stream, events, started, ws], lifespan=[lifespan])
