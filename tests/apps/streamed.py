"""Hashes an upload as it arrives, and says on stderr when it has its first piece, so that a
test can send the rest only then (docs/LIMITS.md, "A fast upload streams"): WSGI as
`streamed:app`, ASGI as `streamed:asgi`. A body cut short is said too, and answered 500."""

import hashlib
import sys

from hasher import PIECE, answer, answer_asgi


def say(line):
    print(line, file=sys.stderr, flush=True)


def app(environ, start_response):
    digest, stream, got = hashlib.sha256(), environ["wsgi.input"], 0
    try:
        while piece := stream.read(PIECE):
            if not got:
                say("streamed: the first piece is read")
            digest.update(piece)
            got += len(piece)
    except OSError as cut:
        say(f"streamed: the body ended short after {got} bytes: {cut}")
        start_response("500 Internal Server Error", [("Content-Length", "0")])
        return [b""]
    return answer(start_response, digest)


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    digest, more, got = hashlib.sha256(), True, 0
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            say(f"streamed: the body ended short after {got} bytes: http.disconnect")
            return
        piece = message.get("body", b"")
        if piece and not got:
            say("streamed: the first piece is read")
        digest.update(piece)
        got += len(piece)
        more = message.get("more_body", False)
    await answer_asgi(send, digest)
