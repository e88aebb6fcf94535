"""An ASGI application whose requests wait at one gate: GET /wait waits until GET /open opens it,
then takes 2 ms of CPU and answers "done"; GET /waiting says how many are waiting. Opened, the
gate lets every waiting request go in the same turn of the event loop."""

import asyncio
import time

# Each request let through spins this long, so that the answers of one turn are far apart.
SPIN_SECONDS = 0.002

gate: asyncio.Event | None = None
waiting = 0


async def app(scope, receive, send):
    global gate, waiting
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if gate is None:
        gate = asyncio.Event()
    if scope["path"] == "/wait":
        waiting += 1
        await gate.wait()
        end = time.thread_time() + SPIN_SECONDS
        while time.thread_time() < end:
            pass
        body = b"done"
    elif scope["path"] == "/open":
        gate.set()
        body = b"open"
    else:
        body = str(waiting).encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]}
    )
    await send({"type": "http.response.body", "body": body})
