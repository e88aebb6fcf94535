"""The soak's own clients (bench/soak.py), on asyncio: HTTP/1.1 keep-alive connections, plain or
TLS, that check every answer (status, and the whole body or its checksum), and WebSocket sessions
that check every echo. Each request carries its own id (?id=...), which the answer must name and
which the application writes down while it holds the request (bench/soak_app.py), so that a
failure can later be matched against the requests a killed worker held.

A connection the server closed while it was idle (seen before the next request is written, as
HTTP clients look before they reuse one) is opened again and counted, not failed; a request that
gets no whole answer is a failure of its kind: refused, closed (before any byte of an answer),
cut (during it), timeout; and an answer is wrong when its status is not 200 or its body is not the
one asked for.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import ssl
import struct
import zlib
from collections import Counter
from dataclasses import dataclass, field

from soak_app import STREAM_BYTES, payload, upload_answer

HOST = "127.0.0.1"
# Longer than any answer takes here (a slow upload's 8 s, a request on a worker stopped for 3 s
# behind a 2 s one): a request without an answer by then is failed as a timeout.
REQUEST_TIMEOUT = 40.0
UPLOAD_BYTES = 1 << 20
MAX_HEAD = 65536
# The WebSocket handshake's fixed GUID (RFC 6455, section 1.3).
WEBSOCKET_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class RequestFailed(Exception):
    """No whole answer; str(error) is the kind: refused, closed, cut, timeout."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def closes(self) -> bool:
        return "close" in self.headers.get("connection", "").lower()


@dataclass
class Record:
    """What one target's clients saw; times are seconds of time.monotonic()."""

    good: Counter = field(default_factory=Counter)  # correct answers by client kind
    good_ids: set[str] = field(default_factory=set)
    # (completion time, request id, client kind, kind of failure, detail, sent time, TLS or not)
    failures: list[tuple] = field(default_factory=list)
    # Connections found closed before a request was written on them: (time, client kind, TLS)
    closed_while_idle: list[tuple] = field(default_factory=list)
    # Idle keep-alive connections the server closed, or whose request failed: (time, how)
    idle_lost: list[tuple[float, str]] = field(default_factory=list)
    # WebSocket sessions that ended by the server's doing: (time, session id, worker pid, code, reason)
    ws_ends: list[tuple] = field(default_factory=list)
    ws_messages: int = 0
    in_flight: dict[str, float] = field(default_factory=dict)  # request id: time sent


class Connection:
    """One keep-alive HTTP/1.1 connection, opened on its first request and again after a close."""

    def __init__(self, port: int, tls: ssl.SSLContext | None) -> None:
        self.port, self.tls = port, tls
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def idle_closed(self) -> bool:
        """Whether the server closed it while it was idle (end of file or reset already seen)."""
        return self.reader is not None and (self.reader.at_eof() or self.reader.exception() is not None)

    async def open(self) -> None:
        try:
            self.reader, self.writer = await asyncio.wait_for(
                asyncio.open_connection(HOST, self.port, ssl=self.tls, server_hostname=HOST if self.tls else None),
                REQUEST_TIMEOUT,
            )
        except (OSError, ssl.SSLError, asyncio.TimeoutError):
            raise RequestFailed("refused") from None

    def close(self, reset: bool = False) -> None:
        if self.writer is not None:
            if reset:
                self.writer.transport.abort()
            else:
                self.writer.close()
        self.reader = self.writer = None

    async def exchange(
        self, method: str, target: str, body: bytes = b"", write_pace: float = 0.0, read_pace: float = 0.0
    ) -> Answer:
        """One request and its whole answer. write_pace, read_pace: seconds between 16 KiB pieces of
        the body sent and of the answer read (a slow uploader, a slow reader)."""
        if self.writer is None:
            await self.open()
        try:
            return await asyncio.wait_for(self._exchange(method, target, body, write_pace, read_pace), REQUEST_TIMEOUT)
        except asyncio.TimeoutError:
            self.close()
            raise RequestFailed("timeout") from None
        except RequestFailed:
            self.close()
            raise

    async def _exchange(self, method: str, target: str, body: bytes, write_pace: float, read_pace: float) -> Answer:
        head = f"{method} {target} HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n"
        if method == "POST":
            head += f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
        answered = False
        try:
            self.writer.write(head.encode() + b"\r\n")
            piece = 16384 if write_pace else len(body) or 1
            for at in range(0, len(body), piece):
                self.writer.write(body[at : at + piece])
                await self.writer.drain()
                await asyncio.sleep(write_pace)
            await self.writer.drain()
            status_head = await self.reader.readuntil(b"\r\n\r\n")
            answered = True
            return await self._answer(status_head, read_pace)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError) as error:
            partial = isinstance(error, asyncio.IncompleteReadError) and error.partial
            raise RequestFailed("cut" if answered or partial else "closed") from None
        except asyncio.LimitOverrunError:
            raise RequestFailed("cut") from None

    async def _answer(self, status_head: bytes, read_pace: float) -> Answer:
        status_line, *lines = status_head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            remaining = int(headers["content-length"])
            parts = []
            while remaining:
                part = await self.reader.read(min(remaining, 16384 if read_pace else remaining))
                if not part:
                    raise asyncio.IncompleteReadError(b"".join(parts), remaining)
                parts.append(part)
                remaining -= len(part)
                if read_pace:
                    await asyncio.sleep(read_pace)
            body = b"".join(parts)
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._chunked()
        else:
            body = await self.reader.read()
            headers["connection"] = "close"
        answer = Answer(int(status_line.split(" ", 2)[1]), headers, body)
        if answer.closes:
            self.close()
        return answer

    async def _chunked(self) -> bytes:
        parts = []
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append(await self.reader.readexactly(size + 2))
        await self.reader.readuntil(b"\r\n")  # the empty trailer
        return b"".join(part[:-2] for part in parts)


def expected(route: str, request_id: str) -> bytes | int:
    """The body route answers for request_id, or for the large ones its CRC-32."""
    if route == "stream":
        return zlib.crc32(payload(request_id, STREAM_BYTES))
    if route == "upload":
        return upload_answer(request_id, payload(request_id, UPLOAD_BYTES))
    return f"{route} {request_id}\n".encode()


def correct(answer: Answer, want: bytes | int) -> bool:
    if answer.status != 200:
        return False
    return zlib.crc32(answer.body) == want if isinstance(want, int) else answer.body == want


class WebSocket:
    """A client WebSocket (RFC 6455): its frames masked, the server's read whole, pings answered."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int, target: str) -> WebSocket:
        reader, writer = await asyncio.open_connection(HOST, port)
        key = base64.b64encode(os.urandom(16))
        writer.write(
            f"GET {target} HTTP/1.1\r\nHost: {HOST}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key.decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        accept = base64.b64encode(hashlib.sha1(key + WEBSOCKET_GUID).digest()).decode()
        if not head.startswith("HTTP/1.1 101") or accept not in head:
            writer.close()
            raise ConnectionError(f"handshake refused: {head.splitlines()[0]}")
        return cls(reader, writer)

    def send(self, opcode: int, data: bytes) -> None:
        mask = os.urandom(4)
        length = len(data)
        if length < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
        elif length < 65536:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
        stream = (mask * (length // 4 + 1))[:length]
        masked = (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(length, "big")
        self.writer.write(head + mask + masked)

    async def receive(self) -> tuple[int, bytes]:
        """The next whole message, (opcode, data); a Close is (8, its payload). Pings are
        answered on the way."""
        message_opcode, parts = 0, []
        while True:
            first, second = await self.reader.readexactly(2)
            length = second & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", await self.reader.readexactly(8))
            data = await self.reader.readexactly(length)
            opcode = first & 0x0F
            if opcode == 9:
                self.send(10, data)
                continue
            if opcode == 10:
                continue
            if opcode == 8:
                return 8, data
            message_opcode = opcode or message_opcode
            parts.append(data)
            if first & 0x80:
                return message_opcode, b"".join(parts)

    async def close(self, code: int = 1000) -> None:
        self.send(8, struct.pack("!H", code))
        await self.writer.drain()
        self.writer.close()


def close_code(data: bytes) -> int:
    return struct.unpack("!H", data[:2])[0] if len(data) >= 2 else 1005
