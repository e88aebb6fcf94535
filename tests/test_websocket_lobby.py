"""The lobby's side of WebSockets (docs/PROTOCOL.md, section 5), driven through maitred-stub
--websocket-echo: native stub workers that say READY_ASGI and echo every message, so that the
lobby's handshake, framing, limits, seat cap and stops are tested without the Python worker.

Clients: the `websockets` library, and raw sockets where a client must misbehave (a bad
handshake, a client that never answers a ping).

Builds nothing: it runs maitred-stub from cargo's target directory (target/, or where
CARGO_TARGET_DIR puts it), which `make test` builds first, and is skipped, saying so, when a bare
pytest run finds it missing.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import websockets.asyncio.client
from conftest import HOST, accepts_connections, free_port, kill_group, maitred_stub, wait_for_empty_group, wait_for_log
from raw_websocket import ACCEPT, GOOD, client_frame, raw_handshake, read_frame, read_head
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

STUB = maitred_stub()

pytestmark = pytest.mark.skipif(
    not STUB.exists(), reason=f"{STUB} is not built (cargo build --release -p maitred-stub)"
)


@dataclass
class Stub:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    stats_port: int | None = None

    def url(self, path: str = "/ws") -> str:
        return f"ws://{HOST}:{self.port}{path}"

    def text(self) -> str:
        return self.log.read_text()

    def wait_for_log(self, pattern: str, timeout: float = 10) -> re.Match[str]:
        """The first match of `pattern` (a regular expression) in the log, once there is one."""
        found = re.compile(pattern)
        match = found.search(wait_for_log(self.text, found, timeout))
        assert match is not None
        return match

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://{HOST}:{self.stats_port}/status.json", timeout=5) as response:
            return json.load(response)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{HOST}:{self.stats_port}/metrics", timeout=5) as response:
            return response.read().decode()


@pytest.fixture
def start_stub(tmp_path: Path) -> Iterator:
    started: list[Stub] = []

    def start(*options: str, echo: bool = True, stats: bool = False) -> Stub:
        port = free_port()
        log = tmp_path / f"stub-{len(started)}.log"
        stats_port = free_port() if stats else None
        command = [str(STUB), "--port", str(port), "--log-level", "debug", *options]
        if echo:
            command.append("--websocket-echo")
        if stats_port is not None:
            command += ["--stats-port", str(stats_port)]
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        stub = Stub(process, port, log, stats_port)
        started.append(stub)
        deadline = time.monotonic() + 10
        while not accepts_connections(port):
            assert process.poll() is None, f"maitred-stub exited with {process.returncode}: {stub.text()}"
            assert time.monotonic() < deadline, f"nothing listens on {port}: {stub.text()}"
            time.sleep(0.01)
        stub.wait_for_log(r"serving maitred-stub")
        return stub

    yield start
    for stub in started:
        kill_group(stub.process.pid)
        stub.process.wait()


def read_to_end(sock: socket.socket, rest: bytes) -> bytes:
    """What the server sends until it closes the connection, after `rest`."""
    data = rest
    while chunk := sock.recv(4096):
        data += chunk
    return data


def no_answer_yet(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return not readable


def test_echo_of_text_binary_and_fragmented_messages_with_the_offered_subprotocol(start_stub) -> None:
    stub = start_stub("--workers", "1", "--threads", "2")
    with connect(stub.url(), subprotocols=["chat.v2", "chat"]) as ws:
        assert ws.subprotocol == "chat.v2"
        # The worker's extra headers come with the 101.
        assert ws.response.headers["X-Stub"] == "echo"
        ws.send("h\u00e9llo")
        assert ws.recv() == "h\u00e9llo"
        ws.send(b"\x00\xff\r\n")
        assert ws.recv() == b"\x00\xff\r\n"
        # Fragments are joined in the lobby: the worker gets one message.
        ws.send(["frag", "mented"])
        assert ws.recv() == "fragmented"
        # Larger than one ring record (128 KiB): it comes back on the channel.
        big = os.urandom(300_000)
        ws.send(big)
        assert ws.recv() == big
        ws.send("close")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1000, "asked to close")
    # The seat is free again: a second WebSocket is served by the same worker.
    with connect(stub.url()) as ws:
        assert ws.subprotocol is None
        ws.send("again")
        assert ws.recv() == "again"


def test_with_wsgi_workers_an_upgrade_request_stays_a_plain_request(start_stub) -> None:
    stub = start_stub("--workers", "1", echo=False)
    sock = raw_handshake(stub.port, GOOD)
    status, _, rest = read_head(sock)
    assert (status, rest) == (200, b"Hello, world!\n")
    sock.close()
    assert "WebSocket" not in stub.text()


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"Sec-WebSocket-Key": "not-a-nonce"}, 400),
        ({"Connection": "keep-alive"}, 400),
        ({"Sec-WebSocket-Version": "8"}, 426),
        ({"method": "POST"}, 400),
        ({"version": "HTTP/1.0"}, 400),
    ],
)
def test_a_bad_handshake_is_refused_by_the_lobby_without_a_worker(start_stub, change, status) -> None:
    stub = start_stub("--workers", "1")
    headers = {**GOOD, **{k: v for k, v in change.items() if k not in ("method", "version")}}
    sock = raw_handshake(stub.port, headers, change.get("method", "GET"), change.get("version", "HTTP/1.1"))
    got, fields, rest = read_head(sock)
    assert got == status
    assert b"WebSocket" in read_to_end(sock, rest)
    if status == 426:
        assert fields["sec-websocket-version"] == "13"
    sock.close()
    stub.wait_for_log(rf"\[INFO\] {status} to 127\.0\.0\.1:\d+: ")
    # No worker saw it: a worker logs every request it takes at debug level.
    assert " takes " not in stub.text()


def test_a_worker_that_refuses_gets_403_and_a_denial_response_is_relayed_then_closed(start_stub) -> None:
    stub = start_stub("--workers", "1")
    refused = raw_handshake(stub.port, GOOD, target="/refuse")
    status, fields, rest = read_head(refused)
    assert (status, fields["connection"]) == (403, "close")
    assert b"refused the WebSocket" in read_to_end(refused, rest)
    denied = raw_handshake(stub.port, GOOD, target="/deny")
    status, fields, rest = read_head(denied)
    assert (status, fields["connection"]) == (401, "close")
    # The denial's body, then the connection closes.
    assert read_to_end(denied, rest) == b"denied\n"
    # Neither held the seat: a WebSocket is accepted next.
    with connect(stub.url()) as ws:
        ws.send("open")
        assert ws.recv() == "open"


def test_a_message_over_ws_max_size_closes_with_1009_and_frees_the_seat(start_stub) -> None:
    stub = start_stub("--workers", "1", "--ws-max-size", "1000")
    with connect(stub.url(), max_size=None) as ws:
        ws.send("x" * 1000)
        assert ws.recv() == "x" * 1000
        ws.send("x" * 1001)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv()
        assert closed.value.rcvd.code == 1009
    stub.wait_for_log(r"closed \(1009\): .*--ws-max-size")
    # The worker heard WS_CLOSED 1009 and answered it: its only seat serves again.
    with connect(stub.url()) as ws:
        ws.send("after")
        assert ws.recv() == "after"


def test_a_client_that_never_answers_a_ping_is_closed_with_1011(start_stub) -> None:
    stub = start_stub("--workers", "1", "--ws-ping-interval", "0.2", "--ws-ping-timeout", "0.3")
    sock = raw_handshake(stub.port, GOOD)
    status, fields, rest = read_head(sock)
    assert (status, fields["sec-websocket-accept"]) == (101, ACCEPT)
    buffered = bytearray(rest)
    # This client reads, but never answers: the ping, then the lobby's Close.
    assert read_frame(sock, buffered) == (0x9, b"")
    opcode, payload = read_frame(sock, buffered)
    assert opcode == 0x8
    assert struct.unpack("!H", payload[:2])[0] == 1011
    sock.close()
    stub.wait_for_log(r"closed \(1011\): no pong within --ws-ping-timeout")


def test_a_client_that_answers_pings_stays_open(start_stub) -> None:
    stub = start_stub("--workers", "1", "--ws-ping-interval", "0.1", "--ws-ping-timeout", "0.5")
    # The websockets library answers pings as it reads; it reads while it waits in recv.
    with connect(stub.url(), ping_interval=None) as ws:
        ws.send("one")
        assert ws.recv() == "one"
        # Several pings come and go while the client is idle.
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1.0)
        ws.send("two")
        assert ws.recv() == "two"
    assert "no pong" not in stub.text()


def test_a_client_slow_to_read_pauses_the_workers_messages_within_the_answers_memory(start_stub) -> None:
    stub = start_stub("--workers", "1")
    message = os.urandom(100 * 1024)
    count = 300

    # The client reads nothing until the lobby has paused (it queues one message, max_queue=1,
    # then leaves the rest in the kernel), while it sends 30 MiB to be echoed. Past what the
    # worker keeps of a held WebSocket's messages, the lobby stops reading this client too
    # (WS_HOLD): asyncio's client, whose sends wait without keeping it from receiving (the
    # threaded one holds a lock through a blocked send, which its reading thread needs).
    async def run() -> None:
        async with websockets.asyncio.client.connect(stub.url(), max_queue=1, max_size=None) as ws:

            async def send_all() -> None:
                for _ in range(count):
                    await ws.send(message)

            sender = asyncio.ensure_future(send_all())
            await asyncio.to_thread(
                stub.wait_for_log,
                r"reading the messages of GET /ws HTTP/1\.1 \(WebSocket\) from worker \d+ paused: 256 KiB",
            )
            # Nothing was lost or reordered: the worker's sends waited.
            for _ in range(count):
                assert await asyncio.wait_for(ws.recv(), 30) == message
            await sender

    asyncio.run(asyncio.wait_for(run(), 120))
    stub.wait_for_log(r"reading the messages of GET /ws HTTP/1\.1 \(WebSocket\) from worker \d+ went on after")


def test_a_slow_reader_that_leaves_while_paused_frees_its_seat_and_the_stop(start_stub) -> None:
    stub = start_stub("--workers", "1")
    sock = raw_handshake(stub.port, GOOD)
    status, _, _ = read_head(sock)
    assert status == 101
    # Binary frames, never read back.
    payload = os.urandom(100 * 1024)
    frame = client_frame(0x2, payload)

    def send_all() -> None:
        try:
            for _ in range(300):
                sock.sendall(frame)
        except OSError:
            # Closed under it below, by design.
            pass

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    stub.wait_for_log(r"reading the messages of GET /ws HTTP/1\.1 \(WebSocket\) from worker \d+ paused")
    # It leaves without reading: the lobby drops what waited for it, the worker hears 1006.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    sender.join(timeout=10)
    with connect(stub.url()) as ws:
        ws.send("next")
        assert ws.recv(timeout=10) == "next"
    stub.process.send_signal(signal.SIGTERM)
    assert stub.process.wait(timeout=10) == 0, stub.text()


def test_open_websockets_hold_no_admission_and_http_requests_are_answered_beside_them(start_stub) -> None:
    # Issue 47: an open WebSocket is a stream, and costs its worker's admission nothing. The
    # worker admits 2 requests at once (the stub's --threads is its --worker-connections), and
    # holds 10 WebSockets open while HTTP requests are answered. (Before, a WebSocket held a
    # seat for its life and at most half the seats: the second handshake waited.)
    stub = start_stub("--workers", "1", "--threads", "2", stats=True)
    sockets = [connect(stub.url(), legacy=True) for _ in range(10)]
    for number, ws in enumerate(sockets):
        ws.send(f"hello {number}")
    assert [ws.recv() for ws in sockets] == [f"hello {number}" for number in range(10)]
    assert stub.status()["websockets"]["open"] == 10
    assert "maitred_websockets_open 10" in stub.metrics()
    (worker,) = stub.status()["scoreboard"]
    assert (worker["admitted"], worker["streams"]) == (0, 10), worker
    for _ in range(3):
        with urllib.request.urlopen(f"http://{HOST}:{stub.port}/plain", timeout=5) as response:
            assert response.read() == b"Hello, world!\n"
    for ws in sockets:
        ws.close()


def test_a_stop_closes_open_websockets_with_1001_after_the_graceful_timeout(start_stub) -> None:
    stub = start_stub("--workers", "1", "--graceful-timeout", "0.5")
    with connect(stub.url()) as ws:
        ws.send("before")
        assert ws.recv() == "before"
        stub.process.send_signal(signal.SIGTERM)
        # During --graceful-timeout the WebSocket still works.
        ws.send("during")
        assert ws.recv() == "during"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1001
    assert stub.process.wait(timeout=10) == 0, stub.text()
    assert wait_for_empty_group(stub.process.pid, timeout=5) == []
    log = stub.text()
    assert "closing the WebSockets (1001)" in log
    # The worker heard WS_CLOSED 1001 and answered before it was stopped.
    assert re.search(r"worker \d+ closed GET /ws HTTP/1\.1 \(WebSocket\)", log), log


def test_a_reload_leaves_open_websockets_with_the_old_worker_until_the_graceful_timeout(start_stub) -> None:
    stub = start_stub("--workers", "1", "--graceful-timeout", "1")
    with connect(stub.url()) as ws:
        ws.send("before")
        assert ws.recv() == "before"
        old = int(stub.wait_for_log(r"worker (\d+) takes GET /ws").group(1))
        stub.process.send_signal(signal.SIGHUP)
        stub.wait_for_log(r"SIGHUP: reloaded")
        # The old worker still holds it, and answers.
        ws.send("after the reload")
        assert ws.recv() == "after the reload"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1001
    stub.wait_for_log(rf"worker {old} retired with GET /ws HTTP/1\.1 \(WebSocket\) open; closing it \(1001\)")
    stub.wait_for_log(rf"worker {old} retired")
    # New WebSockets go to the new worker.
    with connect(stub.url()) as ws:
        ws.send("new")
        assert ws.recv() == "new"


def test_the_access_log_has_one_line_per_websocket_when_it_ends_with_status_101_and_its_life(
    start_stub, tmp_path: Path
) -> None:
    access = tmp_path / "access.log"
    stub = start_stub("--workers", "1", "--access-logfile", str(access), "--access-logformat", '"%(r)s" %(s)s %(D)s')
    with connect(stub.url("/chat?room=1")) as ws:
        opened = time.monotonic()
        for i in range(20):
            ws.send(f"message {i}")
            assert ws.recv() == f"message {i}"
        # Nothing is logged while it is open.
        assert not access.exists() or "/chat" not in access.read_text()
        span = time.monotonic() - opened
    deadline = time.monotonic() + 5
    while not access.exists() or "/chat" not in access.read_text():
        assert time.monotonic() < deadline, stub.text()
        time.sleep(0.01)
    lines = [line for line in access.read_text().splitlines() if "/chat" in line]
    assert len(lines) == 1
    found = re.fullmatch(r'"GET /chat\?room=1 HTTP/1\.1" 101 (\d+)', lines[0])
    assert found, lines[0]
    # Its time (%(D)s, microseconds) is the WebSocket's life, which holds the client's exchanges.
    assert int(found.group(1)) >= span * 1e6


def test_the_handshake_key_is_derived_as_the_rfc_says(start_stub) -> None:
    stub = start_stub("--workers", "1")
    key = base64.b64encode(os.urandom(16)).decode()
    sock = raw_handshake(stub.port, {**GOOD, "Sec-WebSocket-Key": key})
    status, fields, _ = read_head(sock)
    expected = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    assert (status, fields["upgrade"].lower(), fields["sec-websocket-accept"]) == (101, "websocket", expected)
    sock.close()
