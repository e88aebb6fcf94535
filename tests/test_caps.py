"""Caps are visible (docs/LIMITS.md, "Connections cap").

At --max-connections the lobby stops accepting and the kernel's listen queue holds the rest:
one warning when that begins, naming the cap and the descriptor limit, and one line when it
ends. A cap the descriptor limit cannot honour is lowered at start, with a warning. And when
accept(2) runs out of descriptors anyway, the lobby pauses instead of spinning, and says so a
few times, with a count of the rest.
"""

from __future__ import annotations

import os
import re
import resource
import socket
import sys
import time
from pathlib import Path

from client import read_reply
from conftest import HOST, MAITRED, Server, _Launcher, eventually

APPS = Path(__file__).resolve().parent / "apps"
APP = "echo:app"  # tests/apps/echo.py answers "PID BODY-LENGTH"

REQUEST = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"

CAP_REACHED = re.compile(r"\[WARNING\] at --max-connections \((\d+) connections open\): .*\(ulimit -n (\d+)\)")
CAP_ENDED = re.compile(r"\[INFO\] accepting again: below --max-connections \((\d+)\) after ([\d.]+) s at it")


def fd_limit(pid: int) -> int:
    """The soft descriptor limit of process `pid`."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no 'Max open files' in /proc/PID/limits")


def hold(port: int, count: int) -> list[socket.socket]:
    """`count` keep-alive connections, each answered once and then left idle: the lobby holds them."""
    held = []
    for _ in range(count):
        sock = socket.create_connection((HOST, port), timeout=10)
        sock.sendall(REQUEST)
        assert read_reply(sock).status == 200
        held.append(sock)
    return held


def queue(port: int, count: int) -> list[socket.socket]:
    """`count` connections with a request sent, that the lobby has not accepted yet."""
    waiting = []
    for _ in range(count):
        sock = socket.create_connection((HOST, port), timeout=10)
        sock.sendall(REQUEST)
        waiting.append(sock)
    return waiting


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def test_one_warning_per_episode_at_the_cap_and_one_line_when_it_ends(maitred_server):
    server = maitred_server("-w", "1", "--max-connections", "3", APP, cwd=APPS)
    limit = fd_limit(server.pid)
    for episode in (1, 2):
        held = hold(server.port, 3)
        waiting = queue(server.port, 10)
        try:
            assert eventually(lambda n=episode: len(CAP_REACHED.findall(server.stderr())) == n, 5), server.stderr()
            time.sleep(0.5)
            # Each place that frees up goes to the next queued connection at once: the lobby
            # stays at its cap through all ten, so this is still the same episode.
            close_all(held)
            for sock in waiting:
                assert read_reply(sock).status == 200
                sock.close()
        finally:
            close_all(held + waiting)
        assert eventually(lambda n=episode: len(CAP_ENDED.findall(server.stderr())) == n, 10), server.stderr()
    log = server.stderr()
    reached = CAP_REACHED.findall(log)
    ended = CAP_ENDED.findall(log)
    assert reached == [("3", str(limit))] * 2, reached
    assert [cap for cap, _ in ended] == ["3", "3"]
    assert all(float(lasted) >= 0.5 for _, lasted in ended), ended
    assert "Too many open files" not in log


def test_queued_connections_are_served_in_turn_at_the_cap(maitred_server):
    server = maitred_server("-w", "1", "--max-connections", "3", APP, cwd=APPS)
    held = hold(server.port, 3)
    waiting = queue(server.port, 5)
    try:
        for sock in waiting:
            sock.settimeout(0.3)
            try:
                assert sock.recv(1) == b"", "a queued connection was answered at the cap"
            except TimeoutError:
                pass
        close_all(held)
        for sock in waiting:
            sock.settimeout(10)
            assert read_reply(sock).status == 200
            sock.close()
    finally:
        close_all(held + waiting)
    assert eventually(lambda: len(CAP_ENDED.findall(server.stderr())) == 1, 10), server.stderr()
    assert len(CAP_REACHED.findall(server.stderr())) == 1


def lowered_fd_limit(limit: int) -> list[str]:
    """A command that runs maitred with its descriptor limit (soft and hard) at `limit`."""
    setup = (
        f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit})); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", setup, str(MAITRED)]


def test_a_cap_above_the_descriptor_limit_is_lowered_at_start(tmp_path):
    launcher = _Launcher(lowered_fd_limit(128), tmp_path)
    try:
        server: Server = launcher("-w", "1", "--max-connections", "1000", APP, cwd=APPS)
        assert eventually(lambda: "serving echo:app" in server.stderr(), 10), server.stderr()
        log = server.stderr()
        lowered = re.search(
            r"\[WARNING\] --max-connections 1000 is more than the descriptor limit allows: of its 128 \(ulimit -n\), "
            r"(\d+) are kept .*; using --max-connections (\d+)\.",
            log,
        )
        assert lowered, log
        reserved, used = int(lowered.group(1)), int(lowered.group(2))
        assert reserved + used == 128
        assert f"at most {used} connections" in log
        # Every place is taken; the rest wait in the kernel's queue, not in a loop of failed accepts.
        held = hold(server.port, used)
        waiting = queue(server.port, 20)
        try:
            assert eventually(lambda: CAP_REACHED.search(server.stderr()) is not None, 5), server.stderr()
            reached = CAP_REACHED.search(server.stderr())
            assert reached.groups() == (str(used), "128"), reached.group(0)
            advice = "The descriptor limit (ulimit -n 128) allows no more: raise it"
            assert eventually(lambda: advice in server.stderr(), 5), server.stderr()
            close_all(held)
            for sock in waiting:
                assert read_reply(sock).status == 200
        finally:
            close_all(held + waiting)
        # A request body written to a temporary file still finds a descriptor.
        body = b"x" * (2 << 20)
        with socket.create_connection((HOST, server.port), timeout=10) as sock:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            reply = read_reply(sock)
        assert (reply.status, reply.body.split()[1]) == (200, str(len(body)).encode())
        assert "Too many open files" not in server.stderr()
    finally:
        launcher.kill_all()


def lowest_free_fd(pid: int) -> int:
    used = {int(name) for name in os.listdir(f"/proc/{pid}/fd")}
    return min(set(range(len(used) + 1)) - used)


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_accept_without_descriptors_pauses_instead_of_spinning(maitred_server):
    server = maitred_server("-w", "1", "--max-connections", "50", APP, cwd=APPS)
    # The port accepts connections as soon as it listens, before the worker is ready; the lobby
    # still opens descriptors until then (the worker's channel, its bell, its shared region). One request
    # answered: it has them all.
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        sock.sendall(REQUEST)
        assert read_reply(sock).status == 200
    soft, hard = resource.prlimit(server.pid, resource.RLIMIT_NOFILE)
    # From now on the lobby cannot open one more descriptor: accept(2) fails with EMFILE.
    resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (lowest_free_fd(server.pid), hard))
    waiting = queue(server.port, 5)
    try:
        cpu_before, started = cpu_seconds(server.pid), time.monotonic()
        time.sleep(3)
        cpu = cpu_seconds(server.pid) - cpu_before
        failing = time.monotonic() - started
        resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (soft, hard))
        for sock in waiting:
            assert read_reply(sock).status == 200
    finally:
        resource.prlimit(server.pid, resource.RLIMIT_NOFILE, (soft, hard))
        close_all(waiting)
    # Paused 10 ms, 20, 40, 80, then 100 ms at a time: about 30 tries in 3 s, not a spinning loop.
    assert cpu < 0.5 * failing, f"the lobby used {cpu:.2f} s of CPU in {failing:.1f} s of failed accepts"
    failed = r"accept on http://127\.0\.0\.1:\d+ failed: Too many open files \(os error 24\)"
    recovered = re.compile(r"\[INFO\] accepting on \S+ again after (\d+) failed accepts in ([\d.]+) s")
    summary = re.compile(r'\[ERROR\] … and ([\d,]+) more like "' + failed + r'[^"]*" in the last ([\d.]+) s')
    assert eventually(lambda: recovered.search(server.stderr()) is not None, 5), server.stderr()
    # The count of the failures not written comes when their 10 s window ends.
    assert eventually(lambda: summary.search(server.stderr()) is not None, 15), server.stderr()
    log = server.stderr()
    written = re.findall(r"\[ERROR\] " + failed, log)
    count = int(recovered.search(log).group(1))
    assert len(written) == 5, written
    assert 10 <= count <= 100, count
    assert re.search(
        # The connection just answered may not have been seen closed yet.
        failed + r"; [01] connections open, descriptor limit \d+ \(ulimit -n\); retrying in 10 ms \(1 in a",
        log,
    )
    assert len(written) + int(summary.search(log).group(1).replace(",", "")) == count
