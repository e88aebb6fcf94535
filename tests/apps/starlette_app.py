"""A Starlette application for tests/test_asgi.py: routing, a JSON echo of the request, and a
streamed response."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route


async def echo(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse(
        {
            "method": request.method,
            "path": request.url.path,
            "query": dict(request.query_params),
            "headers": {name: value for name, value in request.headers.items() if name.startswith("x-")},
            "body": body.decode(),
        }
    )


async def numbers(request: Request) -> StreamingResponse:
    async def lines() -> AsyncIterator[bytes]:
        for number in range(int(request.query_params.get("n", "3"))):
            yield f"{number}\n".encode()

    return StreamingResponse(lines(), media_type="text/plain")


app = Starlette(routes=[Route("/echo/{rest:path}", echo, methods=["GET", "POST"]), Route("/numbers", numbers)])
