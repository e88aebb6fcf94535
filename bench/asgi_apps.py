"""The ASGI 3 applications the benchmark serves: plain ASGI, no framework, the same for every server,
so that what is measured is the server (A1, O1-ASGI).

Run from this directory (the harness puts it on PYTHONPATH), e.g. ``uvicorn asgi_apps:hello``.
Each app answers the lifespan protocol (startup and shutdown complete at once), so that every
server runs it the same way whatever its lifespan default, and refuses a WebSocket (the close
before accepting answers the handshake with 403).
"""

import asyncio
import time

HELLO_BODY = b"Hello, world!"
_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(HELLO_BODY)).encode())],
}
_BODY = {"type": "http.response.body", "body": HELLO_BODY}


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _not_http(scope, receive, send) -> None:
    """Lifespan, or a WebSocket refused; raises for a scope type no ASGI 3 server sends."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
    elif scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
    else:
        raise ValueError(f"asgi_apps: unsupported ASGI scope type {scope['type']!r}")


async def hello(scope, receive, send):
    """The smallest useful response: measures the server, not the application (A1)."""
    if scope["type"] != "http":
        return await _not_http(scope, receive, send)
    await send(_START)
    await send(_BODY)


# O1-ASGI's cost per request: CPU enough that 2 workers on this machine serve several hundred
# requests a second, then a wait such as a database query's, during which the event loop serves
# other requests: an async endpoint's usual shape.
CPU_SECONDS_PER_REQUEST = 0.002
AWAIT_SECONDS_PER_REQUEST = 0.05


async def overload(scope, receive, send):
    """An async endpoint that computes for 2 ms, then awaits 50 ms, then answers the small body
    (O1-ASGI). It spins on its thread's CPU clock, as apps.cpu_3ms does (O1-WSGI), so that it holds
    the CPU as real work does and time the thread spends preempted by other processes on the shared
    machine does not count as work done; the event loop is blocked meanwhile, as it is for real
    synchronous work in an async endpoint."""
    if scope["type"] != "http":
        return await _not_http(scope, receive, send)
    done_at = time.thread_time() + CPU_SECONDS_PER_REQUEST
    while time.thread_time() < done_at:
        pass
    await asyncio.sleep(AWAIT_SECONDS_PER_REQUEST)
    await send(_START)
    await send(_BODY)
