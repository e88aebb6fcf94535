"""WebSockets end to end through the Python ASGI worker (tests/apps/websocket_echo.py), where the
lobby's side alone (tests/test_websocket_lobby.py) cannot show it: the close code each way of
ending reaches the application as, a connection failed only after the messages before the bad
frame were answered, and a handshake that waits for a worker rather than turning into a plain
request (docs/PROTOCOL.md, section 5)."""

from __future__ import annotations

import os
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from conftest import Server
from raw_websocket import GOOD, client_frame, raw_handshake, read_frame, read_head

APPS = Path(__file__).resolve().parent / "apps"
TIMEOUT = 10.0


def echo_server(maitred_server: Callable[..., Server], events: Path, *args: str, hold: Path | None = None) -> Server:
    env = {"WEBSOCKET_ECHO_EVENTS": str(events)}
    if hold is not None:
        env["WEBSOCKET_ECHO_HOLD"] = str(hold)
    return maitred_server("websocket_echo:app", *args, cwd=APPS, env=env)


def disconnects(events: Path, count: int = 1) -> list[str]:
    """The application's `disconnect CODE` lines, once there are `count`."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        lines = events.read_text().splitlines() if events.exists() else []
        if len(lines) >= count:
            return lines
        assert time.monotonic() < deadline, f"the application heard {lines}, not {count} disconnects"
        time.sleep(0.02)


@dataclass
class Opened:
    """An accepted WebSocket, on a raw socket, to a server of one worker."""

    server: Server
    events: Path
    sock: socket.socket
    buffered: bytearray

    def read_frame(self) -> tuple[int, bytes]:
        return read_frame(self.sock, self.buffered)


@pytest.fixture
def opened(maitred_server: Callable[..., Server], tmp_path: Path) -> Opened:
    events = tmp_path / "events"
    server = echo_server(maitred_server, events, "-w", "1")
    sock = raw_handshake(server.port, GOOD)
    status, _, rest = read_head(sock)
    assert status == 101
    return Opened(server, events, sock, bytearray(rest))


def close_code(payload: bytes) -> int:
    return struct.unpack("!H", payload[:2])[0]


@pytest.mark.parametrize(
    ("ending", "heard"),
    [
        # RFC 6455, 7.1.5: no Close came, the connection was lost: closed (FIN) or reset (RST).
        (None, "disconnect 1006"),
        (b"", "disconnect 1006"),
        # A Close without a code: 1005, as ASGI asks (7.1.5 too).
        (client_frame(0x8, b""), "disconnect 1005"),
        (client_frame(0x8, struct.pack("!H", 4001) + b"bye"), "disconnect 4001"),
    ],
    ids=["tcp-closed", "tcp-reset", "close-without-code", "close-4001"],
)
def test_the_application_hears_how_its_client_ended(opened: Opened, ending: bytes | None, heard: str) -> None:
    opened.sock.sendall(client_frame(0x1, b"hello"))
    assert opened.read_frame() == (0x1, b"hello")
    if ending == b"":
        # A reset, not even a FIN's orderly end.
        opened.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    elif ending is not None:
        opened.sock.sendall(ending)
    opened.sock.close()
    assert disconnects(opened.events) == [heard]


def test_invalid_utf8_in_a_text_message_fails_the_connection_with_1007(opened: Opened) -> None:
    opened.sock.sendall(client_frame(0x1, b"caf\xc3"))
    opcode, payload = opened.read_frame()
    assert (opcode, close_code(payload)) == (0x8, 1007)
    assert disconnects(opened.events) == ["disconnect 1007"]
    opened.server.wait_for_log("closed (1007)", TIMEOUT)


def test_messages_before_a_bad_frame_are_answered_before_the_connection_fails(opened: Opened) -> None:
    # Autobahn's 4.1.3: good messages, then a frame of a reserved opcode, in one segment.
    opened.sock.sendall(client_frame(0x1, b"first") + client_frame(0x2, b"second") + client_frame(0x3, b""))
    assert opened.read_frame() == (0x1, b"first")
    assert opened.read_frame() == (0x2, b"second")
    opcode, payload = opened.read_frame()
    assert (opcode, close_code(payload)) == (0x8, 1002)
    assert disconnects(opened.events) == ["disconnect 1002"]


def test_a_handshake_while_no_worker_is_up_waits_for_the_replacement(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    events = tmp_path / "events"
    # Held, a new worker's import waits until the file is gone: no worker is up meanwhile.
    hold = tmp_path / "hold"
    server = echo_server(maitred_server, events, "-w", "1", hold=hold)
    # The port listens before the workers are ready; the lobby names them once it serves.
    serving = server.wait_for_log("with 1 workers (pids ", TIMEOUT)
    worker = int(serving.split("with 1 workers (pids ", 1)[1].split(")", 1)[0])
    hold.touch()
    os.kill(worker, signal.SIGKILL)
    server.wait_for_log(f"worker {worker} lost", TIMEOUT)
    # The handshake waits as a WebSocket, not as a plain request the new worker would answer.
    sock = raw_handshake(server.port, GOOD)
    hold.unlink()
    status, _, rest = read_head(sock)
    assert status == 101
    sock.sendall(client_frame(0x1, b"after the replacement"))
    assert read_frame(sock, bytearray(rest)) == (0x1, b"after the replacement")
    assert int(requests.get(server.url, timeout=TIMEOUT).text) != worker
