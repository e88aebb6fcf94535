"""The soak's WSGI application (bench/soak.py): every route answers a body the client can check,
and every worker writes down which requests it holds, so that after a worker is killed the soak
can tell a 502 it caused from any other.

Routes (each takes ?id=REQUEST-ID, which the answer names; any other path answers 404):
    GET  /          readiness: "ok"
    GET  /fast      at once: "fast ID\\n"
    GET  /io        after 20 ms (a thread waiting for a database): "io ID\\n"
    GET  /slow      after 2 s (a report): "slow ID\\n"
    GET  /stream    256 KiB of payload(ID), in 16 KiB chunks
    POST /upload    reads the body and answers "upload ID LENGTH CRC32\\n" (CRC in hex)
    GET  /hog       allocates ?mb= megabytes and keeps them for the worker's life, then answers
                    "hog ID": the worker ends its request above --max-worker-memory
Every answer has the header X-Soak-Pid, the worker's pid.

The held requests: each worker appends "+ID" when a request reaches the application and "-ID"
when its answer is done (a streamed one when the server closes its iterable) to
$SOAK_HELD_DIR/PID.log, one write each to a file opened with O_APPEND; the ids with a "+" and no
"-" in a killed worker's file are the requests it held when it died (held_requests).
"""

from __future__ import annotations

import os
import random
import threading
import time
import zlib
from pathlib import Path
from urllib.parse import parse_qs

STREAM_BYTES = 256 * 1024
STREAM_CHUNK = 16 * 1024
SLOW_SECONDS = 2.0
IO_SECONDS = 0.02
_hoard: list[bytes] = []  # /hog's memory, kept until the worker exits


def payload(seed: str, size: int) -> bytes:
    """The bytes of a stream or an upload, the same for the client and the application."""
    return random.Random(seed).randbytes(size)


def upload_answer(request_id: str, body: bytes) -> bytes:
    return f"upload {request_id} {len(body)} {zlib.crc32(body):08x}\n".encode()


def held_requests(log: Path) -> set[str]:
    """The ids a worker's log shows as reached and not done."""
    held: set[str] = set()
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("+"):
            held.add(line[1:])
        elif line.startswith("-"):
            held.discard(line[1:])
    return held


class HeldLog:
    """This worker's file of held requests, opened again after a fork (each worker has its own)."""

    def __init__(self) -> None:
        self.pid = 0
        self.fd = -1
        self.lock = threading.Lock()

    def note(self, mark: str, request_id: str) -> None:
        if self.pid != os.getpid():
            with self.lock:
                if self.pid != os.getpid():
                    path = Path(os.environ["SOAK_HELD_DIR"]) / f"{os.getpid()}.log"
                    self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    self.pid = os.getpid()
        os.write(self.fd, f"{mark}{request_id}\n".encode())


HELD = HeldLog()


class _Streamed:
    """An answer's chunks; the request is done when the server closes it (PEP 3333)."""

    def __init__(self, request_id: str, body: bytes) -> None:
        self.request_id = request_id
        self.chunks = [body[at : at + STREAM_CHUNK] for at in range(0, len(body), STREAM_CHUNK)]

    def __iter__(self):
        return iter(self.chunks)

    def close(self) -> None:
        HELD.note("-", self.request_id)


def app(environ, start_response):
    path = environ["PATH_INFO"]
    query = parse_qs(environ.get("QUERY_STRING", ""))
    request_id = query.get("id", ["-"])[0]
    if path == "/":
        return _answer(start_response, "200 OK", b"ok")
    HELD.note("+", request_id)
    if path == "/stream":
        body = payload(request_id, STREAM_BYTES)
        _start(start_response, "200 OK", len(body))
        return _Streamed(request_id, body)
    try:
        body = _body(path, request_id, query, environ)
    finally:
        HELD.note("-", request_id)
    if body is None:
        return _answer(start_response, "404 Not Found", b"no such route\n")
    return _answer(start_response, "200 OK", body)


def _body(path: str, request_id: str, query: dict[str, list[str]], environ: dict) -> bytes | None:
    """The answer of every route but /stream; None for an unknown path."""
    if path == "/fast":
        return f"fast {request_id}\n".encode()
    if path == "/io":
        time.sleep(IO_SECONDS)
        return f"io {request_id}\n".encode()
    if path == "/slow":
        time.sleep(SLOW_SECONDS)
        return f"slow {request_id}\n".encode()
    if path == "/upload":
        length = int(environ.get("CONTENT_LENGTH") or 0)
        return upload_answer(request_id, environ["wsgi.input"].read(length))
    if path == "/hog":
        hoard(int(query["mb"][0]))
        return f"hog {request_id}\n".encode()
    return None


def hoard(megabytes: int) -> None:
    # b"\1" * n writes every page, so that they are resident (bytes(n) would not be).
    _hoard.append(b"\1" * (megabytes << 20))


def _start(start_response, status: str, length: int) -> None:
    start_response(
        status,
        [
            ("Content-Type", "application/octet-stream"),
            ("Content-Length", str(length)),
            ("X-Soak-Pid", str(os.getpid())),
        ],
    )


def _answer(start_response, status: str, body: bytes) -> list[bytes]:
    _start(start_response, status, len(body))
    return [body]
