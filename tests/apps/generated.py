"""An ASGI application that makes a large answer as fast as its client takes it: GET /generate
sends ?mib= MiB (64 by default) in 256 KiB pieces (with ?listen=1, while another task awaits
receive()), each computed first (hashed, as a page is
rendered), and GET /progress says how many bytes the generator's sends have returned so far,
and then "gone" once a send has raised because the client went away (both in one worker, -w 1).

The computing makes the worker slower than the lobby that reads its ring, as an application
that renders its answer is: its sends then never find the ring full, and never wait on their
own (which once let it make the whole answer for a client that read none of it)."""

import asyncio
import hashlib
from urllib.parse import parse_qs

PIECE = bytes(256 * 1024)
sent = 0
gone = False


async def _until_disconnect(receive):
    while (await receive())["type"] != "http.disconnect":
        pass


async def app(scope, receive, send):
    global sent, gone
    if scope["type"] != "http":
        return
    if scope["path"] == "/progress":
        body = f"{sent}{' gone' if gone else ''}".encode()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]}
        )
        await send({"type": "http.response.body", "body": body})
        return
    query = parse_qs(scope["query_string"].decode())
    size = int(query.get("mib", ["64"])[0]) << 20
    # ?listen=1: a task awaits receive() meanwhile, for http.disconnect, as Django's and Quart's
    # handlers do, while the sends are held and go on.
    listener = asyncio.ensure_future(_until_disconnect(receive)) if "listen" in query else None
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(size).encode())]})
    try:
        for _ in range(size // len(PIECE)):
            for _ in range(4):
                hashlib.sha256(PIECE).digest()
            await send({"type": "http.response.body", "body": PIECE, "more_body": True})
            sent += len(PIECE)
    except OSError:
        gone = True
        raise
    await send({"type": "http.response.body", "body": b""})
    if listener is not None:
        listener.cancel()
