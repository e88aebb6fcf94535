"""The big bodies' applications (issue 49: the BODY scenarios), WSGI and ASGI, the same routes:

    GET /                      hello, the harness's readiness check
    POST /hash                 reads the request body (WSGI: wsgi.input in 64 KiB reads; ASGI: every
                               receive()'d http.request body) and answers its sha256, 64 hex digits
    GET /file                  the file named by BENCH_BODY_FILE (WSGI: wsgi.file_wrapper with a
                               Content-Length; ASGI: Starlette's FileResponse)
    GET /generated?bytes=N     ASGI only: N bytes (default 512 MiB) in 256 KiB pieces, each sent
                               as soon as the server takes the last one, no Content-Length

The ASGI app is plain ASGI 3 except /file, which is Starlette's FileResponse as an application
would serve a file (Starlette comes from bench/peers/db-apps.txt, on every server's PYTHONPATH in
the BODY scenarios). It answers the lifespan protocol, as bench/asgi_apps.py's do.
"""

from __future__ import annotations

import hashlib
import os
from urllib.parse import parse_qs

from asgi_apps import HELLO_BODY, _lifespan

FILE_VARIABLE = "BENCH_BODY_FILE"
READ_SIZE = 64 * 1024
GENERATED_PIECE = 256 * 1024
GENERATED_BYTES = 512 * 1024 * 1024
_PIECE = b"g" * GENERATED_PIECE


def wsgi(environ, start_response):
    path, method = environ.get("PATH_INFO", "/"), environ["REQUEST_METHOD"]
    if path == "/hash" and method == "POST":
        digest = _hash_wsgi_input(environ)
        return _answer(start_response, digest.encode())
    if path == "/file" and method == "GET":
        name = os.environ[FILE_VARIABLE]
        size = os.stat(name).st_size
        start_response("200 OK", [("Content-Type", "application/octet-stream"), ("Content-Length", str(size))])
        handle = open(name, "rb")  # noqa: SIM115 (the server closes it through the wrapper)
        wrapper = environ.get("wsgi.file_wrapper")
        if wrapper is None:
            return iter(lambda: handle.read(READ_SIZE), b"")
        return wrapper(handle, READ_SIZE)
    if path == "/":
        return _answer(start_response, HELLO_BODY)
    start_response("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", "0")])
    return [b""]


def _hash_wsgi_input(environ) -> str:
    """sha256 of the body, read in 64 KiB reads: up to CONTENT_LENGTH where there is one (PEP 3333:
    never past it), else (chunked) until the server's input says it has ended."""
    stream, digest = environ["wsgi.input"], hashlib.sha256()
    length = environ.get("CONTENT_LENGTH")
    left = int(length) if length else None
    while left is None or left > 0:
        piece = stream.read(READ_SIZE if left is None else min(READ_SIZE, left))
        if not piece:
            break
        digest.update(piece)
        if left is not None:
            left -= len(piece)
    return digest.hexdigest()


def _answer(start_response, body: bytes):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


async def asgi(scope, receive, send):
    kind = scope["type"]
    if kind == "lifespan":
        return await _lifespan(receive, send)
    if kind != "http":
        raise ValueError(f"body_app: unsupported ASGI scope type {kind!r}")
    path, method = scope["path"], scope["method"]
    if path == "/hash" and method == "POST":
        digest = hashlib.sha256()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            digest.update(message.get("body", b""))
            if not message.get("more_body", False):
                break
        await _send(send, digest.hexdigest().encode())
    elif path == "/file" and method == "GET":
        from starlette.responses import FileResponse

        await FileResponse(os.environ[FILE_VARIABLE], media_type="application/octet-stream")(scope, receive, send)
    elif path == "/generated" and method == "GET":
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        left = int(query.get("bytes", [GENERATED_BYTES])[0])
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/octet-stream")]}
        )
        while left > 0:
            piece = _PIECE if left >= GENERATED_PIECE else _PIECE[:left]
            left -= len(piece)
            await send({"type": "http.response.body", "body": piece, "more_body": left > 0})
    elif path == "/":
        await _send(send, HELLO_BODY)
    else:
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


async def _send(send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
