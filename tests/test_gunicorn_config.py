"""Configuration as gunicorn users set it (docs/GUNICORN.md): MAITRED_CMD_ARGS, WEB_CONCURRENCY,
PORT, ./maitred.conf.py, -c python:MODULE, --check-config, --print-config, a gunicorn config
file renamed, and --user, --group and --umask."""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

import pytest
import requests
from conftest import HOST, eventually, processes_in_group, workers_of
from maitred import config, gunicorn

ROOT = Path(__file__).resolve().parent.parent

GREETER = """\
import os

def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [os.environ.get("GREETING", "unset").encode()]
"""


@pytest.fixture
def clean_environment(monkeypatch, tmp_path):
    """In-process resolution in an empty directory, with none of the variables it reads."""
    for name in ("WEB_CONCURRENCY", "PORT", config.CMD_ARGS_VARIABLE, "LISTEN_PID", "LISTEN_FDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


# ---------------------------------------------------------------------------------------------
# Precedence: default (WEB_CONCURRENCY, PORT) < config file < MAITRED_CMD_ARGS < command line.


def test_precedence_is_gunicorns(clean_environment, tmp_path):
    clean_environment.setenv("WEB_CONCURRENCY", "2")
    clean_environment.setenv("PORT", "9100")
    clean_environment.setenv(config.CMD_ARGS_VARIABLE, "--timeout 7 --graceful-timeout '12' --log-level warning")
    (tmp_path / "conf.py").write_text("timeout = 5\nmax_requests = 10\nlog_level = 'debug'\n")
    settings = config.resolve(["-c", "conf.py", "--log-level", "error", "hello:app"])
    sources = settings[config.SOURCES]
    assert (settings["workers"], sources["workers"]) == (2, "WEB_CONCURRENCY")
    assert (settings["bind"], sources["bind"]) == (["0.0.0.0:9100"], "PORT")
    assert settings["max_requests"] == 10 and sources["max_requests"].startswith("config file ")
    assert (settings["timeout"], sources["timeout"]) == (7.0, config.CMD_ARGS_VARIABLE)
    assert (settings["graceful_timeout"], sources["graceful_timeout"]) == (12.0, config.CMD_ARGS_VARIABLE)
    assert (settings["log_level"], sources["log_level"]) == ("error", "command line")
    assert (settings["keep_alive"], sources["keep_alive"]) == (75.0, "default")


def test_web_concurrency_and_port_are_only_defaults(clean_environment, tmp_path):
    clean_environment.setenv("WEB_CONCURRENCY", "3")
    clean_environment.setenv("PORT", "9200")
    (tmp_path / "conf.py").write_text("workers = 5\nbind = '127.0.0.1:9300'\n")
    settings = config.resolve(["-c", "conf.py", "hello:app"])
    assert (settings["workers"], settings["bind"]) == (5, ["127.0.0.1:9300"])
    assert config.resolve(["-w", "4", "-b", "127.0.0.1:1", "hello:app"])["bind"] == ["127.0.0.1:1"]


def test_config_file_named_in_maitred_cmd_args_is_read_unless_the_command_line_names_one(clean_environment, tmp_path):
    (tmp_path / "env.py").write_text("workers = 6\n")
    (tmp_path / "cli.py").write_text("workers = 7\n")
    clean_environment.setenv(config.CMD_ARGS_VARIABLE, "-c env.py")
    assert config.resolve(["hello:app"])["workers"] == 6
    assert config.resolve(["-c", "cli.py", "hello:app"])["workers"] == 7


BAD_ENVIRONMENTS = {
    "WEB_CONCURRENCY not a number": ({"WEB_CONCURRENCY": "lots"}, ["WEB_CONCURRENCY:", "'lots'"]),
    "PORT out of range": ({"PORT": "70000"}, ["PORT:", "'70000'"]),
    "unclosed quote": ({config.CMD_ARGS_VARIABLE: "--timeout '5"}, [config.CMD_ARGS_VARIABLE, "quotation"]),
    "unknown option": ({config.CMD_ARGS_VARIABLE: "--wrokers 2"}, [config.CMD_ARGS_VARIABLE, "'--wrokers'"]),
    "bad value": ({config.CMD_ARGS_VARIABLE: "-w 0"}, [config.CMD_ARGS_VARIABLE, "-w/--workers"]),
    "an application": ({config.CMD_ARGS_VARIABLE: "other:app"}, [config.CMD_ARGS_VARIABLE, "'other:app'"]),
}


@pytest.mark.parametrize("environment, fragments", BAD_ENVIRONMENTS.values(), ids=BAD_ENVIRONMENTS)
def test_bad_environment_is_one_line_and_exit_2(run_maitred, tmp_path, environment, fragments):
    (tmp_path / "hello.py").write_text(GREETER)
    result = run_maitred("hello:app", env=environment, linger=0)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("maitred: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert result.leftovers == []


def test_maitred_cmd_args_and_web_concurrency_on_a_real_server(maitred_server, tmp_path):
    (tmp_path / "hello.py").write_text(GREETER)
    server = maitred_server(
        "hello:app",
        env={config.CMD_ARGS_VARIABLE: "-e 'GREETING=from the variable'", "WEB_CONCURRENCY": "3"},
    )
    assert requests.get(server.url, timeout=10).text == "from the variable"
    deadline = time.monotonic() + 20
    while len(processes_in_group(server.pid)) < 1 + 1 + 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(processes_in_group(server.pid)) == 1 + 1 + 3, "lobby, zygote and WEB_CONCURRENCY=3 workers"


def test_port_binds_every_interface(maitred_server, tmp_path):
    (tmp_path / "hello.py").write_text(GREETER)
    port = _free_port()
    server = maitred_server("hello:app", bind=False, port=port, env={"PORT": str(port)})
    assert requests.get(server.url, timeout=10).status_code == 200
    server.wait_for_log(f"0.0.0.0:{port}", 10)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return probe.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# Where the config file comes from: ./maitred.conf.py, -c FILE, -c python:MODULE.


def test_maitred_conf_py_in_the_working_directory_is_read(maitred_server, tmp_path):
    (tmp_path / "hello.py").write_text(GREETER)
    (tmp_path / "maitred.conf.py").write_text("env = ['GREETING=from ./maitred.conf.py']\n")
    server = maitred_server("hello:app")
    assert requests.get(server.url, timeout=10).text == "from ./maitred.conf.py"


def test_a_named_config_file_replaces_maitred_conf_py(clean_environment, tmp_path):
    (tmp_path / "maitred.conf.py").write_text("workers = 2\n")
    (tmp_path / "other.py").write_text("timeout = 9\n")
    settings = config.resolve(["-c", "other.py", "hello:app"])
    assert (settings["workers"], settings["timeout"]) == (1, 9.0)
    found = config.resolve(["hello:app"])
    assert found["workers"] == 2
    assert found[config.SOURCES]["config"] == "./maitred.conf.py in the working directory"


def test_config_module_from_pythonpath_with_wsgi_app(maitred_server, tmp_path):
    app_dir, modules = tmp_path / "app", tmp_path / "modules"
    (modules / "deploy").mkdir(parents=True)
    app_dir.mkdir()
    (app_dir / "hello.py").write_text(GREETER)
    (modules / "deploy" / "__init__.py").write_text("")
    (modules / "deploy" / "web.py").write_text(
        "import os\nwsgi_app = 'hello:app'\nraw_env = ['GREETING=' + os.environ['WHO']]\n"
    )
    server = maitred_server(
        "-c", "python:deploy.web", cwd=app_dir, env={"PYTHONPATH": str(modules), "WHO": "a config module"}
    )
    assert requests.get(server.url, timeout=10).text == "a config module"


def test_config_module_in_the_working_directory(clean_environment, tmp_path):
    (tmp_path / "settings_here.py").write_text("workers = 4\n")
    settings = config.resolve(["-c", "python:settings_here", "hello:app"])
    assert (settings["workers"], settings[config.SOURCES]["workers"]) == (4, "config module settings_here")


@pytest.mark.parametrize(
    "location, fragment",
    [
        ("python:no_such_module_here", "cannot import config module no_such_module_here"),
        ("python:not-a-name", "python:MODULE"),
        ("python:raising", "config module raising raised ZeroDivisionError"),
    ],
)
def test_bad_config_module_is_one_line(run_maitred, tmp_path, location, fragment):
    (tmp_path / "raising.py").write_text("workers = 1 / 0\n")
    result = run_maitred("-c", location, "hello:app", linger=0)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and fragment in result.stderr, result.stderr


# ---------------------------------------------------------------------------------------------
# A gunicorn config file, renamed.

GUNICORN_CONF = """\
import multiprocessing
import os

wsgi_app = "hello:app"
workers = int(os.environ.get("APP_WORKERS", multiprocessing.cpu_count()))
worker_class = "gthread"
threads = 4
keepalive = 5
timeout = 20
graceful_timeout = 10
accesslog = os.environ["LOG_DIR"] + "/access.log"
errorlog = "-"
loglevel = "info"
preload_app = True
raw_env = ["GREETING=from gunicorn.conf.py"]
pidfile = os.environ["LOG_DIR"] + "/app.pid"
proc_name = "myapp"
daemon = False
keyfile = None
forwarded_allow_ips = "*"
access_log_format = '%(h)s "%(r)s" %(s)s %({user-agent}i)s'
limit_request_line = 4094

def post_fork(server, worker):
    server.log.info("forked %s", worker.pid)

def when_ready(server):
    server.log.info("ready with %s workers", server.num_workers)
"""


def test_gunicorn_config_file_renamed_works(maitred_server, tmp_path):
    (tmp_path / "hello.py").write_text(GREETER)
    (tmp_path / "maitred.conf.py").write_text(GUNICORN_CONF)
    server = maitred_server(env={"APP_WORKERS": "2", "LOG_DIR": str(tmp_path)})
    # From a proxy forwarded_allow_ips trusts (any), the client's address is the forwarded one.
    forwarded = {"X-Forwarded-For": "203.0.113.9", "User-Agent": "probe/1"}
    assert requests.get(server.url, headers=forwarded, timeout=10).text == "from gunicorn.conf.py"
    assert (tmp_path / "app.pid").read_text().strip() == str(server.pid)
    deadline = time.monotonic() + 10
    while not (tmp_path / "access.log").exists() or "GET / " not in (tmp_path / "access.log").read_text():
        assert time.monotonic() < deadline, "no access-log line"
        time.sleep(0.05)
    assert (tmp_path / "access.log").read_text().splitlines()[0] == '203.0.113.9 "GET / HTTP/1.1" 200 probe/1'
    warnings = [line for line in server.stderr().splitlines() if " is ignored: " in line]
    ignored = sorted(re.search(r"config file \S+: (\w+) is ignored: ", line)[1] for line in warnings)
    # One line each for what maitred cannot honour; none for what it does (threads), for hooks,
    # or for values that ask for nothing maitred does not do (worker_class "gthread", daemon
    # False, keyfile None).
    assert ignored == ["proc_name"], server.stderr()
    # The hooks ran where gunicorn runs them, with the arguments its documentation shows.
    server.wait_for_log("ready with 2 workers", 10)
    assert eventually(lambda: server.stderr().count("forked ") >= 2, 10), server.stderr()
    # threads = 4: each worker serves with four threads. A worker says it is ready on every
    # channel, then starts the threads of all but the first: they may come just after the line.
    for worker in workers_of(server.pid, 2):
        threads = f"/proc/{worker}/task"
        assert eventually(lambda threads=threads: len(os.listdir(threads)) >= 4, 10), os.listdir(threads)


def test_gunicorn_names_map_to_maitreds(clean_environment, tmp_path):
    (tmp_path / "conf.py").write_text(
        "keepalive = 5\naccesslog = '-'\nerrorlog = '-'\nloglevel = 'debug'\npreload_app = True\n"
        "raw_env = ['A=1']\npidfile = 'app.pid'\n"
    )
    settings = config.resolve(["-c", "conf.py", "hello:app"])
    assert settings["keep_alive"] == 5.0
    assert (settings["access_logfile"], settings["log_level"], settings["preload"]) == ("-", "debug", True)
    assert settings["env"] == ["A=1"] and settings["pid"] == str(tmp_path / "app.pid")
    (tmp_path / "both.py").write_text("keepalive = 5\nkeep_alive = 6\n")
    with pytest.raises(config.UsageError, match="sets both 'keepalive' and 'keep_alive'"):
        config.resolve(["-c", "both.py", "hello:app"])


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("import ssl\ndef ssl_context(conf, default):\n    return default()\n", "ssl_context cannot be honoured"),
    ],
)
def test_settings_that_would_be_dangerous_to_ignore_are_refused(clean_environment, tmp_path, source, fragment):
    (tmp_path / "conf.py").write_text(source)
    with pytest.raises(config.UsageError, match=fragment):
        config.resolve(["-c", "conf.py", "hello:app"])


def test_every_gunicorn_setting_is_classified_consistently():
    names = [setting.name for setting in gunicorn.GUNICORN_SETTINGS]
    assert len(names) == len(set(names)) >= 119
    for setting in gunicorn.GUNICORN_SETTINGS:
        ours = config.BY_NAME.get(setting.name)
        if setting.verdict is gunicorn.Verdict.SAME:
            assert ours is not None, f"{setting.name}: SAME, but maitred has no such setting"
            assert set(setting.flags) <= set(ours.flags), f"{setting.name}: gunicorn's flags are not all maitred's"
        elif setting.verdict is gunicorn.Verdict.HOOK:
            assert ours is not None and ours.hook, f"{setting.name}: a hook, but not maitred's"
        else:
            assert ours is None, f"{setting.name} is maitred's own name: it cannot also be {setting.verdict}"
        if setting.verdict is gunicorn.Verdict.MAPPED:
            assert setting.target == "app" or setting.target in config.BY_NAME
        if setting.verdict in (gunicorn.Verdict.IGNORED, gunicorn.Verdict.REFUSED, gunicorn.Verdict.HOOK):
            assert setting.why, f"{setting.name}: no reason given"


def test_gunicorn_flags_maitred_ignores_are_taken_with_a_warning(maitred_server, tmp_path):
    """gunicorn's Docker advice, --worker-tmp-dir /dev/shm, and the other flags of settings a
    config file gets a warning for: the command line and MAITRED_CMD_ARGS get the same."""
    (tmp_path / "hello.py").write_text(GREETER)
    server = maitred_server(
        *("--worker-tmp-dir", "/dev/shm", "-k", "sync", "--daemon", "hello:app"),
        cwd=tmp_path,
        env={config.CMD_ARGS_VARIABLE: "--reuse-port"},
    )
    log = server.wait_for_log("--reuse-port (gunicorn's reuse_port) is ignored", timeout=10)
    warnings = [
        line.split("[WARNING] ", 1)[1] for line in log.splitlines() if "[WARNING] " in line and "gunicorn's" in line
    ]
    reuse_port = gunicorn.BY_NAME["reuse_port"].why
    tmp_dir = gunicorn.BY_NAME["worker_tmp_dir"].why
    daemon = gunicorn.BY_NAME["daemon"].why
    assert warnings == [
        f"MAITRED_CMD_ARGS: --reuse-port (gunicorn's reuse_port) is ignored: {reuse_port}",
        f"command line: --worker-tmp-dir (gunicorn's worker_tmp_dir) is ignored: {tmp_dir}",
        f"command line: --daemon (gunicorn's daemon) is ignored: {daemon}",
    ], log
    assert "keep no heartbeat file" in tmp_dir
    assert requests.get(f"http://{HOST}:{server.port}/", timeout=10).status_code == 200


def test_every_gunicorn_flag_maitred_ignores_is_taken_on_the_command_line(clean_environment):
    for theirs in gunicorn.IGNORED_WITH_FLAGS:
        for flag in theirs.flags:
            words = [flag] if theirs.flag_sets is not None else [flag, "something maitred does not do"]
            given = theirs.flag_sets if theirs.flag_sets is not None else words[1]
            warnings = config.resolve([*words, "hello:app"])[config.WARNINGS]
            expected = f"command line: {flag} (gunicorn's {theirs.name}) is ignored: {theirs.why}"
            assert warnings == ([] if gunicorn.asks_nothing_more(theirs, given) else [expected]), flag
    # A value that asks for nothing more is taken silently, as in a config file.
    assert config.resolve(["-k", "sync", "--reload-engine", "auto", "hello:app"])[config.WARNINGS] == []


def test_gunicorn_md_migration_table_matches_the_table():
    document = (ROOT / "docs" / "GUNICORN.md").read_text()
    begin, end = "<!-- gunicorn-settings:begin -->\n", "<!-- gunicorn-settings:end -->"
    assert begin in document and end in document, "docs/GUNICORN.md lacks the table markers"
    table = document.split(begin, 1)[1].split(end, 1)[0].strip()
    expected = gunicorn.markdown_table()
    assert table == expected, "docs/GUNICORN.md's table is out of date; replace it with:\n" + expected


# ---------------------------------------------------------------------------------------------
# --check-config and --print-config.


def test_check_config_good(run_maitred, tmp_path):
    (tmp_path / "hello.py").write_text(GREETER)
    (tmp_path / "maitred.conf.py").write_text("workers = 2\n")
    result = run_maitred("--check-config", "hello:app", linger=0)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert result.leftovers == []


@pytest.mark.parametrize(
    "args, environment, fragment",
    [
        (["hello:missing"], {}, "missing"),
        (["nothere:app"], {}, "nothere"),
        (["-c", "bad.py", "hello:app"], {}, "wrkers"),
        (["hello:app"], {config.CMD_ARGS_VARIABLE: "--timeout never"}, "--timeout"),
    ],
    ids=["no such callable", "no such module", "bad config file", "bad MAITRED_CMD_ARGS"],
)
def test_check_config_bad_is_one_line_and_exit_1(run_maitred, tmp_path, args, environment, fragment):
    (tmp_path / "hello.py").write_text(GREETER)
    (tmp_path / "bad.py").write_text("wrkers = 2\n")
    result = run_maitred("--check-config", *args, env=environment, linger=0)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("maitred: error: ") and fragment in lines[0], result.stderr
    assert result.leftovers == []


def test_print_config_says_each_value_and_where_it_came_from(run_maitred, tmp_path):
    (tmp_path / "hello.py").write_text(GREETER)
    (tmp_path / "maitred.conf.py").write_text("workers = 3\nkeepalive = 4\n")
    result = run_maitred(
        "--print-config",
        "--log-level",
        "debug",
        "hello:app",
        env={"PORT": "9400", config.CMD_ARGS_VARIABLE: "--umask 0027", "WEB_CONCURRENCY": "8"},
        linger=0,
    )
    assert (result.returncode, result.stderr) == (0, "")
    lines = {line.split(" = ")[0].strip(): line for line in result.stdout.splitlines()}
    assert set(lines) == {"app"} | {setting.name for setting in config.SETTINGS}
    conf = str(tmp_path / "maitred.conf.py")
    assert lines["app"].endswith("= 'hello:app'  # command line")
    assert lines["workers"].endswith(f"= 3  # config file {conf}")
    assert lines["keep_alive"].endswith(f"= 4.0  # config file {conf}")
    assert lines["bind"].endswith("= ['0.0.0.0:9400']  # PORT")
    assert lines["umask"].endswith(f"= 0o027  # {config.CMD_ARGS_VARIABLE}")
    assert lines["log_level"].endswith("= 'debug'  # command line")
    assert lines["timeout"].endswith("= 30.0  # default")
    assert lines["config"].endswith(f"= {conf!r}  # ./maitred.conf.py in the working directory")


# ---------------------------------------------------------------------------------------------
# --user, --group, --umask.


def _ids(pid: int, field: str) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return [int(value) for value in line.split()[1:]]
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _free_privileged_port() -> int:
    for port in range(1023, 600, -1):
        with socket.socket() as probe:
            try:
                probe.bind((HOST, port))
            except OSError:
                continue
            return port
    pytest.skip("no free port below 1024 on 127.0.0.1")


@pytest.fixture
def shared_directory():
    """A directory in /tmp that the unprivileged user can enter and write (pytest's own are
    root's alone), removed at the end."""
    path = Path(tempfile.mkdtemp(prefix="maitred-privileges-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


WRITER = """\
import os

def app(environ, start_response):
    path = os.path.join(os.environ["OUT_DIR"], "written")
    with open(path, "w") as file:
        file.write("x")
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"wrote"]
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_user_group_and_umask(maitred_server, shared_directory):
    try:
        nobody, nogroup = pwd.getpwnam("nobody").pw_uid, grp.getgrnam("nogroup").gr_gid
    except KeyError:
        pytest.skip("no user 'nobody' or group 'nogroup' on this machine")
    (shared_directory / "writer.py").write_text(WRITER)
    privileged = _free_privileged_port()
    sock_path = shared_directory / "app.sock"
    server = maitred_server(
        "--user",
        "nobody",
        "--group",
        "nogroup",
        "--umask",
        "0027",
        "-w",
        "2",
        "-b",
        f"{HOST}:{privileged}",
        "-b",
        f"unix:{sock_path}",
        "-e",
        f"OUT_DIR={shared_directory}",
        "writer:app",
        cwd=shared_directory,
    )
    assert requests.get(server.url, timeout=10).text == "wrote"
    assert requests.get(f"http://{HOST}:{privileged}/", timeout=10).text == "wrote"
    written = (shared_directory / "written").stat()
    assert (written.st_uid, written.st_gid) == (nobody, nogroup)
    assert stat.S_IMODE(written.st_mode) == 0o640, oct(written.st_mode)
    assert sock_path.stat().st_uid == nobody, "the Unix socket is handed to --user, as gunicorn does"
    deadline = time.monotonic() + 20
    while len(processes_in_group(server.pid)) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    processes = processes_in_group(server.pid)
    assert server.pid in processes and len(processes) == 4, "lobby, zygote and two workers"
    for pid in processes:
        assert _ids(pid, "Uid") == [nobody] * 4, f"pid {pid}"
        assert _ids(pid, "Gid") == [nogroup] * 4, f"pid {pid}"
        assert _ids(pid, "Groups") == [nogroup], f"pid {pid}: supplementary groups dropped"


def test_a_user_or_group_that_cannot_be_had_is_one_line(run_maitred, tmp_path):
    if os.geteuid() == 0:
        # Root can switch; ask for a switch nobody can make: root's uid with no such group.
        result = run_maitred("--user", "root", "--group", "no-such-group-here", "hello:app", linger=0)
        assert result.returncode == 2 and "no such group: 'no-such-group-here'" in result.stderr
        return
    result = run_maitred("--user", "0", "--group", "0", "hello:app", linger=0)
    assert result.returncode == 1 and "needs maitred to be started as root" in result.stderr


def test_umask_is_read_as_gunicorn_reads_it(clean_environment):
    for text, mask in (("0022", 0o22), ("0o027", 0o27), ("18", 18), ("0x12", 0x12), ("0", 0)):
        assert config.resolve(["--umask", text, "hello:app"])["umask"] == mask
    with pytest.raises(config.UsageError, match="file-mode mask"):
        config.resolve(["--umask", "0999", "hello:app"])


def test_user_alone_means_its_primary_group(clean_environment):
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    settings = config.resolve(["--user", "nobody", "hello:app"])
    assert (settings["user"], settings["group"]) == (entry.pw_uid, entry.pw_gid)
    assert config.lobby_settings(settings)["drop_to"] == (entry.pw_uid, entry.pw_gid, [entry.pw_gid])
    with_groups = config.lobby_settings(config.resolve(["--user", "nobody", "--initgroups", "hello:app"]))
    assert with_groups["drop_to"][2] == sorted(set(os.getgrouplist("nobody", entry.pw_gid)))
    with pytest.raises(config.UsageError, match="give --group too"):
        config.resolve(["--user", "4000000000", "hello:app"])


def test_sighup_imports_a_config_module_again(clean_environment, tmp_path):
    module = tmp_path / "reloaded_settings.py"
    module.write_text("timeout = 5\n")
    argv = ["-c", "python:reloaded_settings", "hello:app"]
    started = config.resolve(argv)
    reread = config.rereader(argv, started, lambda settings: None)
    assert reread is not None
    # A different size as well as a later time: the import system's cache compares both.
    module.write_text("timeout = 25.5\n")
    os.utime(module, (time.time() + 5, time.time() + 5))
    lobby, kept = reread()
    assert (lobby["timeout"], kept) == (25.5, [])
