"""Files answered three ways, for tests/test_asgi_pathsend.py: a plain ASGI application that
sends `http.response.pathsend` itself (`app`), Starlette's FileResponse (`starlette_app`, and
`starlette_unoffered`, the same with the extension hidden from it, so that it reads the file in
chunks), and a WSGI application that returns the same file through wsgi.file_wrapper
(`wsgi_app`, which answers one Range itself with `ranges=1`). The file is the query's `path`;
`/pid` answers the worker's pid, `/big` a large body of zeros."""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse
from starlette.routing import Route


def _query(scope: dict[str, Any]) -> dict[str, str]:
    return {name: values[0] for name, values in parse_qs(scope["query_string"].decode()).items()}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    query = _query(scope)
    if scope["path"] == "/pid":
        body = str(os.getpid()).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
    elif scope["path"] == "/extensions":
        body = json.dumps(scope.get("extensions")).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
    elif scope["path"] == "/big":
        # One large body in one message: its pieces fill the worker's answer ring.
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": bytes(int(query["size"]))})
    elif scope["path"] == "/before-start":
        await send({"type": "http.response.pathsend", "path": query["path"]})
    else:
        # No Content-Length: the server takes it from the file, as for wsgi.file_wrapper.
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/x-test")]}
        )
        await send({"type": "http.response.pathsend", "path": query["path"]})


async def _file(request: Request) -> FileResponse:
    return FileResponse(request.query_params["path"])


async def _pid(request: Request) -> PlainTextResponse:
    return PlainTextResponse(str(os.getpid()))


starlette_app = Starlette(routes=[Route("/file", _file), Route("/pid", _pid)])


async def starlette_unoffered(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Starlette without the extension in its scope: FileResponse's chunked path, for the
    tests to see what reading the file in the worker looks like."""
    if scope["type"] == "http":
        scope = {**scope, "extensions": {}}
    await starlette_app(scope, receive, send)


def wsgi_app(environ: dict[str, Any], start_response: Any) -> Any:
    if environ["PATH_INFO"] == "/pid":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [str(os.getpid()).encode()]
    query = {name: values[0] for name, values in parse_qs(environ["QUERY_STRING"]).items()}
    file = open(query["path"], "rb")  # noqa: SIM115 - the file wrapper closes it
    wanted = environ.get("HTTP_RANGE", "")
    if query.get("ranges") == "1" and wanted.startswith("bytes="):
        # One range, as Starlette's FileResponse answers it: the file from its first byte, and
        # a Content-Length that stops the lobby at its last.
        first_text, _, last_text = wanted.removeprefix("bytes=").partition("-")
        first, last = int(first_text), int(last_text)
        size = os.fstat(file.fileno()).st_size
        file.seek(first)
        headers = [("Content-Range", f"bytes {first}-{last}/{size}"), ("Content-Length", str(last - first + 1))]
        start_response("206 Partial Content", [("Content-Type", "application/x-test"), *headers])
    else:
        start_response("200 OK", [("Content-Type", "application/x-test")])
    return environ["wsgi.file_wrapper"](file)
