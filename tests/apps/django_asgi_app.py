"""A Django application served through Django's ASGI handler, with async views, for
tests/test_asgi.py (configured in code, no database)."""

from __future__ import annotations

import asyncio
import json

from django_settings import configure

configure(__name__)

from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, JsonResponse
from django.urls import path


async def hello(request: HttpRequest) -> JsonResponse:
    await asyncio.sleep(0)
    return JsonResponse({"view": "async", "path": request.path, "method": request.method})


async def submit(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"received": json.loads(request.body)})


urlpatterns = [path("hello/", hello), path("submit/", submit)]

application = ASGIHandler()
