"""tests/apps/conformance.py's routes, in FastAPI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from conformance import CHUNKS, CLOSE_CODE, CLOSE_REASON, EVENTS, HELLO, SSE_HEADERS, SUBPROTOCOL, record, sse
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import PlainTextResponse, Response, StreamingResponse


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, bool]]:
    record("startup")
    yield {"started": True}
    record("shutdown")


app = FastAPI(lifespan=lifespan)


@app.get("/hello", response_class=PlainTextResponse)
async def hello() -> str:
    return HELLO


@app.post("/echo")
async def echo(request: Request) -> Response:
    return Response(await request.body(), media_type="application/octet-stream")


@app.get("/stream")
async def stream() -> StreamingResponse:
    async def chunks() -> AsyncIterator[str]:
        for chunk in CHUNKS:
            yield chunk

    return StreamingResponse(chunks(), media_type="text/plain")


@app.get("/sse")
async def events() -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        for event in EVENTS:
            yield sse(event)

    return StreamingResponse(lines(), media_type="text/event-stream", headers=SSE_HEADERS)


@app.get("/lifespan", response_class=PlainTextResponse)
async def started(request: Request) -> str:
    return "started" if request.state.started else "not started"


@app.websocket("/ws")
async def ws(websocket: WebSocket) -> None:
    offered = websocket.scope["subprotocols"]
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    try:
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
    except WebSocketDisconnect:
        return
