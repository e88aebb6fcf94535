"""Requests offered ahead to busy workers (docs/PROTOCOL.md, section 3; docs/DESIGN.md).

When a worker takes a request while others wait, the lobby offers it the next one at once, so
that it need not wait for the lobby when it finishes. An offer must never cost what seating
promises: a request does not wait behind a slow one while another worker is free, and a
worker that dies does not take an offered request down with it.

Each test first makes both workers busy, then queues a request that becomes the current one
of the first worker to finish, and one more, which is offered to that same worker.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from client import Reply, get

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
        except BaseException as error:  # reported by the test's assertions
            self.error = error
        self.finished_after = time.monotonic() - self.started


def send(port: int, path: str, started: float) -> Request:
    request = Request(port, path, started)
    request.start()
    return request


def test_an_idle_worker_takes_back_a_request_offered_to_a_busy_one(maitred_server):
    server = maitred_server("-w", "2", "--log-level", "debug", "crashy:app", cwd=APPS)
    started = time.monotonic()
    busy = [send(server.port, "/sleep?seconds=0.6", started) for _ in range(2)]
    time.sleep(0.2)
    slow = send(server.port, "/sleep?seconds=4", started)
    time.sleep(0.1)
    fast = send(server.port, "/pid", started)
    for request in (*busy, slow, fast):
        request.join(30)

    assert [r.reply.status if r.reply else r.error for r in (*busy, slow, fast)] == [200] * 4
    # The worker that took the slow request was offered the fast one; the other worker,
    # free a moment later, took it back instead of leaving it 4 s behind the slow one.
    assert fast.finished_after < 2.5, f"the fast request waited {fast.finished_after:.1f} s"
    assert fast.reply.body != slow.reply.body, "both ran in the same worker"
    assert "GET /pid HTTP/1.1 was offered to a busy worker; an idle one takes it back" in server.stderr()


def test_a_request_offered_to_a_worker_that_dies_is_served_by_another(maitred_server):
    server = maitred_server("-w", "2", "crashy:app", cwd=APPS)
    started = time.monotonic()
    long = send(server.port, "/sleep?seconds=3", started)
    short = send(server.port, "/sleep?seconds=0.6", started)
    time.sleep(0.2)
    dying = send(server.port, "/sigkill?after=0.5", started)
    time.sleep(0.1)
    offered = send(server.port, "/pid", started)
    for request in (long, short, dying, offered):
        request.join(30)

    assert long.reply is not None and long.reply.status == 200
    assert dying.reply is not None and dying.reply.status == 502
    # The dying worker had been offered /pid and never started it: the lobby took it back
    # and seated it at the other worker or the dying one's replacement.
    assert offered.reply is not None and offered.reply.status == 200, offered.error or offered.reply
    assert offered.finished_after < 2.5, f"/pid waited {offered.finished_after:.1f} s"
    refused = [line for line in server.stderr().splitlines() if "502" in line]
    assert refused and not any("/pid" in line for line in refused), refused
    assert server.process.poll() is None
