"""Limits, refusals and listen addresses, through the real server.

Every refused request gets the status that names its fault, a body and an error-log line that
say why, and costs nothing else: the next request, on a new connection, is served by the same
worker. Then --queue-timeout, --max-connections, and each form of --bind and --backlog.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from client import get, read_reply, wait_for_queue
from conftest import HOST, Server, eventually, free_port, kill_group, wait_for_empty_group

APPS = Path(__file__).resolve().parent / "apps"
APP = "echo:app"  # tests/apps/echo.py answers "PID BODY-LENGTH"


# ---------------------------------------------------------------------------------------------
# Refused requests.

LIMITS = (
    "--limit-request-line",
    "200",
    "--limit-request-fields",
    "10",
    "--limit-request-field_size",
    "200",
    "--max-body",
    "1000",
    "--header-timeout",
    "1",
)


def head(*lines: str, request_line: str = "POST / HTTP/1.1") -> bytes:
    return "\r\n".join([request_line, *lines, "", ""]).encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


REFUSALS = {
    # What is sent, then the status and the reason the answer and the log must give.
    "request line over the limit": (
        head("Host: t", request_line=f"GET /{'a' * 300} HTTP/1.1"),
        414,
        "request line longer than 200 bytes",
    ),
    "too many header fields": (
        head("Host: t", *(f"X-Field-{n}: {n}" for n in range(10))),
        431,
        "more than 10 header fields",
    ),
    "a header field over the limit": (
        head("Host: t", f"X-Long: {'v' * 300}"),
        431,
        "header field longer than 200 bytes",
    ),
    # Answered from the head alone: not a byte of the body is sent.
    "Content-Length over --max-body": (
        head("Host: t", "Content-Length: 1000000"),
        413,
        "request body larger than 1000 bytes",
    ),
    # Answered as the total passes the limit: the last chunk is never sent.
    "chunked body over --max-body": (
        head("Host: t", "Transfer-Encoding: chunked") + chunk(b"x" * 600) + chunk(b"y" * 600),
        413,
        "request body larger than 1000 bytes",
    ),
    "bare LF": (b"GET / HTTP/1.1\nHost: t\n\n", 400, "bare LF"),
    "obsolete line folding": (
        head("Host: t", "X-Folded: first", " second"),
        400,
        "obsolete line folding",
    ),
    "Content-Length with Transfer-Encoding": (
        head("Host: t", "Content-Length: 5", "Transfer-Encoding: chunked") + b"0\r\n\r\n",
        400,
        "Content-Length and Transfer-Encoding both present",
    ),
    "bad chunk size": (
        head("Host: t", "Transfer-Encoding: chunked") + b"zz\r\nhello\r\n0\r\n\r\n",
        400,
        "invalid chunk size",
    ),
    "HTTP/1.1 without Host": (head(request_line="GET / HTTP/1.1"), 400, "missing Host header"),
    # A path takes its authority from Host, and an http URI's host is never empty (RFC 9110
    # section 4.2.1); an empty Host is for targets without an authority (RFC 9112 section 3.2).
    "empty Host": (head("Host: ", request_line="GET / HTTP/1.1"), 400, "empty host in the Host header"),
    # A long method is no long URI: 400, not 414, refused at the limit.
    "a 100 KB method": (
        head("Host: t", request_line=f"{'A' * 100_000} / HTTP/1.1"),
        400,
        "request method too long for the 200-byte request line limit",
    ),
    # RFC 9112 section 6.3: without chunked last the body's length is unknown, a 400 even for a
    # coding the server does not know; behind chunked, an unknown coding is a 501.
    "Transfer-Encoding: gzip": (
        head("Host: t", "Transfer-Encoding: gzip") + b"0\r\n\r\n",
        400,
        "chunked is not the final transfer coding",
    ),
    "Transfer-Encoding: gzip, chunked": (
        head("Host: t", "Transfer-Encoding: gzip, chunked") + b"0\r\n\r\n",
        501,
        "unsupported transfer coding 'gzip'",
    ),
    # A head that stops arriving, and a body that does.
    "head slower than --header-timeout": (
        b"GET / HTTP/1.1\r\nHost: t\r\n",
        408,
        "request head did not arrive within --header-timeout",
    ),
    "body stalled for --header-timeout": (
        head("Host: t", "Content-Length: 10") + b"12345",
        408,
        "request body stalled for longer than --header-timeout",
    ),
}


@pytest.mark.parametrize("sent, status, reason", REFUSALS.values(), ids=REFUSALS)
def test_refused_request_names_its_reason_and_costs_nothing_else(maitred_server, sent, status, reason):
    server = maitred_server(*LIMITS, APP, cwd=APPS)
    worker = get(server.port).pid

    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        client_port = sock.getsockname()[1]
        started = time.monotonic()
        sock.sendall(sent)
        refused = read_reply(sock)
        waited = time.monotonic() - started
        assert sock.recv(1) == b"", "the connection stayed open after a refusal"

    assert refused.status == status, refused
    assert reason in refused.body.decode(), refused.body
    assert refused.headers["Connection"] == "close"
    if status == 408:
        assert 0.9 < waited < 3, waited
    else:
        assert waited < 1, waited
    logged = f"{status} to {HOST}:{client_port}: "
    assert eventually(lambda: any(logged in line and reason in line for line in server.stderr().splitlines()), 5), (
        server.stderr()
    )

    after = get(server.port)
    assert (after.status, after.pid) == (200, worker)


def test_a_body_within_max_body_is_served(maitred_server):
    server = maitred_server(*LIMITS, APP, cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        sock.sendall(head("Host: t", "Content-Length: 1000") + b"x" * 1000)
        assert read_reply(sock).body.split()[1] == b"1000"
        chunked = head("Host: t", "Transfer-Encoding: chunked") + chunk(b"x" * 999) + b"0\r\n\r\n"
        sock.sendall(chunked)
        assert read_reply(sock).body.split()[1] == b"999"


def test_request_lines_of_8000_octets_are_served_by_default(maitred_server):
    # RFC 9112 section 3 recommends supporting request lines of at least 8000 octets: the
    # default --limit-request-line is 8190 (gunicorn's is 4094). Past it, a long target is a
    # 414 and a long method a 400.
    server = maitred_server(APP, cwd=APPS)
    assert get(server.port, "/" + "a" * 7899).status == 200
    for request_line, status, reason in [
        (f"GET /{'a' * 100_000} HTTP/1.1", 414, "request line longer than 8190 bytes"),
        (f"{'A' * 100_000} / HTTP/1.1", 400, "request method too long for the 8190-byte request line limit"),
    ]:
        with socket.create_connection((HOST, server.port), timeout=10) as sock:
            sock.sendall(head("Host: t", request_line=request_line))
            refused = read_reply(sock)
        assert (refused.status, reason in refused.body.decode()) == (status, True), refused


# ---------------------------------------------------------------------------------------------
# --queue-timeout and --max-connections.


def test_queue_timeout_answers_503_and_keeps_the_connection(maitred_server):
    stats = free_port()
    server = maitred_server("--queue-timeout", "0.5", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(get, server.port, "/?sleep=2")
        wait_for_queue(stats, busy=1, waiting=0)
        with socket.create_connection((HOST, server.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            refused = read_reply(sock)
            waited = time.monotonic() - started
            served = busy.result(timeout=20)
            # The worker is free again; the same connection carries the next request.
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            again = read_reply(sock)

    assert refused.status == 503
    assert b"--queue-timeout" in refused.body
    assert 0.4 < waited < 1.5, waited
    assert served.status == 200
    assert refused.headers["Connection"] != "close"
    assert (again.status, again.pid) == (200, served.pid)
    assert "Retry-After" in refused.headers, f"no Retry-After in {dict(refused.headers)}"


def test_max_connections_holds_the_rest_in_the_kernel_queue(maitred_server):
    server = maitred_server("-w", "2", "--max-connections", "5", APP, cwd=APPS)
    idle = []
    for _ in range(5):
        sock = socket.create_connection((HOST, server.port), timeout=10)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_reply(sock).status == 200
        idle.append(sock)  # an idle keep-alive connection: the lobby holds it
    try:
        # The sixth is accepted by the kernel, not by the lobby, until one of the five goes.
        with socket.create_connection((HOST, server.port), timeout=1) as waiting:
            waiting.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            with pytest.raises(TimeoutError):
                waiting.recv(1)
            idle.pop().close()
            waiting.settimeout(10)
            assert read_reply(waiting).status == 200
    finally:
        for sock in idle:
            sock.close()

    def one_request() -> int:
        with socket.create_connection((HOST, server.port), timeout=20) as sock:
            sock.sendall(b"GET /?sleep=0.2 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            return read_reply(sock).status

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one_request) for _ in range(8)]
        statuses = [future.result(timeout=30) for future in futures]
    assert statuses == [200] * 8


def test_a_filling_listen_queue_is_named_while_it_fills(maitred_server):
    """S1/S2 (docs/METRICS.md, diagnoses): --max-connections 1 makes the queue fill behind one
    held connection, all 4 of its places; the log says so within a second, with the backlog
    asked and granted, somaxconn, and that --max-connections is what stops the accepting."""
    server = maitred_server("--max-connections", "1", "--backlog", "4", APP, cwd=APPS)
    held = socket.create_connection((HOST, server.port), timeout=10)
    held.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    assert read_reply(held).status == 200
    queued = [socket.create_connection((HOST, server.port), timeout=10) for _ in range(4)]
    try:
        for sock in queued:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        filled = time.monotonic()
        assert eventually(lambda: "listen queue" in server.stderr(), timeout=5)
        assert time.monotonic() - filled < 1.5
        line = next(line for line in server.stderr().splitlines() if "listen queue" in line)
        assert "[WARNING] diagnosis S1/S2 (listen_queue)" in line
        assert f"the listen queue of http://{HOST}:{server.port} held 4 of its 4 connections" in line
        assert "raise --backlog (asked 4, granted 4; net.core.somaxconn" in line
        assert "--max-connections (1)" in line
        held.close()
        # Each queued connection is served in turn, once the one before it has closed.
        assert [read_reply(sock).status for sock in queued] == [200] * 4
        assert eventually(lambda: "diagnosis S1/S2 (listen_queue) is over" in server.stderr(), timeout=10)
    finally:
        for sock in queued:
            sock.close()


# ---------------------------------------------------------------------------------------------
# Listen addresses and the backlog.


def somaxconn() -> int:
    return int(Path("/proc/sys/net/core/somaxconn").read_text())


def listening_line(address: str, backlog: int) -> str:
    return f"listening at {address} (backlog {backlog})"


def start_up_log(server: Server) -> str:
    """The error log once start-up is over: the port accepts connections before the workers
    are up and the addresses logged."""
    assert eventually(lambda: "serving " in server.stderr(), 30), server.stderr()
    return server.stderr()


def test_unix_socket_bind(maitred_server, tmp_path):
    path = tmp_path / "maitred.sock"
    server = maitred_server("--bind", f"unix:{path}", APP, cwd=APPS)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc")
        reply = read_reply(sock)
    assert (reply.status, reply.body.split()[1]) == (200, b"3")
    log = start_up_log(server)
    assert listening_line(f"unix:{path}", somaxconn()) in log
    assert listening_line(f"http://{HOST}:{server.port}", somaxconn()) in log
    assert server.stop() == 0
    assert not path.exists(), "the socket file was left behind"


def ipv6_loopback_missing() -> str | None:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError as error:
        return f"this machine has no IPv6 loopback (binding [::1] failed: {error})"
    return None


def test_ipv6_bind(maitred_server):
    if reason := ipv6_loopback_missing():
        pytest.skip(reason)
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
        probe.bind(("::1", 0))
        port6 = probe.getsockname()[1]
    server = maitred_server("--bind", f"[::1]:{port6}", APP, cwd=APPS)
    with socket.create_connection(("::1", port6), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n")
        assert read_reply(sock).status == 200
    assert listening_line(f"http://[::1]:{port6}", somaxconn()) in start_up_log(server)


def test_two_binds_serve_alike(maitred_server):
    second = free_port()
    server = maitred_server("--bind", f"{HOST}:{second}", APP, cwd=APPS)
    assert get(server.port).status == 200
    assert get(second).status == 200
    log = start_up_log(server)
    assert listening_line(f"http://{HOST}:{server.port}", somaxconn()) in log
    assert listening_line(f"http://{HOST}:{second}", somaxconn()) in log


def test_inherited_listening_socket(maitred_command, tmp_path):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((HOST, 0))
    listener.listen(16)
    port, fd = listener.getsockname()[1], listener.fileno()
    stderr_path = tmp_path / "maitred.stderr"
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(
            [*maitred_command, "--bind", f"fd://{fd}", "--backlog", "64", APP],
            cwd=APPS,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            pass_fds=[fd],
            start_new_session=True,
        )
    listener.close()  # the server holds the only copy now
    try:
        # The socket listens before the server runs: wait for its log, not for a connection.
        started = eventually(lambda: "serving " in stderr_path.read_text(), 30)
        assert started, stderr_path.read_text()
        assert get(port).status == 200
        assert listening_line(f"http://{HOST}:{port} (fd {fd})", 64) in stderr_path.read_text()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert wait_for_empty_group(process.pid, 10) == []
    finally:
        kill_group(process.pid)
        process.wait(timeout=10)


def test_backlog_is_logged_as_granted(maitred_server):
    server = maitred_server("--backlog", "64", APP, cwd=APPS)
    log = start_up_log(server)
    assert listening_line(f"http://{HOST}:{server.port}", 64) in log
    assert "somaxconn" not in log


def test_backlog_above_somaxconn_is_capped_with_a_warning(maitred_server):
    cap = somaxconn()
    server = maitred_server("--backlog", str(cap + 1), APP, cwd=APPS)
    log = start_up_log(server)
    assert listening_line(f"http://{HOST}:{server.port}", cap) in log
    warning = [line for line in log.splitlines() if "[WARNING]" in line]
    assert len(warning) == 1, log
    assert re.search(rf"--backlog {cap + 1} .*net\.core\.somaxconn.* {cap}\b", warning[0]), warning


def test_keep_alive_zero_closes_after_each_answer_and_says_so(maitred_server):
    server = maitred_server("--keep-alive", "0", APP, cwd=APPS)
    with socket.create_connection((HOST, server.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        reply = read_reply(sock)
        assert reply.status == 200
        assert reply.headers["Connection"] == "close"
        assert sock.recv(1) == b""


IDLE_DRIVER = Path("/sys/devices/system/cpu/cpuidle/current_driver")
HALT_POLL_NS = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
IDLE_NOTE = "idle CPUs halt without polling first"


def idle_cpus_noted(maitred_server) -> list[str]:
    """The start-up log's lines that name idle CPUs halting without polling, of a new server."""
    server = maitred_server(APP, cwd=APPS)
    lines = [line for line in start_up_log(server).splitlines() if IDLE_NOTE in line]
    server.stop()
    return lines


def assert_idle_note(lines: list[str], halts_without_polling: bool) -> None:
    if halts_without_polling:
        assert len(lines) == 1 and "[INFO]" in lines[0], lines
        assert "haltpoll.guest_halt_poll_ns 0" in lines[0] and "docs/TUNING.md" in lines[0], lines
    else:
        assert lines == []


def idle_driver() -> str:
    return IDLE_DRIVER.read_text().strip() if IDLE_DRIVER.exists() else ""


def test_the_start_names_idle_cpus_that_halt_without_polling(maitred_server):
    """docs/TUNING.md, "Virtual machines": a KVM guest whose idle CPUs halt without polling
    (cpuidle-haltpoll with guest_halt_poll_ns 0) is named once at start; any other machine is
    not. Checked on every machine, against the machine's own driver and setting."""
    halts_without_polling = idle_driver() == "haltpoll" and HALT_POLL_NS.read_text().strip() == "0"
    assert_idle_note(idle_cpus_noted(maitred_server), halts_without_polling)


def test_both_haltpoll_settings_are_told_apart(maitred_server):
    """Where cpuidle-haltpoll is in use and its setting writable (root), both settings are
    tried, and the machine's own is put back: only there can a test see the note come and go."""
    if idle_driver() != "haltpoll":
        pytest.skip(f"the idle driver is {idle_driver() or 'none'!r}, not haltpoll: no guest_halt_poll_ns to set")
    if not os.access(HALT_POLL_NS, os.W_OK):
        pytest.skip(f"{HALT_POLL_NS} is not writable here (it takes root)")
    machine_setting = HALT_POLL_NS.read_text().strip()
    try:
        for setting in ("0", "200000"):
            HALT_POLL_NS.write_text(setting)
            assert_idle_note(idle_cpus_noted(maitred_server), setting == "0")
    finally:
        HALT_POLL_NS.write_text(machine_setting)
