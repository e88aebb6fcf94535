"""Long-lived streams on ASGI workers (issue 47; docs/ASGI.md, "Streams"): an ASGI worker's one
channel carries any number of requests at once, a request counts against --worker-connections
only until its answer starts, and a stream is never cut by --timeout. A WSGI stream, which holds
its thread, is cut only when silent for --timeout. Real processes and sockets: a plain ASGI
application, a plain WSGI one, and clients on asyncio's streams."""

from __future__ import annotations

import asyncio
import json
import os
import re
import resource
import signal
import statistics
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from socket import create_connection

import h2.config
import h2.connection
import h2.events
import pytest
from conftest import HOST, Server, free_port, workers_of

APP = """
import asyncio
import os
import time


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "websocket":
        await receive()
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            await send({"type": "websocket.send", "text": message.get("text") or ""})
    query = dict(pair.split("=") for pair in scope["query_string"].decode().split("&") if pair)
    if scope["path"] == "/block":
        # Synchronous code in an async endpoint: the worker's loop is blocked meanwhile.
        time.sleep(float(query["seconds"]))
    if scope["path"] == "/pid":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(os.getpid()).encode()})
        return
    if scope["path"] == "/events":
        # Server-Sent Events: one event every `every` seconds, `count` of them (0: for ever).
        every, count = float(query.get("every", "1")), int(query.get("count", "0"))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        sent = 0
        while count == 0 or sent < count:
            await send({"type": "http.response.body", "body": b"data: %d\\n\\n" % sent, "more_body": True})
            sent += 1
            await asyncio.sleep(every)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})
"""


WSGI_APP = """
import time


def app(environ, start_response):
    query = dict(pair.split("=") for pair in environ["QUERY_STRING"].split("&") if pair)
    # `count` events `every` seconds apart, after the head and `silent` seconds of nothing.
    every, count, silent = float(query.get("every", "0.5")), int(query.get("count", "10")), float(query.get("silent", "0"))
    start_response("200 OK", [("Content-Type", "text/event-stream")])

    def events():
        yield b"data: head\\n\\n"
        time.sleep(silent)
        for sent in range(count):
            yield b"data: %d\\n\\n" % sent
            time.sleep(every)

    return events()
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "streams.py").write_text(APP)
    (tmp_path / "wsgi_streams.py").write_text(WSGI_APP)
    return tmp_path


def raise_descriptor_limit(wanted: int) -> None:
    """The soft limit of open descriptors up to `wanted` (the test's clients, and the lobby it
    starts, which inherits it); skips when the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"{wanted} descriptors are needed and the hard limit (ulimit -Hn) is {hard}")
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def open_stream(port: int, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def first_event(port: int, target: str) -> tuple[float, asyncio.StreamReader, asyncio.StreamWriter]:
    """Opens an SSE stream; the seconds until its first event, and the stream, still open."""
    started = time.monotonic()
    reader, writer = await open_stream(port, target)
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    await reader.readuntil(b"data: 0\n\n")
    return time.monotonic() - started, reader, writer


async def get_root(port: int) -> float:
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello"), answer[:200]
    return time.monotonic() - started


def test_a_thousand_sse_clients_at_the_defaults_all_get_their_first_event_within_a_second_and_get_answers(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    raise_descriptor_limit(4096)
    server = maitred_server("streams:app", "-w", "2", cwd=app_dir)
    clients = 1000

    async def run() -> tuple[list[float], list[float]]:
        streams = await asyncio.gather(*(first_event(server.port, "/events?every=1") for _ in range(clients)))
        firsts = [took for took, _, _ in streams]
        # While every stream is open: short requests are answered, one after the other.
        roots = [await get_root(server.port) for _ in range(50)]
        # The streams still flow: each has its second event.
        await asyncio.gather(*(reader.readuntil(b"data: 1\n\n") for _, reader, _ in streams))
        for _, _, writer in streams:
            writer.close()
        return firsts, roots

    firsts, roots = asyncio.run(asyncio.wait_for(run(), 60))
    slow = [took for took in firsts if took > 1.0]
    assert not slow, f"{len(slow)} of {clients} waited more than 1 s for their first event: {sorted(slow)[-5:]}"
    p99 = statistics.quantiles(roots, n=100)[98]
    assert p99 < 0.25, f"GET / while {clients} streams were open: p99 {p99 * 1000:.0f} ms"


@pytest.mark.parametrize(
    ("app", "target"),
    [("streams:app", "/events?every=0.5&count=10"), ("wsgi_streams:app", "/?every=0.5&count=10")],
    ids=["asgi", "wsgi"],
)
def test_a_stream_longer_than_timeout_that_keeps_producing_is_not_cut(
    maitred_server: Callable[..., Server], app_dir: Path, app: str, target: str
) -> None:
    server = maitred_server(app, "-w", "1", "--timeout", "2", cwd=app_dir)

    async def run() -> bytes:
        # 10 events 0.5 s apart: 5 s of a stream, none of it silent for 2 s.
        reader, writer = await open_stream(server.port, target)
        body = await reader.readuntil(b"\r\n0\r\n\r\n")
        writer.close()
        return body

    body = asyncio.run(asyncio.wait_for(run(), 20))
    assert all(f"data: {n}\n\n".encode() in body for n in range(10)), body
    assert body.endswith(b"0\r\n\r\n"), "the stream ends with the chunked terminator"
    # Not cut, nor said to be long (long_request counts a WSGI stream's silence).
    assert "--timeout" not in server.stderr(), server.stderr()


def test_a_wsgi_stream_silent_for_timeout_after_its_head_is_cut_with_its_line(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    server = maitred_server("wsgi_streams:app", "-w", "1", "--timeout", "2", cwd=app_dir)

    async def run() -> tuple[bytes, float]:
        reader, writer = await open_stream(server.port, "/?silent=3&count=1")
        await reader.readuntil(b"data: head\n\n")
        headed = time.monotonic()
        rest = await reader.read()
        writer.close()
        return rest, time.monotonic() - headed

    rest, silent_for = asyncio.run(asyncio.wait_for(run(), 20))
    # Cut at --timeout of silence after the head's event, before the application's next one.
    assert b"data: 0" not in rest and not rest.endswith(b"0\r\n\r\n"), rest
    assert 1.5 < silent_for < 2.9, silent_for
    log = server.wait_for_log("nothing more of it came for that long", 10)
    assert "timed out after 2 s on GET /?silent=3&count=1" in log, log


def test_many_more_websockets_than_seats_are_accepted_at_once(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    websockets = pytest.importorskip("websockets.asyncio.client")
    raise_descriptor_limit(4096)
    server = maitred_server("streams:app", "-w", "1", cwd=app_dir)
    sockets = 300

    async def run() -> float:
        started = time.monotonic()
        opened = await asyncio.gather(
            *(websockets.connect(f"ws://{HOST}:{server.port}/ws", open_timeout=10) for _ in range(sockets))
        )
        accepted_in = time.monotonic() - started
        for number, socket in enumerate(opened):
            await socket.send(f"hello {number}")
        answers = await asyncio.gather(*(socket.recv() for socket in opened))
        assert answers == [f"hello {number}" for number in range(sockets)]
        await asyncio.gather(*(socket.close() for socket in opened))
        return accepted_in

    accepted_in = asyncio.run(asyncio.wait_for(run(), 60))
    assert accepted_in < 2.0, f"{sockets} WebSockets on one worker took {accepted_in:.1f} s to be accepted"


def test_a_worker_killed_with_streams_open_ends_each_of_them(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    raise_descriptor_limit(4096)
    server = maitred_server("streams:app", "-w", "1", cwd=app_dir)
    clients = 200

    async def run() -> list[bytes]:
        streams = await asyncio.gather(*(first_event(server.port, "/events?every=0.2") for _ in range(clients)))
        (worker,) = workers_of(server.pid, 1)
        os.kill(worker, signal.SIGKILL)
        # Each client's connection is closed after what was sent, as an aborted answer is.
        ends = await asyncio.gather(*(reader.read() for _, reader, _ in streams))
        for _, _, writer in streams:
            writer.close()
        return ends

    ends = asyncio.run(asyncio.wait_for(run(), 30))
    assert len(ends) == clients
    assert all(not end.endswith(b"0\r\n\r\n") for end in ends), "a cut stream does not look complete"
    # The lobby's log thread may write its line after the clients have seen their ends.
    server.wait_for_log(re.compile("502|cut off"), timeout=30)
    # The replacement serves.
    assert asyncio.run(asyncio.wait_for(get_root(server.port), 10)) < 10


def test_the_deprecated_websocket_seats_says_its_one_line_and_starts(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    server = maitred_server("streams:app", "-w", "1", "--websocket-seats", "4", cwd=app_dir)
    log = server.wait_for_log("--websocket-seats is deprecated and does nothing", 10)
    assert log.count("--websocket-seats is deprecated") == 1
    assert asyncio.run(asyncio.wait_for(get_root(server.port), 10)) < 10


def test_http2_streams_on_one_connection_hold_no_seats_and_get_answers_meanwhile(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    """Issue 47, item 8: an HTTP/2 stream to an ASGI worker is a stream as an HTTP/1.1 one is.
    150 SSE streams on one connection, to one worker at the defaults (--worker-connections 32),
    each get their first event, and a GET / on the same connection is answered while they are
    open."""
    streams = 150
    server = maitred_server("streams:app", "-w", "1", "--http2-max-concurrent-streams", str(streams + 10), cwd=app_dir)
    sock = create_connection((HOST, server.port), timeout=10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    bodies: dict[int, bytes] = {}
    ended: set[int] = set()

    def request(path: str) -> int:
        stream = conn.get_next_available_stream_id()
        fields = [(":method", "GET"), (":scheme", "http"), (":authority", "x"), (":path", path)]
        conn.send_headers(stream, fields, end_stream=True)
        sock.sendall(conn.data_to_send())
        bodies[stream] = b""
        return stream

    def until(condition: Callable[[], bool], within: float) -> None:
        deadline = time.monotonic() + within
        while not condition():
            assert time.monotonic() < deadline, f"{sum(b'data: 0' in body for body in bodies.values())} first events"
            data = sock.recv(1 << 16)
            assert data, "the server closed the connection"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    bodies[event.stream_id] += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    ended.add(event.stream_id)
            sock.sendall(conn.data_to_send())

    until(lambda: conn.remote_settings.max_concurrent_streams > streams, 10)
    started = time.monotonic()
    sse = [request("/events?every=1") for _ in range(streams)]
    until(lambda: all(b"data: 0\n\n" in bodies[stream] for stream in sse), 10)
    first_events_in = time.monotonic() - started
    asked = time.monotonic()
    root = request("/")
    until(lambda: root in ended, 10)
    answered_in = time.monotonic() - asked
    assert bodies[root] == b"hello"
    # The streams flow on meanwhile: each has its second event.
    until(lambda: all(b"data: 1\n\n" in bodies[stream] for stream in sse), 10)
    sock.close()
    assert first_events_in < 2.0, f"{streams} HTTP/2 streams had their first events after {first_events_in:.1f} s"
    assert answered_in < 0.5, f"GET / beside {streams} HTTP/2 streams took {answered_in * 1000:.0f} ms"


def test_a_blocked_event_loop_is_given_no_new_requests_and_its_lag_is_on_status(
    maitred_server: Callable[..., Server], app_dir: Path
) -> None:
    """Issue 47, item 2: the lobby admits nothing new to a worker whose loop is late (over 50 ms,
    worker/mux.rs), and status.json gives each worker's loop_lag_seconds. One worker's loop is
    blocked for 4 s; meanwhile every request goes to the other, at once."""
    stats = free_port()
    server = maitred_server("streams:app", "-w", "2", "--stats", f"{HOST}:{stats}", cwd=app_dir)

    def lags() -> list[float | None]:
        with urllib.request.urlopen(f"http://{HOST}:{stats}/status.json", timeout=5) as response:
            return [worker.get("loop_lag_seconds", "absent") for worker in json.load(response)["scoreboard"]]

    def get(target: str) -> tuple[float, bytes]:
        started = time.monotonic()
        with urllib.request.urlopen(f"http://{HOST}:{server.port}{target}", timeout=10) as response:
            return time.monotonic() - started, response.read()

    deadline = time.monotonic() + 10
    while not all(isinstance(lag, float) and lag < 0.05 for lag in lags()):
        assert time.monotonic() < deadline, lags()
        time.sleep(0.05)
    with ThreadPoolExecutor(1) as pool:
        blocked = pool.submit(get, "/block?seconds=4")
        while max(lags()) < 0.2:
            assert time.monotonic() < deadline, lags()
            time.sleep(0.02)
        answers = [get("/pid") for _ in range(20)]
        assert blocked.result(timeout=20)[1] == b"hello"
    slowest = max(took for took, _ in answers)
    assert slowest < 1.0, f"a request waited {slowest:.1f} s behind the blocked loop"
    assert len({pid for _, pid in answers}) == 1, "every request went to the worker whose loop runs"
