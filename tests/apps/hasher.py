"""Answers the sha256 of the request body, read in 64 KiB pieces as an upload handler reads it:
WSGI as `hasher:app`, ASGI as `hasher:asgi`."""

import hashlib

PIECE = 64 * 1024


def app(environ, start_response):
    digest = hashlib.sha256()
    stream = environ["wsgi.input"]
    while piece := stream.read(PIECE):
        digest.update(piece)
    return answer(start_response, digest)


def answer(start_response, digest):
    """The hash as a WSGI answer."""
    body = digest.hexdigest().encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    digest = hashlib.sha256()
    more = True
    while more:
        message = await receive()
        digest.update(message.get("body", b""))
        more = message.get("more_body", False)
    await answer_asgi(send, digest)


async def answer_asgi(send, digest):
    """The hash as an ASGI answer."""
    body = digest.hexdigest().encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", str(len(body)).encode())]}
    )
    await send({"type": "http.response.body", "body": body})
