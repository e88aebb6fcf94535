"""A Django application for tests/test_frameworks.py, configured in code (no settings
module, no database): a form post, a JSON API, a file download and a streamed response."""

from __future__ import annotations

import json

from django_settings import configure

configure(__name__)

from django.core.handlers.wsgi import WSGIHandler
from django.http import (
    FileResponse,
    HttpRequest,
    HttpResponseNotAllowed,
    JsonResponse,
    StreamingHttpResponse,
)
from django.urls import path
from framework_support import DOWNLOAD, describe_upload, order_summary, reporting_result_type, stream_lines


def form(request: HttpRequest) -> JsonResponse | HttpResponseNotAllowed:
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    files = {
        field: describe_upload(upload.name, upload.content_type, upload.read())
        for field, upload in request.FILES.items()
    }
    return JsonResponse({"fields": dict(request.POST.lists()), "files": files})


def orders(request: HttpRequest) -> JsonResponse | HttpResponseNotAllowed:
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    return JsonResponse(order_summary(json.loads(request.body)), status=201)


def download(request: HttpRequest) -> FileResponse:
    return FileResponse(
        open(DOWNLOAD, "rb"), as_attachment=True, filename="report.bin", content_type="application/octet-stream"
    )


def stream(request: HttpRequest) -> StreamingHttpResponse:
    lines = stream_lines(request.GET["word"], int(request.GET["n"]))
    return StreamingHttpResponse(lines, content_type="text/plain")


urlpatterns = [
    path("form", form),
    path("api/orders", orders),
    path("download", download),
    path("stream", stream),
]

application = reporting_result_type(WSGIHandler())
