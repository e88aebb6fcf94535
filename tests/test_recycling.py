"""Recycling workers (docs/SIGNALS.md, "Recycling workers"; docs/TUNING.md): a worker is retired
and replaced after --max-requests requests, above --max-worker-memory, or past
--max-worker-lifetime, and a spare worker, ready beforehand, takes its place at once, so that
no request waits for a new worker to load the application.

Every test runs the real server and real clients on keep-alive connections, each for a bounded
time, and checks what the clients saw and what /proc says about the workers.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from client import read_reply, status_of
from conftest import HOST, Server, eventually, free_port, wait_until
from test_lifecycle import APPS, wait_for_workers, worker_pids

LEAKY = "leaky:app"  # tests/apps/leaky.py: leaks 2 MB per request, answers its pid
SLOW_BOOT = "slow_boot:app"  # tests/apps/slow_boot.py: its import takes 1 s, answers its pid
CRASHY = "crashy:app"  # tests/apps/crashy.py: answers its pid

if TYPE_CHECKING:
    from typing import Self


@dataclass
class Answer:
    sent: float
    """time.monotonic() when the request was sent."""
    latency: float
    status: int
    pid: int


@dataclass
class Clients:
    """Keep-alive clients sending GETs in a loop, each as soon as it has its last answer (or
    `pause` later), until `requests` were sent in all or `duration` seconds passed."""

    port: int
    threads: int
    requests: int | None = None
    duration: float = 60.0
    pause: float = 0.0
    answers: list[Answer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _sent: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        deadline = time.monotonic() + self.duration
        workers = [threading.Thread(target=self._client, args=(deadline,)) for _ in range(self.threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=self.duration + 30)
        assert not any(worker.is_alive() for worker in workers), "a client did not finish"

    def _take_one(self) -> bool:
        with self._lock:
            if self.requests is not None and self._sent >= self.requests:
                return False
            self._sent += 1
            return True

    def _client(self, deadline: float) -> None:
        sock: socket.socket | None = None
        try:
            while time.monotonic() < deadline and self._take_one():
                if sock is None:
                    sock = socket.create_connection((HOST, self.port), timeout=20)
                sent = time.monotonic()
                try:
                    sock.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
                    reply = read_reply(sock)
                except OSError as error:
                    self.errors.append(f"{type(error).__name__}: {error}")
                    sock.close()
                    sock = None
                    continue
                answer = Answer(sent, time.monotonic() - sent, reply.status, int(reply.body.split()[0]))
                with self._lock:
                    self.answers.append(answer)
                if self.pause:
                    time.sleep(self.pause)
        finally:
            if sock is not None:
                sock.close()


def resident_mb(pid: int) -> float | None:
    """A process's resident memory, from /proc/PID/statm, in MiB; None once it is gone."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * 4096 / (1 << 20)


class MemorySampler:
    """Samples every worker's resident memory every few milliseconds while it runs."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.peak: dict[int, float] = defaultdict(float)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        while not self._stop.is_set():
            for pid in worker_pids(self.server):
                resident = resident_mb(pid)
                if resident is not None:
                    self.peak[pid] = max(self.peak[pid], resident)
            self._stop.wait(0.005)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_max_worker_memory_replaces_leaking_workers_and_fails_no_request(maitred_server):
    """2,000 requests to an application leaking 2 MB each, -w 2 --max-worker-memory 100: every
    answer is 200, workers are replaced, and none grows past about 110 MB."""
    server = maitred_server("-w", "2", "--max-worker-memory", "100", LEAKY, cwd=APPS)
    first = wait_for_workers(server, 3)  # two serve, one is the spare
    clients = Clients(server.port, threads=4, requests=2000, duration=120)
    with MemorySampler(server) as sampler:
        clients.run()
    assert clients.errors == []
    assert len(clients.answers) == 2000
    assert {answer.status for answer in clients.answers} == {200}
    served_by = {answer.pid for answer in clients.answers}
    # Each worker leaks below 100 MB in about 45 requests: 2,000 need some 40 workers.
    assert len(served_by) >= 20, len(served_by)
    assert first - worker_pids(server), "the first workers are still there"
    peak = max(sampler.peak.values())
    assert peak <= 110, f"a worker reached {peak:.1f} MB"
    # The lobby's own figure when it retired each: above the limit, by a request or two.
    over_limit = r"([0-9.]+) MB resident, over --max-worker-memory 100"
    assert eventually(lambda: len(re.findall(over_limit, server.stderr())) >= 20, 10), server.stderr()
    retired = [float(mb) for mb in re.findall(over_limit, server.stderr())]
    assert all(100 < mb <= 110 for mb in retired), retired


def test_max_worker_lifetime_replaces_workers_after_their_lifetime_under_load(maitred_server):
    """--max-worker-lifetime 1 with 0.5 s of jitter, requests sent without a pause for 5 s:
    every one succeeds, and each worker serves for 1 to 1.5 s before another takes over."""
    server = maitred_server(
        "-w", "2", "--max-worker-lifetime", "1", "--max-worker-lifetime-jitter", "0.5", CRASHY, cwd=APPS
    )
    wait_for_workers(server, 3)
    clients = Clients(server.port, threads=2, duration=5.0)
    started = time.monotonic()
    clients.run()
    assert clients.errors == []
    assert len(clients.answers) > 100
    assert {answer.status for answer in clients.answers} == {200}
    first_seen: dict[int, float] = {}
    last_seen: dict[int, float] = {}
    for answer in clients.answers:
        first_seen.setdefault(answer.pid, answer.sent)
        last_seen[answer.pid] = answer.sent
    # Two at a time for 5 s, each for 1 to 1.5 s: at least six workers.
    assert len(first_seen) >= 6, sorted(first_seen)
    # Those that began and ended inside the run served for about their lifetime.
    whole = [pid for pid in first_seen if first_seen[pid] > started + 0.2 and last_seen[pid] < started + 4.8]
    assert whole
    spans = sorted(last_seen[pid] - first_seen[pid] for pid in whole)
    assert 0.7 < spans[0] and spans[-1] < 2.0, spans
    reasons = re.findall(r"served for ([0-9.]+) s, past --max-worker-lifetime 1 \+ ([0-9.]+) s jitter", server.stderr())
    assert len(reasons) >= 4
    assert all(0 <= float(jitter) <= 0.5 for _, jitter in reasons), reasons
    assert len({jitter for _, jitter in reasons}) > 1, "every worker drew the same jitter"


def test_an_idle_worker_past_its_lifetime_is_replaced_at_once(maitred_server):
    server = maitred_server("-w", "1", "--max-worker-lifetime", "1", CRASHY, cwd=APPS)
    first = wait_for_workers(server, 2)
    wait_until(lambda: not first & worker_pids(server), 10, "the first worker and the spare replaced without a request")
    assert re.search(r"retiring worker \d+: served for 1\.\d s, past --max-worker-lifetime 1;", server.stderr())


@pytest.mark.parametrize(
    "recycling",
    [("--max-worker-lifetime", "1.5"), ("--max-requests", "30")],
    ids=["lifetime", "max-requests"],
)
def test_a_retiring_worker_is_replaced_by_a_ready_spare_without_a_wait(maitred_server, recycling):
    """-w 1 and an application whose import takes 1 s: a worker retires every 1.5 s or so, and
    the request after it is served at once by the spare, not after a 1 s boot."""
    stats = free_port()
    server = maitred_server("-w", "1", *recycling, "--stats", f"{HOST}:{stats}", SLOW_BOOT, cwd=APPS)
    wait_for_workers(server, 2, timeout=30)
    # The spare loads the application for 1 s after the server serves: the load starts once it
    # is held, ready.
    assert eventually(lambda: status_of(stats)["workers"]["held"] == 1, 30), status_of(stats)["workers"]
    clients = Clients(server.port, threads=1, duration=6.0, pause=0.05)
    clients.run()
    assert clients.errors == []
    assert {answer.status for answer in clients.answers} == {200}
    pids = [answer.pid for answer in clients.answers]
    assert len(set(pids)) >= 4, "fewer than three retirements"
    slowest = max(answer.latency for answer in clients.answers)
    assert slowest < 0.4, f"a request waited {slowest:.2f} s: a worker's boot"
    server.wait_for_log("takes its place", 10)
