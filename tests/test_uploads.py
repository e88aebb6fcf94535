"""A large upload is read and spilled in large pieces (docs/LIMITS.md, "Request bodies"): the
lobby's reads of a body grow from 4 KiB to 256 KiB while they come full, and what one read
brought is one write to the body's temporary file, chunked or not. Counted on a real upload of
64 MiB by the lobby's write calls (`syscw` in /proc/PID/io, every thread's), each of which
before was one 4 KiB read: 16,552 writes for the Content-Length body, 12,589 chunked.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import time

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


def upload(port: int, body: bytes, chunked: bool, slow_start: bool = False) -> bytes:
    """Sends `body` in 64 KiB writes (chunks, when chunked) and returns the answer's body. With
    `slow_start`, the first 256 KiB go at about 3 MB/s, so that the body is spooled, not streamed
    (LIMITS.md, "A fast upload streams")."""
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(body)
    with socket.create_connection((HOST, port), timeout=60) as client:
        client.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + framing + b"\r\n\r\n")
        for start in range(0, len(body), 64 * 1024):
            piece = body[start : start + 64 * 1024]
            client.sendall(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
            if slow_start and start < 256 * 1024:
                time.sleep(0.02)  # the client's pace, not a wait for an event
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
    # At debug level, for the line a streamed body would have; its few lines are writes too.
    server = maitred_server("-w", "1", "--log-level", "debug", app, cwd=APPS)
    assert upload(server.port, b"warm", chunked) == hashlib.sha256(b"warm").hexdigest().encode()
    before = lobby_writes(server.pid)
    assert upload(server.port, body, chunked, slow_start=True) == hashlib.sha256(body).hexdigest().encode()
    writes = lobby_writes(server.pid) - before
    # Spooled, not streamed: its file had the writes counted here.
    assert "its body streams to its worker" not in server.stderr()
    assert writes < MOST_WRITES, f"{writes} write calls for a {SIZE >> 20} MiB upload"


def writes_by_thread(pid: int) -> dict[str, int]:
    """The lobby's write calls (`syscw`) by thread: its event loop (the process's first thread,
    "loop") and the others by name."""
    counts: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as comm, open(f"/proc/{pid}/task/{tid}/io") as io:
            name = "loop" if int(tid) == pid else comm.read().strip()
            writes = next(int(line.split()[1]) for line in io if line.startswith("syscw:"))
        counts[name] = counts.get(name, 0) + writes
    return counts


def test_a_spooled_body_is_written_by_the_spooler_thread_not_the_event_loop(maitred_server):
    """A spooled body's file is written by the lobby's `maitred-spooler` thread while its event
    loop reads the next piece (docs/LIMITS.md, "A spooled body is written off the event loop"):
    the loop makes none of the file's writes. Before, the loop made them all, and a small request
    beside four such uploads of 512 MiB waited 14-31 ms at the median for it."""
    body = os.urandom(SIZE)
    server = maitred_server("-w", "1", "hasher:app", cwd=APPS)
    assert upload(server.port, b"warm", chunked=True) == hashlib.sha256(b"warm").hexdigest().encode()
    before = writes_by_thread(server.pid)
    assert upload(server.port, body, chunked=True, slow_start=True) == hashlib.sha256(body).hexdigest().encode()
    after = writes_by_thread(server.pid)
    spooler = after.get("maitred-spooler", 0) - before.get("maitred-spooler", 0)
    # At most 256 KiB a write: at least this many for the body.
    assert spooler >= SIZE // (256 * 1024), after
    # The loop's own for the request: its bells to the worker, a few.
    assert after["loop"] - before["loop"] < 50, (before, after)


def test_a_spilled_body_s_file_is_freed_off_the_event_loop(maitred_server):
    """Freeing a large body file's pages took the lobby's event loop 46-62 ms for 512 MiB, every
    connection waiting meanwhile; now the closer thread frees it (docs/LIMITS.md, "Request
    bodies"), and says so at debug level once it has. (Chunked to WSGI under
    `--wsgi-chunked-body whole`, which promises the body's CONTENT_LENGTH, docs/PROXIES.md: so
    it is spooled, however fast. Any other body this fast would stream, and have no file.)"""
    body = os.urandom(SIZE)
    server = maitred_server("-w", "1", "--log-level", "debug", "--wsgi-chunked-body", "whole", "hasher:app", cwd=APPS)
    assert upload(server.port, body, chunked=True) == hashlib.sha256(body).hexdigest().encode()
    server.wait_for_log("closed a temporary file of 64.0 MiB off the event loop", timeout=30)
    assert "its body streams to its worker" not in server.stderr()
    assert upload(server.port, b"next", chunked=False) == hashlib.sha256(b"next").hexdigest().encode()


def read_answer(client: socket.socket) -> tuple[bytes, bytes]:
    answer = b""
    while data := client.recv(65536):
        answer += data
    head, _, content = answer.partition(b"\r\n\r\n")
    return head, content


def post_head(length: int) -> bytes:
    return b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % length


@pytest.mark.parametrize("app", ["streamed:app", "streamed:asgi"], ids=["wsgi", "asgi"])
def test_a_fast_upload_streams_to_its_worker_as_it_arrives(maitred_server, app):
    """The application reads the body's first piece before the client has sent the rest: the
    rest goes only once the application says it has it. Spooled whole first, as every body
    was, the application never starts and the upload never ends."""
    body = os.urandom(SIZE)
    server = maitred_server("-w", "1", "--log-level", "debug", app, cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=60) as client:
        client.sendall(post_head(len(body)) + body[: 1 << 20])
        server.wait_for_log("streamed: the first piece is read", timeout=30)
        client.sendall(body[1 << 20 :])
        head, content = read_answer(client)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert content == hashlib.sha256(body).hexdigest().encode()
    server.wait_for_log("POST /upload: its body streams to its worker", timeout=30)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_slow_upload_is_spooled_whole_before_its_worker_sees_it(maitred_server, framing):
    """A body whose first 256 KiB come slower than 32 MB/s costs no worker while it arrives
    (S1): it is spooled, and the application reads it once it is whole, chunked or not."""
    body = os.urandom(512 * 1024)
    server = maitred_server("-w", "1", "--log-level", "debug", "streamed:app", cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=60) as client:
        client.sendall(post_head(len(body)) if framing == "content-length" else CHUNKED_CLOSING_HEAD)
        # 64 KiB every 20 ms, about 3 MB/s: the client's pace, not a wait for an event.
        for start in range(0, len(body), 64 * 1024):
            piece = body[start : start + 64 * 1024]
            client.sendall(piece if framing == "content-length" else chunked(piece))
            time.sleep(0.02)
        if framing == "chunked":
            client.sendall(b"0\r\n\r\n")
        head, content = read_answer(client)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert content == hashlib.sha256(body).hexdigest().encode()
    # The answer has come: had the body streamed, the lobby would have said so first.
    assert "its body streams to its worker" not in server.stderr()


@pytest.mark.parametrize("app", ["streamed:app", "streamed:asgi"], ids=["wsgi", "asgi"])
def test_a_streaming_body_that_stalls_gets_408_and_its_worker_goes_on(maitred_server, app):
    """A client that starts fast, then stalls past --header-timeout, gets its 408 as a spooled
    body's would; the application's read ends short (WSGI: ClientDisconnected; ASGI:
    http.disconnect), and the worker serves the next request."""
    server = maitred_server("-w", "1", "--header-timeout", "1", "--log-level", "debug", app, cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=60) as client:
        client.sendall(post_head(SIZE) + os.urandom(1 << 20))
        server.wait_for_log("streamed: the first piece is read", timeout=30)
        head, _ = read_answer(client)
    assert head.startswith(b"HTTP/1.1 408"), head
    server.wait_for_log("streamed: the body ended short after", timeout=30)
    # The lobby's log thread writes its line when it can: after the client has its 408, maybe.
    server.wait_for_log("the request body stalled for longer than --header-timeout", timeout=30)
    with socket.create_connection((HOST, server.port), timeout=60) as client:
        client.sendall(post_head(4) + b"next")
        head, content = read_answer(client)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert content == hashlib.sha256(b"next").hexdigest().encode()


def test_a_streaming_body_that_slows_down_keeps_its_pace_below_the_low_water_mark(maitred_server):
    """The lobby splices a streaming body once 256 KiB of it have come, or its last bytes (the
    socket's low-water mark, pump.rs's LOW_WATER); at each deadline of its pace it takes what
    came below that mark as the client's. A client that sends its first MiB fast, then 4 KiB
    every 0.3 s, at --header-timeout 1, is no stalled client: it is served. Without that look
    at the deadline it got 408 once its first second passed."""
    server = maitred_server("-w", "1", "--header-timeout", "1", "--log-level", "debug", "streamed:app", cwd=APPS)
    body = os.urandom((1 << 20) + 10 * 4096)
    with socket.create_connection((HOST, server.port), timeout=60) as client:
        client.sendall(post_head(len(body)) + body[: 1 << 20])
        server.wait_for_log("streamed: the first piece is read", timeout=30)
        for start in range(1 << 20, len(body), 4096):
            client.sendall(body[start : start + 4096])
            time.sleep(0.3)  # the client's pace, not a wait for an event
        head, content = read_answer(client)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert content == hashlib.sha256(body).hexdigest().encode()
    server.wait_for_log("POST /upload: its body streams to its worker", timeout=30)


def streamed_count(count: int) -> re.Pattern[str]:
    """The lobby's debug line for a streaming body, `count` times in the log."""
    return re.compile(r"(its body streams to its worker[\s\S]*)" + f"{{{count}}}")


def test_a_fast_upload_that_waits_for_a_worker_streams_once_one_is_free(maitred_server):
    """The one worker is busy with a fast upload; a second fast one streams too, as fewer
    requests wait than there are workers (docs/LIMITS.md, "A fast upload streams"): its client
    is held back by TCP while it waits, and the worker reads it once it is free. Before, it was
    spooled whole to a file first, the lobby's event loop writing every byte of it."""
    first, second = os.urandom(SIZE), os.urandom(SIZE)
    server = maitred_server("-w", "1", "--log-level", "debug", "streamed:app", cwd=APPS)
    with (
        socket.create_connection((HOST, server.port), timeout=60) as one,
        socket.create_connection((HOST, server.port), timeout=60) as two,
    ):
        one.sendall(post_head(len(first)) + first[: 1 << 20])
        server.wait_for_log("streamed: the first piece is read", timeout=30)
        two.sendall(post_head(len(second)) + second[: 1 << 20])
        server.wait_for_log(streamed_count(2), timeout=30)
        one.sendall(first[1 << 20 :])
        head, content = read_answer(one)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert content == hashlib.sha256(first).hexdigest().encode()
        server.wait_for_log(re.compile(r"(streamed: the first piece is read[\s\S]*){2}"), timeout=30)
        two.sendall(second[1 << 20 :])
        head, content = read_answer(two)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert content == hashlib.sha256(second).hexdigest().encode()


def test_a_streaming_upload_that_waits_past_queue_timeout_gets_503(maitred_server):
    """A fast upload waiting for the busy worker keeps --queue-timeout as any request does: 503
    with Retry-After, the client told before the connection closes, and the upload being served
    goes on to its answer."""
    first = os.urandom(SIZE)
    server = maitred_server("-w", "1", "--queue-timeout", "1", "--log-level", "debug", "streamed:app", cwd=APPS)
    with (
        socket.create_connection((HOST, server.port), timeout=60) as one,
        socket.create_connection((HOST, server.port), timeout=60) as two,
    ):
        one.sendall(post_head(len(first)) + first[: 1 << 20])
        server.wait_for_log("streamed: the first piece is read", timeout=30)
        two.sendall(post_head(SIZE) + os.urandom(1 << 20))
        head, _ = read_answer(two)
        assert head.startswith(b"HTTP/1.1 503"), head
        assert b"\r\nRetry-After: 1\r\n" in head, head
        one.sendall(first[1 << 20 :])
        head, content = read_answer(one)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert content == hashlib.sha256(first).hexdigest().encode()
    server.wait_for_log(streamed_count(2), timeout=30)


def chunked(body: bytes) -> bytes:
    """`body` as 64 KiB chunks, without the last chunk."""
    pieces = (body[start : start + 64 * 1024] for start in range(0, len(body), 64 * 1024))
    return b"".join(b"%x\r\n%b\r\n" % (len(piece), piece) for piece in pieces)


CHUNKED_HEAD = b"POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNKED_CLOSING_HEAD = CHUNKED_HEAD.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n")


@pytest.mark.parametrize("app", ["streamed:app", "streamed:asgi"], ids=["wsgi", "asgi"])
def test_a_fast_chunked_upload_streams_to_its_worker(maitred_server, app):
    """A chunked body's length is not known, so the lobby streams it to its worker in records
    (docs/PROTOCOL.md), the last one saying it has ended: the application reads its first piece
    before the client has sent the rest (a WSGI one's reads wait for theirs, and it has no
    CONTENT_LENGTH: docs/PROXIES.md), and its trailer and the next request on the connection
    are the lobby's. Before, it was spooled whole first, and the upload never ended."""
    body = os.urandom(SIZE)
    server = maitred_server("-w", "1", "--log-level", "debug", app, cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=60) as client:
        client.sendall(CHUNKED_HEAD + chunked(body[: 1 << 20]))
        server.wait_for_log("streamed: the first piece is read", timeout=30)
        client.sendall(chunked(body[1 << 20 :]) + b"0\r\nX-Checksum: ignored\r\n\r\n" + post_head(4) + b"next")
        head, content = read_answer(client)
    first, _, second = content.partition(b"HTTP/1.1 200")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert first == hashlib.sha256(body).hexdigest().encode()
    assert second.endswith(hashlib.sha256(b"next").hexdigest().encode()), second
    server.wait_for_log("POST /upload: its body streams to its worker (", timeout=30)
    assert "of a chunked body's bytes came in" in server.stderr()


@pytest.mark.parametrize(
    ("app", "cut"),
    [
        (
            "streamed:app",
            r"\[Errno 32\] the request body ended at byte \d+ of a chunked body: its client stopped sending it",
        ),
        ("streamed:asgi", r"http.disconnect"),
    ],
    ids=["wsgi", "asgi"],
)
def test_a_chunked_upload_cut_between_chunks_is_a_disconnect_not_an_end(maitred_server, app, cut):
    """A client that goes after a whole chunk, before the last one: the body streamed so far
    is not taken for all of it. The application gets `http.disconnect` (ASGI) or
    `ClientDisconnected`, an `OSError`, from its read (WSGI), so that its handler does not act
    on half a body, and the worker serves the next request. A pipe of bare bytes would end there
    as if the body had."""
    server = maitred_server("-w", "1", "--log-level", "debug", app, cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=60) as client:
        client.sendall(CHUNKED_HEAD + chunked(os.urandom(1 << 20)))
        server.wait_for_log("streamed: the first piece is read", timeout=30)
    server.wait_for_log(re.compile(r"streamed: the body ended short after \d+ bytes: " + cut), timeout=30)
    with socket.create_connection((HOST, server.port), timeout=60) as client:
        client.sendall(post_head(4) + b"next")
        head, content = read_answer(client)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert content == hashlib.sha256(b"next").hexdigest().encode()
