"""A small HTTP client over raw sockets, for tests that need to see exactly what the server
sends: one response at a time on a connection the test controls."""

from __future__ import annotations

import http.client
import io
import json
import socket
import weakref
from dataclasses import dataclass

from conftest import HOST, eventually


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def pid(self) -> int:
        """The serving worker's pid, for test apps whose body starts with it."""
        return int(self.body.split()[0])


# What was received past the end of a response: the start of the next one on that socket.
# http.client's reader would read ahead and drop it, losing a pipelined answer that arrived
# in the same segment as the one before.
_unread: weakref.WeakKeyDictionary[socket.socket, bytes] = weakref.WeakKeyDictionary()


class _Received:
    """The bytes of one socket, taken exactly as far as the response being read needs."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = _unread.pop(sock, b"")

    def _more(self) -> bool:
        chunk = self.sock.recv(65536)
        self.data += chunk
        return bool(chunk)

    def until(self, delimiter: bytes) -> bytes:
        while delimiter not in self.data:
            if not self._more():
                raise ConnectionError(f"the connection closed before {delimiter!r}: {self.data[:200]!r}")
        taken, _, self.data = self.data.partition(delimiter)
        return taken

    def exactly(self, count: int) -> bytes:
        while len(self.data) < count:
            if not self._more():
                raise ConnectionError(f"the connection closed {count - len(self.data)} bytes short")
        taken, self.data = self.data[:count], self.data[count:]
        return taken

    def to_end(self) -> bytes:
        while self._more():
            pass
        taken, self.data = self.data, b""
        return taken

    def keep_the_rest(self) -> None:
        if self.data:
            _unread[self.sock] = self.data


def read_reply(sock: socket.socket, method: str = "GET") -> Reply:
    """Reads one response from `sock` (after any 100 Continue), leaving the socket open for
    the next and keeping what came after it for that next call."""
    received = _Received(sock)
    try:
        while True:
            status_line, _, header_lines = received.until(b"\r\n\r\n").partition(b"\r\n")
            status = int(status_line.split()[1])
            headers = http.client.parse_headers(io.BytesIO(header_lines + b"\r\n\r\n"))
            if status != 100:
                break
        if method == "HEAD" or status in (204, 304):
            body = b""
        elif "chunked" in headers.get("Transfer-Encoding", "").lower():
            body = b""
            while size := int(received.until(b"\r\n").split(b";")[0], 16):
                body += received.exactly(size)
                received.exactly(2)
            while received.until(b"\r\n"):  # trailer fields, up to the empty line
                pass
        elif "Content-Length" in headers:
            body = received.exactly(int(headers["Content-Length"]))
        else:
            body = received.to_end()
    finally:
        received.keep_the_rest()
    return Reply(status, headers, body)


def get(port: int, path: str = "/", timeout: float = 20.0) -> Reply:
    """One GET on a connection of its own."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        return read_reply(sock)


def status_of(stats_port: int) -> dict:
    """GET /status.json from a stats listener (docs/METRICS.md)."""
    reply = get(stats_port, "/status.json")
    assert reply.status == 200, reply
    assert reply.headers["Content-Type"] == "application/json", reply
    return json.loads(reply.body)


def wait_for_queue(stats_port: int, busy: int, waiting: int, timeout: float = 10.0) -> None:
    """Waits until `busy` workers serve a request and `waiting` requests wait for one (those
    offered to a busy worker included), as the stats listener sees it: how a test knows that
    the requests it sent one after another reached the lobby, and in that order. Fails,
    showing the last figures, after `timeout` s."""
    seen: dict = {}

    def holds() -> bool:
        seen.update(status_of(stats_port))
        return seen["workers"]["busy"] == busy and seen["queue"]["waiting"] == waiting

    assert eventually(holds, timeout), (
        f"not {busy} busy and {waiting} waiting within {timeout} s: workers {seen['workers']}, queue {seen['queue']}"
    )


def requests_arrived(stats_port: int) -> int:
    """Requests the lobby has read so far, as the stats listener sees them: answered, waiting
    for a worker, or in one's hands. One being written back may be missed for a moment; none
    is counted twice, so waiting for a number never ends early."""
    status = status_of(stats_port)
    connections = status["connections"]
    return sum(status["requests"].values()) + connections["queued"] + connections["in_service"]
