"""SIGUSR2, the binary upgrade (docs/SIGNALS.md): a new maitred starts with the running one's
listen sockets, says it is ready, and the old one finishes its requests, hands over its idle
keep-alive connections instead of closing them, and exits 0. No client notices.

Every test runs real maitred processes on 127.0.0.1 with tests/apps/echo.py (whose answers
name the worker's pid) and talks to them over real sockets; every wait is bounded.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from pathlib import Path

from client import read_reply, status_of
from conftest import HOST, eventually, free_port, workers_of

APPS = Path(__file__).resolve().parent / "apps"
REQUEST = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n"


def ask(sock: socket.socket) -> int:
    """One request on a keep-alive connection; the pid of the worker that answered."""
    sock.sendall(REQUEST)
    reply = read_reply(sock)
    assert reply.status == 200, reply
    assert reply.headers.get("Connection", "").lower() != "close", reply
    return reply.pid


def read_pid(path: Path) -> int:
    return int(path.read_text().strip())


def test_idle_keep_alive_connections_are_handed_to_the_new_lobby(maitred_server, tmp_path):
    """200 idle keep-alive connections, some asleep (idle past the lobby's 0.5 s) and some
    fresh: after the upgrade each is answered, on the same connection, by the new workers."""
    pid_file = tmp_path / "maitred.pid"
    stats = free_port()
    server = maitred_server("-w", "2", "--pid", str(pid_file), "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    old_workers = workers_of(server.pid, count=2)
    sleepers = [socket.create_connection((HOST, server.port), timeout=10) for _ in range(150)]
    for sock in sleepers:
        assert ask(sock) in old_workers
    hibernating = eventually(lambda: status_of(stats)["connections"]["hibernating"] == 150, 10)
    assert hibernating, status_of(stats)["connections"]
    fresh = [socket.create_connection((HOST, server.port), timeout=10) for _ in range(50)]
    for sock in fresh:
        assert ask(sock) in old_workers
    server.send_signal(signal.SIGUSR2)
    assert server.wait(timeout=30) == 0, server.stderr()
    new_lobby = read_pid(pid_file)
    assert new_lobby != server.pid
    new_workers = workers_of(new_lobby, count=2)
    assert new_workers and not new_workers & old_workers
    for sock in sleepers + fresh:
        assert ask(sock) in new_workers
        sock.close()
    log = server.wait_for_log("took over 200 idle connections", timeout=10)
    assert "handed 200 idle connections to the new maitred" in log
    # The new lobby stops like any other, and takes its pid file with it.
    os.kill(new_lobby, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while pid_file.exists():
        assert time.monotonic() < deadline, server.stderr()
        time.sleep(0.05)


def test_under_load_no_request_fails_across_an_upgrade(maitred_server):
    """Eight clients in a tight keep-alive loop and four opening a connection per request,
    across an upgrade: every request is answered 200, and both generations answered some."""
    server = maitred_server("-w", "2", "echo:app", cwd=APPS)
    old_workers = workers_of(server.pid, count=2)
    stop = threading.Event()
    failures: list[str] = []
    # The pids that answered each client: the eight keep-alive ones first.
    answered_by: list[set[int]] = [set() for _ in range(12)]

    def keep_alive_client(pids: set[int]) -> None:
        try:
            with socket.create_connection((HOST, server.port), timeout=10) as sock:
                while not stop.is_set():
                    pids.add(ask(sock))
        except Exception as error:  # noqa: BLE001 - any failure is the test's finding
            failures.append(f"keep-alive client: {error!r}")

    def connection_per_request_client(pids: set[int]) -> None:
        try:
            while not stop.is_set():
                with socket.create_connection((HOST, server.port), timeout=10) as sock:
                    pids.add(ask(sock))
        except Exception as error:  # noqa: BLE001 - any failure is the test's finding
            failures.append(f"connection-per-request client: {error!r}")

    threads = [threading.Thread(target=keep_alive_client, args=(pids,)) for pids in answered_by[:8]]
    threads += [threading.Thread(target=connection_per_request_client, args=(pids,)) for pids in answered_by[8:]]
    for thread in threads:
        thread.start()
    try:
        # The upgrade comes once every client has been answered by the old workers, and the
        # load goes on until every one has been answered by a new worker too.
        assert eventually(lambda: all(answered_by) or bool(failures), 10), answered_by
        server.send_signal(signal.SIGUSR2)
        assert server.wait(timeout=30) == 0, server.stderr()
        assert eventually(lambda: all(pids - old_workers for pids in answered_by) or bool(failures), 10), answered_by
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not failures, failures
    everyone = set().union(*answered_by)
    assert everyone & old_workers and everyone - old_workers, everyone
    # Each keep-alive client went on, on its one connection, with the new workers.
    assert all(pids - old_workers for pids in answered_by[:8]), answered_by


def test_a_new_maitred_that_cannot_start_leaves_the_old_one_serving(maitred_server, tmp_path):
    """The config file is broken between start and SIGUSR2: the new maitred exits, the log
    says why in one line, the old one serves on and keeps its pid file; once the file is
    fixed, the next SIGUSR2 upgrades."""
    config_file = tmp_path / "maitred.conf.py"
    config_file.write_text("workers = 1\n")
    pid_file = tmp_path / "maitred.pid"
    server = maitred_server("-c", str(config_file), "--pid", str(pid_file), "echo:app", cwd=APPS)
    keep_alive = socket.create_connection((HOST, server.port), timeout=10)
    first = ask(keep_alive)
    config_file.write_text("workers = 'many'\n")
    server.send_signal(signal.SIGUSR2)
    log = server.wait_for_log("this maitred goes on serving", timeout=30)
    assert "SIGUSR2: the new maitred exited with code 2 before it was ready" in log, log
    assert "workers" in log.split("SIGUSR2: binary upgrade")[1], log
    assert server.process.poll() is None
    assert read_pid(pid_file) == server.pid
    assert ask(keep_alive) == first
    config_file.write_text("workers = 1\n")
    server.send_signal(signal.SIGUSR2)
    assert server.wait(timeout=30) == 0, server.stderr()
    assert read_pid(pid_file) != server.pid
    assert ask(keep_alive) != first
    keep_alive.close()


def test_a_listener_dropped_from_the_config_is_closed_and_one_added_is_bound(maitred_server, tmp_path):
    """The new maitred serves what its --bind names: an inherited socket no longer named is
    closed (the log says so), a new address is bound, one named again is used as it is."""
    second_port = free_port()
    config_file = tmp_path / "maitred.conf.py"
    config_file.write_text(f"bind = ['{HOST}:{second_port}']\n")
    server = maitred_server("-c", str(config_file), "echo:app", cwd=APPS, bind=False, port=second_port)
    third_port = free_port()
    config_file.write_text(f"bind = ['{HOST}:{third_port}']\n")
    server.send_signal(signal.SIGUSR2)
    assert server.wait(timeout=30) == 0, server.stderr()
    log = server.wait_for_log(f"no longer listening at {HOST}:{second_port}", timeout=10)
    assert f"listening at http://{HOST}:{third_port}" in log
    with socket.create_connection((HOST, third_port), timeout=10) as sock:
        ask(sock)
    try:
        socket.create_connection((HOST, second_port), timeout=2).close()
        raise AssertionError(f"port {second_port} still accepts connections")
    except ConnectionRefusedError:
        pass


def test_sigusr2_sent_to_the_whole_group_upgrades_once(maitred_server, tmp_path):
    """Only the lobby acts on SIGUSR2: sent to the process group, it upgrades once, and no
    process of the old maitred is killed by it."""
    pid_file = tmp_path / "maitred.pid"
    server = maitred_server("-w", "2", "--pid", str(pid_file), "echo:app", cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        ask(sock)
    os.killpg(server.pid, signal.SIGUSR2)
    assert server.wait(timeout=30) == 0, server.stderr()
    log = server.stderr()
    assert log.count("SIGUSR2: binary upgrade: started") == 1, log
    assert "exited (signal" not in log and "killed by signal" not in log, log
    new_lobby = read_pid(pid_file)
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        assert ask(sock) in workers_of(new_lobby, count=2)


def test_a_unix_socket_is_kept_across_an_upgrade_and_removed_by_the_last_lobby(maitred_server, tmp_path):
    path = tmp_path / "app.sock"
    pid_file = tmp_path / "maitred.pid"
    server = maitred_server("--bind", f"unix:{path}", "--pid", str(pid_file), "echo:app", cwd=APPS)
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.settimeout(10)
    unix.connect(str(path))
    first = ask(unix)
    server.send_signal(signal.SIGUSR2)
    assert server.wait(timeout=30) == 0, server.stderr()
    assert path.exists()
    assert ask(unix) != first
    unix.close()
    os.kill(read_pid(pid_file), signal.SIGTERM)
    deadline = time.monotonic() + 30
    while path.exists():
        assert time.monotonic() < deadline, server.stderr()
        time.sleep(0.05)


def test_the_stats_listener_goes_to_the_new_lobby_too(maitred_server):
    """The new lobby could not bind --stats while the old one holds it: it inherits it."""
    stats = free_port()
    server = maitred_server("--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    server.send_signal(signal.SIGUSR2)
    assert server.wait(timeout=30) == 0, server.stderr()
    assert server.stderr().count(f"stats at http://{HOST}:{stats}/metrics") == 2
    with socket.create_connection((HOST, stats), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: stats\r\n\r\n")
        assert read_reply(sock).status == 200


def test_an_idle_proxy_protocol_connection_stays_with_the_old_lobby_and_is_answered(maitred_server, tmp_path):
    """docs/SIGNALS.md: a connection under --proxy-protocol cannot go to the new maitred (the
    client its header named does not travel with the descriptor). Idle at SIGUSR2, it is not
    closed under its client: its next request is answered by the old lobby, with Connection:
    close, and the old lobby exits once it has closed."""
    pid_file = tmp_path / "maitred.pid"
    server = maitred_server("-w", "1", "--pid", str(pid_file), "--proxy-protocol", "v1", "echo:app", cwd=APPS)
    old_workers = workers_of(server.pid, count=1)
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        sock.sendall(b"PROXY TCP4 203.0.113.7 127.0.0.1 5555 80\r\n")
        assert ask(sock) in old_workers
        server.send_signal(signal.SIGUSR2)
        server.wait_for_log("shutting down: no new connections", 10)
        # A close that must not come: the old rule closed it within 0.5 s of the signal.
        readable, _, _ = select.select([sock], [], [], 1.0)
        assert not readable, "the idle PROXY protocol connection was closed at the upgrade"
        sock.sendall(REQUEST)
        reply = read_reply(sock)
        assert reply.status == 200, reply
        assert reply.pid in old_workers
        assert reply.headers["Connection"].lower() == "close", reply
    assert server.wait(timeout=10) == 0, server.stderr()
    os.kill(read_pid(pid_file), signal.SIGTERM)
    deadline = time.monotonic() + 30
    while pid_file.exists():
        assert time.monotonic() < deadline, server.stderr()
        time.sleep(0.05)
