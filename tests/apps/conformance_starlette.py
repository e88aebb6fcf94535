"""tests/apps/conformance.py's routes, in Starlette."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from conformance import CHUNKS, CLOSE_CODE, CLOSE_REASON, EVENTS, HELLO, SSE_HEADERS, SUBPROTOCOL, record, sse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[dict[str, bool]]:
    record("startup")
    yield {"started": True}
    record("shutdown")


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse(HELLO)


async def echo(request: Request) -> Response:
    return Response(await request.body(), media_type="application/octet-stream")


async def stream(request: Request) -> StreamingResponse:
    async def chunks() -> AsyncIterator[str]:
        for chunk in CHUNKS:
            yield chunk

    return StreamingResponse(chunks(), media_type="text/plain")


async def events(request: Request) -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        for event in EVENTS:
            yield sse(event)

    return StreamingResponse(lines(), media_type="text/event-stream", headers=SSE_HEADERS)


async def started(request: Request) -> PlainTextResponse:
    return PlainTextResponse("started" if request.state.started else "not started")


async def ws(websocket: WebSocket) -> None:
    offered = websocket.scope["subprotocols"]
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("text") == "close":
            await websocket.close(code=CLOSE_CODE, reason=CLOSE_REASON)
            return
        if message.get("text") is not None:
            await websocket.send_text(message["text"])
        else:
            await websocket.send_bytes(message["bytes"])


app = Starlette(
    routes=[
        Route("/hello", hello),
        Route("/echo", echo, methods=["POST"]),
        Route("/stream", stream),
        Route("/sse", events),
        Route("/lifespan", started),
        WebSocketRoute("/ws", ws),
    ],
    lifespan=lifespan,
)
