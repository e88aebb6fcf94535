"""tests/apps/conformance.py's routes, in BlackSheep."""

from __future__ import annotations

from collections.abc import AsyncIterator

from blacksheep import Application, Content, Request, Response, StreamedContent, WebSocket, WebSocketDisconnectError
from blacksheep.server.responses import text
from blacksheep.server.sse import ServerSentEventsResponse, TextServerSentEvent
from conformance import CHUNKS, CLOSE_CODE, CLOSE_REASON, EVENTS, HELLO, SUBPROTOCOL, record

app = Application()
started = False


@app.lifespan
async def lifespan() -> AsyncIterator[None]:
    global started
    record("startup")
    started = True
    yield
    record("shutdown")


@app.router.get("/hello")
async def hello() -> Response:
    return text(HELLO)


@app.router.post("/echo")
async def echo(request: Request) -> Response:
    return Response(200, content=Content(b"application/octet-stream", await request.read() or b""))


@app.router.get("/stream")
async def stream() -> Response:
    # BlackSheep's streamed responses carry Transfer-Encoding: chunked among their headers.
    async def chunks() -> AsyncIterator[bytes]:
        for chunk in CHUNKS:
            yield chunk.encode()

    return Response(200, content=StreamedContent(b"text/plain", chunks))


@app.router.get("/sse")
async def events() -> Response:
    # BlackSheep's own SSE response: it sends Connection: Keep-Alive itself.
    async def provider() -> AsyncIterator[TextServerSentEvent]:
        for event in EVENTS:
            yield TextServerSentEvent(event)

    return ServerSentEventsResponse(provider)


@app.router.get("/lifespan")
async def lifespan_ran() -> Response:
    return text("started" if started else "not started")


@app.router.ws("/ws")
async def ws(websocket: WebSocket) -> None:
    offered = websocket.scope["subprotocols"]
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    try:
        while True:
            message = await websocket.receive()
            if message.get("text") == "close":
                await websocket.close(CLOSE_CODE, CLOSE_REASON)
                return
            if message.get("text") is not None:
                await websocket.send_text(message["text"])
            else:
                await websocket.send_bytes(message["bytes"])
    except WebSocketDisconnectError:
        return
