"""A large upload is read and spilled in large pieces (docs/LIMITS.md, "Request bodies"): the
lobby's reads of a body grow from 4 KiB to 256 KiB while they come full, and what one read
brought is one write to the body's temporary file, chunked or not. Counted on a real upload of
64 MiB by the lobby's write calls (`syscw` in /proc/PID/io, every thread's), each of which
before was one 4 KiB read: 16,552 writes for the Content-Length body, 12,589 chunked.
"""

from __future__ import annotations

import hashlib
import os
import socket

import pytest
from conftest import HOST
from test_lifecycle import APPS

SIZE = 64 * 1024 * 1024
# Writes of 16 KiB on average, four times the old fixed read: on a quiet machine the reads grow
# to 256 KiB (about 320 writes), but while other work takes the cores a read finds less waiting,
# the room shrinks, and the writes are more (1,037 in a `make test` beside a busy machine).
MOST_WRITES = SIZE // (16 * 1024)


def lobby_writes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("syscw:"))


def upload(port: int, body: bytes, chunked: bool) -> bytes:
    """Sends `body` in 64 KiB writes (chunks, when chunked) and returns the answer's body."""
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(body)
    with socket.create_connection((HOST, port), timeout=60) as client:
        client.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + framing + b"\r\n\r\n")
        for start in range(0, len(body), 64 * 1024):
            piece = body[start : start + 64 * 1024]
            client.sendall(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
        if chunked:
            client.sendall(b"0\r\n\r\n")
        answer = b""
        while data := client.recv(65536):
            answer += data
    head, _, content = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return content


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("app", ["hasher:app", "hasher:asgi"], ids=["wsgi", "asgi"])
def test_a_large_upload_is_spilled_in_large_writes(maitred_server, app, chunked):
    body = os.urandom(SIZE)
    server = maitred_server("-w", "1", app, cwd=APPS)
    assert upload(server.port, b"warm", chunked) == hashlib.sha256(b"warm").hexdigest().encode()
    before = lobby_writes(server.pid)
    assert upload(server.port, body, chunked) == hashlib.sha256(body).hexdigest().encode()
    writes = lobby_writes(server.pid) - before
    assert writes < MOST_WRITES, f"{writes} write calls for a {SIZE >> 20} MiB upload"


def test_a_spilled_body_s_file_is_freed_off_the_event_loop(maitred_server):
    """Freeing a large body file's pages took the lobby's event loop 46-62 ms for 512 MiB, every
    connection waiting meanwhile; now the closer thread frees it (docs/LIMITS.md, "Request
    bodies"), and says so at debug level once it has."""
    body = os.urandom(SIZE)
    server = maitred_server("-w", "1", "--log-level", "debug", "hasher:app", cwd=APPS)
    assert upload(server.port, body, chunked=False) == hashlib.sha256(body).hexdigest().encode()
    server.wait_for_log("closed a temporary file of 64.0 MiB off the event loop", timeout=30)
    assert upload(server.port, b"next", chunked=False) == hashlib.sha256(b"next").hexdigest().encode()
