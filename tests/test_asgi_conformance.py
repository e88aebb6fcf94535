"""What the ASGI specification (asgiref's specs/www.rst 2.5 and specs/lifespan.rst 2.0) asks of a
server, held against maitred with a plain ASGI application (tests/apps/asgi_conformance.py), as
docs/ASGI.md's table "What the specification asks" lists: every key of the HTTP, WebSocket and
lifespan scopes with its type, hop-by-hop headers from the application, http.disconnect while a
response streams, and --timeout with a request that does not end at once when cancelled."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import HOST, Server, workers_of
from test_wsgi_live import Client, request

APPS = Path(__file__).resolve().parent / "apps"
TIMEOUT = 10.0


def event_lines(path: Path, name: str, count: int = 1, timeout: float = TIMEOUT) -> list[list[str]]:
    """The events named `name` (`[name, pid, value]` each), once there are `count` of them."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text() if path.exists() else ""
        lines = [line.split(" ", 2) for line in text.splitlines() if line.split(" ", 1)[0] == name]
        if len(lines) >= count:
            return lines
        assert time.monotonic() < deadline, f"{count} {name!r} events did not come:\n{text}"
        time.sleep(0.02)


def conformance_server(launch: Callable[..., Server], events: Path, *args: str) -> Server:
    return launch("asgi_conformance:app", *args, cwd=APPS, env={"ASGI_EVENTS": str(events)})


def get(server: Server, target: str) -> tuple[int, bytes]:
    with Client(server.port) as client:
        response = client.exchange("GET", target)
    return response.status, response.body


# ---------------------------------------------------------------------------------------------
# The scopes, key by key.


@pytest.fixture(scope="module")
def scopes(maitred_module_server: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The three scopes as the application described them (`describe`: [type, contents])."""
    from websockets.sync.client import connect

    events = tmp_path_factory.mktemp("scopes") / "events"
    server = conformance_server(maitred_module_server, events, "-w", "1")
    http = json.loads(get(server, "/scope?x=1")[1])
    lifespan = json.loads(get(server, "/lifespan-scope")[1])
    with connect(f"ws://{HOST}:{server.port}/scope?y=2", subprotocols=["one", "two"], open_timeout=TIMEOUT) as ws:
        websocket = json.loads(ws.recv(timeout=TIMEOUT))
    return {"http": http, "websocket": websocket, "lifespan": lifespan, "port": server.port}


ADDRESS = ["tuple", [["str", HOST], ["int", "any"]]]
# Each key: the scope type, the key, and what it must be: its type and value ("any" where the
# value is the test's own: a port, the headers), as uvicorn gives them where the specification
# lets a server choose (tuples for client and server, lists for headers and subprotocols).
EXPECTED = [
    ("http", "type", ["str", "http"]),
    ("http", "asgi", ["dict", {"version": ["str", "3.0"], "spec_version": ["str", "2.5"]}]),
    ("http", "http_version", ["str", "1.1"]),
    ("http", "method", ["str", "GET"]),
    ("http", "scheme", ["str", "http"]),
    ("http", "path", ["str", "/scope"]),
    ("http", "raw_path", ["bytes", "/scope"]),
    ("http", "query_string", ["bytes", "x=1"]),
    ("http", "root_path", ["str", ""]),
    ("http", "headers", ["list", "any"]),
    ("http", "client", ADDRESS),
    ("http", "server", ["tuple", [["str", HOST], ["int", "port"]]]),
    ("http", "state", ["dict", {"greeting": ["str", "from lifespan"]}]),
    # Only what maitred implements: Path Send (tests/test_asgi_pathsend.py).
    ("http", "extensions", ["dict", {"http.response.pathsend": ["dict", {}]}]),
    ("websocket", "type", ["str", "websocket"]),
    ("websocket", "asgi", ["dict", {"version": ["str", "3.0"], "spec_version": ["str", "2.5"]}]),
    ("websocket", "http_version", ["str", "1.1"]),
    ("websocket", "scheme", ["str", "ws"]),
    ("websocket", "path", ["str", "/scope"]),
    ("websocket", "raw_path", ["bytes", "/scope"]),
    ("websocket", "query_string", ["bytes", "y=2"]),
    ("websocket", "root_path", ["str", ""]),
    ("websocket", "headers", ["list", "any"]),
    ("websocket", "client", ADDRESS),
    ("websocket", "server", ["tuple", [["str", HOST], ["int", "port"]]]),
    ("websocket", "subprotocols", ["list", [["str", "one"], ["str", "two"]]]),
    ("websocket", "state", ["dict", {"greeting": ["str", "from lifespan"]}]),
    # Only what maitred implements: the denial response (docs/PROTOCOL.md, section 5).
    ("websocket", "extensions", ["dict", {"websocket.http.response": ["dict", {}]}]),
    ("lifespan", "type", ["str", "lifespan"]),
    # The lifespan's own specification, at 2.0, not the HTTP one's.
    ("lifespan", "asgi", ["dict", {"version": ["str", "3.0"], "spec_version": ["str", "2.0"]}]),
    # Empty when the application is called; what startup puts there reaches every request.
    ("lifespan", "state", ["dict", {}]),
]


def matches(got: object, expected: object, port: int) -> bool:
    if expected == "any":
        return True
    if expected == "port":
        return got == port
    if isinstance(expected, list) and isinstance(got, list):
        return len(got) == len(expected) and all(matches(g, e, port) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(matches(got[key], expected[key], port) for key in expected)
    return got == expected


@pytest.mark.parametrize(("kind", "key", "expected"), EXPECTED, ids=[f"{kind}-{key}" for kind, key, _ in EXPECTED])
def test_each_scope_key_has_the_specifications_type(scopes: dict, kind: str, key: str, expected: list) -> None:
    scope = scopes[kind]
    assert key in scope, f"the {kind} scope has no {key!r}: {sorted(scope)}"
    assert matches(scope[key], expected, scopes["port"]), f"{kind} scope[{key!r}] is {scope[key]}, not {expected}"


@pytest.mark.parametrize("kind", ["http", "websocket", "lifespan"])
def test_a_scope_has_no_key_the_specification_does_not_name(scopes: dict, kind: str) -> None:
    # A WebSocket scope has no "method": Litestar refuses a WebSocket whose scope has one.
    # An HTTP scope offers one extension, pathsend: maitred implements none of HTTP's others
    # (trailers, early hints, zero-copy send, tls).
    expected = {key for scope_kind, key, _ in EXPECTED if scope_kind == kind}
    assert set(scopes[kind]) == expected


@pytest.mark.parametrize("kind", ["http", "websocket"])
def test_header_names_are_lowercased_bytes_in_pairs(scopes: dict, kind: str) -> None:
    headers = scopes[kind]["headers"][1]
    assert headers, "no headers"
    for pair in headers:
        assert pair[0] == "tuple" and [item[0] for item in pair[1]] == ["bytes", "bytes"], pair
        name = pair[1][0][1]
        assert name == name.lower(), pair
    assert ["bytes", "host"] in [pair[1][0] for pair in headers]


def test_a_scope_has_state_without_a_lifespan(maitred_server: Callable[..., Server], tmp_path: Path) -> None:
    # As uvicorn's: an application without a lifespan (Django's raises on its scope) still finds
    # scope["state"], empty, and a copy of its own for each request.
    (tmp_path / "stateless.py").write_text(
        "async def app(scope, receive, send):\n"
        "    assert scope['type'] == 'http', 'no lifespan here'\n"
        "    body = repr(scope['state']).encode()\n"
        "    scope['state']['seen'] = True\n"
        "    await send({'type': 'http.response.start', 'status': 200, 'headers': []})\n"
        "    await send({'type': 'http.response.body', 'body': body})\n"
    )
    server = maitred_server("stateless:app", "-w", "1", "--interface", "asgi", cwd=tmp_path)
    assert get(server, "/") == (200, b"{}")
    assert get(server, "/") == (200, b"{}")


def test_over_a_unix_socket_the_client_is_none_and_the_server_is_its_path_and_none(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    path = tmp_path / "maitred.sock"
    # Listening on its TCP port too, so that the launcher knows when it serves.
    maitred_server("asgi_conformance:app", "-w", "1", "--bind", f"unix:{path}", cwd=APPS)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(TIMEOUT)
        sock.connect(str(path))
        sock.sendall(request("GET", "/scope", headers=[("Connection", "close")]))
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    scope = json.loads(received.split(b"\r\n\r\n", 1)[1])
    assert scope["client"] == ["NoneType", None]
    assert scope["server"] == ["tuple", [["str", str(path)], ["NoneType", None]]]


# ---------------------------------------------------------------------------------------------
# Hop-by-hop headers from the application: the framing is the server's.


def test_hop_by_hop_headers_from_the_application_are_dropped_and_said_once(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    server = conformance_server(maitred_server, tmp_path / "events", "-w", "1")
    with Client(server.port) as client:
        for _ in range(2):
            response = client.exchange("GET", "/hop-by-hop")
            assert response.status == 200, server.stderr()
            assert response.body == b"data: 1\n\ndata: 2\n\n"
            # The lobby's own framing, once; nothing of the application's connection headers.
            assert [name for name, _ in response.headers].count("transfer-encoding") == 1
            assert response.framing == "chunked"
            assert response.header("keep-alive") is None and response.header("connection") is None
        # The connection stayed open for both: keep-alive is HTTP/1.1's default.
    lines = [line for line in server.stderr().splitlines() if "hop-by-hop" in line]
    assert len(lines) == 1, lines
    assert '"connection"' in lines[0] and "GET /hop-by-hop" in lines[0], lines[0]


def test_connection_close_from_the_application_still_closes(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    server = conformance_server(maitred_server, tmp_path / "events", "-w", "1")
    with Client(server.port) as client:
        response = client.exchange("GET", "/hop-close")
        assert (response.status, response.body) == (200, b"bye\n"), server.stderr()
        assert response.header("connection") == "close"
        assert client.at_eof()


# ---------------------------------------------------------------------------------------------
# http.disconnect while a response streams.


def test_a_streaming_application_hears_at_once_that_its_client_left(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    events = tmp_path / "events"
    # One seat: the request after it is served only once this one has ended.
    server = conformance_server(maitred_server, events, "-w", "1", "--worker-connections", "1")
    with Client(server.port) as client:
        client.send(request("GET", "/first-then-wait"))
        head = client.read_head()
        assert head.status == 200
        assert client.read_chunk() == b"first\n"
        event_lines(events, "first-sent")
        left = time.monotonic()
    # Closed: the application's receive() returns http.disconnect, without waiting for its own
    # patience (asgi_conformance.PATIENCE, 10 s) to run out.
    ((_, _, heard),) = event_lines(events, "http.disconnect", timeout=5)
    assert float(heard) - left < 1.0
    # A send after it raises an OSError (the specification's 2.4), which the worker does not
    # log as an error.
    ((_, _, raised),) = event_lines(events, "send-raised")
    assert raised == "ClientDisconnected"
    # Its one seat is free again: the application's return ended the request.
    assert get(server, "/pid")[0] == 200
    assert "Error handling request" not in server.stderr()


# ---------------------------------------------------------------------------------------------
# --timeout on an event loop that runs, and on one that is blocked.


def test_a_request_slow_to_cancel_gets_504_at_timeout_and_its_worker_serves_on(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    events = tmp_path / "events"
    timeout = 4.0
    server = conformance_server(maitred_server, events, "-w", "1", "--timeout", f"{timeout:g}")
    worker = int(get(server, "/pid")[1])

    def slow_to_cancel() -> tuple[int, float]:
        with Client(server.port) as client:
            client.send(request("GET", "/stubborn"))
            response = client.read_response()
        return response.status, time.monotonic()

    def fine(seconds: float) -> tuple[int, bytes]:
        return get(server, f"/sleep?seconds={seconds}")

    with ThreadPoolExecutor(2) as pool:
        stubborn = pool.submit(slow_to_cancel)
        ((_, _, started),) = event_lines(events, "stubborn-started")
        # Once the loop has cancelled the stubborn task, another request on the same loop that
        # lasts past the moment the old lobby killed the worker (--timeout + 2 s), though well
        # within its own --timeout.
        event_lines(events, "stubborn-cancelled", timeout=timeout + 3)
        other = pool.submit(fine, 3.0)
        status, answered = stubborn.result(timeout=TIMEOUT)
        assert status == 504
        # At --timeout, not when the task ends (STUBBORN_FOR later).
        assert timeout - 0.2 < answered - float(started) < timeout + 1.0
        assert other.result(timeout=TIMEOUT)[0] == 200, server.stderr()
    event_lines(events, "stubborn-done")
    assert workers_of(server.pid) == {worker}
    assert get(server, "/pid") == (200, f"{worker}\n".encode())
    log = server.stderr()
    assert "its event loop is blocked" not in log and "it is killed" not in log, log
    # Half-way, the diagnosis says what --timeout will do to an ASGI request: cancel it.
    line = next(line for line in log.splitlines() if "(long_request)" in line)
    assert "GET /stubborn" in line and "is cancelled" in line and "killed" not in line, line


def test_a_blocked_event_loop_is_still_killed_at_timeout(maitred_server: Callable[..., Server], tmp_path: Path) -> None:
    timeout = 2.0
    server = conformance_server(maitred_server, tmp_path / "events", "-w", "1", "--timeout", f"{timeout:g}")
    worker = int(get(server, "/pid")[1])
    started = time.monotonic()
    status, _ = get(server, "/block?seconds=60")
    assert status == 504
    assert time.monotonic() - started < timeout + 1.0
    server.wait_for_log("its event loop is blocked", TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while worker in (current := workers_of(server.pid)) or not current:
        assert time.monotonic() < deadline, server.stderr()
        time.sleep(0.05)
    status, body = get(server, "/pid")
    assert status == 200 and int(body) != worker
