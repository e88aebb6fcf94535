"""The application's own output never stops it (docs/LIMITS.md, "The application's output never
stops it"): wsgi.errors, print() and logging to standard error go through the non-blocking,
bounded log path, marked as the application's, in order, held to a rate, and a crash's last
words are kept.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from client import get
from test_log_limits import drain, stalled_server

APPS = Path(__file__).resolve().parent / "apps"

# The bound: 400 requests that each write half a kilobyte to a log nobody reads.
WITHIN = 10.0

# The application's lines each worker may write (docs/LIMITS.md): this many at once, then this
# many a second.
BURST = 1_000
PER_SECOND = 1_000


def test_an_unread_log_stops_neither_wsgi_errors_nor_logging():
    with stalled_server("-w", "2", "chatty:app", cwd=APPS) as (port, pipe, _):
        started = time.monotonic()
        for path in ("/errors", "/logging"):
            statuses = [get(port, path).status for _ in range(200)]
            assert statuses == [200] * 200, path
        took = time.monotonic() - started
        assert took < WITHIN, f"400 requests took {took:.1f} s"
        drain(pipe, re.compile(r"\[app\]"), timeout=10)
        # The log is read again: each writer says what it dropped with its next line.
        for path in ("/errors", "/logging"):
            for _ in range(4):
                assert get(port, path).status == 200
        log = drain(pipe, re.compile(r"lines dropped while the log was not being read"), timeout=10)
    assert re.search(r"\[WARNING\] [\d,]+ log lines dropped while the log was not being read", log), log[-2000:]


def test_the_applications_lines_are_marked_whole_and_in_order(maitred_server):
    server = maitred_server("-w", "1", "chatty:app", cwd=APPS)
    pid = get(server.port, "/print?n=300").pid
    assert get(server.port, "/errors").status == 200
    assert get(server.port, "/logging").status == 200
    log = server.wait_for_log(f"[{pid}] [WARNING] [app] WARNING:chatty:logged from {pid}", timeout=10)
    printed = re.findall(rf"\[{pid}\] \[INFO\] \[app\] printed line (\d+) from {pid}\n", log)
    assert [int(n) for n in printed] == list(range(300))
    assert f"[{pid}] [INFO] [app] error line from {pid} {'x' * 500}\n" in log


def test_a_printed_line_reaches_the_log_while_its_worker_lives(maitred_server, monkeypatch):
    # Python block-buffers standard output that is a pipe, as a container's is: unflushed, the
    # line would wait in the worker until it exits. Not PYTHONUNBUFFERED: maitred's own doing.
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    server = maitred_server("-w", "1", "chatty:app", cwd=APPS)
    pid = get(server.port, "/say").pid
    server.wait_for_log(f"[{pid}] [INFO] [app] said by {pid}, unflushed", timeout=2)
    assert get(server.port, "/").pid == pid  # the same worker, still serving


def test_a_crashing_workers_last_words_are_kept(maitred_server):
    server = maitred_server("-w", "1", "chatty:app", cwd=APPS)
    pid = get(server.port, "/").pid
    assert get(server.port, "/crash").status == 502
    server.wait_for_log(f"[{pid}] [INFO] [app] last words of {pid}", timeout=10)


def test_a_runaway_loop_is_held_to_its_rate(maitred_server):
    """200,000 lines as fast as the worker can print them: the log keeps the first 1,000 at once
    and then 1,000 a second (docs/LIMITS.md), and says how many more there were."""
    server = maitred_server("-w", "1", "chatty:app", cwd=APPS)
    assert get(server.port, "/").status == 200  # the worker is up, and has printed nothing
    started = time.monotonic()
    pid = get(server.port, "/runaway").pid
    log = server.wait_for_log("lines of the application's output left out: over 1,000 a second", timeout=20)
    # No tolerance is needed: the rate is a token bucket (log.AppLines) holding at most its
    # burst, refilled at its rate on the clock this test reads too. Every line counted was
    # written after `started`, when the bucket held at most the burst, and before the log was
    # read; and since the worker had printed nothing, the whole burst was there to write.
    bound = BURST + PER_SECOND * (time.monotonic() - started)
    kept = len(re.findall(rf"\[{pid}\] \[INFO\] \[app\] runaway line", log))
    assert BURST <= kept <= bound, f"{kept} lines kept, at most {bound:.0f} allowed"
    assert get(server.port, "/").status == 200


def test_capture_output_no_leaves_the_descriptors_alone(maitred_server):
    server = maitred_server("-w", "1", "--capture-output", "no", "chatty:app", cwd=APPS)
    pid = get(server.port, "/print?n=1").pid
    # print() writes to the worker's own standard output, as the CLI's: the same file, unmarked.
    assert f"printed line 0 from {pid}\n" in server.stdout()
    assert "[app]" not in server.stderr()


def test_uncaptured_a_printed_line_reaches_standard_output_while_its_worker_lives(maitred_server, monkeypatch):
    """--capture-output no: the worker's standard output is the CLI's, here a file, which Python
    block-buffers as it does a pipe; maitred makes it line buffered all the same."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    server = maitred_server("-w", "1", "--capture-output", "no", "chatty:app", cwd=APPS)
    pid = get(server.port, "/say").pid
    deadline = time.monotonic() + 2
    while f"said by {pid}, unflushed\n" not in server.stdout():
        assert time.monotonic() < deadline, f"the line is not in standard output: {server.stdout()!r}"
        time.sleep(0.02)
    assert get(server.port, "/").pid == pid  # the same worker, still serving
