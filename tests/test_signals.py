"""Every signal docs/SIGNALS.md lists, sent to a real server: what the lobby does, that the
zygote and the workers neither die nor stop, and that no client notices -- a graceful stop
answers every request that was sent, a reload (SIGHUP) fails none, a log rotation (SIGUSR1)
loses no line.

The graceful stop is also tested in test_lifecycle.py (queued and running requests, idle
connections, --graceful-timeout, SIGQUIT).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from client import Reply, get, read_reply, requests_arrived, status_of, wait_for_queue
from conftest import (
    HOST,
    Server,
    eventually,
    free_port,
    processes_in_group,
    read_if_there,
    wait_for_empty_group,
    wait_for_log,
    wait_until,
)
from maitred import config
from test_lifecycle import APPS, parent_of, wait_for_workers, worker_pids

if TYPE_CHECKING:
    from typing import Self

CRASHY = "crashy:app"  # tests/apps/crashy.py: every answer is the serving worker's pid

# An application whose answer says which version of its file it was imported from and which
# worker serves it; /log?n=N also writes a line to wsgi.errors. Written into the test's own
# directory, and rewritten between reloads.
VERSIONED = """\
import os
import time

VERSION = {version!r}
time.sleep({import_delay})


def app(environ, start_response):
    if environ["PATH_INFO"] == "/log":
        environ["wsgi.errors"].write(f"app line {{environ['QUERY_STRING']}} from {{os.getpid()}}\\n")
    body = f"{{VERSION}} {{os.getpid()}}\\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
"""

# The test rewrites the application's file within a second, sometimes at the same size: with
# bytecode caches on, a worker could import a stale .pyc.
NO_PYC = {"PYTHONDONTWRITEBYTECODE": "1"}


def write_app(directory: Path, version: str, import_delay: float = 0.0, source: str | None = None) -> None:
    """Replaces versioned.py at once (a new file renamed over the old), as a deploy would."""
    text = source if source is not None else VERSIONED.format(version=version, import_delay=import_delay)
    scratch = directory / "versioned.py.new"
    scratch.write_text(text)
    scratch.rename(directory / "versioned.py")


def state_of(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def zygote_of(server: Server) -> int:
    (zygote,) = {pid for pid in processes_in_group(server.pid) if parent_of(pid) == server.pid}
    return zygote


def version_of(reply: Reply) -> str:
    return reply.body.split()[0].decode()


# ---------------------------------------------------------------------------------------------
# Clients that keep the server busy.


@dataclass
class Answer:
    at: float
    body: bytes


@dataclass
class LoadClient:
    """A keep-alive client that sends `path` again as soon as it has its answer, until told to
    stop. Any request that does not get a 200 is a failure."""

    port: int
    path: str = "/"
    answers: list[Answer] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def run(self, stop: threading.Event, deadline: float) -> None:
        request = f"GET {self.path} HTTP/1.1\r\nHost: signals\r\n\r\n".encode()
        sock: socket.socket | None = None
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                if sock is None:
                    sock = socket.create_connection((HOST, self.port), timeout=10)
                try:
                    sock.sendall(request)
                    reply = read_reply(sock)
                except (OSError, ValueError) as error:
                    self.failures.append(f"{type(error).__name__}: {error}")
                    sock.close()
                    sock = None
                    continue
                if reply.status != 200:
                    self.failures.append(f"status {reply.status}: {reply.body[:200]!r}")
                self.answers.append(Answer(time.monotonic(), reply.body))
                if reply.headers.get("Connection") == "close":
                    sock.close()
                    sock = None
        finally:
            if sock is not None:
                sock.close()


class Load:
    """A few LoadClients on threads of their own, bounded by `limit` seconds."""

    def __init__(self, port: int, clients: int, path: str = "/", limit: float = 60.0) -> None:
        self.clients = [LoadClient(port, path) for _ in range(clients)]
        self.stop = threading.Event()
        deadline = time.monotonic() + limit
        self.threads = [threading.Thread(target=c.run, args=(self.stop, deadline), daemon=True) for c in self.clients]

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in self.threads), "a load client did not stop"

    def answers(self) -> list[Answer]:
        return sorted((a for c in self.clients for a in c.answers), key=lambda a: a.at)

    def failures(self) -> list[str]:
        return [f for c in self.clients for f in c.failures]

    def count(self) -> int:
        return sum(len(c.answers) for c in self.clients)


# ---------------------------------------------------------------------------------------------
# SIGTERM and SIGINT: a graceful stop that no client notices.


@dataclass
class StopRun:
    answered: int = 0
    closed: int = 0
    """Clients whose last answer said Connection: close."""
    lost: int = 0
    """Requests fully sent that got no answer: the connection closed or reset under them."""
    unsent: int = 0
    """Requests the client could not finish sending (the connection was already closed)."""
    connected: int = 0
    """Clients that have had their first answer."""


def keep_asking_until_closed(port: int, run: StopRun, lock: threading.Lock) -> None:
    """One keep-alive client in a tight loop, until an answer says Connection: close."""
    with socket.create_connection((HOST, port), timeout=20) as sock:
        first = True
        while True:
            try:
                sock.sendall(b"GET /pid HTTP/1.1\r\nHost: signals\r\n\r\n")
            except OSError:
                with lock:
                    run.unsent += 1
                return
            try:
                reply = read_reply(sock)
            except Exception:  # noqa: BLE001 - closed, reset or cut: the request was lost
                with lock:
                    run.lost += 1
                return
            with lock:
                run.connected += first
                run.answered += 1
            first = False
            if reply.headers.get("Connection") == "close":
                with lock:
                    run.closed += 1
                return


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_graceful_stop_answers_every_request_sent_on_a_keep_alive_connection(maitred_server, signum):
    """50 keep-alive clients in a tight loop on a fast application; the signal comes after 1 s,
    ten times (SIGTERM; SIGINT once). A request sent on a connection the lobby holds idle when
    the signal comes is answered, with Connection: close, not closed unread."""
    runs = 10 if signum == signal.SIGTERM else 1
    for _ in range(runs):
        server = maitred_server("-w", "4", CRASHY, cwd=APPS)
        run, lock = StopRun(), threading.Lock()
        threads = [threading.Thread(target=keep_asking_until_closed, args=(server.port, run, lock)) for _ in range(50)]
        for thread in threads:
            thread.start()
        # The signal comes once every client is in its loop (connected: the signal closes the
        # listener) and they are well into it.
        wait_until(lambda run=run: run.connected == 50 and run.answered > 500, 20, "50 clients, 500 answers")
        server.send_signal(signum)
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)
        assert server.wait(timeout=30) == 0
        assert wait_for_empty_group(server.pid, 10) == []
        assert run.answered > 500, run
        assert (run.lost, run.unsent, run.closed) == (0, 0, 50), run


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2], ids=["SIGTERM", "SIGUSR2"])
def test_a_large_upload_on_a_connection_the_drain_lets_finish_is_answered(maitred_server, signum):
    """Issue 31: a request body over the 256 KiB kept in memory goes to a temporary file, which
    takes a place under --max-connections; the drain of SIGTERM, and of the old lobby at
    SIGUSR2, must leave those places to the connections it lets finish. The request's head is
    still arriving when the drain begins, so its body is spilled during the drain."""
    server = maitred_server("-w", "1", "echo:app", cwd=APPS)
    # Serving: a signal before the workers are ready stops at once, without a drain.
    server.wait_for_log("serving echo:app", 30)
    body = os.urandom(1 << 20)
    with socket.create_connection((HOST, server.port), timeout=30) as sock:
        sock.sendall(b"POST /upload HTTP/1.1\r\nHost: test\r\n")
        server.send_signal(signum)
        server.wait_for_log("shutting down: no new connections", 30)
        sock.sendall(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        reply = read_reply(sock)
    assert reply.status == 200, reply
    assert reply.body.split()[1] == str(len(body)).encode()
    # At SIGUSR2 the old lobby hands the connection over to the new maitred after the answer.
    assert reply.headers["Connection"] == ("close" if signum == signal.SIGTERM else None)


def test_workers_lost_during_the_drain_are_replaced_while_requests_wait(maitred_server):
    """One worker, retired after two requests (--max-requests), and six requests queued when
    SIGTERM comes: replacements serve them all, well before --graceful-timeout."""
    stats = free_port()
    server = maitred_server(
        "-w", "1", "--max-requests", "2", "--graceful-timeout", "20", "--stats", f"{HOST}:{stats}", CRASHY, cwd=APPS
    )
    replies: list[Reply | BaseException] = []

    def ask() -> None:
        try:
            replies.append(get(server.port, "/sleep?seconds=0.2"))
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            replies.append(error)

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for thread in threads:
        thread.start()
    wait_until(lambda: requests_arrived(stats) == 6, 10, "six requests at the lobby")
    server.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    for thread in threads:
        thread.join(timeout=30)
    assert server.wait(timeout=30) == 0
    stopped_after = time.monotonic() - signalled
    assert [getattr(reply, "status", reply) for reply in replies] == [200] * 6
    assert len({reply.pid for reply in replies if isinstance(reply, Reply)}) == 3
    assert stopped_after < 10, stopped_after
    assert server.stderr().count("2 requests served, --max-requests 2") >= 2


def test_a_worker_that_crashes_during_the_drain_is_replaced(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "2", "--graceful-timeout", "20", "--stats", f"{HOST}:{stats}", CRASHY, cwd=APPS)
    wait_for_workers(server, 2)
    results: dict[str, Reply | BaseException] = {}

    def ask(name: str, path: str) -> None:
        try:
            results[name] = get(server.port, path)
        except BaseException as error:  # noqa: BLE001 - reported by the assertions below
            results[name] = error

    threads = [threading.Thread(target=ask, args=("dies", "/exit?after=0.5"))]
    threads += [threading.Thread(target=ask, args=(f"q{n}", "/sleep?seconds=0.5")) for n in range(5)]
    threads[0].start()
    wait_for_queue(stats, busy=1, waiting=0)  # the dying request holds a worker, not a place in the queue
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: requests_arrived(stats) == 6, 10, "six requests at the lobby")
    server.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(timeout=30)
    assert server.wait(timeout=30) == 0
    assert getattr(results["dies"], "status", None) == 502
    assert [getattr(results[f"q{n}"], "status", results[f"q{n}"]) for n in range(5)] == [200] * 5
    assert re.search(r"worker \d+ lost: .*; starting a replacement", server.stderr())


# ---------------------------------------------------------------------------------------------
# Signals that must not end the server, and signals during the start.


def test_hup_sent_to_the_whole_group_reloads_once_and_kills_no_process(maitred_server, app_dir):
    """A terminal that hangs up signals its foreground process group: the lobby reloads, the
    zygote and the workers ignore it."""
    write_app(app_dir, "v1")
    server = maitred_server("-w", "2", "versioned:app", cwd=app_dir, env=NO_PYC)
    before = wait_for_workers(server, 2)
    zygote = zygote_of(server)
    write_app(app_dir, "v2")
    os.killpg(server.pid, signal.SIGHUP)
    server.wait_for_log("SIGHUP: reloaded", 10)
    wait_until(lambda: len(worker_pids(server) - before) == 2 and len(worker_pids(server)) == 2, 10, "new workers")
    assert zygote_of(server) == zygote
    assert "exited (signal" not in server.stderr()
    assert server.stderr().count("SIGHUP: reloaded") == 1
    assert version_of(get(server.port)) == "v2"
    assert server.stop() == 0


def test_winch_sent_to_the_whole_group_changes_nothing(maitred_server, tmp_path):
    pid_file = tmp_path / "maitred.pid"
    server = maitred_server("-w", "2", "-p", str(pid_file), CRASHY, cwd=APPS)
    before = wait_for_workers(server, 2) | {zygote_of(server)}
    os.killpg(server.pid, signal.SIGWINCH)
    # Each process has run since the signal reached it (a signal is acted on before the process
    # runs again): the lobby, when it answers the SIGTTIN sent after it; the zygote, when it forks
    # the third worker; each worker, when it answers a request.
    server.send_signal(signal.SIGTTIN)
    server.wait_for_log("SIGTTIN: 3 workers (one more)", 10)
    wait_for_workers(server, 3)
    workers = before - {zygote_of(server)}
    answered: set[int] = set()

    def both_answered() -> bool:
        answered.add(get(server.port, "/pid").pid)
        return workers <= answered

    wait_until(both_answered, 10, f"workers {sorted(workers)} answering")
    assert before <= worker_pids(server) | {zygote_of(server)}
    assert pid_file.exists()
    assert server.stop() == 0
    assert not pid_file.exists()


def test_job_control_signals_to_the_whole_group_stop_no_process(maitred_server):
    """A shell's job control signals the whole process group: SIGTTIN and SIGTTOU must not
    stop any process of maitred (their default action), the lobby counts them."""
    server = maitred_server("-w", "2", CRASHY, cwd=APPS)
    workers = wait_for_workers(server, 2)
    zygote = zygote_of(server)
    os.killpg(server.pid, signal.SIGTTIN)
    server.wait_for_log("SIGTTIN: 3 workers (one more)", 10)
    for pid in [server.pid, zygote, *workers]:
        assert state_of(pid) != "T", f"process {pid} stopped"
    wait_for_workers(server, 3)
    os.killpg(server.pid, signal.SIGTTOU)
    server.wait_for_log("SIGTTOU: 2 workers (one fewer)", 10)
    wait_for_workers(server, 2)
    assert all(state_of(pid) != "T" for pid in processes_in_group(server.pid))
    assert get(server.port, "/pid").status == 200
    assert server.stop() == 0


# Runs maitred in the background of a terminal of its own, as `maitred … &` in a job-control
# shell with `stty tostop`: a background process that writes to the terminal is sent SIGTTOU.
# Prints the lobby's state and its answer to one request, then kills maitred. The job's process
# group is made by os.setpgrp before maitred runs (Popen's process_group=0 is Python 3.11's):
# safe here, as the job starts no thread.
BACKGROUND_JOB = """\
import fcntl, os, signal, socket, subprocess, sys, termios, time
maitred, port, apps = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.setsid()
master, terminal = os.openpty()
fcntl.ioctl(terminal, termios.TIOCSCTTY, 0)
attributes = termios.tcgetattr(terminal)
attributes[3] |= termios.TOSTOP
termios.tcsetattr(terminal, termios.TCSANOW, attributes)
server = subprocess.Popen(
    [maitred, "-b", f"127.0.0.1:{port}", "-w", "2", "crashy:app"],
    cwd=apps, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, preexec_fn=os.setpgrp,
)
try:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET /pid HTTP/1.0\\r\\n\\r\\n")
                answer = sock.recv(64)
            break
        except OSError:
            time.sleep(0.1)
    else:
        answer = b"no answer"
    os.kill(server.pid, signal.SIGTTIN)
    deadline = time.monotonic() + 10
    states = []
    while len(states) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
        states = []
        for pid in os.listdir("/proc"):
            try:
                stat = open(f"/proc/{pid}/stat").read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == server.pid and fields[0] != "Z":
                states.append(fields[0])
    # The log reaches the terminal a moment after the fact: read it until the SIGTTIN line is
    # there, then 0.2 s more, a window in which no SIGTTOU line may follow.
    os.set_blocking(master, False)
    terminal_text = b""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            terminal_text += os.read(master, 1 << 16)
        except OSError:
            pass  # nothing new yet
        if b"SIGTTIN: 3 workers" in terminal_text and deadline - time.monotonic() > 0.2:
            deadline = time.monotonic() + 0.2
        time.sleep(0.02)
    print(answer.split(b"\\r\\n")[0].decode(), "".join(sorted(states)))
    print(terminal_text.decode(errors="replace"))
finally:
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()
"""


def test_in_the_background_of_a_terminal_with_tostop_no_process_stops(maitred_command, tmp_path):
    """The lobby handles SIGTTOU (one worker fewer), yet writing its log to the terminal from
    the background must neither stop it (the default action) nor count as a SIGTTOU."""
    port = free_port()
    job = subprocess.run(
        [sys.executable, "-c", BACKGROUND_JOB, maitred_command[0], str(port), str(APPS)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    first_line, _, terminal = job.stdout.decode().partition("\n")
    answer, _, states = first_line.rpartition(" ")
    assert answer == "HTTP/1.1 200 OK", job.stdout + job.stderr
    assert "T" not in states and len(states) == 5, states  # lobby, zygote, three workers
    assert "serving crashy:app with 2 workers" in terminal
    assert "SIGTTIN: 3 workers (one more)" in terminal
    assert "SIGTTOU" not in terminal


def test_sigterm_during_the_start_stops_at_once(maitred_server, app_dir):
    write_app(app_dir, "v1", import_delay=3)
    server = maitred_server("-w", "2", "versioned:app", cwd=app_dir, env=NO_PYC)
    wait_for_workers(server, 2)  # forked, and 3 s from ready: the start is under way
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=10) == 0
    assert wait_for_empty_group(server.pid, 10) == []
    assert "SIGTERM: stopping before the workers were ready" in server.stderr()


def test_sighup_during_the_start_waits_for_it_and_reloads(maitred_server, app_dir):
    write_app(app_dir, "v1", import_delay=1)
    server = maitred_server("-w", "1", "versioned:app", cwd=app_dir, env=NO_PYC)
    wait_for_workers(server, 1)  # forked, and importing v1 for 1 s: the start is under way
    write_app(app_dir, "v2")
    server.send_signal(signal.SIGHUP)
    server.wait_for_log("SIGHUP: reloaded", 10)
    assert version_of(get(server.port)) == "v2"
    assert server.stop() == 0


# ---------------------------------------------------------------------------------------------
# SIGTTIN and SIGTTOU: one worker more, one fewer.


def test_ttin_and_ttou_add_and_retire_one_worker_never_below_one(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", CRASHY, cwd=APPS)
    two = wait_for_workers(server, 2)
    server.send_signal(signal.SIGTTIN)
    three = wait_for_workers(server, 3)
    assert two < three
    server.wait_for_log("SIGTTIN: 3 workers (one more)", 10)
    # A worker still loading its application is retired first: the new one must have loaded
    # for the oldest to go (on a busy machine it once had not, and went first).
    assert eventually(lambda: status_of(stats)["workers"]["starting"] == 0, 20), status_of(stats)["workers"]
    with Load(server.port, clients=3, path="/sleep?seconds=0.01") as load:
        for expected in (2, 1):
            # One at a time: the kernel delivers signals of one kind sent together as one.
            server.send_signal(signal.SIGTTOU)
            server.wait_for_log(f"SIGTTOU: {expected} worker{'s' if expected > 1 else ''} (one fewer)", 10)
            wait_for_workers(server, expected)
        server.send_signal(signal.SIGTTOU)
        server.wait_for_log("SIGTTOU: already at one worker, the fewest; ignored", 10)
        # No worker retires: the SIGTTIN sent after it finds one worker and makes two, and the
        # one that was there serves on.
        server.send_signal(signal.SIGTTIN)
        server.wait_for_log("SIGTTIN: 2 workers (one more)", 10)
        now = wait_for_workers(server, 2)
        wait_until(lambda: load.count() > 20, 10, "20 requests served through the changes")
    assert load.failures() == []
    # The oldest go first; retiring ones finish what they hold.
    assert max(three) in now, (three, now)
    assert server.stderr().count("retired (SIGTTOU)") == 2
    assert server.stop() == 0


def test_the_count_set_by_ttin_survives_a_reload(maitred_server, app_dir):
    write_app(app_dir, "v1")
    server = maitred_server("-w", "1", "versioned:app", cwd=app_dir, env=NO_PYC)
    server.send_signal(signal.SIGTTIN)
    wait_for_workers(server, 2)
    write_app(app_dir, "v2")
    server.send_signal(signal.SIGHUP)
    server.wait_for_log("SIGHUP: reloaded: 2 new workers serve", 10)
    wait_until(lambda: len(worker_pids(server)) == 2, 10, "the old workers gone")
    assert version_of(get(server.port)) == "v2"
    assert server.stop() == 0


# ---------------------------------------------------------------------------------------------
# SIGUSR1: every process reopens its logs.


def test_usr1_reopens_every_log_and_loses_no_line(maitred_server, app_dir, tmp_path):
    write_app(app_dir, "v1")
    error_log, access_log = tmp_path / "error.log", tmp_path / "access.log"
    server = maitred_server(
        "-w",
        "2",
        "--log-level",
        "debug",
        "--error-logfile",
        str(error_log),
        "--access-logfile",
        str(access_log),
        "versioned:app",
        cwd=app_dir,
        env=NO_PYC,
    )
    workers = wait_for_workers(server, 2)
    sent = 0

    def ask() -> Reply:
        nonlocal sent
        reply = get(server.port, f"/log?n={sent}")
        assert reply.status == 200
        sent += 1
        return reply

    for _ in range(10):
        ask()
    error_log.rename(tmp_path / "error.log.1")
    access_log.rename(tmp_path / "access.log.1")
    # The rotation has happened; until SIGUSR1 every process writes on to the renamed files.
    for _ in range(5):
        ask()
    before_usr1 = sent
    server.send_signal(signal.SIGUSR1)
    wait_for_log(lambda: read_if_there(error_log), "SIGUSR1: reopened the error log", 10)

    # Every worker reopens its log soon after the lobby: ask until each has written to the new one.
    def every_worker_writes_to_the_new_file() -> bool:
        ask()
        text = error_log.read_text()
        return all(f"from {pid}" in text for pid in workers)

    wait_until(every_worker_writes_to_the_new_file, 10, "each worker writing to the new error log")
    # The zygote too: it logs each fork at debug level.
    server.send_signal(signal.SIGTTIN)
    wait_for_workers(server, 3)
    wait_for_log(lambda: read_if_there(error_log), "zygote: forked worker", 10)
    assert server.stop() == 0

    old_errors = (tmp_path / "error.log.1").read_text()
    new_errors = error_log.read_text()
    old_access = (tmp_path / "access.log.1").read_text()
    new_access = access_log.read_text()
    numbers = re.compile(r"app line n=(\d+) from (\d+)")
    logged = [int(n) for n, _ in numbers.findall(old_errors) + numbers.findall(new_errors)]
    assert sorted(logged) == list(range(sent)), "an application line was lost or doubled"
    accessed = [int(n) for n in re.findall(r"GET /log\?n=(\d+) ", old_access + new_access)]
    assert sorted(accessed) == list(range(sent)), "an access log line was lost or doubled"
    assert "SIGUSR1" not in old_errors
    # The lobby's own lines queued before SIGUSR1 are written to the old file, those after it
    # to the new one, however late its writer gets to them.
    assert [int(n) for n in re.findall(r"GET /log\?n=(\d+) ", old_access)] == list(range(before_usr1))
    # Once a worker writes to the new file, it never writes to the old one again.
    for pid in workers:
        first_new = min(int(n) for n, p in numbers.findall(new_errors) if int(p) == pid)
        assert all(int(n) < first_new for n, p in numbers.findall(old_errors) if int(p) == pid)
    assert wait_for_empty_group(server.pid, 10) == []


def test_usr1_without_log_files_is_one_line(maitred_server):
    server = maitred_server(CRASHY, cwd=APPS)
    server.send_signal(signal.SIGUSR1)
    server.wait_for_log("SIGUSR1: no log file to reopen", 10)
    assert get(server.port, "/pid").status == 200
    assert server.stop() == 0


# ---------------------------------------------------------------------------------------------
# SIGHUP: reload the application, and fail no request.


def test_reloads_under_load_fail_no_request_and_serve_the_new_code_within_2_s(maitred_server, app_dir):
    write_app(app_dir, "v0")
    server = maitred_server("-w", "2", "versioned:app", cwd=app_dir, env=NO_PYC)
    hups: list[tuple[str, float]] = []
    with Load(server.port, clients=4) as load:
        wait_until(lambda: all(client.answers for client in load.clients), 10, "every load client answered")
        for number in range(1, 9):
            version = f"v{number}"
            write_app(app_dir, version)
            server.send_signal(signal.SIGHUP)
            hups.append((version, time.monotonic()))
            # Deliberately not a wait for the reload: SIGHUPs at a steady pace, some of them
            # while a reload is under way (it follows once that one is done).
            time.sleep(0.5)
        final = hups[-1][0]
        wait_until(lambda: any(version_of_body(a.body) == final for a in load.answers()), 5, f"answers from {final}")

        # The window of the negative check below (no older code answers after the final one):
        # every client has had three answers from the final code since, its later requests
        # asked of whatever workers remain.
        def three_final_answers_each() -> bool:
            return all(
                sum(version_of_body(a.body) == final for a in list(client.answers)) >= 3 for client in load.clients
            )

        wait_until(three_final_answers_each, 5, f"three answers from {final} for every client")
    assert load.failures() == []
    answers = load.answers()
    assert len(answers) > 100
    for version, sent_at in hups:
        number = int(version[1:])
        newer = [a.at for a in answers if int(version_of_body(a.body)[1:]) >= number]
        assert newer and newer[0] - sent_at < 2.0, f"{version}: first answer {newer[0] - sent_at if newer else None}"
    # Each client's answers come from ever newer code: a retiring worker takes no new request.
    for client in load.clients:
        versions = [int(version_of_body(a.body)[1:]) for a in client.answers]
        assert versions == sorted(versions)
    wait_until(lambda: len(worker_pids(server)) == 2, 10, "only the new workers left")
    assert "reload abandoned" not in server.stderr()
    assert server.stop() == 0


def version_of_body(body: bytes) -> str:
    return body.split()[0].decode()


def test_a_broken_file_abandons_the_reload_and_the_next_one_works(maitred_server, app_dir):
    write_app(app_dir, "v1")
    server = maitred_server("-w", "2", "versioned:app", cwd=app_dir, env=NO_PYC)
    with Load(server.port, clients=3) as load:
        wait_until(lambda: all(client.answers for client in load.clients), 10, "every load client answered")
        write_app(app_dir, "", source="def app(:\n")
        server.send_signal(signal.SIGHUP)
        server.wait_for_log("SIGHUP: reload abandoned", 10)
        log = server.stderr()
        assert re.search(r"reload abandoned: a new worker could not load the application: .*SyntaxError", log), log
        assert log.count("reload abandoned") == 1
        assert {version_of(get(server.port)) for _ in range(5)} == {"v1"}
        write_app(app_dir, "v3")
        server.send_signal(signal.SIGHUP)
        hup = time.monotonic()
        wait_until(lambda: any(version_of_body(a.body) == "v3" for a in load.answers()), 5, "answers from v3")
        first_v3 = min(a.at for a in load.answers() if version_of_body(a.body) == "v3")
        assert first_v3 - hup < 2.0
    assert load.failures() == []
    wait_until(lambda: len(worker_pids(server)) == 2, 10, "only the new workers left")
    assert server.stop() == 0


def test_a_reload_whose_import_outlasts_timeout_is_abandoned(maitred_server, app_dir):
    write_app(app_dir, "v1")
    server = maitred_server("-w", "1", "--timeout", "1", "versioned:app", cwd=app_dir, env=NO_PYC)
    before = wait_for_workers(server, 1)
    assert version_of(get(server.port)) == "v1"  # loaded, before v2 is written
    write_app(app_dir, "v2", import_delay=5)
    server.send_signal(signal.SIGHUP)
    server.wait_for_log("SIGHUP: reload abandoned: the new workers did not finish loading versioned:app within", 10)
    assert version_of(get(server.port)) == "v1"
    wait_until(lambda: worker_pids(server) == before, 5, "the slow new worker stopped")
    assert server.stop() == 0


def test_a_reload_reads_the_config_file_again_and_names_what_it_keeps(maitred_server, app_dir, tmp_path):
    write_app(app_dir, "v1")
    conf = tmp_path / "conf.py"
    conf.write_text("workers = 1\nkeep_alive = 30\n")
    server = maitred_server("-c", str(conf), "versioned:app", cwd=app_dir, env=NO_PYC)
    wait_for_workers(server, 1)
    conf.write_text("workers = 3\nkeep_alive = 30\nbacklog = 64\nmax_connections = 10\n")
    server.send_signal(signal.SIGHUP)
    server.wait_for_log("SIGHUP: reloaded: 3 new workers serve", 10)
    assert re.search(r"the config file changes backlog, max_connections, which a reload cannot change", server.stderr())
    wait_for_workers(server, 3)
    # A broken config file abandons the reload and changes nothing.
    conf.write_text("workers = 'many'\n")
    server.send_signal(signal.SIGHUP)
    server.wait_for_log("SIGHUP: reload abandoned: config file", 10)
    # The worker count stays as it was: the SIGTTIN sent after it finds three, and makes four.
    server.send_signal(signal.SIGTTIN)
    server.wait_for_log("SIGTTIN: 4 workers (one more)", 10)
    assert len(wait_for_workers(server, 4)) == 4
    assert get(server.port).status == 200
    assert server.stop() == 0


def test_reread_applies_the_file_keeps_what_needs_a_new_lobby_and_the_command_line_wins(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf.py"
    conf.write_text("workers = 2\ntimeout = 10\nbind = '127.0.0.1:9000'\n")
    argv = ["-c", str(conf), "--timeout", "5", "hello:app"]
    started = config.resolve(argv)
    adopted = []
    reread = config.rereader(argv, started, adopted.append)
    assert reread is not None
    conf.write_text("workers = 4\ntimeout = 20\nbind = '127.0.0.1:9001'\nkeep_alive = 5\nenv = ['A=1']\n")
    lobby, kept = reread()
    assert kept == ["bind", "env"]
    assert (lobby["workers"], lobby["keep_alive"], lobby["timeout"]) == (4, 5.0, 5.0)
    assert lobby["bind"] == ["127.0.0.1:9000"]
    assert [settings["workers"] for settings in adopted] == [4]
    conf.write_text("workers = 'many'\n")
    with pytest.raises(config.UsageError, match="workers"):
        reread()
    assert len(adopted) == 1
    assert config.rereader(["hello:app"], config.resolve(["hello:app"]), adopted.append) is None


def zygotes_of(server: Server) -> set[int]:
    """The lobby's children: its zygote, and during a reload with --preload the new one too."""
    return {pid for pid in processes_in_group(server.pid) if parent_of(pid) == server.pid}


def test_with_preload_a_reload_starts_a_fresh_zygote_and_fails_no_request(maitred_server, app_dir):
    """--preload: the application lives in the zygote, so a reload starts a new zygote that
    imports the code on disk now; its workers take over once all are ready, the old zygote
    exits after its workers, and a broken file leaves the serving ones as they were."""
    write_app(app_dir, "v1")
    server = maitred_server("--preload", "-w", "2", "versioned:app", cwd=app_dir, env=NO_PYC)
    wait_for_workers(server, 2)
    (first_zygote,) = zygotes_of(server)
    with Load(server.port, clients=4) as load:
        wait_until(lambda: all(client.answers for client in load.clients), 10, "every load client answered")
        write_app(app_dir, "v2", import_delay=0.5)
        server.send_signal(signal.SIGHUP)
        server.wait_for_log("SIGHUP: reloaded", 10)
        wait_until(
            lambda: len(zygotes_of(server)) == 1 and first_zygote not in zygotes_of(server), 10, "old zygote gone"
        )
        # Every client's last answers are the new code's: the old zygote's workers are all gone.
        wait_until(
            lambda: all(version_of_body(c.answers[-1].body) == "v2" for c in load.clients), 10, "answers from v2"
        )
    assert load.failures() == []
    versions = [version_of_body(a.body) for a in load.answers()]
    assert versions[0] == "v1" and versions[-1] == "v2", versions
    server.wait_for_log("started a new zygote", 10)
    (second_zygote,) = zygotes_of(server)
    write_app(app_dir, "v3", source="def app(:\n")
    server.send_signal(signal.SIGHUP)
    server.wait_for_log("SIGHUP: reload abandoned: the new zygote could not load the application", 10)
    wait_until(lambda: zygotes_of(server) == {second_zygote}, 10, "the failed zygote gone")
    assert version_of(get(server.port)) == "v2"
    write_app(app_dir, "v4")
    server.send_signal(signal.SIGHUP)
    wait_until(lambda: version_of(get(server.port)) == "v4", 10, "v4 served")
    assert server.stop() == 0
    assert wait_for_empty_group(server.pid, 10) == []
