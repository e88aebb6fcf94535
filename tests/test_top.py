"""`maitred top` (docs/METRICS.md): the live view, run in a real terminal -- a detached tmux
session of a fixed size on a tmux server of its own -- against a real maitred's stats
listener, and read back from the screen. The tests that need a terminal skip, saying why,
without tmux (Debian's tmux package).
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from client import Reply, get, status_of
from conftest import HOST, MAITRED, ROOT, free_port
from maitred import top
from test_asgi_stream_lifecycle import PID_APP, open_streams
from test_cli import HELLO, assert_one_error_line
from test_lifecycle import APPS, wait_for_workers

TMUX = shutil.which("tmux")
needs_tmux = pytest.mark.skipif(
    TMUX is None, reason="tmux is not installed (Debian: apt-get install tmux; .ci/run installs it)"
)

WIDTH, HEIGHT = 160, 40


@dataclass
class Terminal:
    """`maitred top ARGS` running in a tmux window of WIDTH x HEIGHT."""

    server: str
    """The tmux server's socket name (-L)."""
    exit_file: Path
    """Where the shell writes top's exit code once it has ended."""
    stty_file: Path
    """`stty -a` run in the same terminal right after top ended."""
    stderr_file: Path
    """top's standard error (curses draws on standard output)."""

    def _tmux(self, *args: str) -> str:
        assert TMUX is not None
        done = subprocess.run([TMUX, "-L", self.server, *args], check=False, capture_output=True, text=True, timeout=10)
        if done.returncode != 0:
            # The window, and with it the tmux server, ends when top does.
            ended = self.exit_file.read_text().strip() if self.exit_file.exists() else "unknown"
            pytest.fail(
                f"tmux {args[0]}: {done.stderr.strip()}; maitred top exited with {ended}, "
                f"its standard error:\n{self.stderr_file.read_text(errors='replace')}"
            )
        return done.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "top")

    def press(self, key: str) -> None:
        self._tmux("send-keys", "-t", "top", key)

    def resize(self, width: int, height: int) -> None:
        self._tmux("resize-window", "-t", "top", "-x", str(width), "-y", str(height))

    def wait_for(self, condition: Callable[[str], bool], timeout: float, what: str) -> str:
        """The first screen for which `condition` holds; fails the test after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if condition(screen):
                return screen
            if time.monotonic() >= deadline:
                pytest.fail(f"{what}: not on the screen within {timeout} s; it showed:\n{screen}")
            time.sleep(0.1)

    def exit_code(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while not (self.exit_file.exists() and self.exit_file.read_text().strip()):
            if time.monotonic() >= deadline:
                pytest.fail(f"maitred top still running {timeout} s after q; it showed:\n{self.screen()}")
            time.sleep(0.05)
        return int(self.exit_file.read_text())


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Callable[..., Terminal]]:
    """Starts ``maitred top ARGS`` in a new tmux server's only window; kills that server, and
    with it anything still running in the window, when the test ends."""
    servers: list[str] = []

    def start(*args: str) -> Terminal:
        assert TMUX is not None
        server = f"maitred-top-test-{uuid.uuid4().hex[:12]}"
        servers.append(server)
        found = Terminal(server, *(tmp_path / f"{server}.{name}" for name in ("exit", "stty", "stderr")))
        command = (
            f"{shlex.join([str(MAITRED), 'top', *args])} 2> {shlex.quote(str(found.stderr_file))}; code=$?; "
            f"stty -a > {shlex.quote(str(found.stty_file))}; echo $code > {shlex.quote(str(found.exit_file))}"
        )
        environment = dict(os.environ)
        environment.pop("TMUX", None)  # a tmux server of its own, even when the tests run inside tmux
        subprocess.run(
            [TMUX, "-L", server, "-f", "/dev/null", "new-session", "-d", "-s", "top"]
            + ["-x", str(WIDTH), "-y", str(HEIGHT), command],
            env=environment,
            check=True,
            timeout=10,
        )
        return found

    try:
        yield start
    finally:
        for server in servers:
            # Fails harmlessly when the server has already ended with its only window.
            subprocess.run([TMUX, "-L", server, "kill-server"], check=False, capture_output=True, timeout=10)
            # tmux leaves its socket file behind (where -L puts it, tmux(1)).
            (Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}" / server).unlink(missing_ok=True)


def requests_answered(screen: str) -> int:
    found = re.search(r"^requests (\d+) ", screen, re.MULTILINE)
    assert found, f"no request count on the screen:\n{screen}"
    return int(found.group(1))


def row_of(screen: str, text: str) -> str | None:
    """The scoreboard row, or any line, that holds `text`."""
    return next((line for line in screen.splitlines() if text in line), None)


def restored(stty_file: Path) -> bool:
    """Whether the terminal is back in the mode a shell uses: curses turns off canonical
    input and echo while it runs."""
    settings = re.split(r"[\s;]+", stty_file.read_text())
    return "icanon" in settings and "echo" in settings


@needs_tmux
def test_top_shows_the_workers_a_held_request_and_the_counts_moving(maitred_server, terminal):
    stats = free_port()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    workers = wait_for_workers(server, 2)
    top = terminal("--stats", f"{HOST}:{stats}")

    screen = top.wait_for(lambda s: all(str(pid) in s for pid in workers), 15, f"the workers' pids {sorted(workers)}")
    assert f"lobby pid {server.pid}" in screen
    before = requests_answered(screen)

    # One request held in the application for 6 s (echo.py sleeps as asked).
    held: list[Reply] = []
    slow = threading.Thread(target=lambda: held.append(get(server.port, "/held-by-top?sleep=6")))
    slow.start()
    try:
        screen = top.wait_for(lambda s: row_of(s, "/held-by-top") is not None, 10, "the held request")
        held_row = row_of(screen, "/held-by-top")
        for _ in range(5):
            assert get(server.port, "/").status == 200
        top.wait_for(lambda s: requests_answered(s) >= before + 5, 10, f"more than {before + 4} requests answered")
    finally:
        slow.join(timeout=30)
    assert held and held[0].status == 200
    # The row was the worker that answered it, busy with it.
    fields = held_row.split()
    assert fields[0] == str(held[0].pid), held_row
    assert "busy" in fields and "GET" in fields, held_row

    top.press("q")
    assert top.exit_code(timeout=10) == 0
    assert restored(top.stty_file), top.stty_file.read_text()


@needs_tmux
def test_top_shows_what_each_thread_of_a_worker_is_busy_with(maitred_server, terminal):
    stats = free_port()
    server = maitred_server("-w", "1", "--threads", "2", "--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    top = terminal("--stats", f"{HOST}:{stats}")
    top.wait_for(lambda s: row_of(s, "thread 1") is not None, 15, "a line per thread")
    held: list[Reply] = []
    slow = threading.Thread(target=lambda: held.append(get(server.port, "/held-in-a-thread?sleep=3")))
    slow.start()
    try:
        screen = top.wait_for(lambda s: row_of(s, "/held-in-a-thread") is not None, 10, "the held request")
    finally:
        slow.join(timeout=30)
    assert held and held[0].status == 200
    threads = [line for line in screen.splitlines() if " thread " in line]
    assert len(threads) == 2, screen
    assert sum("/held-in-a-thread" in line for line in threads) == 1, screen
    assert sum(line.rstrip().endswith("-") for line in threads) == 1, "the other thread is free"
    top.press("q")
    assert top.exit_code(timeout=10) == 0


@needs_tmux
def test_top_shows_an_asgi_workers_admitted_requests_and_open_streams(maitred_server, terminal, tmp_path):
    """An ASGI worker's row counts its admitted requests (answers not started: docs/ASGI.md,
    "Streams and admission") and its open streams, beside its event loop's lag."""
    (tmp_path / "streams.py").write_text(PID_APP)
    stats = free_port()
    server = maitred_server("-w", "1", "--stats", f"{HOST}:{stats}", "streams:app", cwd=tmp_path)
    top = terminal("--stats", f"{HOST}:{stats}")
    screen = top.wait_for(lambda s: "STREAMS" in s, 15, "the ASGI columns")
    assert row_of(screen, "STREAMS").split()[4:7] == ["ADMIT", "STREAMS", "LAG"], screen

    def counts(screen: str) -> list[str]:
        """The worker's row's ADMIT and STREAMS: the row of a pid, a generation and a state."""
        rows = [line.split() for line in screen.splitlines() if re.match(r"\s*\d+ +\d+ +[a-z]", line)]
        return rows[0][4:6] if rows else []

    async def with_streams() -> str:
        streams = await open_streams(server.port, 30, every=1)
        seen = await asyncio.to_thread(top.wait_for, lambda s: counts(s) == ["0", "30"], 15, "30 streams")
        for _, writer in streams:
            writer.close()
        return seen

    asyncio.run(asyncio.wait_for(with_streams(), 30))
    top.press("q")
    assert top.exit_code(timeout=10) == 0


def test_top_and_the_live_page_name_the_states_and_exits_the_lobby_counts(maitred_server):
    """The lobby defines the names of worker states, connection states and exit reasons
    (worker/scoreboard.rs, observe/status.rs), and status.json carries every one, zeros too.
    top.py and the live page (status.js) keep only the order to show them in: each list names
    exactly the lobby's, so a state the lobby adds is not left to trail unordered."""
    stats = free_port()
    maitred_server("--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    status = status_of(stats)
    script = (ROOT / "crates/lobby/assets/status.js").read_text()

    def page_list(name: str) -> set[str]:
        (listed,) = re.findall(rf"^const {name} = \[(.*)\];$", script, re.MULTILINE)
        return set(re.findall(r'"([a-z_]+)"', listed))

    lobby = {
        "workers": set(status["workers"]),
        "connections": set(status["connections"]),
        "exits": set(status["worker_exits"]),
    }
    assert set(top.WORKER_STATES) == lobby["workers"] == page_list("WORKER_STATES")
    assert set(top.CONNECTION_STATES) == lobby["connections"] == page_list("CONNECTION_STATES")
    assert set(top.EXIT_REASONS) == lobby["exits"]


@needs_tmux
@pytest.mark.parametrize("listening", [False, True], ids=["nothing-listens", "listens-but-never-answers"])
def test_top_says_when_the_stats_address_does_not_answer_and_q_still_quits(terminal, listening):
    port = free_port()
    # Listening, it takes connections into its queue and never answers them.
    silent = socket.create_server((HOST, port), backlog=16) if listening else None
    try:
        top = terminal("--stats", f"{HOST}:{port}", "--interval", "0.5")
        said = f"{HOST}:{port} did not answer within" if listening else f"cannot reach {HOST}:{port}"
        screen = top.wait_for(lambda s: said in s, 15, said)
        assert "trying again every 0.5s; last answer: never" in screen
        # Silent: the next fetch started at once and hangs for seconds; q does not wait for it.
        top.press("q")
        assert top.exit_code(timeout=3) == 0
        assert restored(top.stty_file), top.stty_file.read_text()
    finally:
        if silent is not None:
            silent.close()


@needs_tmux
def test_top_shows_a_server_that_starts_after_it(maitred_server, terminal):
    stats = free_port()
    top = terminal("--stats", f"{HOST}:{stats}")
    top.wait_for(lambda s: f"cannot reach {HOST}:{stats}" in s, 15, "the stats address not reachable")
    server = maitred_server("--stats", f"{HOST}:{stats}", "echo:app", cwd=APPS)
    top.wait_for(lambda s: f"lobby pid {server.pid}" in s, 15, "the server once it listens")
    top.press("q")
    assert top.exit_code(timeout=10) == 0


@needs_tmux
def test_top_reads_a_unix_stats_address_and_fits_a_small_terminal(maitred_server, terminal, tmp_path):
    stats = tmp_path / "stats.sock"
    server = maitred_server("--stats", f"unix:{stats}", "echo:app", cwd=APPS)
    top = terminal("--stats", f"unix:{stats}")
    top.wait_for(lambda s: f"lobby pid {server.pid}" in s, 15, "the server's pid")
    top.resize(40, 6)
    screen = top.wait_for(lambda s: "more lines: enlarge the terminal" in s, 10, "the screen cut to 40x6")
    assert all(len(line) < 40 for line in screen.splitlines()), screen
    top.resize(WIDTH, HEIGHT)
    top.wait_for(lambda s: "PID" in s and "STATE" in s, 10, "the scoreboard again at full size")
    top.press("q")
    assert top.exit_code(timeout=10) == 0


def test_a_bad_stats_address_is_one_line_and_exit_code_2(run_maitred):
    finished = run_maitred("top", "--stats", "127.0.0.1:99999")
    assert finished.returncode == 2
    assert_one_error_line(finished.stderr, "--stats", "'99999'")
    finished = run_maitred("top")
    assert finished.returncode == 2
    assert_one_error_line(finished.stderr, "--stats")


def test_top_help_prints_its_usage(run_maitred):
    finished = run_maitred("top", "--help")
    assert finished.returncode == 0
    assert finished.stdout.startswith("usage: maitred top [-h] --stats ADDRESS [--interval SECONDS]")


def test_an_application_in_a_module_named_top_still_serves(maitred_server, app_dir):
    (app_dir / "top.py").write_text(HELLO)
    server = maitred_server("top:app", cwd=app_dir)
    reply = get(server.port, "/")
    assert (reply.status, reply.body) == (200, b"hello\n")
