"""A small HTTP client over raw sockets, for tests that need to see exactly what the server
sends: one response at a time on a connection the test controls."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from conftest import HOST


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def pid(self) -> int:
        """The serving worker's pid, for test apps whose body starts with it."""
        return int(self.body.split()[0])


def read_reply(sock: socket.socket, method: str = "GET") -> Reply:
    """Reads one response from `sock`, leaving the socket open for the next."""
    response = http.client.HTTPResponse(sock, method=method)
    response.begin()
    reply = Reply(response.status, response.headers, response.read())
    response.close()
    return reply


def get(port: int, path: str = "/", timeout: float = 20.0) -> Reply:
    """One GET on a connection of its own."""
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        return read_reply(sock)


def eventually(condition: Callable[[], bool], timeout: float) -> bool:
    """Whether `condition` comes true within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True
