"""What tests/apps/flask_app.py and tests/apps/django_app.py share."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA_DIR = Path(os.environ["FRAMEWORK_DATA_DIR"])
DOWNLOAD = DATA_DIR / "download.bin"
"""The file the download routes serve; the test writes it before starting the server."""

WsgiApp = Callable[[dict, Callable[..., Any]], Any]


def reporting_result_type(wsgi_app: WsgiApp) -> WsgiApp:
    """Wraps `wsgi_app` so that each request writes, to wsgi.errors (the server's log), the
    type of what the framework returned: ``/download returned FileWrapper`` shows that the
    framework handed its file to the server's wsgi.file_wrapper. The result itself passes
    through untouched, so the server sees exactly what the framework returned."""

    def application(environ: dict, start_response: Callable[..., Any]) -> Any:
        result = wsgi_app(environ, start_response)
        environ["wsgi.errors"].write(f"{environ['PATH_INFO']} returned {type(result).__name__}\n")
        return result

    return application


def describe_upload(name: str, content_type: str, data: bytes) -> dict[str, object]:
    return {
        "filename": name,
        "content_type": content_type,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def order_summary(order: dict) -> dict[str, object]:
    """The JSON APIs' answer to a posted order."""
    items = order["items"]
    return {
        "count": sum(item["quantity"] for item in items),
        "total_cents": sum(item["price_cents"] * item["quantity"] for item in items),
        "note": order["note"].upper(),
        "echo": order,
    }


def stream_lines(word: str, count: int):
    for index in range(count):
        yield f"{word} {index}\n"
