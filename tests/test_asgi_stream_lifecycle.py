"""Open streams of ASGI workers across the server's lifecycle (issue 47, item 6; docs/SIGNALS.md):
SIGTERM ends each cleanly at --graceful-timeout (the chunked terminator, HTTP/2's END_STREAM,
a WebSocket's Close 1001); SIGHUP leaves them with the old workers, and SIGUSR2 with the old
lobby, until they end or --graceful-timeout passes, while new requests go to the new ones; a
worker killed with thousands open ends each for its client. Real processes and sockets, the
application and clients of tests/test_asgi_streams.py; every wait is on an event."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import HOST, Server, eventually, workers_of
from test_asgi_streams import APP, first_event, raise_descriptor_limit

# The streams' application, and `GET /pid`: the pid of the worker that answers.
PID_APP = (
    APP
    + """
import os

_streams = app


async def app(scope, receive, send):
    if scope["type"] == "http" and scope["path"] == "/pid":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(os.getpid()).encode()})
        return
    await _streams(scope, receive, send)
"""
)

CHUNKED_END = b"\r\n0\r\n\r\n"


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "streams.py").write_text(PID_APP)
    return tmp_path


async def pid_of_answer(port: int) -> int:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(b"GET /pid HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    return int(answer.rsplit(b"\r\n\r\n", 1)[1])


async def open_streams(port: int, count: int, every: float) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """`count` SSE streams, each with its first event; opened a hundred at a time, as clients
    arrive, so that the listen queue never overflows."""
    streams = []
    for start in range(0, count, 100):
        batch = range(start, min(count, start + 100))
        opened = await asyncio.gather(*(first_event(port, f"/events?every={every}") for _ in batch))
        streams.extend((reader, writer) for _, reader, writer in opened)
    return streams


async def rest_of(reader: asyncio.StreamReader) -> bytes:
    """What the stream sends until its end (the chunked terminator; the connection may stay
    open for another request), or until its connection closes."""
    try:
        return await reader.readuntil(CHUNKED_END)
    except asyncio.IncompleteReadError as cut:
        return cut.partial


def ended_cleanly(rest: bytes) -> bool:
    return rest.endswith(CHUNKED_END)


def test_sigterm_ends_open_sse_streams_cleanly_and_closes_websockets_1001_at_graceful_timeout(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    websockets = pytest.importorskip("websockets.asyncio.client")
    raise_descriptor_limit(4096)
    grace = 6.0
    server = maitred_server("streams:app", "-w", "2", "--graceful-timeout", str(grace), cwd=app_dir)
    clients = 300

    async def run() -> tuple[list[bytes], list[int | None], float]:
        streams = await open_streams(server.port, clients, every=0.5)
        sockets = await asyncio.gather(
            *(websockets.connect(f"ws://{HOST}:{server.port}/ws", open_timeout=10) for _ in range(clients))
        )
        for socket in sockets:
            await socket.send("before")
        assert await asyncio.gather(*(socket.recv() for socket in sockets)) == ["before"] * clients
        signalled = time.monotonic()
        server.send_signal(signal.SIGTERM)
        # During the grace the streams still flow, and the WebSockets still echo.
        await asyncio.gather(*(reader.readuntil(b"data: 2\n\n") for reader, _ in streams))
        for socket in sockets:
            await socket.send("during")
        assert await asyncio.gather(*(socket.recv() for socket in sockets)) == ["during"] * clients
        assert time.monotonic() - signalled < grace, "the test was slower than the grace it checks"
        rests = await asyncio.gather(*(rest_of(reader) for reader, _ in streams))
        ended_after = time.monotonic() - signalled
        for socket in sockets:
            await socket.wait_closed()
        for _, writer in streams:
            writer.close()
        return rests, [socket.close_code for socket in sockets], ended_after

    rests, codes, ended_after = asyncio.run(asyncio.wait_for(run(), 60))
    unclean = [rest[-40:] for rest in rests if not ended_cleanly(rest)]
    assert not unclean, f"{len(unclean)} of {clients} SSE streams were cut, not ended: {unclean[:3]}"
    assert ended_after >= grace - 0.5, f"the streams ended {ended_after:.1f} s after SIGTERM, before the grace"
    assert codes == [1001] * clients, sorted(set(map(str, codes)))
    assert server.wait(timeout=30) == 0, server.stderr()
    log = server.stderr()
    assert f"--graceful-timeout passed with {clients} streams and {clients} WebSockets open" in log, log[-3000:]
    assert "requests unfinished" not in log


def http2_frames(log: Path, kind: str) -> list[tuple[int, str]]:
    """nghttp -v's log: the stream id and flags of each frame of `kind` received."""
    found = re.findall(rf"recv {kind} frame <[^>]*flags=(0x[0-9a-f]+), stream_id=(\d+)>", log.read_text())
    return [(int(stream), flags) for flags, stream in found]


def test_sigterm_ends_http2_sse_streams_with_end_stream(
    maitred_server: Callable[..., Server], app_dir: Path, tmp_path: Path
) -> None:
    """20 SSE streams multiplexed on one HTTP/2 connection (nghttp, nghttp2's client, prior
    knowledge): at --graceful-timeout each ends with END_STREAM, none with RST_STREAM."""
    nghttp = shutil.which("nghttp")
    if nghttp is None:
        pytest.skip("nghttp (nghttp2's client) is not installed")
    server = maitred_server("streams:app", "-w", "1", "--graceful-timeout", "2", cwd=app_dir)
    streams = 20
    urls = [f"{server.url}/events?every=0.3&client={number}" for number in range(streams)]
    log = tmp_path / "nghttp.log"
    with log.open("w") as out, subprocess.Popen([nghttp, "-v", "-n", "-m", "1", *urls], stdout=out) as client:
        opened = eventually(lambda: len({stream for stream, _ in http2_frames(log, "DATA")}) == streams, 20)
        assert opened, log.read_text()[-2000:]
        server.send_signal(signal.SIGTERM)
        assert client.wait(timeout=30) == 0, log.read_text()[-2000:]
    ends = {stream for stream, flags in http2_frames(log, "DATA") if int(flags, 16) & 0x1}
    assert len(ends) == streams and not http2_frames(log, "RST_STREAM"), log.read_text()[-2000:]
    assert server.wait(timeout=30) == 0, server.stderr()
    assert f"--graceful-timeout passed with {streams} streams" in server.stderr()


def test_sighup_leaves_open_streams_with_the_old_workers_until_graceful_timeout(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    raise_descriptor_limit(4096)
    grace = 4.0
    server = maitred_server("streams:app", "-w", "2", "--graceful-timeout", str(grace), cwd=app_dir)
    old_workers = workers_of(server.pid, 2)

    async def run() -> tuple[list[bytes], set[int]]:
        streams = await open_streams(server.port, 200, every=0.3)
        server.send_signal(signal.SIGHUP)
        await asyncio.to_thread(server.wait_for_log, "SIGHUP: reloaded", 30)
        reloaded = time.monotonic()
        # New requests go to the new workers, while the old ones keep their streams flowing.
        answered_by = {await pid_of_answer(server.port) for _ in range(20)}
        await asyncio.gather(*(reader.readuntil(b"data: 5\n\n") for reader, _ in streams))
        assert time.monotonic() - reloaded < grace, "the streams were slower than the test assumes"
        rests = await asyncio.gather(*(rest_of(reader) for reader, _ in streams))
        assert time.monotonic() - reloaded >= grace - 0.5, "the streams ended before --graceful-timeout"
        for _, writer in streams:
            writer.close()
        return rests, answered_by

    rests, answered_by = asyncio.run(asyncio.wait_for(run(), 60))
    assert not answered_by & old_workers, (answered_by, old_workers)
    unclean = [rest[-40:] for rest in rests if not ended_cleanly(rest)]
    assert not unclean, f"{len(unclean)} of {len(rests)} streams were cut, not ended: {unclean[:3]}"
    # The old workers leave once their streams have ended; the new ones serve on.
    assert eventually(lambda: not workers_of(server.pid) & old_workers, 15), server.stderr()[-3000:]
    assert "ended at --graceful-timeout (its worker retired)" in server.stderr()
    assert asyncio.run(asyncio.wait_for(pid_of_answer(server.port), 10)) in workers_of(server.pid, 2)


def test_a_worker_recycled_by_max_requests_keeps_its_streams_until_graceful_timeout(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    """Recycling (--max-requests) retires a worker as a reload does: its
    open streams flow on until --graceful-timeout, then end cleanly, and its place is taken."""
    grace = 3.0
    server = maitred_server(
        "streams:app", "-w", "1", "--max-requests", "30", "--graceful-timeout", str(grace), cwd=app_dir
    )
    # Asked of an answer, not of the zygote: recycling keeps a spare worker, which may be up.
    recycled = asyncio.run(asyncio.wait_for(pid_of_answer(server.port), 10))

    async def run() -> list[bytes]:
        streams = await open_streams(server.port, 20, every=0.3)
        # The streams count as 20 of its 30 requests, with the one above and these nine.
        for _ in range(9):
            assert await pid_of_answer(server.port) == recycled
        await asyncio.to_thread(server.wait_for_log, "retiring worker", 30)
        retired = time.monotonic()
        await asyncio.gather(*(reader.readuntil(b"data: 3\n\n") for reader, _ in streams))
        assert time.monotonic() - retired < grace, "the streams were slower than the test assumes"
        rests = await asyncio.gather(*(rest_of(reader) for reader, _ in streams))
        assert time.monotonic() - retired >= grace - 0.5, "the streams ended before --graceful-timeout"
        for _, writer in streams:
            writer.close()
        return rests

    rests = asyncio.run(asyncio.wait_for(run(), 60))
    unclean = [rest[-40:] for rest in rests if not ended_cleanly(rest)]
    assert not unclean, f"{len(unclean)} of {len(rests)} streams were cut, not ended: {unclean[:3]}"
    assert "ended at --graceful-timeout (its worker retired)" in server.stderr()
    assert eventually(lambda: recycled not in workers_of(server.pid), 15), server.stderr()[-3000:]
    assert asyncio.run(asyncio.wait_for(pid_of_answer(server.port), 10)) != recycled


def test_sigusr2_leaves_open_streams_with_the_old_lobby_until_graceful_timeout(
    maitred_server: Callable[..., Server], app_dir: Path, tmp_path: Path
) -> None:
    raise_descriptor_limit(4096)
    grace = 4.0
    pid_file = tmp_path / "maitred.pid"
    server = maitred_server(
        "streams:app", "-w", "2", "--graceful-timeout", str(grace), "--pid", str(pid_file), cwd=app_dir
    )
    old_workers = workers_of(server.pid, 2)

    def new_lobby() -> int | None:
        text = pid_file.read_text().strip() if pid_file.exists() else ""
        return int(text) if text and int(text) != server.pid else None

    async def run() -> tuple[list[bytes], set[int], int]:
        streams = await open_streams(server.port, 200, every=0.3)
        server.send_signal(signal.SIGUSR2)
        assert await asyncio.to_thread(eventually, lambda: new_lobby() is not None, 30), server.stderr()[-3000:]
        successor = new_lobby()
        assert successor is not None
        await asyncio.to_thread(server.wait_for_log, "shutting down: no new connections", 30)
        upgraded = time.monotonic()
        new_workers = await asyncio.to_thread(workers_of, successor, 2)
        answered_by = {await pid_of_answer(server.port) for _ in range(20)}
        assert answered_by <= new_workers, (answered_by, new_workers)
        await asyncio.gather(*(reader.readuntil(b"data: 5\n\n") for reader, _ in streams))
        assert time.monotonic() - upgraded < grace, "the streams were slower than the test assumes"
        rests = await asyncio.gather(*(rest_of(reader) for reader, _ in streams))
        assert time.monotonic() - upgraded >= grace - 0.5, "the streams ended before --graceful-timeout"
        for _, writer in streams:
            writer.close()
        return rests, answered_by, successor

    rests, answered_by, successor = asyncio.run(asyncio.wait_for(run(), 90))
    try:
        assert not answered_by & old_workers
        unclean = [rest[-40:] for rest in rests if not ended_cleanly(rest)]
        assert not unclean, f"{len(unclean)} of {len(rests)} streams were cut, not ended: {unclean[:3]}"
        assert server.wait(timeout=30) == 0, server.stderr()[-3000:]
        assert "--graceful-timeout passed with 200 streams and 0 WebSockets open" in server.stderr()
    finally:
        os.kill(successor, signal.SIGTERM)
        eventually(lambda: not pid_file.exists(), 30)


def test_a_worker_killed_with_five_thousand_streams_open_ends_each_of_them(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    """5,000 streams: the client's 5,000 sockets and the lobby's 5,000 under the hard limit of
    descriptors (ulimit -Hn), which must allow 12,000 (skipped, saying so, otherwise)."""
    raise_descriptor_limit(12_000)
    clients = 5000
    server = maitred_server("streams:app", "-w", "1", cwd=app_dir)

    async def run(worker: int) -> list[bytes]:
        streams = await open_streams(server.port, clients, every=5)
        os.kill(worker, signal.SIGKILL)
        # Each client's connection is closed after what was sent, as an aborted answer's is: a
        # client sees a cut, never an end that looks complete.
        rests = await asyncio.gather(*(rest_of(reader) for reader, _ in streams))
        for _, writer in streams:
            writer.close()
        return rests

    (killed,) = workers_of(server.pid, 1)
    rests = asyncio.run(asyncio.wait_for(run(killed), 120))
    assert len(rests) == clients
    assert not [rest for rest in rests if ended_cleanly(rest)], "a cut stream does not look complete"
    # The replacement serves.
    assert asyncio.run(asyncio.wait_for(pid_of_answer(server.port), 20)) != killed
