"""Server hooks (docs/HOOKS.md): gunicorn's hook settings in a config file, each called in the
maitred process and at the moment the document gives, with the arguments hook code uses.

Every test runs real maitred with a config file whose hooks append one JSON line each (the
hook's name, os.getpid() and the arguments' attributes) to a file, drives the server over real
sockets and with real signals, and reads the lines back in the order they were written.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from client import get
from conftest import Server, eventually, free_port, wait_for_empty_group
from test_lifecycle import parent_of, wait_for_workers, worker_pids

APP = """
import os, time

def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/sleep":
        time.sleep(60)
    if path == "/crash":
        os._exit(7)
    body = str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
"""

# Every hook, as typical hook code writes them: the attributes it reads, `log` calls.
HOOKS = """
import json, os, sys

_RECORDS = {records!r}

def _record(hook, **fields):
    with open(_RECORDS, "a") as file:
        file.write(json.dumps({{"hook": hook, "pid": os.getpid(), **fields}}) + "\\n")

def _server(server):
    return dict(server_pid=server.pid, num_workers=server.num_workers, cfg_workers=server.cfg.workers)

def _worker(worker):
    return dict(worker_pid=worker.pid, ppid=worker.ppid, age=worker.age, alive=worker.alive)

def on_starting(server):
    server.log.info("on_starting: %d workers", server.num_workers)
    _record("on_starting", **_server(server))

def when_ready(server):
    server.log.info("when_ready: server %s is ready", server.pid)
    _record("when_ready", **_server(server))

def on_reload(server):
    _record("on_reload", **_server(server))

def pre_fork(server, worker):
    _record("pre_fork", **_server(server), **_worker(worker))

def post_fork(server, worker):
    worker.log.info("post_fork: worker %s spawned", worker.pid)
    _record("post_fork", **_server(server), **_worker(worker))

def post_worker_init(worker):
    _record("post_worker_init", app_loaded="app" in sys.modules, timeout=worker.cfg.timeout, **_worker(worker))

def worker_int(worker):
    worker.log.warning("worker_int: worker %s interrupted", worker.pid)
    _record("worker_int", **_worker(worker))

def worker_abort(worker):
    worker.log.error("worker_abort: worker %s aborted", worker.pid)
    _record("worker_abort", **_worker(worker))

def pre_exec(server):
    _record("pre_exec", **_server(server))

def pre_request(worker, req):
    worker.log.debug("%s %s", req.method, req.path)
    _record("pre_request", method=req.method, path=req.path, query=req.query, uri=req.uri,
            version=req.version, headers=req.headers, remote_addr=req.remote_addr, **_worker(worker))
    if req.path == "/pre-fails":
        raise RuntimeError("pre_request refuses " + req.path)

def post_request(worker, req, environ, resp):
    _record("post_request", path=req.path, path_info=environ["PATH_INFO"], status=resp.status,
            status_code=resp.status_code, headers=resp.headers, **_worker(worker))
    if req.path == "/post-fails":
        raise RuntimeError("post_request fails for " + req.path)

def child_exit(server, worker):
    _record("child_exit", **_server(server), **_worker(worker))

def worker_exit(server, worker):
    _record("worker_exit", **_server(server), **_worker(worker))

def nworkers_changed(server, new_value, old_value):
    _record("nworkers_changed", new=new_value, old=old_value, **_server(server))
    if old_value == 3:
        raise RuntimeError("nworkers_changed fails going down from 3")

def on_exit(server):
    _record("on_exit", **_server(server))
"""


def records(file: Path) -> list[dict]:
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text().splitlines()]


def named(file: Path, hook: str) -> list[dict]:
    return [record for record in records(file) if record["hook"] == hook]


def wait_for(file: Path, hook: str, count: int = 1, timeout: float = 15.0) -> list[dict]:
    """The records of `hook`, once there are at least `count` of them."""
    if not eventually(lambda: len(named(file, hook)) >= count, timeout):
        pytest.fail(f"{count} {hook} records not within {timeout} s: {records(file)}")
    return named(file, hook)


def matches(record: dict, **fields: object) -> bool:
    return all(record.get(key) == value for key, value in fields.items())


def the_record(file: Path, hook: str, **fields: object) -> dict:
    """The one record of `hook` with `fields`, once it is there: post_request, for one, is
    written after the client has its answer."""
    if not eventually(lambda: any(matches(r, **fields) for r in named(file, hook)), 10):
        pytest.fail(f"no {hook} record with {fields}: {records(file)}")
    (record,) = [r for r in named(file, hook) if matches(r, **fields)]
    return record


def index_of(file: Path, hook: str, **fields: object) -> int:
    """Where the first record of `hook` with `fields` is among all the records in `file`."""
    for position, record in enumerate(records(file)):
        if record["hook"] == hook and matches(record, **fields):
            return position
    pytest.fail(f"no {hook} record with {fields}: {records(file)}")


def zygote_of(server: Server) -> int:
    (zygote,) = {pid for pid in os.listdir("/proc") if pid.isdigit() and parent_of(int(pid)) == server.pid}
    return int(zygote)


def one_block(stderr: str, hook: str, error: str) -> bool:
    """The hook's traceback is in the log as one block: its line, then the traceback's lines
    with no other line between them."""
    pattern = (
        rf"\[ERROR\] the {hook} hook raised:\nTraceback \(most recent call last\):\n(?:  .*\n)+RuntimeError: {error}"
    )
    return re.search(pattern, stderr) is not None


def start(maitred_server, app_dir: Path, tmp_path: Path, *args: str) -> tuple[Server, Path]:
    path = tmp_path / "hooks.jsonl"
    (app_dir / "app.py").write_text(APP)
    (tmp_path / "hooks.conf.py").write_text(HOOKS.format(records=str(path)))
    server = maitred_server("-c", str(tmp_path / "hooks.conf.py"), *args, "app:app", cwd=app_dir)
    return server, path


def test_every_hook_runs_in_its_process_at_its_moment_with_gunicorns_arguments(maitred_server, app_dir, tmp_path):
    server, path = start(maitred_server, app_dir, tmp_path, "-w", "2", "--timeout", "2")
    lobby = server.pid
    first = wait_for_workers(server, 2)
    zygote = zygote_of(server)
    wait_for(path, "when_ready")

    # The start: nworkers_changed(2, None) and on_starting in the maitred command (the lobby to
    # be), pre_fork in the zygote, post_fork and post_worker_init in each worker, then
    # when_ready in the lobby.
    start_hooks = [(r["hook"], r["pid"]) for r in records(path)]
    assert start_hooks[:2] == [("nworkers_changed", lobby), ("on_starting", lobby)]
    assert start_hooks[-1] == ("when_ready", lobby)
    assert matches(named(path, "nworkers_changed")[0], new=2, old=None, num_workers=2)
    assert named(path, "on_starting")[0]["server_pid"] == lobby
    assert named(path, "on_starting")[0]["cfg_workers"] == 2
    forks = named(path, "pre_fork")
    assert [(f["pid"], f["age"], f["worker_pid"], f["num_workers"], f["server_pid"]) for f in forks] == [
        (zygote, 1, None, 2, lobby),
        (zygote, 2, None, 2, lobby),
    ]
    assert {(r["pid"], r["worker_pid"], r["ppid"], r["server_pid"]) for r in named(path, "post_fork")} == {
        (pid, pid, zygote, lobby) for pid in first
    }
    inits = named(path, "post_worker_init")
    assert {r["pid"] for r in inits} == first
    assert all(r["app_loaded"] and r["alive"] and r["timeout"] == 2.0 for r in inits)
    assert sorted(r["age"] for r in inits) == [1, 2]
    assert matches(named(path, "when_ready")[0], server_pid=lobby, num_workers=2)
    server.wait_for_log(f"[{lobby}] [INFO] when_ready: server {lobby} is ready", 10)
    for pid in first:
        server.wait_for_log(f"[{pid}] [INFO] post_fork: worker {pid} spawned", 10)

    # Requests: pre_request and post_request around each, in the worker that answers.
    reply = get(server.port, "/hello%20there?x=1&y=2")
    assert reply.status == 200
    answered_by = int(reply.body)
    pre = the_record(path, "pre_request", path="/hello%20there")
    assert pre["pid"] == answered_by
    assert (pre["method"], pre["query"], pre["uri"], pre["version"]) == (
        "GET",
        "x=1&y=2",
        "/hello%20there?x=1&y=2",
        [1, 1],
    )
    assert ["HOST", "test"] in pre["headers"]
    assert pre["remote_addr"][0] == "127.0.0.1" and isinstance(pre["remote_addr"][1], int)
    post = the_record(path, "post_request", path="/hello%20there")
    assert (post["pid"], post["path_info"], post["status"], post["status_code"]) == (
        answered_by,
        "/hello there",
        "200 OK",
        200,
    )
    assert ["Content-Type", "text/plain"] in post["headers"]
    assert index_of(path, "pre_request", path="/hello%20there") < index_of(path, "post_request", path="/hello%20there")

    # A pre_request that raises costs its request a 500 (as under gunicorn), and post_request
    # still runs; a post_request that raises costs nothing. Both tracebacks in one block each.
    assert get(server.port, "/pre-fails").status == 500
    post = the_record(path, "post_request", path="/pre-fails")
    assert (post["status"], post["status_code"], post["headers"]) == ("500 Internal Server Error", 500, [])
    assert get(server.port, "/post-fails").status == 200
    assert eventually(lambda: one_block(server.stderr(), "post_request", "post_request fails for /post-fails"), 5)
    server.wait_for_log("RuntimeError: pre_request refuses /pre-fails", 10)
    assert get(server.port, "/after").status == 200

    # SIGHUP: nworkers_changed and on_reload in the lobby, then the new workers are forked; the
    # old ones leave through worker_exit, and the lobby hears of them (child_exit).
    server.send_signal(signal.SIGHUP)
    second = set()

    def reloaded() -> bool:
        nonlocal second
        second = worker_pids(server)
        return len(second) == 2 and not second & first

    assert eventually(reloaded, 20), server.stderr()
    reload_at = index_of(path, "on_reload", pid=lobby)
    assert index_of(path, "nworkers_changed", pid=lobby, new=2, old=2) < reload_at
    assert reload_at < index_of(path, "pre_fork", age=3) < index_of(path, "post_fork", age=3)
    assert {r["pid"] for r in named(path, "post_fork") if r["age"] in (3, 4)} == second
    exits = wait_for(path, "child_exit", 2)
    assert {(r["pid"], r["worker_pid"], r["ppid"], r["alive"]) for r in exits} == {
        (lobby, pid, zygote, False) for pid in first
    }
    assert sorted(r["age"] for r in exits) == [1, 2]
    for pid in first:
        assert index_of(path, "worker_exit", pid=pid, worker_pid=pid, alive=False) < index_of(
            path, "child_exit", worker_pid=pid
        )

    # SIGTTIN and SIGTTOU: nworkers_changed in the lobby; the new worker's pre_fork sees three.
    # nworkers_changed raises going down from 3: logged, and the worker is retired all the same.
    server.send_signal(signal.SIGTTIN)
    wait_for(path, "post_worker_init", 5)
    assert matches(the_record(path, "nworkers_changed", new=3, old=2), pid=lobby, num_workers=3)
    assert named(path, "pre_fork")[-1]["num_workers"] == 3
    third = wait_for_workers(server, 3)
    server.send_signal(signal.SIGTTOU)
    wait_for_workers(server, 2)
    assert the_record(path, "nworkers_changed", new=2, old=3)["pid"] == lobby
    assert eventually(lambda: one_block(server.stderr(), "nworkers_changed", "nworkers_changed fails going down"), 5)
    (retired,) = third - worker_pids(server)
    assert the_record(path, "child_exit", worker_pid=retired)["pid"] == lobby
    assert index_of(path, "worker_exit", pid=retired) < index_of(path, "child_exit", worker_pid=retired)

    # --timeout: SIGABRT first, so worker_abort runs in the worker, then worker_exit; the client
    # gets its 504 and the lobby hears of the exit.
    reply = get(server.port, "/sleep", timeout=20)
    assert reply.status == 504
    (abort,) = wait_for(path, "worker_abort")
    stuck = abort["pid"]
    assert abort["worker_pid"] == stuck and abort["alive"] is False
    server.wait_for_log(f"[{stuck}] [ERROR] worker_abort: worker {stuck} aborted", 10)
    post = the_record(path, "post_request", path="/sleep")
    assert (post["pid"], post["status"], post["status_code"]) == (stuck, None, None)
    wait_for(path, "child_exit", 4)
    assert index_of(path, "worker_abort") < index_of(path, "worker_exit", pid=stuck)
    assert index_of(path, "worker_exit", pid=stuck) < index_of(path, "child_exit", worker_pid=stuck)

    # A crash: no worker_exit (the worker is gone at once, as under gunicorn), child_exit in
    # the lobby.
    before = wait_for_workers(server, 2)
    assert get(server.port, "/crash").status == 502
    (*_, crash_exit) = wait_for(path, "child_exit", 5)
    crashed = crash_exit["worker_pid"]
    assert crashed in before and crash_exit["pid"] == lobby
    assert [r for r in named(path, "worker_exit") if r["pid"] == crashed] == []

    # SIGINT to a worker (a Ctrl-C reaches every process): worker_int runs there, and the worker
    # serves on, since the lobby decides when a request is abandoned.
    interrupted = min(wait_for_workers(server, 2))
    os.kill(interrupted, signal.SIGINT)
    (record,) = wait_for(path, "worker_int")
    assert (record["pid"], record["worker_pid"], record["alive"]) == (interrupted, interrupted, False)
    server.wait_for_log(f"[{interrupted}] [WARNING] worker_int: worker {interrupted} interrupted", 10)
    time.sleep(0.2)  # a window for a negative check: the interrupted worker does not exit
    assert interrupted in worker_pids(server)

    # SIGQUIT to the lobby: as gunicorn's master, it passes SIGQUIT on; every worker runs
    # worker_int (once) and leaves through worker_exit; on_exit comes last, in the lobby.
    last = wait_for_workers(server, 2)
    server.send_signal(signal.SIGQUIT)
    assert server.wait(30) == 0, server.stderr()
    assert [r["pid"] for r in named(path, "worker_int")].count(interrupted) == 1
    assert {r["pid"] for r in named(path, "worker_int")} == last
    for pid in last:
        assert index_of(path, "worker_int", pid=pid) < index_of(path, "worker_exit", pid=pid)
    final = records(path)[-1]
    assert (final["hook"], final["pid"], final["server_pid"]) == ("on_exit", lobby, lobby)
    assert wait_for_empty_group(server.pid, 10) == []


def test_a_new_maitred_started_by_sigusr2_comes_after_pre_exec(maitred_server, app_dir, tmp_path):
    pid_file = tmp_path / "maitred.pid"
    server, path = start(maitred_server, app_dir, tmp_path, "--pid", str(pid_file))
    wait_for(path, "when_ready")
    server.send_signal(signal.SIGUSR2)
    assert server.wait(30) == 0, server.stderr()
    successor = int(pid_file.read_text())
    assert successor != server.pid
    pre_exec = index_of(path, "pre_exec", pid=server.pid, server_pid=server.pid)
    assert pre_exec < index_of(path, "on_starting", pid=successor)
    assert index_of(path, "when_ready", pid=successor) < index_of(path, "on_exit", pid=server.pid)
    os.kill(successor, signal.SIGTERM)
    wait_for(path, "on_exit", 2)
    assert records(path)[-1]["pid"] == successor
    assert wait_for_empty_group(server.pid, 10) == []


# A post_fork as real deployments write it: the application, imported once by --preload, opened
# a database connection; each worker must have its own, not share the one forked with it.
STORE = """
import os, sqlite3

DATABASE = {database!r}
connection = sqlite3.connect(DATABASE, isolation_level=None)
connection.execute("create table if not exists hits (pid integer)")
opened_in = os.getpid()

def reconnect():
    global connection, opened_in
    connection = sqlite3.connect(DATABASE, isolation_level=None)
    opened_in = os.getpid()

def app(environ, start_response):
    connection.execute("insert into hits values (?)", (os.getpid(),))
    body = f"{{os.getpid()}} {{opened_in}}".encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
"""

RECONNECTING = """
workers = 2
preload = True

def post_fork(server, worker):
    import store  # imported by --preload in the zygote, before the fork

    store.reconnect()
    worker.log.info("worker %s has its own database connection", worker.pid)

def post_request(worker, req):
    pass
"""


def test_a_post_fork_that_reopens_a_preloaded_resource_gives_each_worker_its_own(maitred_server, app_dir, tmp_path):
    database = tmp_path / "hits.sqlite"
    (app_dir / "store.py").write_text(STORE.format(database=str(database)))
    conf = tmp_path / "reconnect.conf.py"
    conf.write_text(RECONNECTING)
    server = maitred_server("-c", str(conf), "store:app", cwd=app_dir)
    workers = wait_for_workers(server, 2)
    seen = {}
    deadline = time.monotonic() + 15
    while set(seen) != workers and time.monotonic() < deadline:
        worker, opened_in = map(int, get(server.port).body.split())
        seen[worker] = opened_in
    assert seen == {pid: pid for pid in workers}, seen
    with sqlite3.connect(database) as db:
        rows = {pid for (pid,) in db.execute("select pid from hits")}
    assert rows == workers
    for pid in workers:
        server.wait_for_log(f"worker {pid} has its own database connection", 10)
    assert server.stop() == 0


@pytest.mark.parametrize(
    ("hook", "source", "message"),
    [
        (
            "on_starting",
            "def on_starting(server):\n    raise RuntimeError('no database')\n",
            "maitred: error: the on_starting hook raised an exception (its traceback is in the error log)",
        ),
        (
            "when_ready",
            "def when_ready(server):\n    raise RuntimeError('no database')\n",
            "maitred: error: the when_ready hook raised an exception (its traceback is in the error log)",
        ),
        (
            "post_worker_init",
            "def post_worker_init(worker):\n    raise RuntimeError('no database')\n",
            "maitred: error: the post_worker_init hook raised an exception (its traceback is in the error log)",
        ),
    ],
)
def test_a_hook_gunicorn_lets_stop_the_start_stops_it_with_one_line(
    run_maitred, app_dir, tmp_path, hook, source, message
):
    (app_dir / "app.py").write_text(APP)
    conf = tmp_path / "failing.conf.py"
    conf.write_text(source)
    finished = run_maitred("-c", str(conf), "--bind", f"127.0.0.1:{free_port()}", "app:app", cwd=app_dir)
    assert finished.returncode == 1, finished.stderr
    assert finished.stderr.rstrip().splitlines()[-1] == message
    assert one_block(finished.stderr, hook, "no database")
    assert finished.leftovers == []


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "def post_fork(server):\n    pass\n",
            "post_fork: the function must take (server, worker), but its signature is (server)",
        ),
        ("post_request = 5\n", "post_request: expected a function of (worker, req, environ, resp), got 5"),
        (
            "def post_request(worker):\n    pass\n",
            (
                "post_request: the function must take (worker, req) or (worker, req, environ) or "
                "(worker, req, environ, resp), but its signature is (worker)"
            ),
        ),
    ],
)
def test_a_hook_that_takes_the_wrong_arguments_is_refused_with_one_line(
    run_maitred, app_dir, tmp_path, source, message
):
    (app_dir / "app.py").write_text(APP)
    conf = tmp_path / "wrong.conf.py"
    conf.write_text(source)
    finished = run_maitred("-c", str(conf), "app:app", cwd=app_dir)
    assert finished.returncode == 2
    assert finished.stderr == f"maitred: error: config file {conf}: {message}\n"


def test_a_hook_cannot_be_given_on_the_command_line(run_maitred, app_dir):
    (app_dir / "app.py").write_text(APP)
    finished = run_maitred("--post-fork", "x", "app:app", cwd=app_dir)
    assert finished.returncode == 2
    assert "unknown option '--post-fork'" in finished.stderr
