"""tests/apps/conformance.py's HTTP routes, in Django's own ASGI handler (async views). Django
has no lifespan and no WebSockets: the server must serve it all the same (`/lifespan` answers
"no lifespan"), and refuse a WebSocket handshake as Django does. Channels adds WebSockets:
tests/apps/conformance_channels.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

from django_settings import configure

configure(__name__)

from conformance import CHUNKS, EVENTS, HELLO, SSE_HEADERS, sse
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt


async def hello(request: HttpRequest) -> HttpResponse:
    return HttpResponse(HELLO, content_type="text/plain")


@csrf_exempt
async def echo(request: HttpRequest) -> HttpResponse:
    return HttpResponse(request.body, content_type="application/octet-stream")


async def stream(request: HttpRequest) -> StreamingHttpResponse:
    async def chunks() -> AsyncIterator[str]:
        for chunk in CHUNKS:
            yield chunk

    return StreamingHttpResponse(chunks(), content_type="text/plain")


async def events(request: HttpRequest) -> StreamingHttpResponse:
    async def lines() -> AsyncIterator[str]:
        for event in EVENTS:
            yield sse(event)

    return StreamingHttpResponse(lines(), content_type="text/event-stream", headers=SSE_HEADERS)


async def no_lifespan(request: HttpRequest) -> HttpResponse:
    return HttpResponse("no lifespan", content_type="text/plain")


urlpatterns = [
    path("hello", hello),
    path("echo", echo),
    path("stream", stream),
    path("sse", events),
    path("lifespan", no_lifespan),
]

application = ASGIHandler()
