"""What no client can make the lobby hold without bound (docs/LIMITS.md): answers waiting for
slow readers, clients that stop reading, and bodies trickled in.

Every test runs a real maitred on 127.0.0.1 with tests/apps/bounded_app.py and talks to it
over real sockets; every wait is bounded.
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import time
from pathlib import Path

import pytest
from conftest import HOST, eventually

APPS = Path(__file__).resolve().parent / "apps"
sys.path.insert(0, str(APPS))
from bounded_app import expected_digest

MIB = 1024 * 1024

# Where the lobby makes its spill files (tempfile::tempfile(), in Rust's std::env::temp_dir()).
SPILL_DIRECTORY = os.path.realpath(os.environ.get("TMPDIR") or "/tmp")


def lobby_rss(pid: int) -> int:
    """The lobby's resident set, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def spill_files(pid: int) -> list[str]:
    """The spill files process `pid` holds open. They have no name (O_TMPFILE, or unlinked at
    once), so nothing of them is left in the directory: /proc shows each as the directory and
    `#<inode> (deleted)`, or its old name and `(deleted)`."""
    found = []
    for link in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(link)
        except FileNotFoundError:
            continue  # closed while we looked
        if target.startswith(SPILL_DIRECTORY + "/") and target.endswith(" (deleted)"):
            found.append(target)
    return found


def slow_socket(port: int, receive_buffer: int = 4096) -> socket.socket:
    """A client whose kernel holds little of what it has not read yet."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(30)
    sock.connect((HOST, port))
    return sock


def request_stream(sock: socket.socket, mebibytes: int) -> None:
    # HTTP/1.0: the answer is delimited by the close, so the body is the bytes after the head.
    sock.sendall(f"GET /stream?mb={mebibytes} HTTP/1.0\r\n\r\n".encode())


class Reader:
    """Reads an HTTP/1.0 answer: its head, then its body into a running digest."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.head = b""
        self.head_complete = False
        self.digest = hashlib.sha256()
        self.body_bytes = 0
        self.ended = False

    def read(self, limit: int) -> int:
        """Reads at most `limit` bytes; returns how many (0 at the end)."""
        try:
            data = self.sock.recv(limit)
        except ConnectionResetError:
            data = b""
        if not data:
            self.ended = True
            return 0
        if not self.head_complete:
            self.head += data
            if b"\r\n\r\n" not in self.head:
                return len(data)
            self.head, _, data = self.head.partition(b"\r\n\r\n")
            self.head_complete = True
        self.digest.update(data)
        self.body_bytes += len(data)
        return len(data)

    def read_to_end(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ended:
            assert time.monotonic() < deadline, f"the answer did not end within {timeout} s ({self.body_bytes} bytes)"
            self.read(1 << 20)


def get(port: int, path: str, timeout: float = 10.0) -> bytes:
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def post(port: int, path: str, body: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(f"POST {path} HTTP/1.0\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_slow_readers_keep_the_lobby_small_and_the_workers_free(maitred_server):
    """Three clients read 100 MiB answers at a trickle: the lobby stays within 64 MiB of idle,
    two workers serve other requests meanwhile, and every byte arrives intact."""
    server = maitred_server("bounded_app:app", "-w", "2", cwd=APPS)
    assert get(server.port, "/").startswith(b"HTTP/1.1 200")
    idle = lobby_rss(server.pid)
    readers = []
    for _ in range(3):
        sock = slow_socket(server.port)
        request_stream(sock, 100)
        readers.append(Reader(sock))
    peak = idle
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        for reader in readers:
            reader.read(1024)
        # The third stream needed a worker that the first two had finished with.
        started = time.monotonic()
        assert get(server.port, "/", timeout=5).startswith(b"HTTP/1.1 200")
        assert time.monotonic() - started < 2
        peak = max(peak, lobby_rss(server.pid))
        time.sleep(0.1)
    assert peak - idle < 64 * MIB, f"lobby RSS grew from {idle / MIB:.0f} to {peak / MIB:.0f} MiB"
    # What the lobby does not hold in memory waits in files, one per answer.
    assert eventually(lambda: len(spill_files(server.pid)) == len(readers), timeout=10), spill_files(server.pid)
    expected = expected_digest(100)
    for reader in readers:
        reader.read_to_end(timeout=60)
        assert reader.body_bytes == 100 * MIB
        assert reader.digest.hexdigest() == expected
        reader.sock.close()


def test_past_max_spill_the_worker_waits_for_the_client_and_the_log_says_so(maitred_server):
    server = maitred_server("bounded_app:app", "-w", "1", "--max-spill", str(MIB), cwd=APPS)
    sock = slow_socket(server.port)
    request_stream(sock, 20)
    reader = Reader(sock)
    reader.read(1024)
    log = server.wait_for_log("paused", timeout=10)
    assert "--max-spill" in log
    reader.read_to_end(timeout=60)
    assert reader.body_bytes == 20 * MIB
    assert reader.digest.hexdigest() == expected_digest(20)
    sock.close()
    server.wait_for_log("went on after", timeout=10)
    # The worker went on once the client caught up, and is free again.
    assert get(server.port, "/").startswith(b"HTTP/1.1 200")


def test_a_client_that_keeps_reading_is_never_cut(maitred_server):
    """At 1 s of --send-timeout, a client taking 16 KiB every 0.25 s for 4 s gets everything."""
    server = maitred_server("bounded_app:app", "--send-timeout", "1", cwd=APPS)
    sock = slow_socket(server.port)
    request_stream(sock, 8)
    reader = Reader(sock)
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline and not reader.ended:
        reader.read(16 * 1024)
        time.sleep(0.25)
    reader.read_to_end(timeout=30)
    assert reader.body_bytes == 8 * MIB
    assert reader.digest.hexdigest() == expected_digest(8)
    assert "--send-timeout" not in server.stderr()


def test_a_client_that_takes_nothing_is_cut_at_send_timeout_and_the_log_says_which(maitred_server):
    server = maitred_server("bounded_app:app", "--send-timeout", "1", cwd=APPS)
    sock = slow_socket(server.port)
    request_stream(sock, 64)
    log = server.wait_for_log("--send-timeout", timeout=10)
    assert "took no byte of its answer for 1 s (--send-timeout)" in log
    assert f"{HOST}:{sock.getsockname()[1]}" in log
    reader = Reader(sock)
    reader.read_to_end(timeout=30)
    assert reader.body_bytes < 64 * MIB
    sock.close()
    assert get(server.port, "/").startswith(b"HTTP/1.1 200")


def test_a_trickled_body_ends_with_408_at_body_min_rate(maitred_server):
    """1 byte every 0.5 s never trips the 2 s gap limit, but falls under 500 bytes/s."""
    server = maitred_server("bounded_app:app", "--header-timeout", "2", "--body-min-rate", "500", cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        sock.sendall(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n")
        started = time.monotonic()
        answer = b""
        sock.settimeout(0.5)
        while time.monotonic() - started < 10:
            try:
                sock.sendall(b"x")
            except OSError:
                break
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - started < 4
    server.wait_for_log("slower than --body-min-rate (500 bytes/s)", timeout=5)
    # A body that arrives at speed is not affected.
    assert post(server.port, "/upload", b"y" * (3 * MIB)).endswith(str(3 * MIB).encode())


def test_a_spilled_body_takes_a_place_under_max_connections(maitred_server):
    body = b"z" * (300 * 1024)  # past the 256 KiB kept in memory: spilled to a file
    server = maitred_server("bounded_app:app", "--max-connections", "2", cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=10) as idle:
        idle.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")
        # Two places: the idle connection's and the upload's; none is left for its file.
        answer = post(server.port, "/upload", body)
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"no temporary file for this request body" in answer
        # The idle connection was not disturbed.
        idle.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert idle.recv(4096).startswith(b"HTTP/1.1 200")
    # With a place to spare (the accept loop may hold one while it waits), the same upload
    # is served.
    roomier = maitred_server("bounded_app:app", "--max-connections", "3", cwd=APPS)
    assert post(roomier.port, "/upload", body).endswith(str(len(body)).encode())


def test_past_max_head_memory_the_oldest_incomplete_heads_get_408_first(maitred_server):
    budget = 256 * 1024
    server = maitred_server("bounded_app:app", "--max-head-memory", str(budget), "--header-timeout", "30", cwd=APPS)
    # 60 KB of head each, never finished: a few fit in the budget, eight do not.
    fields = b"".join(b"X-Field-%d: %s\r\n" % (i, b"a" * 1000) for i in range(60))
    heads = []
    for _ in range(8):
        sock = socket.create_connection((HOST, server.port), timeout=10)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n" + fields)
        heads.append(sock)
        time.sleep(0.1)
    try:
        # Complete requests are served as usual.
        assert get(server.port, "/").startswith(b"HTTP/1.1 200")
        oldest = heads[0].recv(4096)
        assert oldest.startswith(b"HTTP/1.1 408"), oldest
        assert b"--max-head-memory" in oldest
        # The newest is still being waited for.
        heads[-1].settimeout(0.5)
        with pytest.raises(TimeoutError):
            heads[-1].recv(4096)
        heads[-1].sendall(b"\r\n")
        heads[-1].settimeout(10)
        assert heads[-1].recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        for sock in heads:
            sock.close()
    server.wait_for_log("--max-head-memory", timeout=5)


@pytest.fixture(autouse=True)
def _no_spill_file_outlives_its_answer(maitred_server):
    """Once a test's clients are done or gone, every lobby still running has closed its spill
    files (it gives them back as the bytes in them are sent or the client leaves)."""
    yield
    for server in maitred_server.started:
        if server.process.poll() is None:
            lobby = server.pid
            assert eventually(lambda lobby=lobby: not spill_files(lobby), timeout=10), spill_files(lobby)
