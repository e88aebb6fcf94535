"""--reload (docs/SIGNALS.md, "--reload, for development"): a real maitred serving an
application from the test's own directory, whose files the test edits as an editor would, while
clients keep asking. Every answer must be a 200, from the old code until the new code serves."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import pytest
from client import get
from conftest import Server, wait_until
from test_signals import NO_PYC, Load, version_of, version_of_body

pytest.importorskip("watchfiles", reason="--reload needs watchfiles: make install installs it (maitred[reload])")

# The application imports its answer from a module of its own, so that the edited file is one
# the application imported rather than the module named on the command line.
APP = """\
import os

import message


def app(environ, start_response):
    body = f"{message.VERSION} {os.getpid()}\\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
"""

# An application whose answer is read, at import, from a data file that no module is.
DATA_APP = """\
from pathlib import Path

VERSION = Path("version.txt").read_text().strip()


def app(environ, start_response):
    body = f"{VERSION}\\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
"""

# The user a report is sent as in test_a_report_from_another_user_is_ignored.
NOBODY = 65534

# From the change to the first answer of the new code: the watcher waits for 0.1 s of quiet,
# then the new workers import the application.
WITHIN = 5.0


def edit(path: Path, text: str) -> None:
    """Saves `text` over the file in place, as many editors do: truncate, then write."""
    with open(path, "w") as file:
        file.write(text)


def serve_with_reload(maitred_server, app_dir: Path, *args: str) -> Server:
    (app_dir / "reloadable.py").write_text(APP)
    (app_dir / "message.py").write_text('VERSION = "v1"\n')
    server = maitred_server("--reload", *args, "reloadable:app", cwd=app_dir, env=NO_PYC)
    # The workers have told the watcher which files they imported.
    server.wait_for_log("--reload: watching", 10)
    return server


def first_answer_from(load: Load, version: str, timeout: float) -> float:
    wait_until(
        lambda: any(version_of_body(a.body) == version for a in load.answers()), timeout, f"answers from {version}"
    )
    return min(a.at for a in load.answers() if version_of_body(a.body) == version)


@pytest.mark.parametrize("preload", [False, True], ids=["fork", "preload"])
def test_an_edited_module_is_served_within_seconds_and_no_request_fails(maitred_server, app_dir, preload):
    server = serve_with_reload(maitred_server, app_dir, "-w", "2", *(["--preload"] if preload else []))
    with Load(server.port, clients=3) as load:
        wait_until(lambda: all(client.answers for client in load.clients), 10, "every load client answered")
        for reloads, version in enumerate(("v2", "v3"), start=1):
            edited = time.monotonic()
            edit(app_dir / "message.py", f"VERSION = {version!r}\n")
            assert first_answer_from(load, version, WITHIN) - edited < WITHIN
            # The next save comes once this reload is over, not during it.
            wait_until(lambda n=reloads: server.stderr().count("SIGHUP: reloaded:") == n, 10, f"reload {reloads}")
    assert load.failures() == []
    # Each client's answers come from ever newer code.
    for client in load.clients:
        versions = [int(version_of_body(a.body)[1:]) for a in client.answers]
        assert versions == sorted(versions)
    log = server.stderr()
    assert f"--reload: {(app_dir / 'message.py').resolve()} changed; reloading as SIGHUP does" in log
    # One save, one reload: the events of a save are taken together.
    assert log.count("SIGHUP: reloaded:") == 2, log
    assert server.stop() == 0


def test_a_syntax_error_keeps_the_old_code_serving_and_names_the_file(maitred_server, app_dir):
    server = serve_with_reload(maitred_server, app_dir, "-w", "2")
    message = app_dir / "message.py"
    with Load(server.port, clients=2) as load:
        wait_until(lambda: all(client.answers for client in load.clients), 10, "every load client answered")
        edit(message, "VERSION = (\n")
        server.wait_for_log("SIGHUP: reload abandoned", 10)
        log = server.stderr()
        assert (
            "SIGHUP: reload abandoned: a new worker could not load the application: importing reloadable raised "
            f"SyntaxError: '(' was never closed ({message}, line 1); the old workers keep serving"
        ) in log, log
        assert {version_of(get(server.port)) for _ in range(5)} == {"v1"}
        edit(message, 'VERSION = "v2"\n')
        first_answer_from(load, "v2", WITHIN)
    assert load.failures() == []
    assert server.stop() == 0


@pytest.mark.parametrize("preload", [False, True], ids=["fork", "preload"])
def test_a_new_module_that_fails_its_first_import_is_watched_until_it_is_fixed(maitred_server, app_dir, preload):
    server = serve_with_reload(maitred_server, app_dir, *(["--preload"] if preload else []))
    added = app_dir / "added.py"
    added.write_text("VERSION = (\n")
    edit(app_dir / "message.py", "from added import VERSION\n")
    server.wait_for_log(f"SyntaxError: '(' was never closed ({added}, line 1)", 10)
    assert version_of(get(server.port)) == "v1"
    # Only the new module is saved again: no module list named it, the failure did.
    edit(added, 'VERSION = "v2"\n')
    wait_until(lambda: version_of(get(server.port)) == "v2", WITHIN, "answers from v2")
    assert server.stop() == 0


def test_a_reload_extra_file_that_changes_reloads(maitred_server, app_dir):
    (app_dir / "data_app.py").write_text(DATA_APP)
    data = app_dir / "version.txt"
    data.write_text("v1\n")
    server = maitred_server("--reload", "--reload-extra-file", str(data), "data_app:app", cwd=app_dir, env=NO_PYC)
    server.wait_for_log("--reload: watching", 10)
    assert version_of(get(server.port)) == "v1"
    # A change to a file in a watched directory that is neither imported nor named reloads nothing.
    (app_dir / "notes.txt").write_text("not watched\n")
    edit(data, "v2\n")
    wait_until(lambda: version_of(get(server.port)) == "v2", WITHIN, "answers from v2")
    # The negative check waits for an event after it: a later change of the named file reloads
    # once more, and the watcher reads its changes in order, so a reload for notes.txt would
    # have come by then. Two reloads, not three: notes.txt brought none.
    (app_dir / "notes.txt").write_text("not watched, again\n")
    edit(data, "v3\n")
    wait_until(lambda: version_of(get(server.port)) == "v3", WITHIN, "answers from v3")
    # New workers answer a moment before the lobby logs the reload's end.
    wait_until(lambda: server.stderr().count("SIGHUP: reloaded:") >= 2, WITHIN, "the second reload's log line")
    assert server.stderr().count("SIGHUP: reloaded:") == 2, server.stderr()
    assert server.stop() == 0


def test_reload_extra_file_needs_reload_and_an_existing_file(run_maitred, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("x\n")
    without_reload = run_maitred("--reload-extra-file", str(data), "app:app")
    assert without_reload.returncode == 2
    assert without_reload.stderr == "maitred: error: --reload-extra-file is given without --reload, which it needs\n"
    missing = run_maitred("--reload", "--reload-extra-file", str(tmp_path / "nowhere.txt"), "app:app")
    assert missing.returncode == 2
    assert missing.stderr.startswith("maitred: error: argument --reload-extra-file: no such file: ")
    assert missing.stderr.count("\n") == 1


def test_a_report_from_another_user_is_ignored(maitred_server, app_dir):
    if os.geteuid() != 0:
        pytest.skip("sending a report as another user needs root")
    server = serve_with_reload(maitred_server, app_dir)
    # The watcher's abstract socket, named after the lobby's pid (/proc/net/unix lists it).
    (address,) = re.findall(rf"@(maitred-reload-{server.pid}-\w+)", Path("/proc/net/unix").read_text())
    other = app_dir / "other.txt"
    other.write_text("1\n")
    assert send_as(NOBODY, address, os.fsencode(other) + b"\n") == 0
    server.wait_for_log(f"--reload: ignored a report from user {NOBODY}, who is not this server's", 10)
    edit(other, "2\n")
    # The negative check waits for an event after it: an edit of a file the workers imported,
    # made after the one of other.txt, reloads, and the watcher reads its changes in order, so
    # other.txt's edit, had the ignored report made it watched, would have reloaded by then.
    edit(app_dir / "message.py", 'VERSION = "v2"\n')
    wait_until(lambda: version_of(get(server.port)) == "v2", WITHIN, "answers from v2")
    # New workers answer a moment before the lobby logs the reload's end.
    wait_until(lambda: "SIGHUP: reloaded:" in server.stderr(), WITHIN, "the reload's log line")
    assert "other.txt changed" not in server.stderr(), server.stderr()
    assert server.stderr().count("SIGHUP: reloaded:") == 1, server.stderr()
    assert server.stop() == 0


def send_as(uid: int, address: str, report: bytes) -> int:
    """Sends `report` to the abstract socket `address` from a child process running as `uid`;
    returns the child's exit code."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
                sender.sendto(report, b"\0" + address.encode())
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
