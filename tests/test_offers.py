"""Requests offered ahead to busy workers (docs/PROTOCOL.md, section 3; docs/DESIGN.md).

When a worker takes a request while others wait, the lobby offers it the next one at once, so
that it need not wait for the lobby when it finishes. An offer must never cost what seating
promises: a request does not wait behind a slow one while another worker is free, and a
worker that dies does not take an offered request down with it.

Each test first makes both workers busy, then queues a request that becomes the current one
of the first worker to finish, and one more, which is offered to that same worker.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from client import Reply, get, status_of, wait_for_queue
from conftest import HOST, eventually, free_port

APPS = Path(__file__).resolve().parent / "apps"


class Request(threading.Thread):
    """One GET in the background, timed from the start of the test."""

    def __init__(self, port: int, path: str, started: float) -> None:
        super().__init__(daemon=True)
        self.port, self.path, self.started = port, path, started
        self.reply: Reply | None = None
        self.error: BaseException | None = None
        self.finished_after = float("inf")

    def run(self) -> None:
        try:
            self.reply = get(self.port, self.path, timeout=30)
        except BaseException as error:  # noqa: BLE001 - reported by the test's assertions
            self.error = error
        self.finished_after = time.monotonic() - self.started


def send(port: int, path: str, started: float) -> Request:
    request = Request(port, path, started)
    request.start()
    return request


def test_an_idle_worker_takes_back_a_request_offered_to_a_busy_one(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", "--log-level", "debug", "crashy:app", cwd=APPS)
    started = time.monotonic()
    busy = [send(server.port, "/sleep?seconds=0.6", started) for _ in range(2)]
    wait_for_queue(stats, busy=2, waiting=0)
    slow = send(server.port, "/sleep?seconds=4", started)
    wait_for_queue(stats, busy=2, waiting=1)
    fast = send(server.port, "/pid", started)
    for request in (*busy, slow, fast):
        request.join(30)

    assert [r.reply.status if r.reply else r.error for r in (*busy, slow, fast)] == [200] * 4
    # The worker that took the slow request was offered the fast one; the other worker,
    # free a moment later, took it back instead of leaving it 4 s behind the slow one.
    assert fast.finished_after < 2.5, f"the fast request waited {fast.finished_after:.1f} s"
    assert fast.reply.body != slow.reply.body, "both ran in the same worker"
    # Taken back as an idle worker's oldest request, or as one behind a request that has held
    # its worker for long (offer.rs, STALE_AFTER), depending on when the other worker looked.
    server.wait_for_log("GET /pid HTTP/1.1 was offered to a busy worker", 10)


def test_requests_offered_behind_a_slow_one_go_to_the_next_worker_that_looks(maitred_server):
    """Even while the queue holds newer requests: those offered behind a slow request are older."""
    stats = free_port()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", "--log-level", "debug", "crashy:app", cwd=APPS)
    started = time.monotonic()

    def arrives(path: str, waiting: int) -> Request:
        request = send(server.port, path, started)
        assert eventually(lambda: status_of(stats)["queue"]["waiting"] == waiting, 10), f"{path} never queued"
        return request

    # Quick requests first, as in a real mix: next to them a request of 4 s is slow, and one of
    # 0.5 s soon is (the lobby counts a worker as stuck past 4 times the typical request).
    for _ in range(40):
        assert get(server.port, "/pid").status == 200
    first = send(server.port, "/sleep?seconds=0.5", started)
    server.wait_for_log("takes GET /sleep?seconds=0.5 HTTP/1.1", 10)
    second = send(server.port, "/sleep?seconds=1", started)
    server.wait_for_log("takes GET /sleep?seconds=1 HTTP/1.1", 10)
    slow = arrives("/sleep?seconds=4", 1)
    fast = [arrives(f"/pid?n={n}", n + 2) for n in range(8)]
    later = [arrives(f"/sleep?seconds=2&n={n}", n + 10) for n in range(2)]
    # At 0.5 s the first worker takes the slow request and is offered the first fast ones (as
    # many as requests of 0.5 s call for: two); the rest and the two later ones stay queued. At 1 s the other worker looks for
    # work: the fast ones, older, come before the later ones, instead of waiting 4 s behind the
    # slow one.
    for request in (first, second, slow, *fast, *later):
        request.join(30)

    assert [r.reply.status if r.reply else r.error for r in (first, second, slow, *fast, *later)] == [200] * 13
    waits = [round(r.finished_after, 1) for r in fast]
    assert max(waits) < 2.0, f"the fast requests finished after {waits} s"
    assert all(r.reply.body != slow.reply.body for r in fast), "a fast request ran behind the slow one"
    server.wait_for_log("was offered to a busy worker on a slow request; another worker takes it", 10)


def test_a_request_offered_to_a_worker_that_dies_is_served_by_another(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", "crashy:app", cwd=APPS)
    started = time.monotonic()
    long = send(server.port, "/sleep?seconds=3", started)
    short = send(server.port, "/sleep?seconds=0.6", started)
    wait_for_queue(stats, busy=2, waiting=0)
    dying = send(server.port, "/sigkill?after=0.5", started)
    wait_for_queue(stats, busy=2, waiting=1)
    offered = send(server.port, "/pid", started)
    for request in (long, short, dying, offered):
        request.join(30)

    assert long.reply is not None and long.reply.status == 200
    assert dying.reply is not None and dying.reply.status == 502
    # The dying worker had been offered /pid and never started it: the lobby took it back
    # and seated it at the other worker or the dying one's replacement.
    assert offered.reply is not None and offered.reply.status == 200, offered.error or offered.reply
    assert offered.finished_after < 2.5, f"/pid waited {offered.finished_after:.1f} s"
    server.wait_for_log("502", 10)
    refused = [line for line in server.stderr().splitlines() if "502" in line]
    assert refused and not any("/pid" in line for line in refused), refused
    assert server.process.poll() is None


def test_a_client_leaving_while_its_worker_holds_an_offer_loses_nobody_else_their_answer(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "drip:app", cwd=APPS)
    started = time.monotonic()
    busy = send(server.port, "/drip?seconds=0.5", started)
    wait_for_queue(stats, busy=1, waiting=0)
    leaving = socket.create_connection((HOST, server.port), timeout=10)
    leaving.sendall(b"GET /drip?seconds=5 HTTP/1.1\r\nHost: test\r\n\r\n")
    wait_for_queue(stats, busy=1, waiting=1)
    offered = send(server.port, "/pid", started)
    # The worker takes the long drip when the first ends, and is offered /pid with it.
    assert leaving.recv(1024).startswith(b"HTTP/1.1 200 OK")
    leaving.close()
    offered.join(30)
    busy.join(30)

    assert busy.reply is not None and busy.reply.status == 200
    # The lobby took the offer back before telling the worker to stop the drip, so the stop
    # reached the drip and /pid was answered, long before the drip would have ended.
    assert offered.reply is not None and offered.reply.status == 200, offered.error
    assert offered.finished_after < 3.0, f"/pid waited {offered.finished_after:.1f} s"
    server.wait_for_log("client went away during GET /drip?seconds=5 HTTP/1.1; response abandoned", 10)
    assert server.process.poll() is None


def test_queue_timeout_withdraws_a_request_offered_to_a_busy_worker(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "--queue-timeout", "1", "drip:app", cwd=APPS)
    started = time.monotonic()
    first = send(server.port, "/drip?seconds=0.3", started)
    wait_for_queue(stats, busy=1, waiting=0)
    slow = send(server.port, "/drip?seconds=3", started)
    wait_for_queue(stats, busy=1, waiting=1)
    offered = send(server.port, "/pid", started)
    for request in (first, slow, offered):
        request.join(30)

    assert [r.reply.status if r.reply else r.error for r in (first, slow)] == [200, 200]
    # /pid was offered to the worker with the slow drip; at --queue-timeout it was still
    # waiting, so the lobby took it back and answered 503 instead of letting it run late.
    assert offered.reply is not None and offered.reply.status == 503, offered.error or offered.reply
    assert 1.0 <= offered.finished_after < 2.0, f"503 after {offered.finished_after:.1f} s"
    assert b"--queue-timeout" in offered.reply.body
