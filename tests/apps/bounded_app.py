"""An application for tests/test_bounded.py: long answers, and bodies it counts.

- ``/stream?mb=N``: N MiB in 64 KiB chunks, each chunk's bytes derived from its index, so that
  a client can check what it received against ``expected_digest(N)``.
- ``/upload``: reads the whole body and answers with its length.
- anything else: ``ok`` and the worker's pid.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from urllib.parse import parse_qs

CHUNK = 64 * 1024


def chunks(mebibytes: int) -> Iterator[bytes]:
    for index in range(mebibytes * 16):
        yield bytes([index % 251]) * (CHUNK - 8) + index.to_bytes(8, "big")


def expected_digest(mebibytes: int) -> str:
    digest = hashlib.sha256()
    for chunk in chunks(mebibytes):
        digest.update(chunk)
    return digest.hexdigest()


def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/stream":
        mebibytes = int(parse_qs(environ["QUERY_STRING"])["mb"][0])
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return chunks(mebibytes)
    if path == "/upload":
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [str(len(body)).encode()]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"ok {os.getpid()}".encode()]
