"""Workers that cannot answer, seen from the outside (docs/SIGNALS.md, "--timeout and worker
health"): one killed at --timeout says where it was stuck first; a request is never seated at a
stopped worker, nor lost to a worker that leaves after its answer."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from client import get, read_reply, wait_for_queue
from conftest import HOST, free_port, wait_for_empty_group, wait_until
from test_lifecycle import wait_for_workers, worker_pids

APPS = Path(__file__).resolve().parent / "apps"
APP = "health:app"  # tests/apps/health.py
# What /proc/PID/task/TID/wchan begins with for a thread in nanosleep(2) (the name moved between
# kernels), and for one in poll(2) ("poll_schedule_timeout.constprop.0" on 6.18).
NANOSLEEPS = ("do_nanosleep", "hrtimer_nanosleep")
IN_POLL = "poll_schedule_timeout"
# crates/lobby/src/worker/health.rs's LOOK_AFTER_IDLE, in seconds.
LOOK_AFTER_IDLE = 0.010


@pytest.mark.parametrize("main", ["sleep", "read"])
@pytest.mark.parametrize("destination", ["stderr", "file"])
def test_a_worker_killed_at_timeout_first_writes_every_threads_stack(maitred_server, tmp_path, main, destination):
    log_file = tmp_path / "error.log"
    logging = ["--error-logfile", str(log_file)] if destination == "file" else []
    server = maitred_server("-w", "2", "--timeout", "2", *logging, APP, cwd=APPS)
    before = wait_for_workers(server, 2)

    started = time.monotonic()
    cut = get(server.port, f"/stuck?main={main}", timeout=20)
    waited = time.monotonic() - started
    assert cut.status == 504, cut
    assert b"--timeout" in cut.body
    assert 1.9 < waited < 4, waited  # --timeout, and at most a second for the stack

    def log() -> str:
        return log_file.read_text() if destination == "file" else server.stderr()

    # The lobby writes its lines from a thread of its own: the last may come after the answer.
    wait_until(lambda: f"504 for GET /stuck?main={main}" in log(), 5, "the 504 in the log")
    log = log()
    timed_out = re.search(
        rf"worker (\d+) timed out after 2 s on GET /stuck\?main={main} HTTP/1.1 \(seated [\d.]+ s ago\); "
        r"its Python stack follows",
        log,
    )
    assert timed_out, log
    assert int(timed_out[1]) in before
    answered = log.rindex("\n", 0, log.index(f"504 for GET /stuck?main={main}"))
    stack = log[log.index("\n", timed_out.end()) : answered]
    # faulthandler's format: one block per thread, innermost call first.
    assert (
        len(re.findall(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$", stack, re.MULTILINE))
        >= 2
    )
    stuck_main = "stuck_in_time_sleep" if main == "sleep" else "stuck_reading_a_pipe"
    for function in (stuck_main, "stuck_in_select", "app"):
        assert re.search(rf'^  File ".*health\.py", line \d+ in {function}$', stack, re.MULTILINE), stack
    # Nothing of the lobby's lands inside the stack: every line is faulthandler's.
    for line in stack.strip().splitlines():
        assert re.match(r"(?:Current thread|Thread) 0x|  File |  <no Python frame>|$", line), line

    # The worker is replaced, and the next request is answered.
    wait_until(lambda: len(worker_pids(server)) == 2 and worker_pids(server) != before, 20, "a replacement")
    assert get(server.port, "/pid").status == 200


@pytest.mark.parametrize("then", ["left", "shutdown"])
def test_a_stopped_idle_worker_gets_no_request_and_is_replaced_then_killed(maitred_server, then):
    server = maitred_server("-w", "2", "--timeout", "8", APP, cwd=APPS)
    before = wait_for_workers(server, 2)
    # Both have loaded the application and answered: one stopped before that would hold up
    # the start instead.
    wait_until(lambda: {get(server.port, "/pid").pid for _ in range(4)} == before, 10, "both workers answering")
    answered = time.monotonic()
    # The lobby looks at a worker's state before seating a request only once the worker has been
    # quiet for LOOK_AFTER_IDLE since its last answer: a request sooner is seated unlooked, and a
    # worker stopped meanwhile holds it for READ_WITHIN (2 s). So the stop comes once the worker
    # is back in its wait for a request (poll(2) on its bell and its channel) and that long
    # after the answer reached this client, which is after the lobby read it.
    stopped = min(before)
    wait_until(
        lambda: (
            Path(f"/proc/{stopped}/wchan").read_text().startswith(IN_POLL)
            and time.monotonic() - answered > LOOK_AFTER_IDLE
        ),
        10,
        "the worker back in poll(2), quiet for LOOK_AFTER_IDLE",
    )
    os.kill(stopped, signal.SIGSTOP)
    wait_until(lambda: Path(f"/proc/{stopped}/stat").read_text().split(") ")[1][0] == "T", 5, "a stopped worker")

    replies = []
    for _ in range(10):
        started = time.monotonic()
        reply = get(server.port, "/pid", timeout=10)
        replies.append((reply.status, reply.pid, time.monotonic() - started))
    assert [status for status, _, _ in replies] == [200] * 10, replies
    assert stopped not in {pid for _, pid, _ in replies}
    assert max(seconds for _, _, seconds in replies) < 2, replies  # --timeout is 8 s

    server.wait_for_log(f"worker {stopped} lost: it is stopped (SIGSTOP), so no request goes to it", 10)
    if then == "shutdown":
        # Not one of the workers any more, and still stopped: the shutdown kills it.
        assert server.stop() == 0
        assert wait_for_empty_group(server.pid, 10) == []
        assert f"worker {stopped} was still there at the shutdown; killing it" in server.stderr()
        return
    # Killed once it has been left stopped for --timeout, and replaced meanwhile.
    wait_until(lambda: stopped not in worker_pids(server), 15, f"worker {stopped} killed")
    server.wait_for_log(f"worker {stopped} was still there 8 s after it was found stopped; killing it", 10)
    wait_for_workers(server, 2)
    assert get(server.port, "/pid").status == 200


def test_a_wedged_idle_worker_is_killed_and_its_request_goes_to_another(maitred_server):
    """A worker alive but wedged (another thread holds the GIL) does not read the request sent
    to it: within health::READ_WITHIN (2 s) the lobby stops it, sees the request unread, kills
    it and seats the request elsewhere; nothing waits for --timeout, nothing runs twice."""
    server = maitred_server("-w", "2", "--timeout", "30", APP, cwd=APPS)
    before = wait_for_workers(server, 2)
    wedged = get(server.port, "/wedge").pid
    assert wedged in before
    # The application wedges its worker 0.3 s after this answer (tests/apps/health.py): its
    # thread says so, then sleeps in C with the GIL held.
    line = server.wait_for_log(re.compile(r"health: thread (\d+) takes the GIL"), 10)
    thread = re.search(r"health: thread (\d+) takes the GIL", line).group(1)
    wait_until(
        lambda: Path(f"/proc/{wedged}/task/{thread}/wchan").read_text().startswith(NANOSLEEPS),
        10,
        "the GIL held in a sleep",
    )
    replies = []
    for _ in range(6):
        started = time.monotonic()
        reply = get(server.port, "/pid", timeout=20)
        replies.append((reply.status, reply.pid, time.monotonic() - started))
    assert [status for status, _, _ in replies] == [200] * 6, replies
    assert wedged not in {pid for _, pid, _ in replies}
    assert max(seconds for _, _, seconds in replies) < 5, replies  # --timeout is 30 s
    wait_until(lambda: "alive but wedged" in server.stderr(), 5, "the wedged worker named in the log")
    assert re.search(
        rf"worker {wedged} lost: was killed: alive but wedged .* which goes to another worker", server.stderr()
    )
    wait_until(lambda: wedged not in worker_pids(server) and len(worker_pids(server)) == 2, 10, "a replacement")


def _exit_then_get(port: int, stats: int, order: str) -> int:
    """GET /exit (its worker answers, then exits) and a GET /pid that goes to the same worker
    unless the lobby knows better; returns the status of the GET /pid. `stats` is the stats
    listener's port, which shows when a request has reached the lobby."""
    with socket.create_connection((HOST, port), timeout=20) as leaving, ThreadPoolExecutor(2) as pool:
        if order == "after":
            # Sent the moment the answer to /exit is in: the lobby may still see the worker
            # idle, and send it the request while it exits.
            leaving.sendall(b"GET /exit HTTP/1.1\r\nHost: test\r\n\r\n")
            assert read_reply(leaving).status == 500
            return get(port, "/pid").status
        ahead = []
        if order == "offered":
            # /exit and /pid wait behind a request in progress: the worker that takes /exit is
            # offered /pid at once (docs/PROTOCOL.md, section 3).
            ahead.append(pool.submit(get, port, "/sleep?seconds=0.3"))
            wait_for_queue(stats, busy=1, waiting=0)
            leaving.sendall(b"GET /exit HTTP/1.1\r\nHost: test\r\n\r\n")
            wait_for_queue(stats, busy=1, waiting=1)
        else:
            # "queued": /pid waits while /exit runs, and goes on the worker's channel the
            # moment it answers /exit.
            leaving.sendall(b"GET /exit?after=0.2 HTTP/1.1\r\nHost: test\r\n\r\n")
            wait_for_queue(stats, busy=1, waiting=0)
        follow_up = pool.submit(get, port, "/pid")
        assert [reply.result(timeout=20).status for reply in ahead] == [200] * len(ahead)
        assert read_reply(leaving).status == 500
        return follow_up.result(timeout=20).status


@pytest.mark.parametrize(("order", "rounds"), [("after", 50), ("queued", 10), ("offered", 10)])
def test_a_request_after_a_worker_exits_is_never_lost_to_it(maitred_server, order, rounds):
    # One worker: every follow-up is the leaving worker's to take, or the lobby's to keep.
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    statuses = [_exit_then_get(server.port, stats, order) for _ in range(rounds)]
    assert statuses == [200] * rounds, statuses
    if order != "after":  # there the worker may have been seen gone before /pid came
        server.wait_for_log("lost: exited without reading GET /pid HTTP/1.1, which goes to another worker", 10)
    assert "502 for" not in server.stderr()
