"""An ASGI application whose requests wait at one gate: GET /wait waits until GET /open opens it,
then takes 0.5 ms of CPU, writes "answered" and the time to $GATED_MARKS and answers "done"; GET /waiting says
how many are waiting. Opened, the gate lets every waiting request go in the same turn of the
event loop. GET /wait?block=S first blocks the loop for S seconds, and writes "unblocked"."""

import asyncio
import os
import time

SPIN_SECONDS = 0.0005

gate: asyncio.Event | None = None
waiting = 0


def mark(word: str) -> None:
    with open(os.environ["GATED_MARKS"], "a") as marks:
        marks.write(f"{word}\n")


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
        if scope["query_string"].startswith(b"block="):
            time.sleep(float(scope["query_string"][len(b"block=") :]))  # noqa: ASYNC251 - the block is the point
            mark("unblocked")
        end = time.thread_time() + SPIN_SECONDS
        while time.thread_time() < end:
            pass
        mark(f"answered {time.time()!r}")
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
