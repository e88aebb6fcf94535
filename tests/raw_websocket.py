"""A WebSocket client over a raw socket, for tests that must see, or send, exactly the bytes
of the opening handshake and of each frame: a bad handshake, a frame that breaks the protocol,
a client that leaves without a Close."""

from __future__ import annotations

import socket
import struct

from conftest import HOST

# A handshake as RFC 6455, 1.3 shows it.
KEY = "dGhlIHNhbXBsZSBub25jZQ=="
ACCEPT = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def raw_handshake(
    port: int, headers: dict[str, str], method: str = "GET", version: str = "HTTP/1.1", target: str = "/ws"
) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=10)
    lines = [
        f"{method} {target} {version}",
        f"Host: {HOST}:{port}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


GOOD = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": KEY}


def read_head(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The response head's status and fields, and the bytes read past it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"the connection closed inside a head: {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    fields = {}
    for line in lines:
        name, value = line.split(":", 1)
        fields[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), fields, rest


def read_frame(sock: socket.socket, buffered: bytearray) -> tuple[int, bytes]:
    """One server frame (unmasked): its opcode and payload."""
    first, payload = read_frame_bits(sock, buffered)
    return first & 0x0F, payload


def read_frame_bits(sock: socket.socket, buffered: bytearray) -> tuple[int, bytes]:
    """One server frame (unmasked): its first byte (FIN, RSV1-3 and the opcode) and payload."""

    def need(count: int) -> None:
        while len(buffered) < count:
            chunk = sock.recv(4096)
            assert chunk, "the connection closed inside a frame"
            buffered.extend(chunk)

    need(2)
    first, length = buffered[0], buffered[1] & 0x7F
    at = 2
    if length == 126:
        need(4)
        (length,) = struct.unpack("!H", buffered[2:4])
        at = 4
    elif length == 127:
        need(10)
        (length,) = struct.unpack("!Q", buffered[2:10])
        at = 10
    need(at + length)
    payload = bytes(buffered[at : at + length])
    del buffered[: at + length]
    return first, payload


def client_frame(opcode: int, payload: bytes, fin: bool = True, rsv1: bool = False) -> bytes:
    """A client's frame, masked as RFC 6455, 5.3 requires (with a zero key, which leaves the
    payload as it is); RSV1 says it is compressed (RFC 7692)."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    if len(payload) < 126:
        head = bytes([first, 0x80 | len(payload)])
    elif len(payload) < 1 << 16:
        head = bytes([first, 0x80 | 126]) + struct.pack("!H", len(payload))
    else:
        head = bytes([first, 0x80 | 127]) + struct.pack("!Q", len(payload))
    return head + b"\0\0\0\0" + payload
