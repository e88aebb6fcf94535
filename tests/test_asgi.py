"""ASGI applications under maitred (docs/ASGI.md): FastAPI, Starlette and Django's ASGI handler,
told from WSGI by their signature; lifespan, streaming, large uploads, a client that leaves,
--timeout, a blocked event loop, overload with --queue-timeout, and the interface's checks."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from conftest import HOST, Finished, Server, children, eventually, free_port, is_probe, workers_of
from maitred.zygote import PROBE_NAME

APPS = Path(__file__).resolve().parent / "apps"
TIMEOUT = 10.0

pytest.importorskip("fastapi", reason="FastAPI is in the test extra (pyproject.toml)")


def wait_for_lines(path: Path, word: str, count: int, timeout: float = TIMEOUT) -> list[str]:
    """The lines of `path` that start with `word`, once there are `count` of them."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in (path.read_text() if path.exists() else "").splitlines() if line.startswith(word)]
        if len(lines) >= count:
            return lines
        assert time.monotonic() < deadline, f"{count} {word!r} lines did not come: {lines}"
        time.sleep(0.02)


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return tmp_path / "events"


def fastapi_server(
    maitred_server: Callable[..., Server], events: Path, *args: str, env: dict[str, str] | None = None
) -> Server:
    return maitred_server(
        "fastapi_app:app", "-w", "2", *args, cwd=APPS, env={"FASTAPI_EVENTS": str(events), **(env or {})}
    )


def test_a_fastapi_application_is_told_by_its_signature_and_its_lifespan_state_reaches_requests(
    maitred_server: Callable[..., Server], events: Path
) -> None:
    server = fastapi_server(maitred_server, events)
    # Each worker ran startup before it took a request.
    wait_for_lines(events, "startup", 2)
    answer = requests.get(f"{server.url}/state", timeout=TIMEOUT)
    assert answer.status_code == 200
    body = answer.json()
    assert body["greeting"] == "hello from lifespan"
    assert body["scheme"] == "http" and body["client"] == HOST and body["root_path"] == ""
    assert body["pid"] in workers_of(server.pid, 2)
    assert server.stop() == 0
    # ... and shutdown at the stop.
    assert len(wait_for_lines(events, "shutdown", 2)) == 2


def test_a_recycled_worker_runs_its_lifespan_shutdown(maitred_server: Callable[..., Server], events: Path) -> None:
    server = fastapi_server(maitred_server, events, "-w", "1", "--max-requests", "2")
    first = {requests.get(f"{server.url}/pid", timeout=TIMEOUT).text for _ in range(2)}
    # The worker that served its two requests leaves through its shutdown; its successor starts.
    assert wait_for_lines(events, "shutdown", 1) == [f"shutdown {pid}" for pid in first]
    assert requests.get(f"{server.url}/pid", timeout=TIMEOUT).text not in first


def test_lifespan_shutdown_runs_at_sigttou_and_at_a_reload(maitred_server: Callable[..., Server], events: Path) -> None:
    server = fastapi_server(maitred_server, events)
    first = {int(line.split()[1]) for line in wait_for_lines(events, "startup", 2)}
    server.send_signal(signal.SIGTTOU)
    (fewer,) = wait_for_lines(events, "shutdown", 1)
    assert int(fewer.split()[1]) in first
    server.send_signal(signal.SIGHUP)
    # The worker left leaves through its shutdown once its successor serves.
    assert {int(line.split()[1]) for line in wait_for_lines(events, "shutdown", 2)} == first
    assert int(requests.get(f"{server.url}/pid", timeout=TIMEOUT).text) not in first


def test_the_access_log_metrics_forwarded_headers_and_an_upgrade_apply_to_asgi(
    maitred_server: Callable[..., Server], events: Path, tmp_path: Path
) -> None:
    access_log, pid_file, stats = tmp_path / "access.log", tmp_path / "maitred.pid", free_port()
    server = fastapi_server(
        maitred_server,
        events,
        *("--access-logfile", str(access_log), "--access-logformat", "json"),
        *("--stats", f"{HOST}:{stats}", "--pid", str(pid_file)),
    )
    first = {int(line.split()[1]) for line in wait_for_lines(events, "startup", 2)}
    forwarded = {"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https"}
    body = requests.get(f"{server.url}/state", headers=forwarded, timeout=TIMEOUT).json()
    assert (body["client"], body["scheme"]) == ("203.0.113.7", "https")
    (line,) = wait_for_lines(access_log, "{", 1)
    record = json.loads(line)
    assert (record["request"], record["status"], record["pid"]) == ("GET /state HTTP/1.1", 200, body["pid"]), line
    assert record["queue_ms"] >= 0 and record["app_ms"] >= 0, line
    metrics = requests.get(f"http://{HOST}:{stats}/metrics", timeout=TIMEOUT).text
    assert 'maitred_requests_total{class="2xx"} 1' in metrics.splitlines(), metrics
    # SIGUSR2: a new maitred takes over with workers of its own; the old ones run their shutdown.
    server.send_signal(signal.SIGUSR2)
    assert server.wait(timeout=30) == 0, server.stderr()
    new_lobby = int(pid_file.read_text())
    assert {int(line.split()[1]) for line in wait_for_lines(events, "shutdown", 2)} == first
    assert len(wait_for_lines(events, "startup", 4)) == 4
    assert int(requests.get(f"{server.url}/pid", timeout=TIMEOUT).text) in workers_of(new_lobby, 2)
    os.kill(new_lobby, signal.SIGTERM)
    assert eventually(lambda: not Path(f"/proc/{new_lobby}").exists(), TIMEOUT), "the new lobby did not exit"
    assert not pid_file.exists()


def test_a_streamed_response_arrives_whole_in_pieces(maitred_server: Callable[..., Server], events: Path) -> None:
    server = fastapi_server(maitred_server, events)
    answer = requests.get(f"{server.url}/stream", params={"count": 2000}, timeout=TIMEOUT, stream=True)
    assert answer.headers.get("transfer-encoding") == "chunked"
    assert answer.raw.read() == b"".join(f"piece {number}\n".encode() for number in range(2000))


@pytest.mark.parametrize("size", [0, 1, 65_536, 3_000_001])
def test_an_upload_reaches_the_application_in_pieces(
    maitred_server: Callable[..., Server], events: Path, size: int
) -> None:
    server = fastapi_server(maitred_server, events)
    data = random.Random(size).randbytes(size)
    answer = requests.post(f"{server.url}/upload", data=data, timeout=TIMEOUT)
    assert answer.status_code == 200
    assert answer.json()["size"] == size
    assert answer.json()["sha256"] == hashlib.sha256(data).hexdigest()
    # Never whole in memory: at most BODY_PIECE (64 KiB) an event, or STREAMED_PIECE (256 KiB)
    # for a body that streams as it arrives (a fast one: docs/LIMITS.md).
    assert answer.json()["pieces"] >= size // (256 * 1024)


def test_the_application_hears_that_its_client_left(maitred_server: Callable[..., Server], events: Path) -> None:
    server = fastapi_server(maitred_server, events)
    with socket.create_connection((HOST, server.port)) as client:
        client.sendall(b"GET /wait-for-leave HTTP/1.1\r\nHost: x\r\n\r\n")
        # The request is the application's once the worker's log or the events say so; the
        # handler polls is_disconnected, so closing at any point after sending is the test.
    wait_for_lines(events, "client-left", 1)
    # The seat is free again: the worker answers the next request.
    assert requests.get(f"{server.url}/pid", timeout=TIMEOUT).status_code == 200


def test_timeout_cancels_the_task_answers_504_and_keeps_the_worker(
    maitred_server: Callable[..., Server], events: Path
) -> None:
    # --timeout bounds the boot too, and FastAPI's import takes a second on a busy machine.
    server = fastapi_server(maitred_server, events, "--timeout", "3")
    before = workers_of(server.pid, 2)
    started = time.monotonic()
    answer = requests.get(f"{server.url}/sleep", params={"seconds": 30}, timeout=TIMEOUT)
    assert answer.status_code == 504
    assert time.monotonic() - started < 5 + 2
    server.wait_for_log("ran past --timeout (3 s): its task was cancelled", TIMEOUT)
    # The worker was healthy: nobody killed it.
    assert requests.get(f"{server.url}/sleep", params={"seconds": 0}, timeout=TIMEOUT).status_code == 200
    assert workers_of(server.pid, 2) == before


def test_a_blocked_event_loop_is_diagnosed_with_the_blocking_call(
    maitred_server: Callable[..., Server], events: Path
) -> None:
    server = fastapi_server(maitred_server, events, "-w", "1")
    started = time.monotonic()
    answer = requests.get(f"{server.url}/block", params={"seconds": 1.5}, timeout=TIMEOUT)
    assert answer.status_code == 200
    log = server.wait_for_log("diagnosis S2 (blocked_event_loop)", TIMEOUT)
    line = next(line for line in log.splitlines() if "blocked_event_loop" in line)
    assert "during GET /block" in line
    # The stack names the handler and the call that blocks.
    assert "fastapi_app.py" in log and "time.sleep(seconds)" in log
    assert time.monotonic() - started < 5


def test_overload_past_the_seats_queues_in_the_lobby_and_expires_with_503(
    maitred_server: Callable[..., Server], events: Path, tmp_path: Path
) -> None:
    # One worker with two seats, both taken by requests held until the test lets them go: six
    # more wait in the lobby's FIFO past --queue-timeout, and get 503 without reaching the worker.
    release = tmp_path / "release"
    server = fastapi_server(
        maitred_server,
        events,
        "-w",
        "1",
        "--worker-connections",
        "2",
        "--queue-timeout",
        "0.5",
        env={"FASTAPI_RELEASE": str(release)},
    )

    def held(number: int) -> int:
        return requests.get(f"{server.url}/held", params={"number": number}, timeout=TIMEOUT).status_code

    with ThreadPoolExecutor(8) as pool:
        seated = [pool.submit(held, number) for number in (0, 1)]
        wait_for_lines(events, "began", 2)
        queued = [pool.submit(held, number) for number in range(2, 8)]
        refused = [future.result() for future in queued]
        release.touch()
        served = [future.result() for future in seated]
    assert (served, refused) == ([200] * 2, [503] * 6)
    # Request 8 comes after the six in the FIFO: had any of them been left in it, the worker
    # would have begun it before request 8.
    assert held(8) == 200
    began = sorted(int(line.split()[1]) for line in wait_for_lines(events, "began", 3))
    assert began == [0, 1, 8]


def test_starlette_routes_bodies_and_streams(maitred_server: Callable[..., Server]) -> None:
    server = maitred_server("starlette_app:app", "-w", "2", cwd=APPS)
    answer = requests.post(
        f"{server.url}/echo/a%20b/c", params={"q": "é"}, headers={"X-Trace": "7"}, data="payload", timeout=TIMEOUT
    )
    assert answer.json() == {
        "method": "POST",
        "path": "/echo/a b/c",
        "query": {"q": "é"},
        "headers": {"x-trace": "7"},
        "body": "payload",
    }
    assert requests.get(f"{server.url}/numbers", params={"n": 4}, timeout=TIMEOUT).text == "0\n1\n2\n3\n"


def test_django_async_views_through_its_asgi_handler(maitred_server: Callable[..., Server]) -> None:
    server = maitred_server("django_asgi_app:application", "-w", "2", cwd=APPS)
    answer = requests.get(f"{server.url}/hello/", timeout=TIMEOUT)
    assert answer.json() == {"view": "async", "path": "/hello/", "method": "GET"}
    answer = requests.post(f"{server.url}/submit/", data=json.dumps({"n": 1}), timeout=TIMEOUT)
    assert answer.json() == {"received": {"n": 1}}


def test_a_failing_lifespan_startup_is_a_boot_failure_in_one_line(
    run_maitred: Callable[..., Finished], events: Path
) -> None:
    finished = run_maitred(
        "fastapi_app:app", cwd=APPS, env={"FASTAPI_FAIL_STARTUP": "1", "FASTAPI_EVENTS": str(events)}, timeout=60
    )
    assert finished.returncode != 0 and not finished.leftovers
    assert "the application's lifespan startup failed: RuntimeError: the database is unreachable" in finished.stderr


def test_a_reload_that_turns_the_application_into_asgi_is_abandoned_with_the_reason(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    app = tmp_path / "switching.py"
    app.write_text(
        "def app(environ, start_response):\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "    return [b'wsgi']\n"
    )
    server = maitred_server("switching:app", "-w", "1", cwd=tmp_path)
    assert requests.get(server.url, timeout=TIMEOUT).text == "wsgi"
    app.write_text(
        "async def app(scope, receive, send):\n"
        "    await send({'type': 'http.response.start', 'status': 200, 'headers': []})\n"
        "    await send({'type': 'http.response.body', 'body': b'asgi'})\n"
    )
    server.send_signal(signal.SIGHUP)
    server.wait_for_log("the application is ASGI, and this maitred serves WSGI", TIMEOUT)
    # The old workers go on serving.
    assert requests.get(server.url, timeout=TIMEOUT).text == "wsgi"


def test_interface_wsgi_forces_the_interface(maitred_server: Callable[..., Server], tmp_path: Path) -> None:
    # A WSGI callable that would look like ASGI by its parameters: forced, it is served as WSGI.
    (tmp_path / "three.py").write_text(
        "def app(environ, start_response, unused=None, *, also=None):\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "    return [b'served as wsgi']\n"
    )
    server = maitred_server("three:app", "--interface", "wsgi", cwd=tmp_path)
    assert requests.get(server.url, timeout=TIMEOUT).text == "served as wsgi"


def test_the_interface_probe_is_named_for_ps_and_exits(maitred_server: Callable[..., Server], tmp_path: Path) -> None:
    # An application whose import waits for a file: the probe is caught while it imports.
    go = tmp_path / "go"
    (tmp_path / "waits.py").write_text(
        "import pathlib, time\n"
        f"deadline = time.monotonic() + {TIMEOUT}\n"
        f"while not pathlib.Path({str(go)!r}).exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "def app(environ, start_response):\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "    return [b'loaded']\n"
    )
    server = maitred_server("waits:app", "-w", "1", cwd=tmp_path)
    deadline = time.monotonic() + TIMEOUT
    while not (probes := [pid for zygote in children(server.pid) for pid in children(zygote) if is_probe(pid)]):
        assert time.monotonic() < deadline, f"no process named {PROBE_NAME}: {server.stderr()}"
        time.sleep(0.02)
    assert workers_of(server.pid) == set()
    go.touch()
    assert requests.get(server.url, timeout=TIMEOUT).text == "loaded"
    (worker,) = workers_of(server.pid, 1)
    assert worker not in probes and not Path(f"/proc/{probes[0]}").exists()


def test_an_asgi_worker_shows_its_open_streams_and_admitted_requests_on_the_scoreboard(
    maitred_server: Callable[..., Server], events: Path
) -> None:
    # An ASGI worker has one channel, whatever --worker-connections is (issue 47): its
    # scoreboard line counts the requests admitted and the open streams instead of seats.
    stats = free_port()
    server = fastapi_server(
        maitred_server, events, "-w", "1", "--worker-connections", "5", "--stats", f"{HOST}:{stats}"
    )
    assert requests.get(f"{server.url}/pid", timeout=TIMEOUT).status_code == 200
    with requests.get(f"{server.url}/open-stream", stream=True, timeout=TIMEOUT) as streaming:
        assert streaming.status_code == 200
        assert next(streaming.iter_content(5)) == b"open\n"
        status = requests.get(f"http://{HOST}:{stats}/status.json", timeout=TIMEOUT).json()
        assert [(worker["streams"], worker["admitted"]) for worker in status["scoreboard"]] == [(1, 0)]
        assert [len(worker["threads"]) for worker in status["scoreboard"]] == [1]


# WebSockets: the lobby does the handshake and the framing, the worker sees ASGI's events
# (docs/ASGI.md, "WebSockets"; the lobby's side alone: tests/test_websocket_lobby.py).


def test_a_fastapi_websocket_echoes_text_and_bytes_and_closes_with_the_applications_code(
    maitred_server: Callable[..., Server], events: Path
) -> None:
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    server = fastapi_server(maitred_server, events)
    with connect(
        f"ws://{HOST}:{server.port}/echo", subprotocols=["chat"], open_timeout=TIMEOUT, max_size=None
    ) as websocket:
        assert websocket.subprotocol == "chat"
        websocket.send("héllo")
        assert websocket.recv(timeout=TIMEOUT) == "héllo"
        large = random.Random(1).randbytes(3_000_000)
        websocket.send(large)
        assert websocket.recv(timeout=TIMEOUT) == large
        websocket.send("close")
        with pytest.raises(ConnectionClosed) as closed:
            websocket.recv(timeout=TIMEOUT)
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4000, "asked to")
    # An application that closes before it accepts refuses the handshake: 403.
    with pytest.raises(InvalidStatus) as refused:
        connect(f"ws://{HOST}:{server.port}/refuse", open_timeout=TIMEOUT)
    assert refused.value.response.status_code == 403
    # The seats the sockets held are free again.
    assert requests.get(f"{server.url}/pid", timeout=TIMEOUT).status_code == 200


def test_the_application_hears_its_websocket_client_close(maitred_server: Callable[..., Server], events: Path) -> None:
    from websockets.sync.client import connect

    server = fastapi_server(maitred_server, events)
    with connect(f"ws://{HOST}:{server.port}/echo", open_timeout=TIMEOUT) as websocket:
        websocket.send("ping")
        assert websocket.recv(timeout=TIMEOUT) == "ping"
        websocket.close(code=1000)
    wait_for_lines(events, "ws-closed-1000", 1)


def test_headless_chromium_talks_to_a_websocket(maitred_server: Callable[..., Server], events: Path, tmp_path: Path):
    from browser import CHROMIUM, Browser

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian's chromium package; .ci/run installs it)")
    server = fastapi_server(maitred_server, events)
    browser = Browser(tmp_path / "chromium")
    try:
        echoed = browser.evaluate(
            f"""new Promise((resolve, reject) => {{
                const socket = new WebSocket("ws://{HOST}:{server.port}/echo", ["chat"]);
                const heard = [];
                socket.onopen = () => socket.send("from the browser");
                socket.onmessage = (event) => {{ heard.push(event.data); socket.send("close"); }};
                socket.onclose = (event) => resolve({{heard, code: event.code, reason: event.reason,
                                                     protocol: socket.protocol}});
                socket.onerror = () => reject(new Error("the WebSocket failed"));
                setTimeout(() => reject(new Error("no answer within 10 s")), 10000);
            }})"""
        )
    finally:
        browser.close()
    assert echoed == {"heard": ["from the browser"], "code": 4000, "reason": "asked to", "protocol": "chat"}


def test_a_reload_leaves_open_websockets_with_the_old_workers(
    maitred_server: Callable[..., Server], events: Path
) -> None:
    from websockets.sync.client import connect

    server = fastapi_server(maitred_server, events, "-w", "1")
    old = {int(requests.get(f"{server.url}/pid", timeout=TIMEOUT).text)}
    with connect(f"ws://{HOST}:{server.port}/echo", open_timeout=TIMEOUT) as websocket:
        websocket.send("before")
        assert websocket.recv(timeout=TIMEOUT) == "before"
        server.send_signal(signal.SIGHUP)
        server.wait_for_log("SIGHUP: reloaded", 30)
        # New requests go to the new worker; the socket stays with the old one, and works.
        assert int(requests.get(f"{server.url}/pid", timeout=TIMEOUT).text) not in old
        websocket.send("after")
        assert websocket.recv(timeout=TIMEOUT) == "after"
        assert old <= workers_of(server.pid)
    # Closed, it lets the old worker go.
    deadline = time.monotonic() + TIMEOUT
    while old & workers_of(server.pid):
        assert time.monotonic() < deadline, "the old worker did not leave once its WebSocket closed"
        time.sleep(0.05)


def test_messages_behind_a_close_do_not_reach_the_next_websocket_of_the_seat(
    maitred_server: Callable[..., Server], events: Path
) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    # One seat, so that the second WebSocket takes the first one's; the first sends messages
    # behind the one that makes the application close, which the lobby may pass on after it.
    server = fastapi_server(maitred_server, events, "-w", "1", "--worker-connections", "2", "--websocket-seats", "1")
    with connect(f"ws://{HOST}:{server.port}/echo", open_timeout=TIMEOUT) as first:
        first.send("close")
        for number in range(50):
            try:
                first.send(f"stale {number}")
            except ConnectionClosed:
                break
        with pytest.raises(ConnectionClosed):
            while True:
                first.recv(timeout=TIMEOUT)
    with connect(f"ws://{HOST}:{server.port}/echo", open_timeout=TIMEOUT) as second:
        second.send("fresh")
        assert second.recv(timeout=TIMEOUT) == "fresh"
    assert requests.get(f"{server.url}/pid", timeout=TIMEOUT).status_code == 200


def test_a_websocket_client_that_leaves_before_the_accept_is_a_disconnect(
    maitred_server: Callable[..., Server], events: Path
) -> None:
    server = fastapi_server(maitred_server, events)
    with socket.create_connection((HOST, server.port)) as client:
        client.sendall(
            b"GET /late-accept HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        wait_for_lines(events, "late-connected", 1)
    wait_for_lines(events, "late-websocket.disconnect-1006", 1)
    assert requests.get(f"{server.url}/pid", timeout=TIMEOUT).status_code == 200
