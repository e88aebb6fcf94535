"""Hibernation: a keep-alive connection idle for half a second gives up its task in the lobby
and waits as a bare descriptor (docs/DESIGN.md). Nothing about it may be visible to a client:
it is served when it speaks, closed when its --keep-alive runs out or a shutdown begins, and
its --max-connections place is freed when its client goes."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import time
from pathlib import Path

from client import read_reply, status_of
from conftest import HOST, eventually, free_port, wait_for_empty_group

APPS = Path(__file__).resolve().parent / "apps"
APP = "echo:app"
REQUEST = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"


def connect_and_ask(port: int) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=10)
    sock.sendall(REQUEST)
    assert read_reply(sock).status == 200
    return sock


def wait_for_hibernating(stats: int, count: int) -> None:
    """Waits until `count` connections hibernate (the lobby's 0.5 s idle wait, and its
    watcher's tick), as the stats listener on port `stats` counts them."""
    assert eventually(lambda: status_of(stats)["connections"]["hibernating"] == count, 10), status_of(stats)


def test_a_hibernating_connection_is_served_when_it_speaks_again(maitred_server):
    stats = free_port()
    server = maitred_server("--keep-alive", "30", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    with connect_and_ask(server.port) as sock:
        for _ in range(3):
            wait_for_hibernating(stats, 1)
            # Two pipelined requests in one write: both are answered, in order.
            sock.sendall(REQUEST + b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc")
            first, second = read_reply(sock), read_reply(sock)
            assert (first.status, second.status) == (200, 200)
            assert second.body.split()[1] == b"3"


def test_a_first_request_may_come_after_hibernation(maitred_server):
    stats = free_port()
    server = maitred_server("--header-timeout", "10", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        wait_for_hibernating(stats, 1)
        sock.sendall(REQUEST)
        assert read_reply(sock).status == 200


def test_keep_alive_runs_out_while_hibernating(maitred_server):
    server = maitred_server("--keep-alive", "1.5", APP, cwd=APPS)
    with connect_and_ask(server.port) as sock:
        answered = time.monotonic()
        assert sock.recv(1) == b""
        closed_after = time.monotonic() - answered
    # Checked on a 0.25 s tick.
    assert 1.4 < closed_after < 2.5, closed_after


def test_a_client_leaving_while_hibernating_frees_its_place(maitred_server):
    stats = free_port()
    server = maitred_server("--max-connections", "1", "--keep-alive", "30", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    first = connect_and_ask(server.port)
    wait_for_hibernating(stats, 1)
    first.close()
    with socket.create_connection((HOST, server.port), timeout=10) as second:
        second.sendall(REQUEST)
        assert read_reply(second).status == 200


def test_a_shutdown_closes_hibernating_connections_at_once(maitred_server):
    stats = free_port()
    server = maitred_server("--keep-alive", "30", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    idle = [connect_and_ask(server.port) for _ in range(20)]
    wait_for_hibernating(stats, 20)
    server.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert [sock.recv(1) for sock in idle] == [b""] * 20
    assert time.monotonic() - signalled < 1
    for sock in idle:
        sock.close()
    assert server.wait(timeout=15) == 0
    assert wait_for_empty_group(server.pid, 10) == []
    assert "20 open (20 of them idle long enough to hibernate)" in server.stderr()


def _copy_descriptors(pid: int, inodes: set[int]) -> list[int]:
    """Copies into this process every descriptor of process `pid` that is one of the sockets
    `inodes` (pidfd_getfd(2), as a debugger or a child that inherited them would hold them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    copies = []
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in inodes:
                copy = libc.syscall(_SYS_PIDFD_GETFD, pidfd, int(name), 0)
                assert copy >= 0, f"pidfd_getfd: {os.strerror(ctypes.get_errno())}"
                copies.append(copy)
    finally:
        os.close(pidfd)
    return copies


_SYS_PIDFD_GETFD = 438  # the same number on x86_64 and aarch64 (asm-generic)


def _server_side_inodes(client_ports: set[int]) -> set[int]:
    """The inodes of the server's ends of the TCP connections whose client ends have these
    local ports (/proc/net/tcp: the server's end has the client's port as its remote one)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        if remote_port in client_ports:
            inodes.add(int(fields[9]))
    return inodes


def test_an_idle_connection_closed_while_another_process_holds_its_socket_leaves_no_trace(maitred_server):
    """Issue 46: the lobby closed an expired sleeper by dropping its descriptor, trusting the close
    to take it out of the sleepers' epoll set. It does not when the socket is still open
    elsewhere (a child that inherited it, a debugger): the registration stayed, its key named no
    sleeper, and once 64 such keys were readable the watcher's loop never yielded again. The
    lobby then answered nothing, logged nothing and took no signal, its thread at 100% CPU. Here
    the test itself holds copies of 100 sleepers' sockets while --keep-alive closes them, then
    makes them all readable: the lobby must go on answering."""
    stats = free_port()
    server = maitred_server("--keep-alive", "3", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    idle = [connect_and_ask(server.port) for _ in range(100)]
    wait_for_hibernating(stats, 100)
    copies = _copy_descriptors(server.pid, _server_side_inodes({sock.getsockname()[1] for sock in idle}))
    try:
        assert len(copies) == 100
        # --keep-alive closes them in the lobby; the copies keep the sockets open, so their
        # clients see no end.
        assert eventually(lambda: status_of(stats)["connections"]["hibernating"] == 0, 10), status_of(stats)
        for sock in idle:
            sock.sendall(b"GET / HTTP/1.1\r\n")
        with socket.create_connection((HOST, server.port), timeout=10) as fresh:
            fresh.sendall(REQUEST)
            assert read_reply(fresh).status == 200
        assert status_of(stats)["connections"]["hibernating"] == 0
    finally:
        for copy in copies:
            os.close(copy)
        for sock in idle:
            sock.close()
