"""The lobby's watchdog (--lobby-timeout, docs/SIGNALS.md, "A stalled lobby"): a lobby whose
event loop makes no progress is named and ended, not left standing, and a lobby that was only
stopped, or starved of CPU, is not.

The loop is wedged on purpose through the lobby's test hook: with MAITRED_TEST_WEDGE=spin (a
loop that never yields, as issue 46's did) or =block (a thread asleep in a system call) in its
environment, SIGRTMIN+5 wedges it.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from client import get, status_of
from conftest import HOST, eventually, free_port, wait_for_empty_group

APPS = Path(__file__).resolve().parent / "apps"
WEDGE = signal.SIGRTMIN + 5
LIMIT = 5.0
# The watchdog ends the lobby within LIMIT and two of its looks, a second each; then the log's
# writer has two seconds.
ENDED_WITHIN = LIMIT + 15


def wedged(maitred_server, how: str, *args: str):
    server = maitred_server(
        "-w", "2", "--lobby-timeout", str(LIMIT), *args, "crashy:app", cwd=APPS, env={"MAITRED_TEST_WEDGE": how}
    )
    assert get(server.port, "/pid").status == 200
    server.send_signal(WEDGE)
    server.wait_for_log(f"MAITRED_TEST_WEDGE={how}: wedging the event loop, as asked", 10)
    return server


def test_a_lobby_whose_loop_spins_is_named_and_ended(maitred_server):
    server = wedged(maitred_server, "spin")
    started = time.monotonic()
    assert server.wait(ENDED_WITHIN) == 70
    took = time.monotonic() - started
    assert took >= LIMIT, took
    log = server.stderr()
    assert "[CRITICAL] the lobby's event loop has made no progress for" in log, log
    assert "is running, not waiting (state R)" in log, log
    # The stack names where the loop is.
    assert "wedge_on_signal" in log, log
    # The zygote and the workers follow it out, as when it is killed.
    assert wait_for_empty_group(server.pid, 15) == []


def test_a_lobby_whose_loop_blocks_is_named_and_ended(maitred_server):
    server = wedged(maitred_server, "block")
    assert server.wait(ENDED_WITHIN) == 70
    log = server.stderr()
    assert "is waiting (state S) in system call" in log, log
    assert "wedge_on_signal" in log and "sleep" in log, log
    assert wait_for_empty_group(server.pid, 15) == []


def test_a_lobby_stopped_for_longer_than_the_limit_goes_on_serving(maitred_server):
    """Time the process was stopped is nobody's: the watchdog was stopped too. After SIGCONT the
    lobby serves, and its watchdog has counted no stall near the limit."""
    stats = free_port()
    server = maitred_server(
        "-w", "1", "--lobby-timeout", str(LIMIT), "--stats", f"{HOST}:{stats}", "crashy:app", cwd=APPS
    )
    assert get(server.port, "/pid").status == 200
    server.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    # Three times the limit, stopped: measured by the test's own clock, not slept in steps.
    while time.monotonic() - stopped < 3 * LIMIT:
        time.sleep(0.5)
    server.send_signal(signal.SIGCONT)
    assert get(server.port, "/pid").status == 200
    # A stall counted would end the lobby at the watchdog's next look after the continue; three
    # looks later it still serves, and what the watchdog counted stays far below the limit.
    looks = status_of(stats)["server"]["loop_watchdog_looks"]
    assert eventually(lambda: status_of(stats)["server"]["loop_watchdog_looks"] >= looks + 3, 10)
    status = status_of(stats)
    assert status["server"]["lobby_timeout_seconds"] == LIMIT
    assert status["server"]["loop_stall_max_seconds"] < LIMIT / 2, status["server"]
    assert server.process.poll() is None
    assert server.stop() == 0


def test_no_watchdog_with_a_lobby_timeout_of_zero(maitred_server):
    stats = free_port()
    server = maitred_server("--lobby-timeout", "0", "--stats", f"{HOST}:{stats}", "crashy:app", cwd=APPS)
    status = status_of(stats)
    assert status["server"]["lobby_timeout_seconds"] is None
    assert server.stop() == 0


def test_a_lobby_timeout_too_short_to_judge_is_refused(run_maitred):
    finished = run_maitred("--lobby-timeout", "1", "crashy:app", cwd=APPS)
    assert finished.returncode == 2
    assert "--lobby-timeout" in finished.stderr and "at least 5" in finished.stderr, finished.stderr
