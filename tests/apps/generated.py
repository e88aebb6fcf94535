"""An ASGI application that makes a large answer as fast as its client takes it: GET /generate
sends ?mib= MiB (64 by default) in 256 KiB pieces, and GET /progress says how many bytes the
generator's sends have returned so far, and then "gone" once a send has raised because the
client went away (both in one worker, -w 1)."""

from urllib.parse import parse_qs

PIECE = bytes(256 * 1024)
sent = 0
gone = False


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
    size = int(parse_qs(scope["query_string"].decode()).get("mib", ["64"])[0]) << 20
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(size).encode())]})
    try:
        for _ in range(size // len(PIECE)):
            await send({"type": "http.response.body", "body": PIECE, "more_body": True})
            sent += len(PIECE)
    except OSError:
        gone = True
        raise
    await send({"type": "http.response.body", "body": b""})
