"""maitred's promises about processes, told through real ones: a worker that dies costs one
request, a slow one is cut at --timeout, workers are recycled without losing a request, and the
server stops on each signal as docs/SIGNALS.md says -- leaving nothing behind.

An application that cannot load at start-up is tested in test_cli.py
(test_application_that_cannot_load_stops_the_server), as is the pid file of a server stopped by
SIGTERM (test_serves_and_stops_on_sigterm_removing_its_pid_file).
"""

from __future__ import annotations

import http.client
import re
import signal
import socket
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from client import Reply, get, read_reply, wait_for_queue
from conftest import (
    HOST,
    Server,
    eventually,
    free_port,
    is_worker,
    processes_in_group,
    wait_for_empty_group,
    wait_until,
)

APPS = Path(__file__).resolve().parent / "apps"
APP = "crashy:app"  # tests/apps/crashy.py: every answer is the serving worker's pid


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def worker_pids(server: Server) -> set[int]:
    """The live workers: the grandchildren of the lobby (its child is the zygote), but for the
    zygote's short-lived child that asks whether the application is ASGI (`is_worker`)."""
    group = processes_in_group(server.pid)
    zygotes = {pid for pid in group if parent_of(pid) == server.pid}
    return {pid for pid in group if parent_of(pid) in zygotes and is_worker(pid)}


def wait_for_workers(server: Server, count: int, timeout: float = 20.0) -> set[int]:
    """The workers' pids, once there are `count` of them."""
    found: set[int] = set()

    def settled() -> bool:
        nonlocal found
        found = worker_pids(server)
        return len(found) == count

    wait_until(settled, timeout, f"{count} workers")
    return found


def wait_for_replacement(server: Server, before: set[int], timeout: float = 20.0) -> tuple[int, int]:
    """Waits until exactly one of the workers `before` is gone and a new one has taken its
    place; returns (gone, new)."""
    found: set[int] = set()

    def replaced() -> bool:
        nonlocal found
        found = worker_pids(server)
        return len(found) == len(before) and len(before - found) == 1

    wait_until(replaced, timeout, f"one of the workers {sorted(before)} replaced")
    (gone,) = before - found
    (new,) = found - before
    return gone, new


def results(futures: list[Future[Reply]], timeout: float = 30.0) -> list[Reply]:
    return [future.result(timeout=timeout) for future in futures]


# ---------------------------------------------------------------------------------------------
# Failures inside a worker.


@pytest.mark.parametrize("death", ["exit", "sigkill", "segfault"])
def test_a_worker_dying_mid_request_costs_that_request_alone(maitred_server, death):
    stats = free_port()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    before = wait_for_workers(server, 2)
    with ThreadPoolExecutor(5) as pool:
        running = pool.submit(get, server.port, "/sleep?seconds=1")
        wait_for_queue(stats, busy=1, waiting=0)  # seated at one worker; the dying request takes the other
        dying = pool.submit(get, server.port, f"/{death}?after=0.5")
        wait_for_queue(stats, busy=2, waiting=0)
        queued = [pool.submit(get, server.port, "/sleep?seconds=0.3") for _ in range(3)]
        died = dying.result(timeout=20)
        survivors = results([running, *queued])

    assert died.status == 502, died
    assert b"the worker exited while handling this request" in died.body
    assert [reply.status for reply in survivors] == [200] * 4
    assert survivors[0].pid in before

    lost, replacement = wait_for_replacement(server, before)
    # The lobby's log is written by a thread of its own, a moment after the fact.
    log = server.wait_for_log(f"booting worker {replacement}", 10)
    assert f"worker {lost} lost" in log
    assert f"502 for GET /{death}?after=0.5 HTTP/1.1" in log
    assert f"booting worker {replacement}" in log
    assert {get(server.port, "/pid").pid for _ in range(6)} <= before - {lost} | {replacement}
    assert server.process.poll() is None


def test_an_exception_escaping_the_application_is_a_500_and_the_worker_lives_on(maitred_server):
    server = maitred_server(APP, cwd=APPS)
    first = get(server.port, "/pid")
    assert first.status == 200

    failed = get(server.port, "/raise")
    assert failed.status == 500
    log = server.stderr()
    assert "Traceback (most recent call last)" in log
    assert "RuntimeError: raised on purpose by crashy.py" in log
    assert "GET /raise HTTP/1.1" in log

    after = get(server.port, "/pid")
    assert (after.status, after.pid) == (200, first.pid)
    assert worker_pids(server) == {first.pid}


def test_a_request_past_timeout_gets_504_and_its_worker_is_replaced(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "2", "--timeout", "1", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    before = wait_for_workers(server, 2)
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        stuck = pool.submit(get, server.port, "/sleep?seconds=60")
        wait_for_queue(stats, busy=1, waiting=0)  # the others go to the other worker
        others = [get(server.port, "/sleep?seconds=0.2") for _ in range(5)]
        cut = stuck.result(timeout=20)
        waited = time.monotonic() - started

    assert cut.status == 504, cut
    assert b"--timeout" in cut.body
    assert 0.9 < waited < 5, waited
    assert [reply.status for reply in others] == [200] * 5

    killed, replacement = wait_for_replacement(server, before)
    # The lobby's log is written by a thread of its own, a moment after the fact.
    log = server.wait_for_log(f"booting worker {replacement}", 10)
    assert re.search(rf"worker {killed} timed out after 1 s on GET /sleep\?seconds=60", log)
    assert f"booting worker {replacement}" in log
    assert get(server.port, "/pid").status == 200


# ---------------------------------------------------------------------------------------------
# Recycling workers.


def test_max_requests_recycles_the_worker_without_losing_a_request(maitred_server):
    server = maitred_server("--max-requests", "5", APP, cwd=APPS)
    replies = [get(server.port, "/pid") for _ in range(20)]
    assert [reply.status for reply in replies] == [200] * 20
    pids = [reply.pid for reply in replies]
    # One worker at a time, each retired after exactly five requests.
    assert [pids[i : i + 5] for i in range(0, 20, 5)] == [[pid] * 5 for pid in pids[::5]]
    assert len(set(pids)) == 4
    # The lobby's log is written by a thread of its own, a moment after the fact.
    assert eventually(lambda: server.stderr().count("5 requests served, --max-requests 5") >= 3, 5), server.stderr()


def test_max_requests_under_concurrent_requests(maitred_server):
    server = maitred_server("--max-requests", "5", APP, cwd=APPS)

    def ten_requests() -> list[Reply]:
        return [get(server.port, "/pid") for _ in range(10)]

    with ThreadPoolExecutor(4) as pool:
        batches = [pool.submit(ten_requests) for _ in range(4)]
        replies = [reply for batch in results(batches, timeout=60) for reply in batch]
    assert [reply.status for reply in replies] == [200] * 40
    assert sorted(Counter(reply.pid for reply in replies).values()) == [5] * 8


# ---------------------------------------------------------------------------------------------
# Stopping.


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=0.5).close()
    except ConnectionRefusedError:
        return True
    return False


GRACEFUL_SIGNALS = pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])


@GRACEFUL_SIGNALS
def test_graceful_shutdown_finishes_every_accepted_request(maitred_server, signum):
    stats = free_port()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    wait_for_workers(server, 2)
    with ThreadPoolExecutor(6) as pool:
        # Two run at once and four wait in the queue: 3 s in all.
        accepted = [pool.submit(get, server.port, "/sleep?seconds=1") for _ in range(6)]
        wait_for_queue(stats, busy=2, waiting=4)
        server.send_signal(signum)
        replies = results(accepted)

    assert [reply.status for reply in replies] == [200] * 6
    assert server.wait(timeout=15) == 0
    assert wait_for_empty_group(server.pid, 10) == []
    assert [reply.headers["Connection"] for reply in replies] == ["close"] * 6


@GRACEFUL_SIGNALS
def test_graceful_shutdown_stops_listening_and_closes_idle_connections_at_once(maitred_server, signum):
    stats = free_port()
    server = maitred_server("--keep-alive", "30", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    idle = socket.create_connection((HOST, server.port), timeout=10)
    idle.sendall(b"GET /pid HTTP/1.1\r\nHost: test\r\n\r\n")
    assert read_reply(idle).status == 200
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(get, server.port, "/sleep?seconds=2")  # keeps the shutdown going
        wait_for_queue(stats, busy=1, waiting=0)
        server.send_signal(signum)
        signalled = time.monotonic()

        assert idle.recv(1) == b"", "the idle keep-alive connection got data instead of closing"
        closed_after = time.monotonic() - signalled
        assert closed_after < 1, f"the idle keep-alive connection was closed after {closed_after} s"
        idle.close()
        refused = eventually(lambda: refuses_connections(server.port), 1)
        assert not busy.done(), "the busy request ended too soon to test"
        assert busy.result(timeout=20).status == 200

    assert server.wait(timeout=15) == 0
    assert wait_for_empty_group(server.pid, 10) == []
    assert refused, "a new connection was accepted during the shutdown"


def stop_with_every_worker_busy(server: Server, stats: int, signum: int) -> float:
    """Keeps four workers busy with endless requests and one more queued (as the stats
    listener on port `stats` sees it), sends `signum`, and checks that the server exits 0 and
    every one of those requests is cut. Returns how long the server took to exit."""
    with ThreadPoolExecutor(5) as pool:
        endless = [pool.submit(get, server.port, "/sleep?seconds=60") for _ in range(5)]
        wait_for_queue(stats, busy=4, waiting=1)
        server.send_signal(signum)
        signalled = time.monotonic()
        assert server.wait(timeout=15) == 0
        stopped_after = time.monotonic() - signalled
        for future in endless:
            with pytest.raises((ConnectionError, http.client.HTTPException)):
                future.result(timeout=10)
    return stopped_after


def test_graceful_timeout_cuts_requests_that_run_longer(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "4", "--graceful-timeout", "1", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    wait_for_workers(server, 4)
    stopped_after = stop_with_every_worker_busy(server, stats, signal.SIGTERM)
    assert wait_for_empty_group(server.pid, 10) == []
    assert 0.9 < stopped_after < 3.5, stopped_after
    assert "--graceful-timeout passed with requests unfinished" in server.stderr()


def test_sigquit_stops_at_once(maitred_server, tmp_path):
    pid_file = tmp_path / "maitred.pid"
    stats = free_port()
    server = maitred_server("-w", "4", "-p", str(pid_file), "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    wait_for_workers(server, 4)
    assert pid_file.read_text() == f"{server.pid}\n"
    stopped_after = stop_with_every_worker_busy(server, stats, signal.SIGQUIT)
    assert wait_for_empty_group(server.pid, 10) == []
    assert not pid_file.exists()
    assert stopped_after < 1.5, stopped_after


# ---------------------------------------------------------------------------------------------
# The access log.

COMMON_LOG_LINE = re.compile(
    r"^(?P<host>\S+) - - \[\d{2}/[A-Z][a-z]{2}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4}\] "
    r'"(?P<request>[^"]*)" (?P<status>\d{3}) (?P<bytes>\d+|-)'
)


def test_access_log_has_a_line_per_request_in_common_log_format(maitred_server, tmp_path):
    access_log = tmp_path / "access.log"
    server = maitred_server("--access-logfile", str(access_log), APP, cwd=APPS)
    served = get(server.port, "/pid?x=1")
    assert get(server.port, "/raise").status == 500
    with socket.create_connection((HOST, server.port), timeout=20) as sock:
        sock.sendall(b"GET /pid HTTP/1.0\r\nUser-Agent: lifecycle-test\r\n\r\n")
        assert read_reply(sock).status == 200

    wait_until(lambda: access_log.read_text().count("\n") >= 3, 5, "three access log lines")
    lines = access_log.read_text().splitlines()
    assert len(lines) == 3, lines
    matches = [COMMON_LOG_LINE.match(line) for line in lines]
    assert all(matches), lines
    assert [(m["host"], m["request"], m["status"]) for m in matches] == [
        (HOST, "GET /pid?x=1 HTTP/1.1", "200"),
        (HOST, "GET /raise HTTP/1.1", "500"),
        (HOST, "GET /pid HTTP/1.0", "200"),
    ]
    assert matches[0]["bytes"] == str(len(served.body))
    assert lines[2].endswith('"lifecycle-test"')
