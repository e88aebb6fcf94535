"""Logs never stop serving (docs/LIMITS.md, "Logs").

maitred's standard error (and standard output, with the access log) is a pipe the test holds
and does not read, as a stalled container log driver would: the lobby and the workers must go
on serving anyway, drop what cannot be written, and say how much they dropped once the pipe is
read again. Lines any client can cause at will are rate-limited, with a count of the rest.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import socket
import subprocess
import termios
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import HOST, MAITRED, _environment, accepts_connections, free_port, kill_group

APPS = Path(__file__).resolve().parent / "apps"

MALFORMED = 10_000
GOOD = 1_000
# A long target makes each debug line and access-log line about 3 KB, so that a few hundred
# requests overflow the pipe (64 KiB) and the lobby's queue (1 MiB) behind it.
TARGET = "/" + "a" * 3000
# Long enough for a stalled lobby to show, short enough to call prompt on a loaded machine.
PROMPT = 2.0


@contextmanager
def stalled_server(*args: str, cwd: Path) -> Iterator[tuple[int, int, int]]:
    """Runs maitred with standard output and standard error into one pipe that nobody reads;
    yields (port, read end of the pipe, lobby pid). The whole process group is killed after."""
    read_end, write_end = os.pipe()
    port = free_port()
    process = subprocess.Popen(
        [str(MAITRED), "--bind", f"{HOST}:{port}", *args],
        cwd=cwd,
        env=_environment(None),
        stdin=subprocess.DEVNULL,
        stdout=write_end,
        stderr=write_end,
        start_new_session=True,
    )
    os.close(write_end)
    try:
        deadline = time.monotonic() + 30
        while not accepts_connections(port):
            assert process.poll() is None, f"maitred exited with {process.returncode}"
            assert time.monotonic() < deadline, "maitred did not listen within 30 s"
            time.sleep(0.05)
        yield port, read_end, process.pid
    finally:
        kill_group(process.pid)
        process.wait(timeout=10)
        os.close(read_end)


def unread_bytes(fd: int) -> int:
    return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), "little")


def drain(fd: int, until: re.Pattern[str], timeout: float) -> str:
    """Reads the pipe until what was read matches `until` and the pipe is quiet for 0.5 s, or
    `timeout` passes; returns all of it."""
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        quiet = until.search(data.decode(errors="replace")) is not None
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            if quiet:
                break
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def refuse(port: int, count: int, failures: list[str]) -> None:
    """Sends `count` malformed requests (bare LF), one connection each; each must get a 400."""
    for _ in range(count):
        try:
            with socket.create_connection((HOST, port), timeout=10) as sock:
                sock.sendall(b"GET / HTTP/1.1\nHost: t\n\n")
                reply = sock.recv(64)
                if not reply.startswith(b"HTTP/1.1 400 "):
                    failures.append(repr(reply))
        except OSError as error:
            failures.append(repr(error))


def serve_good(port: int, count: int, latencies: list[float], failures: list[str]) -> None:
    """Sends `count` requests on one keep-alive connection, timing each answer."""
    request = f"GET {TARGET} HTTP/1.1\r\nHost: t\r\n\r\n".encode()
    with socket.create_connection((HOST, port), timeout=10) as sock:
        reader = sock.makefile("rb")
        for _ in range(count):
            started = time.monotonic()
            sock.sendall(request)
            status = reader.readline()
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reader.read(length)
            latencies.append(time.monotonic() - started)
            if not status.startswith(b"HTTP/1.1 200 "):
                failures.append(repr(status))


def run_threads(target, port: int, total: int, threads: int, *extra) -> None:
    workers = [threading.Thread(target=target, args=(port, total // threads, *extra)) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert not worker.is_alive(), "a client thread did not finish within 120 s"


def test_a_stalled_log_pipe_does_not_stop_the_lobby():
    with stalled_server("-w", "2", "--log-level", "debug", "--access-logfile", "-", "echo:app", cwd=APPS) as (
        port,
        pipe,
        lobby,
    ):
        started = time.monotonic()
        failures: list[str] = []
        run_threads(refuse, port, MALFORMED, 8, failures)
        refusing = time.monotonic() - started
        assert not failures, f"{len(failures)} malformed requests not answered 400, e.g. {failures[:3]}"

        # Each good request logs about 6 KB (a debug line and an access-log line): the pipe
        # fills at once and the queues behind it soon after.
        latencies: list[float] = []
        run_threads(serve_good, port, GOOD, 4, latencies, failures)
        assert not failures, f"good requests failed: {failures[:3]}"
        assert len(latencies) == GOOD
        assert max(latencies) < PROMPT, f"slowest answer {max(latencies):.2f} s"
        assert unread_bytes(pipe) >= 32_000, "the pipe was not full: nothing was stalled"

        # Now the pipe is read: the lobby writes what it kept, then what it dropped; the
        # refusals' summary comes when their 10 s window ends.
        summary = re.compile(r'… and ([\d,]+) more like "400 to [^"]*\(bare LF\)" in the last 10 s')
        log = drain(pipe, summary, timeout=30)

    lines = log.splitlines()
    lobby_lines = [line for line in lines if f"] [{lobby}] [" in line]
    dropped = [line for line in lobby_lines if "log lines dropped while the log was not being read" in line]
    assert any("[WARNING]" in line for line in dropped), "\n".join(lines[-20:])
    access_dropped = [line for line in lobby_lines if "access log lines dropped while the access log" in line]
    assert access_dropped, "\n".join(lines[-20:])

    # Every malformed request is accounted for: written, or counted in a summary. (The
    # refusals came before the pipe filled, so none of their lines were dropped.)
    written = [line for line in lobby_lines if re.search(r"\[INFO\] 400 to 127\.0\.0\.1:\d+: .*\(bare LF\)$", line)]
    summarized = sum(int(match.group(1).replace(",", "")) for match in summary.finditer(log))
    windows = int(refusing // 10) + 1
    assert len(written) <= 5 * windows, f"{len(written)} refusal lines in {refusing:.1f} s"
    assert len(written) + summarized == MALFORMED, (len(written), summarized)
    # And every line that made it out is whole.
    for line in lines:
        assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+0000\] \[\d+\] \[[A-Z]+\] |127\.0\.0\.1 - - \[", line) or (
            line.startswith(("Traceback", "  ", "…"))
        ), f"broken line: {line[:200]!r}"


FAILING_APP = """
def app(environ, start_response):
    raise RuntimeError("boom " + "x" * 1000)
"""


def test_a_stalled_log_pipe_does_not_stop_a_worker(app_dir):
    (app_dir / "failing.py").write_text(FAILING_APP)
    with stalled_server("-w", "1", "failing:app", cwd=app_dir) as (port, pipe, lobby):
        # Each request logs a traceback of over 1 KB from the worker: 300 of them overflow the
        # pipe many times over.
        latencies: list[float] = []
        for _ in range(300):
            started = time.monotonic()
            with socket.create_connection((HOST, port), timeout=10) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                assert sock.recv(64).startswith(b"HTTP/1.1 500 ")
            latencies.append(time.monotonic() - started)
        assert max(latencies) < PROMPT, f"slowest answer {max(latencies):.2f} s"
        assert unread_bytes(pipe) >= 32_000, "the pipe was not full: nothing was stalled"

        # Once the pipe is read, the worker's next line comes with the count of those it dropped.
        drain(pipe, re.compile("$^"), timeout=2)
        with socket.create_connection((HOST, port), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 500 ")
        log = drain(
            pipe, re.compile(r"log lines dropped while the log was not being read.*RuntimeError", re.DOTALL), 10
        )

    match = re.search(r"\[(\d+)\] \[WARNING\] ([\d,]+) log lines dropped while the log was not being read", log)
    assert match, log[-2000:]
    assert int(match.group(1)) != lobby, "the count should come from the worker"
    assert int(match.group(2).replace(",", "")) > 200, match.group(0)
