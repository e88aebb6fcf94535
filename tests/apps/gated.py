"""An ASGI application whose requests wait at one gate: GET /wait waits until GET /open opens it,
then takes 0.5 ms of CPU, answers "done" and writes "answered" to $GATED_MARKS; GET /waiting says
how many have waited. Opened, the gate lets every waiting request go in the same turn of the
event loop. GET /wait?block=S first blocks the loop for S seconds, and writes "unblocked".
GET /wait?hold=PATH first holds the loop and the interpreter's lock, so that no other thread of
the worker runs either, until the file PATH's first byte is no longer "0" (at most HOLD_SECONDS),
and writes "released"."""

import asyncio
import mmap
import os
import sys
import time

SPIN_SECONDS = 0.0005
HOLD_SECONDS = 10.0

gate: asyncio.Event | None = None
waiting = 0


def mark(word: str) -> None:
    with open(os.environ["GATED_MARKS"], "a") as marks:
        marks.write(f"{word}\n")


def hold(path: str) -> None:
    """Spins until the first byte of the file `path` is no longer "0", without letting another
    thread take the interpreter's lock: it reads the byte through a shared mapping, with no
    system call (which would let the lock go), and a thread that wants the lock asks for it only
    after the switch interval, here longer than the hold."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(2 * HOLD_SECONDS)
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 1, prot=mmap.PROT_READ) as flag:
            end = time.monotonic() + HOLD_SECONDS
            while flag[0] == ord("0") and time.monotonic() < end:
                pass
    finally:
        sys.setswitchinterval(interval)


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
        if scope["query_string"].startswith(b"hold="):
            hold(scope["query_string"][len(b"hold=") :].decode())
            mark("released")
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
    if body == b"done":
        mark("answered")
