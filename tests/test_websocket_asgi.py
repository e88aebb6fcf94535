"""WebSockets end to end through the Python ASGI worker (tests/apps/websocket_echo.py), where the
lobby's side alone (tests/test_websocket_lobby.py) cannot show it: the close code each way of
ending reaches the application as, a connection failed only after the messages before the bad
frame were answered, a handshake that waits for a worker rather than turning into a plain
request (docs/PROTOCOL.md, section 5), and permessage-deflate (docs/LIMITS.md, "WebSockets")."""

from __future__ import annotations

import os
import signal
import socket
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from conftest import Server
from raw_websocket import GOOD, client_frame, raw_handshake, read_frame, read_frame_bits, read_head

APPS = Path(__file__).resolve().parent / "apps"
TIMEOUT = 10.0


def echo_server(maitred_server: Callable[..., Server], events: Path, *args: str, hold: Path | None = None) -> Server:
    env = {"WEBSOCKET_ECHO_EVENTS": str(events)}
    if hold is not None:
        env["WEBSOCKET_ECHO_HOLD"] = str(hold)
    return maitred_server("websocket_echo:app", *args, cwd=APPS, env=env)


def disconnects(events: Path, count: int = 1) -> list[str]:
    """The application's `disconnect CODE REASON` lines, once there are `count`."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        lines = events.read_text().splitlines() if events.exists() else []
        if len(lines) >= count:
            return lines
        assert time.monotonic() < deadline, f"the application heard {lines}, not {count} disconnects"
        time.sleep(0.02)


def codes(lines: list[str]) -> list[int]:
    """The close codes of `disconnect CODE REASON` lines (the lobby's reasons are its own text)."""
    return [int(line.split()[1]) for line in lines]


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
        (None, "disconnect 1006 the connection ended without a Close"),
        (b"", "disconnect 1006 the connection ended without a Close"),
        # A Close without a code: 1005, as ASGI asks (7.1.5 too).
        (client_frame(0x8, b""), "disconnect 1005"),
        # ASGI 2.5: the client's reason comes with its code.
        (client_frame(0x8, struct.pack("!H", 4001) + b"bye"), "disconnect 4001 bye"),
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
    assert codes(disconnects(opened.events)) == [1007]
    opened.server.wait_for_log("closed (1007)", TIMEOUT)


def test_messages_before_a_bad_frame_are_answered_before_the_connection_fails(opened: Opened) -> None:
    # Autobahn's 4.1.3: good messages, then a frame of a reserved opcode, in one segment.
    opened.sock.sendall(client_frame(0x1, b"first") + client_frame(0x2, b"second") + client_frame(0x3, b""))
    assert opened.read_frame() == (0x1, b"first")
    assert opened.read_frame() == (0x2, b"second")
    opcode, payload = opened.read_frame()
    assert (opcode, close_code(payload)) == (0x8, 1002)
    assert codes(disconnects(opened.events)) == [1002]


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


# permessage-deflate (RFC 7692): the lobby takes the offer, inflates the client's messages and
# compresses the worker's, each message on its own.

DEFLATE_OFFER = {**GOOD, "Sec-WebSocket-Extensions": "permessage-deflate; client_max_window_bits"}
ACCEPTED = "permessage-deflate; server_no_context_takeover; client_no_context_takeover"


def deflated(message: bytes) -> bytes:
    """A message compressed on its own, the sync flush's tail taken off (RFC 7692, 7.2.1)."""
    compressor = zlib.compressobj(wbits=-15)
    return (compressor.compress(message) + compressor.flush(zlib.Z_SYNC_FLUSH)).removesuffix(b"\0\0\xff\xff")


def inflated(payload: bytes) -> bytes:
    return zlib.decompressobj(wbits=-15).decompress(payload + b"\0\0\xff\xff")


def test_permessage_deflate_compresses_both_ways(maitred_server: Callable[..., Server], tmp_path: Path) -> None:
    server = echo_server(maitred_server, tmp_path / "events", "-w", "1")
    sock = raw_handshake(server.port, DEFLATE_OFFER)
    status, fields, rest = read_head(sock)
    assert (status, fields["sec-websocket-extensions"]) == (101, ACCEPTED)
    buffered = bytearray(rest)
    message = b"compressed, compressed, compressed, compressed" * 100
    # Fragmented: RSV1 on the first frame only.
    compressed = deflated(message)
    sock.sendall(client_frame(0x1, compressed[:10], fin=False, rsv1=True) + client_frame(0x0, compressed[10:]))
    first, payload = read_frame_bits(sock, buffered)
    # FIN, RSV1, text: the echo comes compressed.
    assert first == 0xC1
    assert inflated(payload) == message
    assert len(payload) < len(message) / 10
    # A message the client did not compress is served too.
    sock.sendall(client_frame(0x2, b"plain"))
    first, payload = read_frame_bits(sock, buffered)
    assert (first, inflated(payload)) == (0xC2, b"plain")
    # The websockets library negotiates it by default, as browsers do.
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{server.port}/") as websocket:
        assert websocket.response.headers["Sec-WebSocket-Extensions"] == ACCEPTED
        websocket.send(message.decode())
        assert websocket.recv(timeout=TIMEOUT) == message.decode()


def test_a_compressed_message_past_ws_max_size_is_refused_with_1009(
    maitred_server: Callable[..., Server], tmp_path: Path
) -> None:
    events = tmp_path / "events"
    server = echo_server(maitred_server, events, "-w", "1", "--ws-max-size", "65536")
    sock = raw_handshake(server.port, DEFLATE_OFFER)
    status, _, rest = read_head(sock)
    assert status == 101
    # A deflate bomb: 64 MiB of zeros in 64 KiB.
    bomb = deflated(bytes(64 << 20))
    assert len(bomb) < 65536
    sock.sendall(client_frame(0x2, bomb, rsv1=True))
    opcode, payload = read_frame(sock, bytearray(rest))
    assert (opcode, close_code(payload)) == (0x8, 1009)
    assert codes(disconnects(events)) == [1009]
    server.wait_for_log("closed (1009)", TIMEOUT)


def test_ws_per_message_deflate_false_takes_no_offer(maitred_server: Callable[..., Server], tmp_path: Path) -> None:
    server = echo_server(maitred_server, tmp_path / "events", "-w", "1", "--ws-per-message-deflate", "false")
    sock = raw_handshake(server.port, DEFLATE_OFFER)
    status, fields, rest = read_head(sock)
    assert status == 101
    assert "sec-websocket-extensions" not in fields
    sock.sendall(client_frame(0x1, b"plain"))
    assert read_frame_bits(sock, bytearray(rest)) == (0x81, b"plain")
