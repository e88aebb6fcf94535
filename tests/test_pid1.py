"""maitred as PID 1, a container's command: it reaps the orphans the kernel gives it, and still
has its own children's exit statuses (docs/SIGNALS.md, "PID 1 and orphans").

Each test makes its own PID namespace (`unshare --pid --fork --mount-proc`, as root), in which
the lobby is PID 1; pids here are the test's view of them, from outside the namespace.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import HOST, _Launcher

APPS = Path(__file__).parent / "apps"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a PID namespace needs root and unshare(1)",
)


def _stat(pid: int) -> tuple[str, str, int] | None:
    """`pid`'s name, state and parent, or None once it is gone (reaped)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    state, parent = text[text.rindex(")") + 2 :].split()[:2]
    return name, state, int(parent)


def _children(parent: int, name: str | None = None) -> list[int]:
    """`parent`'s children (those named `name`, with one)."""
    found = []
    for entry in Path("/proc").iterdir():
        stat = _stat(int(entry.name)) if entry.name.isdigit() else None
        if stat and stat[2] == parent and name in (None, stat[0]):
            found.append(int(entry.name))
    return found


def _wait_for(what, timeout: float, message):
    deadline = time.monotonic() + timeout
    while not (result := what()):
        assert time.monotonic() < deadline, message()
        time.sleep(0.02)
    return result


@pytest.fixture
def pid1_server(tmp_path, maitred_command):
    """Starts maitred as PID 1 of a new PID namespace; returns the server and the lobby's pid."""
    launcher = _Launcher(["unshare", "--pid", "--fork", "--mount-proc", *maitred_command], tmp_path)

    def start(*args: str):
        server = launcher(*args, cwd=APPS)
        (lobby,) = _wait_for(lambda: _children(server.pid), 10, lambda: "unshare has no child")
        (namespaced,) = [
            line for line in Path(f"/proc/{lobby}/status").read_text().splitlines() if line.startswith("NSpid:")
        ]
        assert namespaced.split()[-1] == "1", namespaced
        return server, lobby

    yield start
    launcher.kill_all()


def test_as_pid_1_maitred_reaps_the_orphans_it_adopts(pid1_server):
    """20 requests each leave a background `sleep` whose parent has exited: all 20 are adopted
    by the lobby, and once they are killed none is left a zombie."""
    server, lobby = pid1_server("orphaning:app", "-w", "2")
    for _ in range(20):
        with urllib.request.urlopen(f"{server.url}/", timeout=10) as answer:
            assert answer.status == 200
    orphans = _wait_for(
        lambda: found if len(found := _children(lobby, "sleep")) == 20 else None,
        10,
        lambda: f"the lobby adopted {len(_children(lobby, 'sleep'))} of the 20 orphans",
    )
    for orphan in orphans:
        os.kill(orphan, signal.SIGKILL)

    def left() -> list[int]:
        return [pid for pid in orphans if _stat(pid) is not None]

    _wait_for(
        lambda: not left(),
        10,
        lambda: f"{len(left())} orphans left unreaped: {[_stat(pid) for pid in left()]}",
    )
    assert server.process.poll() is None
    os.kill(lobby, signal.SIGTERM)
    assert server.wait(30) == 0, server.stderr()


def test_as_pid_1_maitred_still_has_its_own_childrens_exit_statuses(pid1_server, tmp_path):
    """While it reaps every child, the exit code of the new maitred a SIGUSR2 starts (broken
    config: code 2) still reaches the log, and the zygote's exit is still seen at the stop."""
    config_file = tmp_path / "maitred.conf.py"
    config_file.write_text("workers = 1\n")
    server, lobby = pid1_server("-c", str(config_file), "echo:app")
    config_file.write_text("workers = 'many'\n")
    os.kill(lobby, signal.SIGUSR2)
    log = server.wait_for_log("this maitred goes on serving", timeout=30)
    assert "SIGUSR2: the new maitred exited with code 2 before it was ready" in log, log
    with socket.create_connection((HOST, server.port), timeout=10):
        pass
    os.kill(lobby, signal.SIGTERM)
    assert server.wait(30) == 0, server.stderr()
    assert "did not exit; killing it" not in server.stderr()
