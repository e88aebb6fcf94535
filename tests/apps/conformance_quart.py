"""tests/apps/conformance.py's routes, in Quart."""

from __future__ import annotations

from collections.abc import AsyncIterator

from conformance import CHUNKS, CLOSE_CODE, CLOSE_REASON, EVENTS, HELLO, SSE_HEADERS, SUBPROTOCOL, record, sse
from quart import Quart, Response, request, websocket

app = Quart(__name__)
started = False


@app.before_serving
async def startup() -> None:
    global started
    record("startup")
    started = True


@app.after_serving
async def shutdown() -> None:
    record("shutdown")


@app.get("/hello")
async def hello() -> Response:
    return Response(HELLO, content_type="text/plain")


@app.post("/echo")
async def echo() -> Response:
    return Response(await request.get_data(), content_type="application/octet-stream")


@app.get("/stream")
async def stream() -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        for chunk in CHUNKS:
            yield chunk.encode()

    return Response(chunks(), content_type="text/plain")


@app.get("/sse")
async def events() -> Response:
    async def lines() -> AsyncIterator[bytes]:
        for event in EVENTS:
            yield sse(event).encode()

    response = Response(lines(), content_type="text/event-stream", headers=SSE_HEADERS)
    response.timeout = None
    return response


@app.get("/lifespan")
async def lifespan_ran() -> Response:
    return Response("started" if started else "not started", content_type="text/plain")


@app.websocket("/ws")
async def ws() -> None:
    offered = websocket.requested_subprotocols
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    # Quart cancels this handler when the client disconnects.
    while True:
        message = await websocket.receive()
        if message == "close":
            await websocket.close(CLOSE_CODE, CLOSE_REASON)
            return
        await websocket.send(message)
