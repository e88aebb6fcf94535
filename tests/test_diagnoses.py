"""Diagnoses (docs/METRICS.md): each failure is induced on purpose, and the test checks that the
log names it in one line, with the operator's fix, within about a second, and that
/status.json lists it while it lasts. (The filling listen queue, S1/S2, is in test_limits.py.)

Real maitred processes on 127.0.0.1, real sockets; every load is bounded in requests and time.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from client import get, read_reply, status_of
from conftest import HOST, eventually, free_port

APPS = Path(__file__).resolve().parent / "apps"


def diagnosis_line(server, name: str, timeout: float) -> str:
    """The first log line of the diagnosis `name`, once it is there."""
    marker = f"({name}): "
    return next(line for line in server.wait_for_log(marker, timeout).splitlines() if marker in line)


def listed(stats: int, name: str) -> dict | None:
    return next((d for d in status_of(stats)["diagnoses"] if d["name"] == name), None)


def test_every_worker_busy_with_requests_waiting_is_named_s4_s5(maitred_server):
    """2 workers, a 200 ms application and 50 clients: the queue never empties."""
    stats = free_port()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    stop = threading.Event()
    failures = []

    def client() -> None:
        deadline = time.monotonic() + 6
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                if get(server.port, "/work?sleep=0.2", timeout=30).status != 200:
                    failures.append("status")
            except OSError as error:
                failures.append(str(error))

    clients = [threading.Thread(target=client) for _ in range(50)]
    started = time.monotonic()
    for thread in clients:
        thread.start()
    try:
        line = diagnosis_line(server, "workers_saturated", timeout=5)
        # Saturated from the first moment: named after one second of it, within a tick more.
        assert time.monotonic() - started < 3
        assert "[WARNING] diagnosis S4/S5 (workers_saturated): every worker (2) has been busy for" in line
        assert "requests waiting, the oldest for" in line
        assert "running longest: GET /work?sleep=0.2 HTTP/1.1" in line
        assert "fix: more workers (-w 2, or one more now with SIGTTIN)" in line
        assert "--timeout (30 s)" in line and "--queue-timeout (off)" in line
        found = listed(stats, "workers_saturated")
        assert found is not None and found["scenario"] == "S4/S5", status_of(stats)["diagnoses"]
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=60)
    assert failures == []
    # No request failed; once the load is gone, the diagnosis ends, and says so.
    assert eventually(lambda: "diagnosis S4/S5 (workers_saturated) is over" in server.stderr(), timeout=10)
    assert listed(stats, "workers_saturated") is None


def test_a_kernel_overflow_is_named_s1_s2(maitred_server):
    """--max-connections 1 and --backlog 2: once the queue is full, the kernel drops the next
    connects (ListenOverflows), and the log says so."""
    stats = free_port()
    server = maitred_server(
        "--max-connections", "1", "--backlog", "2", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS
    )
    held = socket.create_connection((HOST, server.port), timeout=10)
    held.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    assert read_reply(held).status == 200
    connects = []
    try:
        for _ in range(12):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex((HOST, server.port))
            connects.append(sock)
        line = diagnosis_line(server, "listen_overflows", timeout=3)
        assert "[WARNING] diagnosis S1/S2 (listen_overflows): the kernel lost" in line
        assert "connects for a full listen queue" in line and "ListenOverflows +" in line
        assert "counted for the whole machine" in line
        assert "fix: raise --backlog and net.core.somaxconn" in line
        assert listed(stats, "listen_overflows") is not None
        assert status_of(stats)["listen_overflows"]["ListenOverflows"] > 0
    finally:
        held.close()
        for sock in connects:
            sock.close()


def test_a_long_request_is_named_with_its_worker_and_path(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "1", "--timeout", "4", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    slow = threading.Thread(target=get, args=(server.port, "/report?sleep=3.5"))
    started = time.monotonic()
    slow.start()
    try:
        line = diagnosis_line(server, "long_request", timeout=5)
        # Over half of --timeout (2 s), within a tick.
        assert 2 <= time.monotonic() - started < 3.2
        worker = status_of(stats)["scoreboard"][0]["pid"]
        assert f"diagnosis long request (long_request): worker {worker} has been in GET /report?sleep=3.5" in line
        assert "over half of --timeout (4 s)" in line
        assert "fix: if such a request is expected, raise --timeout" in line
        assert listed(stats, "long_request")["subject"].startswith(f"{worker} ")
    finally:
        slow.join(timeout=10)


def test_frequent_recycling_is_named(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "1", "--max-requests", "1", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    for _ in range(4):
        assert get(server.port, "/").status == 200
    line = diagnosis_line(server, "frequent_recycling", timeout=10)
    assert "workers were recycled in the last minute (" in line and "max_requests)" in line
    assert "fix: raise --max-requests, --max-worker-memory or --max-worker-lifetime" in line
    assert listed(stats, "frequent_recycling") is not None


def test_frequent_timeouts_are_named(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "2", "--timeout", "1", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    slow = [threading.Thread(target=get, args=(server.port, "/stuck?sleep=3")) for _ in range(2)]
    for thread in slow:
        thread.start()
    for thread in slow:
        thread.join(timeout=20)
    line = diagnosis_line(server, "frequent_failures", timeout=5)
    assert "diagnosis worker failures (frequent_failures): 2 workers were lost in the last minute (2 timeout)" in line
    assert "'worker N timed out' (with its stack)" in line
    assert listed(stats, "frequent_failures") is not None


def test_many_slow_clients_are_named_and_cost_no_worker(maitred_server):
    """Twelve clients that send half a request head and stop: named after a second; the one
    worker still answers everyone else at once."""
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    slow = []
    try:
        for _ in range(12):
            sock = socket.create_connection((HOST, server.port), timeout=10)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ")
            slow.append(sock)
        started = time.monotonic()
        line = diagnosis_line(server, "slow_clients", timeout=4)
        assert time.monotonic() - started < 2.5
        assert "diagnosis slow clients (slow_clients): 12 connections have been sending their request" in line
        assert "they hold the lobby's memory, never a worker" in line
        assert "lower --header-timeout" in line
        assert listed(stats, "slow_clients") is not None
        assert get(server.port, "/").status == 200
    finally:
        for sock in slow:
            sock.close()
