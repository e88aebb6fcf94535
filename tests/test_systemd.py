"""maitred under systemd (docs/SYSTEMD.md), told through real processes: socket activation with
systemd's own `systemd-socket-activate` (TCP and Unix sockets, passed from fd 3 as systemd passes
them), the notify protocol through a datagram socket each test makes and names in NOTIFY_SOCKET
(as a path and as an abstract @name), and the example units in examples/systemd/.

systemd itself cannot run here as PID 1, so no test starts a unit: the example units are checked
with `systemd-analyze verify` and then run the way systemd would run them, their sockets passed by
systemd-socket-activate and their settings (WatchdogSec=, KillSignal=, TimeoutStopSec=) applied
by the test. Tests that need systemd-socket-activate or systemd-analyze (Debian's systemd
package) are skipped, with one line saying so, where they are missing.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from client import Reply, get, read_reply
from conftest import (
    HOST,
    MAITRED,
    accepts_connections,
    eventually,
    free_port,
    kill_group,
    wait_for_empty_group,
    wait_for_log,
    workers_of,
)

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "examples" / "systemd"

SOCKET_ACTIVATE = shutil.which("systemd-socket-activate")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_socket_activate = pytest.mark.skipif(
    SOCKET_ACTIVATE is None, reason="systemd-socket-activate is missing (Debian's systemd package provides it)"
)

SERVICE_VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES", "NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC")

# The application: reports which of the service manager's variables it saw at import and sees
# now, and which listening sockets its process holds; sleeps on ?sleep=S. SVC_IMPORT_SECONDS
# slows its import down; SVC_MARKS names a directory where each process that imported it
# leaves a file named after its pid.
APP = """\
import json
import os
import socket
import time
from urllib.parse import parse_qs

SERVICE = ("LISTEN_", "NOTIFY_SOCKET", "WATCHDOG_")


def service_variables():
    return sorted(name for name in os.environ if name.startswith(SERVICE))


AT_IMPORT = service_variables()
time.sleep(float(os.environ.get("SVC_IMPORT_SECONDS", "0")))
if "SVC_MARKS" in os.environ:
    open(os.path.join(os.environ["SVC_MARKS"], str(os.getpid())), "w").close()


def listening_sockets():
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            copy = os.dup(int(name))
        except OSError:
            continue  # the directory's own descriptor, closed by now
        try:
            sock = socket.socket(fileno=copy)
        except OSError:
            os.close(copy)
            continue
        with sock:
            try:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    found.append(int(name))
            except OSError:
                pass
    return found


def app(environ, start_response):
    query = parse_qs(environ["QUERY_STRING"])
    if "sleep" in query:
        time.sleep(float(query["sleep"][0]))
    body = json.dumps(
        {
            "pid": os.getpid(),
            "at_import": AT_IMPORT,
            "now": service_variables(),
            "listening": listening_sockets(),
        }
    ).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
"""


@pytest.fixture
def svc_dir(app_dir: Path) -> Path:
    (app_dir / "svc.py").write_text(APP)
    return app_dir


def clean_environment(**extra: str) -> dict[str, str]:
    """The test's environment without PYTHONPATH and without any service manager's variables
    (pytest itself may run under one)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and k not in SERVICE_VARIABLES}
    env.update(extra)
    return env


# ---------------------------------------------------------------------------------------------
# Processes and the notify socket.


@dataclass
class Run:
    process: subprocess.Popen[bytes]
    stderr_path: Path
    port: int = 0
    """The TCP port it was told to listen on, if any."""

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        wait_for_log(self.log, text, timeout, exited=self.process.poll)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM; returns the exit code once nothing of its process group is left."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=timeout)
        assert wait_for_empty_group(self.pid, 10) == [], self.log()
        return code


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """Starts a command in its own process group, its output in a file; every process group
    started is killed when the test ends."""
    started: list[Run] = []

    def start(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> Run:
        stderr_path = tmp_path / f"run-{len(started)}.log"
        with open(stderr_path, "wb") as output:
            process = subprocess.Popen(
                command,
                cwd=cwd,
                env=env if env is not None else clean_environment(),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,
            )
        run = Run(process, stderr_path)
        started.append(run)
        return run

    yield start
    for run in started:
        kill_group(run.pid)
        run.process.wait(timeout=10)


@dataclass
class NotifySocket:
    """The service manager's end of the notify protocol: a datagram socket at `address`, an
    absolute path or an @name in the abstract namespace. Keeps every message with the time
    it arrived."""

    address: str
    sock: socket.socket = field(init=False)
    messages: list[tuple[float, list[str]]] = field(default_factory=list)
    # The pid that sent each message (SO_PASSCRED), as systemd checks it against MAINPID.
    senders: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind("\0" + self.address[1:] if self.address.startswith("@") else self.address)

    def close(self) -> None:
        self.sock.close()

    def _receive(self, deadline: float) -> bool:
        """Waits until `deadline` for one message; whether one came."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.sock.settimeout(left)
        credentials_size = struct.calcsize("3i")
        try:
            data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(credentials_size))
        except TimeoutError:
            return False
        self.messages.append((time.monotonic(), data.decode().split("\n")))
        sender = 0
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                sender = struct.unpack("3i", value[:credentials_size])[0]
        self.senders.append(sender)
        return True

    def wait_for(self, line: str, timeout: float) -> float:
        """The time the first message holding `line` arrived, waiting for it if need be;
        fails the test after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for at, lines in self.messages[seen:]:
                if line in lines:
                    return at
            seen = len(self.messages)
            if not self._receive(deadline):
                pytest.fail(f"no {line!r} within {timeout} s; received {[m for _, m in self.messages]}")

    def collect(self, seconds: float) -> None:
        """Receives whatever comes for `seconds`."""
        deadline = time.monotonic() + seconds
        while self._receive(deadline):
            pass

    def lines(self, prefix: str, since: float = 0.0) -> list[tuple[float, str]]:
        """Every line starting with `prefix` received at or after `since`, with its time."""
        return [(at, line) for at, lines in self.messages if at >= since for line in lines if line.startswith(prefix)]


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    notify = NotifySocket(str(tmp_path / "notify"))
    yield notify
    notify.close()


def start_notified(launch: Callable[..., Run], svc_dir: Path, notify: NotifySocket, *args: str, **env: str) -> Run:
    """maitred serving svc:app on a free port, told to notify `notify`."""
    port = free_port()
    command = [str(MAITRED), "--bind", f"{HOST}:{port}", *args, "svc:app"]
    run = launch(command, svc_dir, clean_environment(NOTIFY_SOCKET=notify.address, **env))
    run.port = port
    return run


def get_json(port: int, path: str = "/", timeout: float = 20.0) -> dict[str, object]:
    reply = get(port, path, timeout=timeout)
    assert reply.status == 200, reply
    return json.loads(reply.body)


# ---------------------------------------------------------------------------------------------
# Socket activation.


def activate(launch: Callable[..., Run], cwd: Path, listen: list[str], maitred_args: list[str], *extra: str) -> Run:
    """systemd-socket-activate listening on `listen`, starting maitred on the first connection."""
    assert SOCKET_ACTIVATE is not None
    command = [SOCKET_ACTIVATE, *(f"--listen={address}" for address in listen), *extra, str(MAITRED), *maitred_args]
    run = launch(command, cwd)
    run.wait_for_log(f"Listening on {listen[-1]}", timeout=10)
    return run


def request_on(sock: socket.socket, path: str = "/", timeout: float = 30.0) -> Reply:
    with sock:
        sock.settimeout(timeout)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        return read_reply(sock)


@needs_socket_activate
def test_socket_activation_serves_the_passed_socket_instead_of_bind(launch, svc_dir):
    port, other = free_port(), free_port()
    run = activate(launch, svc_dir, [f"{HOST}:{port}"], ["--bind", f"{HOST}:{other}", "svc:app"])
    # The first connection is what makes systemd-socket-activate start maitred: it waits in the
    # listen queue while maitred starts, and is served.
    first = request_on(socket.create_connection((HOST, port)))
    assert first.status == 200, run.log()
    run.wait_for_log(f"listening at http://{HOST}:{port} (fd 3, socket activation) (backlog")
    assert not accepts_connections(other), "--bind is not used under socket activation"
    answer = json.loads(first.body)
    assert answer["at_import"] == answer["now"] == [], "the service manager's variables reached the application"
    assert answer["listening"] == [], "a worker holds a listening socket"
    assert run.stop() == 0, run.log()


@needs_socket_activate
def test_socket_activation_of_tcp_and_unix_sockets_named_by_fdnames(launch, svc_dir, tmp_path):
    port, path = free_port(), tmp_path / "maitred.sock"
    run = activate(
        launch, svc_dir, [f"{HOST}:{port}", str(path)], ["-w", "2", "svc:app"], "--fdname=web:local", "-E", "FOO=1"
    )
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.connect(str(path))
    assert request_on(unix).status == 200, run.log()
    assert get(port).status == 200
    run.wait_for_log(f"listening at http://{HOST}:{port} (fd 3, socket activation: web)")
    run.wait_for_log(f"listening at unix:{path} (fd 4, socket activation: local)")
    assert run.stop() == 0, run.log()
    # The socket file is the service manager's, as is the socket: maitred leaves it.
    assert path.exists()


@needs_socket_activate
@pytest.mark.parametrize("preload", [False, True], ids=["workers", "preload"])
def test_the_service_managers_variables_reach_neither_the_zygote_nor_the_workers(
    launch, svc_dir, notify_socket, preload
):
    port = free_port()
    args = ["-w", "2", *(["--preload"] if preload else []), "svc:app"]
    environment = ["-E", f"NOTIFY_SOCKET={notify_socket.address}", "-E", "WATCHDOG_USEC=60000000"]
    run = activate(launch, svc_dir, [f"{HOST}:{port}"], args, "--fdname=web", *environment)
    first = request_on(socket.create_connection((HOST, port)))
    assert first.status == 200, run.log()
    # The lobby still has them: it notifies.
    notify_socket.wait_for("READY=1", timeout=30)
    answers = [json.loads(first.body)] + [get_json(port) for _ in range(4)]
    for answer in answers:
        assert answer["at_import"] == answer["now"] == [], answer
        assert answer["listening"] == [], answer
    assert run.stop() == 0, run.log()


@needs_socket_activate
@pytest.mark.parametrize(
    "kind, why",
    [
        ("--datagram", "a datagram socket, not a stream socket"),
        ("--accept", "a connected socket, not a listening one"),
    ],
)
def test_passed_sockets_that_do_not_listen_for_streams_are_refused_in_one_line(launch, svc_dir, kind, why):
    port = free_port()
    run = activate(launch, svc_dir, [f"{HOST}:{port}"], ["svc:app"], kind)
    if kind == "--datagram":
        trigger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        trigger.sendto(b"hello", (HOST, port))
    else:
        # --accept starts maitred for each connection, with the connection as fd 3.
        trigger = socket.create_connection((HOST, port))
    run.wait_for_log("maitred: error:")
    trigger.close()
    errors = [line for line in run.log().splitlines() if line.startswith("maitred: error:")]
    expected = (
        f"maitred: error: cannot use fd://3 (fd 3, socket activation): {why} (maitred needs ListenStream= "
        "sockets, TCP or Unix, with Accept=no in the .socket unit; docs/SYSTEMD.md)"
    )
    assert errors == [expected], run.log()
    if kind == "--datagram":
        # maitred is what systemd-socket-activate became.
        assert run.process.wait(timeout=30) == 1


@needs_socket_activate
def test_a_binary_upgrade_keeps_the_activated_socket_and_moves_mainpid(launch, svc_dir, notify_socket):
    """SIGUSR2 under socket activation: the new lobby serves the socket systemd passed (by its
    name), the old one tells systemd MAINPID= and exits 0, the new one speaks to systemd only
    after that (READY=1), and the application never sees the service manager's variables."""
    port = free_port()
    environment = ["-E", f"NOTIFY_SOCKET={notify_socket.address}"]
    run = activate(launch, svc_dir, [f"{HOST}:{port}"], ["-w", "2", "svc:app"], "--fdname=web", *environment)
    keep_alive = socket.create_connection((HOST, port), timeout=30)
    keep_alive.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
    old_worker = json.loads(read_reply(keep_alive).body)["pid"]
    notify_socket.wait_for("READY=1", timeout=30)
    run.process.send_signal(signal.SIGUSR2)
    assert run.process.wait(timeout=30) == 0, run.log()
    new_lobby = _new_lobby(run)
    switched = notify_socket.wait_for(f"MAINPID={new_lobby}", timeout=10)
    assert eventually(lambda: notify_socket.collect(0.1) or notify_socket.lines("READY=1", since=switched), 10), (
        notify_socket.messages
    )
    # Nothing from the new lobby before it is the main process: systemd would refuse it.
    first_from_new = notify_socket.senders.index(new_lobby)
    assert notify_socket.messages[first_from_new][0] > switched, list(
        zip(notify_socket.senders, notify_socket.messages)
    )
    run.wait_for_log(f"listening at http://{HOST}:{port} (fd 3, socket activation: web)")
    keep_alive.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
    answer = json.loads(read_reply(keep_alive).body)
    keep_alive.close()
    assert answer["pid"] != old_worker
    assert answer["at_import"] == answer["now"] == [] and answer["listening"] == [], answer
    assert get_json(port)["pid"] != old_worker
    os.kill(new_lobby, signal.SIGTERM)
    assert wait_for_empty_group(run.pid, 30) == [], run.log()


def _new_lobby(run: Run) -> int:
    """The pid of the lobby a binary upgrade started, from the log line that names it."""
    found = re.search(r"SIGUSR2: the new maitred \(pid (\d+)\) is ready", run.log())
    assert found, run.log()
    return int(found.group(1))


def test_listen_fds_meant_for_another_process_are_ignored(maitred_server, svc_dir):
    server = maitred_server("svc:app", cwd=svc_dir, env={"LISTEN_PID": "1", "LISTEN_FDS": "1"})
    assert get_json(server.port)["listening"] == []
    assert eventually(lambda: "serving svc:app" in server.stderr(), 10)
    assert f"listening at http://{HOST}:{server.port} (backlog" in server.stderr()


@pytest.mark.parametrize(
    "variables, message",
    [
        ({"LISTEN_FDS": "two"}, "socket activation: LISTEN_FDS: expected a number of descriptors, got 'two'"),
        ({"LISTEN_FDS": "1"}, "socket activation: LISTEN_FDS=1: 'fd://3': file descriptor 3 is not open"),
        (
            {"LISTEN_FDS": "1", "LISTEN_FDNAMES": "a:b"},
            "socket activation: LISTEN_FDNAMES names 2 sockets, LISTEN_FDS passes 1",
        ),
    ],
    ids=["count", "closed", "names"],
)
def test_malformed_socket_activation_is_one_line(svc_dir, variables, message):
    # LISTEN_PID must be maitred's own pid: a shell sets it to its own and becomes maitred.
    result = subprocess.run(
        ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$0" "$@"', str(MAITRED), "svc:app"],
        cwd=svc_dir,
        env=clean_environment(**variables),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"maitred: error: {message}"]


# ---------------------------------------------------------------------------------------------
# The notify protocol.


def test_ready_only_once_every_worker_serves(launch, svc_dir, notify_socket, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    started = time.monotonic()
    run = start_notified(
        launch, svc_dir, notify_socket, "-w", "2", "-e", "SVC_IMPORT_SECONDS=1", "-e", f"SVC_MARKS={marks}"
    )
    ready = notify_socket.wait_for("READY=1", timeout=30)
    assert ready - started >= 1.0
    # Marks are named by pid; the zygote's look at the application's interface (a child that
    # imports it once and exits, docs/ASGI.md) leaves one too.
    workers = {str(pid) for pid in workers_of(run.pid)}
    assert len(workers) == 2 and workers <= {mark.name for mark in marks.iterdir()}, (
        "READY=1 before every worker had loaded the application"
    )
    # Served at once: nothing is still starting.
    assert get_json(run.port, timeout=2)["now"] == []
    statuses = [line for _, line in notify_socket.lines("STATUS=")]
    assert statuses[0] == "STATUS=starting: 0 of 2 workers ready", statuses
    notify_socket.wait_for("STATUS=serving, 2 workers (2 idle), 0 queued", timeout=5)
    assert run.stop() == 0


def test_stopping_as_soon_as_sigterm_arrives_while_requests_finish(launch, svc_dir, notify_socket):
    run = start_notified(launch, svc_dir, notify_socket)
    notify_socket.wait_for("READY=1", timeout=30)
    replies: list[Reply] = []
    running = threading.Thread(target=lambda: replies.append(get(run.port, "/?sleep=3")))
    running.start()
    notify_socket.wait_for("STATUS=serving, 1 worker (0 idle), 0 queued", timeout=5)
    signalled = time.monotonic()
    run.process.send_signal(signal.SIGTERM)
    stopping = notify_socket.wait_for("STOPPING=1", timeout=5)
    assert stopping - signalled < 1.0
    notify_socket.wait_for("STATUS=stopping: 1 worker busy, 0 queued", timeout=5)
    assert not replies, "STOPPING=1 came after the request in progress had finished"
    running.join(timeout=30)
    assert [reply.status for reply in replies] == [200]
    assert run.process.wait(timeout=30) == 0


def test_status_says_how_many_workers_are_idle_and_how_many_requests_wait(launch, svc_dir, notify_socket):
    run = start_notified(launch, svc_dir, notify_socket, "-w", "2")
    ready = notify_socket.wait_for("READY=1", timeout=30)
    notify_socket.wait_for("STATUS=serving, 2 workers (2 idle), 0 queued", timeout=5)
    threads = [threading.Thread(target=get, args=(run.port, "/?sleep=2")) for _ in range(3)]
    for thread in threads:
        thread.start()
    notify_socket.wait_for("STATUS=serving, 2 workers (0 idle), 1 queued", timeout=5)
    for thread in threads:
        thread.join(timeout=30)
    notify_socket.wait_for("STATUS=serving, 2 workers (2 idle), 0 queued", timeout=5)
    # At most one STATUS= a second, however often the figures change.
    times = [at for at, _ in notify_socket.lines("STATUS=", since=ready + 0.1)]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(gap > 0.8 for gap in gaps), gaps
    assert run.stop() == 0


def test_watchdog_at_half_its_interval(launch, svc_dir, notify_socket):
    run = start_notified(launch, svc_dir, notify_socket, WATCHDOG_USEC="400000")
    ready = notify_socket.wait_for("READY=1", timeout=30)
    notify_socket.collect(2.0)
    beats = [at for at, _ in notify_socket.lines("WATCHDOG=1", since=ready)]
    gaps = [later - earlier for earlier, later in itertools.pairwise(beats)]
    assert 7 <= len(beats) <= 12, beats
    assert all(0.1 < gap < 0.35 for gap in gaps), gaps
    run.wait_for_log("watchdog every 200 ms")
    assert run.stop() == 0


def test_a_stalled_lobby_stops_the_watchdog_at_once_and_ends(launch, svc_dir, notify_socket):
    """docs/SIGNALS.md, "A stalled lobby": WATCHDOG=1 comes from a task on the event loop, so a
    loop that stops turning stops it with the next beat, and systemd's WatchdogSec acts; the
    lobby's own --lobby-timeout ends it too, with exit code 70, for Restart= to start it again."""
    run = start_notified(
        launch, svc_dir, notify_socket, "--lobby-timeout", "5", WATCHDOG_USEC="400000", MAITRED_TEST_WEDGE="spin"
    )
    notify_socket.wait_for("READY=1", timeout=30)
    notify_socket.wait_for("WATCHDOG=1", timeout=5)
    run.process.send_signal(signal.SIGRTMIN + 5)
    run.wait_for_log("wedging the event loop, as asked")
    wedged = time.monotonic()
    assert run.process.wait(timeout=25) == 70
    notify_socket.collect(0.2)
    # At most the beat already due when the wedge came (one interval, 200 ms).
    late = [at - wedged for at, _ in notify_socket.lines("WATCHDOG=1", since=wedged + 0.25)]
    assert late == [], late
    assert "has made no progress" in run.log()


def test_no_watchdog_for_another_process(launch, svc_dir, notify_socket):
    run = start_notified(launch, svc_dir, notify_socket, WATCHDOG_USEC="200000", WATCHDOG_PID="1")
    notify_socket.wait_for("READY=1", timeout=30)
    notify_socket.collect(1.0)
    assert notify_socket.lines("WATCHDOG=") == []
    assert run.stop() == 0


def test_an_abstract_notify_socket(launch, svc_dir):
    notify = NotifySocket(f"@maitred-test-{uuid.uuid4().hex}")
    try:
        run = start_notified(launch, svc_dir, notify)
        notify.wait_for("READY=1", timeout=30)
        assert get(run.port).status == 200
        run.process.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING=1", timeout=5)
        assert run.process.wait(timeout=30) == 0
    finally:
        notify.close()


def test_a_notify_socket_nobody_reads_never_stops_the_server(launch, svc_dir, notify_socket):
    # A heartbeat every millisecond fills the unread socket's queue within a second; from then
    # on every message is dropped rather than waited for.
    run = start_notified(launch, svc_dir, notify_socket, WATCHDOG_USEC="2000")
    run.wait_for_log("cannot notify the service manager")
    started = time.monotonic()
    for _ in range(20):
        assert get(run.port, timeout=2).status == 200
    assert time.monotonic() - started < 5
    assert run.stop() == 0


# ---------------------------------------------------------------------------------------------
# The example units.


def read_unit(path: Path) -> dict[str, list[str]]:
    """A unit file's settings, as 'Section.Key': [values] (a key may be given more than once)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return settings


def one(unit: dict[str, list[str]], key: str) -> str:
    (value,) = unit[key]
    return value


def seconds(value: str) -> float:
    """A systemd time span in its plain forms: 40, 40s, 2min."""
    match = re.fullmatch(r"([0-9.]+)\s*(s|sec|min|ms)?", value)
    assert match, value
    number, unit = float(match[1]), match[2] or "s"
    return number * {"s": 1, "sec": 1, "min": 60, "ms": 0.001}[unit]


def option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_example_units_say_what_docs_systemd_promises():
    service = read_unit(UNITS / "maitred.service")
    sockets = read_unit(UNITS / "maitred.socket")
    assert one(service, "Service.Type") == "notify"
    assert one(service, "Service.NotifyAccess") == "main"
    assert one(service, "Service.ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one(service, "Service.KillSignal") == "SIGTERM"
    assert one(service, "Service.KillMode") == "mixed"
    args = shlex.split(one(service, "Service.ExecStart"))
    # The lobby waits up to 5 s for the zygote after the graceful timeout.
    assert seconds(one(service, "Service.TimeoutStopSec")) > float(option(args, "--graceful-timeout")) + 5
    assert "--bind" not in args and "-b" not in args, "the sockets come from maitred.socket"
    assert one(service, "Unit.Requires") == "maitred.socket"
    assert one(sockets, "Socket.Accept") == "no"
    assert len(sockets["Socket.ListenStream"]) == 2


@pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is missing (Debian's systemd package provides it)")
def test_the_example_units_pass_systemd_analyze_verify(tmp_path):
    for name in ("maitred.service", "maitred.socket"):
        text = (UNITS / name).read_text()
        # The unit names a maitred that is not installed here; verify checks that it exists.
        text = re.sub(r"^ExecStart=\S+", f'ExecStart="{MAITRED}"', text, flags=re.MULTILINE)
        (tmp_path / name).write_text(text)
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(tmp_path / "maitred.socket"), str(tmp_path / "maitred.service")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout + result.stderr == ""


@needs_socket_activate
def test_the_example_units_run_as_systemd_would_run_them(launch, svc_dir, notify_socket, tmp_path):
    service = read_unit(UNITS / "maitred.service")
    sockets = read_unit(UNITS / "maitred.socket")
    # The socket unit's addresses, moved to a free port and a temporary directory.
    port, path = free_port(), tmp_path / "maitred.sock"
    listen = []
    for address in sockets["Socket.ListenStream"]:
        listen.append(str(path) if address.startswith("/") else f"{HOST}:{port}")
    names = ":".join([one(sockets, "Socket.FileDescriptorName")] * len(listen))
    # The service's command line, with this maitred and the test's application.
    args = shlex.split(one(service, "Service.ExecStart"))
    args[0] = str(MAITRED)
    args[args.index("--chdir") + 1] = str(svc_dir)
    args[-1] = "svc:app"
    watchdog_usec = int(seconds(one(service, "Service.WatchdogSec")) * 1_000_000)
    assert SOCKET_ACTIVATE is not None
    command = [
        SOCKET_ACTIVATE,
        *(f"--listen={address}" for address in listen),
        f"--fdname={names}",
        "-E",
        f"NOTIFY_SOCKET={notify_socket.address}",
        "-E",
        f"WATCHDOG_USEC={watchdog_usec}",
        *args,
    ]
    run = launch(command, svc_dir)
    run.wait_for_log(f"Listening on {listen[-1]}", timeout=10)
    first = socket.create_connection((HOST, port))
    notify_socket.wait_for("READY=1", timeout=60)
    assert request_on(first).status == 200
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.connect(str(path))
    assert request_on(unix).status == 200
    run.wait_for_log(f"watchdog every {watchdog_usec // 2000} ms")
    run.wait_for_log(f"(fd 3, socket activation: {one(sockets, 'Socket.FileDescriptorName')})")
    notify_socket.wait_for("STATUS=serving, 4 workers (4 idle), 0 queued", timeout=5)
    # systemctl stop: KillSignal= to the main process, then TimeoutStopSec= to exit.
    run.process.send_signal(getattr(signal, one(service, "Service.KillSignal")))
    notify_socket.wait_for("STOPPING=1", timeout=5)
    assert run.process.wait(timeout=seconds(one(service, "Service.TimeoutStopSec"))) == 0
    assert wait_for_empty_group(run.pid, 10) == []
