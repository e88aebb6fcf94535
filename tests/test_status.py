"""/status.json on the stats listener (docs/METRICS.md): the worker scoreboard, connections by
state and workers' exits by reason, the same figures /metrics gives.

Real maitred processes on 127.0.0.1, real sockets; every wait is bounded.
"""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path

from client import get, read_reply, status_of
from conftest import HOST, eventually, free_port, workers_of

APPS = Path(__file__).resolve().parent / "apps"


def test_the_scoreboard_shows_each_worker_and_the_request_it_is_busy_with(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    assert eventually(lambda: len(workers_of(server.pid)) == 2, timeout=10)
    for _ in range(3):
        assert get(server.port, "/").status == 200
    slow = threading.Thread(target=get, args=(server.port, "/slow?sleep=1.5"))
    slow.start()
    try:
        assert eventually(lambda: status_of(stats)["workers"]["busy"] == 1, timeout=5)
        status = status_of(stats)
        board = status["scoreboard"]
        assert {row["pid"] for row in board} == workers_of(server.pid)
        busy = [row for row in board if row["state"] == "busy"]
        assert len(busy) == 1
        assert busy[0]["request"]["method"] == "GET"
        assert busy[0]["request"]["path"] == "/slow"
        assert 0 < busy[0]["request"]["elapsed_seconds"] < 1.5
        idle = [row for row in board if row["state"] == "idle"]
        assert len(idle) == 1 and idle[0]["request"] is None
        assert sum(row["served"] for row in board) == 4
        for row in board:
            assert row["generation"] == status["server"]["generation"]
            # A Python worker with the app loaded: megabytes, not bytes, nor gigabytes.
            assert 4 << 20 < row["rss_bytes"] < 1 << 30
        assert status["server"]["pid"] == server.pid
        assert status["server"]["workers_target"] == 2
        assert status["requests"]["2xx"] == 3
        assert status["connections"]["in_service"] == 1
        assert status["queue"] == {"waiting": 0, "oldest_wait_seconds": 0.0}
        wait = status["queue_wait_seconds"]
        assert len(wait["counts"]) == len(wait["bounds"]) + 1 and wait["counts"][-1] == wait["count"] == 4
    finally:
        slow.join(timeout=10)


def test_connections_are_counted_by_state(maitred_server):
    """reading (a head half sent), queued and in_service (one worker, busy), writing (an
    answer streamed), idle (just answered) and hibernating (idle past 0.5 s)."""
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "drip:app", cwd=APPS)
    sockets = []

    def connect() -> socket.socket:
        sock = socket.create_connection((HOST, server.port), timeout=10)
        sockets.append(sock)
        return sock

    try:
        sleeper = connect()
        sleeper.sendall(b"GET /pid HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_reply(sleeper).status == 200
        assert eventually(lambda: status_of(stats)["connections"]["hibernating"] == 1, timeout=5)
        connect().sendall(b"GET /pid HTTP/1.1\r\nHost:")  # half a head
        streamed = connect()
        streamed.sendall(b"GET /drip?seconds=2 HTTP/1.1\r\nHost: t\r\n\r\n")
        assert eventually(lambda: status_of(stats)["connections"]["writing"] == 1, timeout=5)
        waiting = connect()
        waiting.sendall(b"GET /pid HTTP/1.1\r\nHost: t\r\n\r\n")
        assert eventually(lambda: status_of(stats)["connections"]["queued"] == 1, timeout=5)
        connections = status_of(stats)["connections"]
        assert connections == {
            "reading": 1,
            "queued": 1,
            "in_service": 0,
            "writing": 1,
            "websocket": 0,
            "idle": 0,
            "hibernating": 1,
        }
        # Once the stream ends, the waiting request is served, and both connections idle.
        assert read_reply(streamed).status == 200
        assert read_reply(waiting).status == 200
        assert eventually(lambda: status_of(stats)["connections"]["idle"] == 2, timeout=5)
    finally:
        for sock in sockets:
            sock.close()


def test_worker_exits_are_counted_by_reason(maitred_server):
    """max_requests, timeout, crash, scale_down (SIGTTOU) and reload (SIGHUP), in status.json
    and as maitred_worker_exits_total."""
    stats = free_port()
    server = maitred_server(
        "-w", "2", "--max-requests", "3", "--timeout", "1", "--stats", f"{HOST}:{stats}", "crashy:app", cwd=APPS
    )

    def exits() -> dict:
        return status_of(stats)["worker_exits"]

    for _ in range(6):
        assert get(server.port, "/pid").status == 200
    assert eventually(lambda: exits()["max_requests"] >= 1, timeout=10)
    assert get(server.port, "/sleep?seconds=3").status == 504
    assert eventually(lambda: exits()["timeout"] == 1, timeout=10)
    assert get(server.port, "/exit?after=0").status == 502
    assert eventually(lambda: exits()["crash"] == 1, timeout=10)
    server.send_signal(signal.SIGTTOU)
    assert eventually(lambda: exits()["scale_down"] == 1, timeout=10)
    before = exits()["reload"]
    server.send_signal(signal.SIGHUP)
    assert eventually(lambda: exits()["reload"] > before, timeout=20)
    metrics = get(stats, "/metrics").body.decode()
    counts = exits()
    for reason in ("max_requests", "timeout", "crash", "scale_down", "reload"):
        assert f'maitred_worker_exits_total{{reason="{reason}"}} {counts[reason]}' in metrics
    assert counts["memory"] == counts["wedged"] == counts["boot_failed"] == 0


def test_the_generation_moves_on_with_a_reload(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    first = status_of(stats)["server"]["generation"]
    assert first == 1
    server.send_signal(signal.SIGHUP)
    assert eventually(lambda: "SIGHUP: reloaded" in server.stderr(), timeout=20)
    assert eventually(lambda: len(status_of(stats)["scoreboard"]) == 1, timeout=10)
    status = status_of(stats)
    assert status["server"]["generation"] == first + 1
    assert status["scoreboard"][0]["generation"] == first + 1
    assert status["scoreboard"][0]["pid"] in workers_of(server.pid)
