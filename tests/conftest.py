"""Fixtures shared by maitred's tests.

Everything here runs the real `maitred` command (the console script installed beside the
Python running pytest) as a subprocess in its own process group, on 127.0.0.1 and a free port,
and kills that whole group -- lobby, zygote and workers -- when the test ends.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from tls_certs import Authority, Pair

MAITRED = Path(sys.executable).with_name("maitred")
HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parent.parent


def eventually(condition: Callable[[], object], timeout: float) -> bool:
    """Whether `condition` comes true within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Waits until `condition` comes true; fails the test, saying `what` it waited for, after
    `timeout` s."""
    if not eventually(condition, timeout):
        pytest.fail(f"{what}: not within {timeout} s")


def wait_for_log(
    read: Callable[[], str],
    wanted: str | re.Pattern[str],
    timeout: float,
    exited: Callable[[], int | None] | None = None,
) -> str:
    """The log's text (what `read` returns), once `wanted` is in it: a string, or a compiled
    pattern that matches somewhere in it. Fails the test, showing the log, after `timeout` s;
    with `exited` (a process's `poll`), as soon as the process has exited without writing it.
    Every helper of the tests that waits for a line in a log waits here."""

    def found(text: str) -> bool:
        return wanted in text if isinstance(wanted, str) else wanted.search(text) is not None

    deadline = time.monotonic() + timeout
    while not found(log := read()):
        if exited is not None and (code := exited()) is not None:
            if found(log := read()):  # written just before the exit
                return log
            pytest.fail(f"exited with {code} before {wanted!r} was in the log:\n{log}")
        if time.monotonic() >= deadline:
            pytest.fail(f"{wanted!r} is not in the log within {timeout} s:\n{log}")
        time.sleep(0.02)
    return log


def read_if_there(path: Path) -> str:
    """A log file's text, or nothing while it does not exist yet."""
    return path.read_text(errors="replace") if path.exists() else ""


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that no earlier call in
    this run has returned: the kernel may pick the same free port twice in a row, and a test
    that asks for two (an application's and --stats') got one port for both (CI, stop 56)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((HOST, 0))
            port = probe.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def maitred_stub() -> Path:
    """Where `cargo build --release -p maitred-stub` (make test) puts maitred-stub: in cargo's
    target directory, which CARGO_TARGET_DIR or cargo's configuration may move from target/;
    `cargo metadata` says where it is."""
    metadata = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        text=True,
    )
    return Path(json.loads(metadata.stdout)["target_directory"]) / "release" / "maitred-stub"


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def processes_in_group(group: int) -> list[int]:
    """Live (not zombie) processes whose process group is `group`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after its ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == group:
            found.append(int(entry.name))
    return found


def wait_for_empty_group(group: int, timeout: float) -> list[int]:
    """Waits until no process of `group` is left; returns those still there at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        left = processes_in_group(group)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def remove_cgroup(cgroup: Path) -> None:
    """Removes a cgroup that a test made, once the processes killed with its server have left
    it; fails the test if some are still there after 10 s."""
    wait_until(lambda: not (cgroup / "cgroup.procs").read_text().split(), 10, f"no process left in {cgroup}")
    cgroup.rmdir()


def kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def haproxy_command() -> str:
    """Debian's haproxy (in /usr/sbin, which a user's PATH may leave out), or the test skips."""
    found = shutil.which("haproxy", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        pytest.skip("haproxy is not installed (Debian: apt-get install haproxy; .ci/run installs it)")
    return found


@pytest.fixture
def haproxy_started(tmp_path: Path) -> Iterator[Callable[[str, list[int]], None]]:
    """Starts Debian's haproxy in the foreground with a configuration (its text), returning once
    each of the ports given accepts connections; its log is tmp_path/haproxy.log. Every haproxy
    started is stopped when the test ends. Skips the test without haproxy."""
    command = haproxy_command()
    started: list[subprocess.Popen[bytes]] = []

    def start(config: str, ports: list[int]) -> None:
        path = tmp_path / f"haproxy-{len(started)}.cfg"
        path.write_text(config)
        with open(tmp_path / "haproxy.log", "ab") as log:
            started.append(subprocess.Popen([command, "-db", "-f", str(path)], stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 10
        while not all(accepts_connections(port) for port in ports):
            log_text = (tmp_path / "haproxy.log").read_text(errors="replace")
            assert started[-1].poll() is None, f"haproxy exited with {started[-1].returncode}:\n{log_text}"
            assert time.monotonic() < deadline, f"haproxy did not listen within 10 s:\n{log_text}"
            time.sleep(0.05)

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _environment(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the application's directory comes from cwd / --chdir
    if extra:
        env.update(extra)
    return env


@pytest.fixture(scope="session")
def maitred_command() -> list[str]:
    if not MAITRED.exists():
        pytest.fail(f"{MAITRED} is missing: install maitred into this environment (make test)")
    return [str(MAITRED)]


def children(pid: int) -> set[int]:
    """The pids of `pid`'s children (a lobby's zygote, a zygote's workers)."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(child) for child in (task / "children").read_text().split())
    return found


def is_probe(pid: int) -> bool:
    """Whether `pid` is the zygote's child that imports the application only to ask whether it
    is ASGI (zygote.probe_interface): it is named for `ps`, and is no worker."""
    # Imported here: without maitred installed, the maitred_command fixture says so in one line.
    from maitred.zygote import PROBE_NAME

    try:
        return Path(f"/proc/{pid}/comm").read_text().rstrip("\n") == PROBE_NAME
    except OSError:
        return False


def is_worker(pid: int) -> bool:
    """Whether the zygote's child `pid` is a worker: alive (a probe reaped between the listing of
    the zygote's children and this look is gone), and not the interface probe."""
    # Imported here: without maitred installed, the maitred_command fixture says so in one line.
    from maitred.zygote import PROBE_NAME

    try:
        return Path(f"/proc/{pid}/comm").read_text().rstrip("\n") != PROBE_NAME
    except OSError:
        return False


def workers_of(lobby: int, count: int = 0) -> set[int]:
    """The pids of the workers under `lobby`'s zygote; with `count`, once it has forked that
    many (a lobby serves as soon as one worker is ready, so the others may be on their way)."""
    deadline = time.monotonic() + 10
    while True:
        workers = {worker for zygote in children(lobby) for worker in children(zygote) if is_worker(worker)}
        if len(workers) >= count or time.monotonic() > deadline:
            return workers
        time.sleep(0.02)


@dataclass
class Server:
    """A running `maitred`. Its process group holds the lobby, the zygote and the workers."""

    process: subprocess.Popen[bytes]
    port: int
    stdout_path: Path
    stderr_path: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait_for_log(self, text: str | re.Pattern[str], timeout: float) -> str:
        """The error log, once `text` (or a match of the pattern) is in it; fails, showing the
        log, after `timeout` s."""
        return wait_for_log(self.stderr, text, timeout)

    def wait(self, timeout: float) -> int:
        """Waits for the lobby to exit and returns its exit code."""
        return self.process.wait(timeout=timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then waits for the lobby's exit code."""
        self.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL to the whole process group, then reaps the lobby."""
        kill_group(self.pid)
        self.process.wait(timeout=10)


class _Launcher:
    """Starts `maitred` servers whose logs go to `log_dir`, and kills them all at the end."""

    def __init__(self, command: list[str], log_dir: Path) -> None:
        self.command = command
        self.log_dir = log_dir
        self.started: list[Server] = []

    def __call__(
        self,
        *args: str,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        bind: bool = True,
        port: int | None = None,
        ready_timeout: float = 30.0,
    ) -> Server:
        port = port if port is not None else free_port()
        command = [*self.command, *(["--bind", f"{HOST}:{port}"] if bind else []), *args]
        number = len(self.started)
        stdout_path = self.log_dir / f"maitred-{number}.stdout"
        stderr_path = self.log_dir / f"maitred-{number}.stderr"
        with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
            process = subprocess.Popen(
                command,
                cwd=cwd or self.log_dir,
                env=_environment(env),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
        server = Server(process, port, stdout_path, stderr_path)
        self.started.append(server)
        deadline = time.monotonic() + ready_timeout
        while not accepts_connections(port):
            if process.poll() is not None:
                pytest.fail(f"maitred exited with {process.returncode} before listening:\n{server.stderr()}")
            if time.monotonic() >= deadline:
                pytest.fail(f"maitred did not listen within {ready_timeout} s:\n{server.stderr()}")
            time.sleep(0.05)
        return server

    def kill_all(self) -> None:
        for server in self.started:
            server.kill()


@pytest.fixture
def maitred_server(tmp_path: Path, maitred_command: list[str]) -> Iterator[_Launcher]:
    """Starts servers: ``maitred_server("hello:app", "-w", "2", cwd=app_dir)``.

    The server listens on 127.0.0.1 and a free port (``bind=False`` leaves --bind to the
    arguments); the call returns once that port accepts connections, and fails the test with
    the server's stderr if it exits first or does not listen within `ready_timeout` seconds.
    Every server started is killed, with its whole process group, when the test ends.
    """
    launcher = _Launcher(maitred_command, tmp_path)
    yield launcher
    launcher.kill_all()


@pytest.fixture(scope="module")
def maitred_module_server(tmp_path_factory: pytest.TempPathFactory, maitred_command: list[str]) -> Iterator[_Launcher]:
    """``maitred_server`` for servers shared by the tests of one module: each is killed, with
    its whole process group, when the module's last test is done."""
    launcher = _Launcher(maitred_command, tmp_path_factory.mktemp("maitred"))
    yield launcher
    launcher.kill_all()


@pytest.fixture(scope="module")
def uvicorn_module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Launcher]:
    """``maitred_module_server``'s twin for uvicorn with its websockets backend, the peer that
    shows a conformance test is right: call it with ``bind=False`` and ``--port``."""
    launcher = _Launcher([sys.executable, "-m", "uvicorn", "--ws", "websockets"], tmp_path_factory.mktemp("uvicorn"))
    yield launcher
    launcher.kill_all()


@dataclass
class Finished:
    """A `maitred` run that ended by itself."""

    returncode: int
    stdout: str
    stderr: str
    leftovers: list[int]
    """Processes of its group still alive a few seconds after it exited (then killed)."""


@pytest.fixture
def run_maitred(tmp_path: Path, maitred_command: list[str]) -> Callable[..., Finished]:
    """Runs ``maitred ARGS...`` to completion (it is expected to exit by itself, e.g. on a
    bad setting), in its own process group; reports what it printed and whether anything of
    its process group outlived it. Fails the test if it is still running after `timeout`."""

    def run(
        *args: str,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        linger: float = 5.0,
    ) -> Finished:
        process = subprocess.Popen(
            [*maitred_command, *args],
            cwd=cwd or tmp_path,
            env=_environment(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            stdout, stderr = process.communicate()
            pytest.fail(f"maitred {' '.join(args)} still running after {timeout} s:\n{stderr.decode(errors='replace')}")
        leftovers = wait_for_empty_group(process.pid, linger)
        kill_group(process.pid)
        return Finished(
            process.returncode,
            stdout.decode(errors="replace"),
            stderr.decode(errors="replace"),
            leftovers,
        )

    return run


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """An empty directory for a test's application modules (run maitred with cwd=app_dir)."""
    directory = tmp_path / "app"
    directory.mkdir()
    return directory


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    """A certificate authority of the test's own, in its temporary directory (tls_certs.py)."""
    directory = tmp_path / "pki"
    directory.mkdir()
    return Authority(directory)


@pytest.fixture
def server_pair(authority: Authority) -> Pair:
    """A server certificate and key that `authority` signed."""
    return authority.server()
