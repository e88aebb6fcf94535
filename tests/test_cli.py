"""The `maitred` command: settings, errors, the config file, app loading and the zygote."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import requests
from conftest import HOST, accepts_connections, free_port, wait_for_empty_group
from maitred import __version__, _native, config
from maitred.app import AppLoadError, load_app

ROOT = Path(__file__).resolve().parent.parent

HELLO = """\
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello\\n"]
"""


def assert_one_error_line(stderr: str, *fragments: str) -> None:
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    assert lines[0].startswith("maitred: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"


# ---------------------------------------------------------------------------------------------
# Bad command lines and config files: one line, exit 2, nothing started.

BAD_COMMAND_LINES = {
    "unknown flag": (["--bogus", "hello:app"], ["unknown option '--bogus'"]),
    "misspelt flag": (["--worker", "2", "hello:app"], ["'--worker'", "--workers"]),
    "bad int": (["-w", "many", "hello:app"], ["-w/--workers", "'many'"]),
    "negative workers": (["-w", "-1", "hello:app"], ["-w/--workers", "'-1'"]),
    "zero workers": (["--workers", "0", "hello:app"], ["-w/--workers", "at least 1"]),
    "bad float": (["--timeout", "soon", "hello:app"], ["-t/--timeout", "'soon'"]),
    "zero timeout": (["--timeout", "0", "hello:app"], ["-t/--timeout", "greater than 0"]),
    "infinite keep-alive": (["--keep-alive", "inf", "hello:app"], ["--keep-alive", "'inf'"]),
    "negative backlog": (["--backlog", "-5", "hello:app"], ["--backlog", "'-5'"]),
    "limit beyond the wire": (
        ["--limit-request-line", "70000", "hello:app"],
        ["--limit-request-line", "65535"],
    ),
    "no header fields at all": (
        ["--limit-request-fields", "0", "hello:app"],
        ["--limit-request-fields", "from 1 to 65535"],
    ),
    "bad log level": (["--log-level", "loud", "hello:app"], ["--log-level", "'loud'"]),
    "WebSocket message over the wire's 64 MiB": (
        ["--ws-max-size", str((64 << 20) + 1), "hello:app"],
        ["--ws-max-size", "from 1 to 67108864"],
    ),
    "zero WebSocket seats": (["--websocket-seats", "0", "hello:app"], ["--websocket-seats", "from 1 to 64"]),
    "zero ping timeout": (["--ws-ping-timeout", "0", "hello:app"], ["--ws-ping-timeout", "greater than 0"]),
    "env without =": (["-e", "DEBUG", "hello:app"], ["-e/--env", "KEY=VALUE"]),
    "missing chdir": (["--chdir", "/nonexistent/dir", "hello:app"], ["--chdir", "/nonexistent"]),
    "pid file in a missing directory": (
        ["-p", "/nonexistent/dir/maitred.pid", "hello:app"],
        ["-p/--pid", "/nonexistent/dir"],
    ),
    "access log is a directory": (["--access-logfile", "/", "hello:app"], ["is a directory"]),
    "missing config file": (["-c", "/nonexistent/conf.py", "hello:app"], ["-c/--config"]),
    "missing app": ([], ["no application given"]),
    "two apps": (["hello:app", "other:app"], ["unexpected argument 'other:app'"]),
    "app as a file path": (["examples/hello.py:app"], ["--chdir examples hello:app"]),
    "bad app spec": (["hello:app-v2"], ["'app-v2' is not a Python name"]),
    "bind: IPv4 with three parts": (["-b", "1.2.3:80", "hello:app"], ["'1.2.3'"]),
    "bind: IPv6 without brackets": (["-b", "::1:8000", "hello:app"], ["brackets"]),
    "bind: bad IPv6": (["-b", "[::g]:8000", "hello:app"], ["not an IPv6 address"]),
    "bind: port too big": (["-b", "127.0.0.1:65536", "hello:app"], ["'65536'"]),
    "bind: port not a number": (["-b", "127.0.0.1:http", "hello:app"], ["'http'"]),
    "bind: empty": (["-b", "", "hello:app"], ["''"]),
    "bind: bad host name": (["-b", "under_score:80", "hello:app"], ["'under_score'"]),
    "bind: unix socket in a missing directory": (
        ["-b", "unix:/nonexistent/dir/s.sock", "hello:app"],
        ["/nonexistent/dir"],
    ),
    "bind: unix socket path too long": (
        ["-b", "unix:/tmp/" + "s" * 120, "hello:app"],
        ["longer than 107 bytes"],
    ),
    "bind: fd not a number": (["-b", "fd://three", "hello:app"], ["fd://N"]),
    "bind: fd not open": (["-b", "fd://987", "hello:app"], ["987 is not open"]),
    "bind: twice": (
        ["-b", "127.0.0.1:9", "-b", "127.0.0.1:9", "hello:app"],
        ["given twice: 127.0.0.1:9"],
    ),
}


@pytest.mark.parametrize("args, fragments", BAD_COMMAND_LINES.values(), ids=BAD_COMMAND_LINES)
def test_bad_command_line_is_one_line_and_exit_2(run_maitred, app_dir, args, fragments):
    (app_dir / "hello.py").write_text(HELLO)
    result = run_maitred(*args, cwd=app_dir, linger=0)
    assert result.returncode == 2
    assert result.stdout == ""
    assert_one_error_line(result.stderr, *fragments)
    assert result.leftovers == []


BAD_CONFIG_FILES = {
    "syntax error": ("workers = 2\nbind = [\n", ["line 2"]),
    "unknown setting": ("wrkers = 2\n", ["unknown setting 'wrkers'", "'workers'"]),
    "gunicorn's name misspelt": ("acesslog = '-'\n", ["unknown setting 'acesslog'", "'accesslog'"]),
    "a gunicorn setting that maitred cannot honour safely": (
        "def ssl_context(conf, default):\n    return default()\n",
        ["ssl_context cannot be honoured", "rustls"],
    ),
    "bad value": ("workers = 0\n", ["workers: expected a whole number of at least 1, or auto, got '0'"]),
    "wrong type": ("workers = [2]\n", ["workers:", "list"]),
    "bool for a number": ("timeout = True\n", ["timeout:", "True"]),
    "bad bind in a list": ("bind = ['127.0.0.1:80', 'nowhere:port']\n", ["bind:", "'port'"]),
    "raises": (
        "import os\nworkers = int(os.environ['NO_SUCH_VARIABLE'])\n",
        ["KeyError", "NO_SUCH_VARIABLE", "line 2"],
    ),
    "a misspelt server hook": (
        "def post_forks(server, worker):\n    pass\n",
        ["unknown setting 'post_forks'", "'post_fork'"],
    ),
    "sys.exit": ("import sys\nsys.exit(3)\n", ["SystemExit: 3", "line 2"]),
}


@pytest.mark.parametrize("source, fragments", BAD_CONFIG_FILES.values(), ids=BAD_CONFIG_FILES)
def test_bad_config_file_is_one_line_and_exit_2(run_maitred, app_dir, source, fragments):
    (app_dir / "hello.py").write_text(HELLO)
    (app_dir / "maitred.conf.py").write_text(source)
    result = run_maitred("-c", "maitred.conf.py", "hello:app", cwd=app_dir, linger=0)
    assert result.returncode == 2
    assert_one_error_line(result.stderr, "maitred.conf.py", *fragments)
    assert result.leftovers == []


# ---------------------------------------------------------------------------------------------
# An application that cannot be loaded: found by the zygote (--preload) or by the first worker,
# reported by the lobby as one line; the server exits 1 and leaves nothing behind.

BAD_APPS = {
    "unimportable module": ("nosuchmodule:app", None, ["no module named 'nosuchmodule'"]),
    "module raising at import": (
        "broken:app",
        "import os\nraise RuntimeError('database is down')\n",
        ["RuntimeError: database is down", "broken.py, line 2"],
    ),
    "module importing a missing module": (
        "needy:app",
        "import nosuchdependency\n",
        ["importing needy raised ModuleNotFoundError", "nosuchdependency"],
    ),
    "missing callable": ("hello:application2", HELLO, ["no attribute 'application2'"]),
    "default callable missing": ("hello", HELLO, ["no attribute 'application'", "'app'"]),
    "non-callable attribute": (
        "config_only:app",
        "app = {'debug': True}\n",
        ["config_only.app is a dict"],
    ),
}


@pytest.mark.parametrize("preload", [False, True], ids=["in the worker", "preloaded"])
@pytest.mark.parametrize("spec, source, fragments", BAD_APPS.values(), ids=BAD_APPS)
def test_application_that_cannot_load_stops_the_server(run_maitred, app_dir, spec, source, fragments, preload):
    if source is not None:
        (app_dir / f"{spec.partition(':')[0]}.py").write_text(source)
    port = free_port()
    args = ["-b", f"{HOST}:{port}", "-w", "2", *(["--preload"] if preload else []), spec]
    result = run_maitred(*args, cwd=app_dir)
    assert result.returncode == 1
    assert_one_error_line(result.stderr, *fragments)
    assert result.leftovers == []
    assert not accepts_connections(port)


# ---------------------------------------------------------------------------------------------
# --help, --version and the README.


def test_help_lists_every_flag_with_its_default(maitred_command):
    result = subprocess.run([*maitred_command, "--help"], check=False, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert result.stderr == ""
    text = " ".join(result.stdout.split())  # undo the line wrapping
    for setting in config.SETTINGS:
        for flag in setting.flags:
            assert re.search(rf"(^|[ ,]){re.escape(flag)}\b", text), flag
        default = " ".join(f"(default: {setting.shown_default})".split())
        assert default in text, f"{setting.name}: {default!r} missing from --help"


def test_version(maitred_command):
    result = subprocess.run([*maitred_command, "--version"], check=False, capture_output=True, text=True, timeout=30)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"maitred {__version__}\n", "")


def test_python_dash_m_is_the_same_command():
    result = subprocess.run(
        [sys.executable, "-m", "maitred", "-w", "none", "hello:app"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert_one_error_line(result.stderr, "-w/--workers")


def test_readme_flag_table_matches_the_settings():
    readme = (ROOT / "README.md").read_text()
    begin, end = "<!-- flags:begin -->\n", "<!-- flags:end -->"
    assert begin in readme and end in readme, "README.md lacks the flag table markers"
    table = readme.split(begin, 1)[1].split(end, 1)[0].strip()
    expected = config.markdown_table()
    assert table == expected, "README.md's flag table is out of date; replace it with:\n" + expected


# ---------------------------------------------------------------------------------------------
# Settings resolution and the lobby's contract, in process.


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda lobby: lobby.update(not_a_setting=1), "the lobby reads no setting named not_a_setting"),
        (lambda lobby: lobby.pop("max_body"), "setting 'max_body' is missing"),
        (lambda lobby: lobby.pop("certfile"), "setting 'certfile' is missing"),
    ],
    ids=["a key the lobby does not read", "an optional key missing", "a TLS key missing without TLS"],
)
def test_the_lobby_takes_exactly_the_settings_the_cli_gives(monkeypatch, tmp_path, change, error):
    """The settings cross from Python to Rust by name (maitred.config.lobby_settings, and
    crates/python/src/serve.rs): a name on one side only is an error at start, before the lobby
    takes a descriptor, not a setting silently dropped or left unset."""
    monkeypatch.chdir(tmp_path)
    lobby = config.lobby_settings(config.resolve(["hello:app"]))
    change(lobby)
    with pytest.raises(ValueError, match=re.escape(error)):
        _native.serve(lobby, -1, 0, {})


def test_defaults_and_the_settings_dict_for_the_lobby(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    settings = config.resolve(["hello:app"])
    lobby = config.lobby_settings(settings)
    assert lobby == {
        "bind": ["127.0.0.1:8000"],
        "workers": 1,
        "threads": 1,
        "worker_connections": 32,
        "backlog": None,
        "timeout": 30.0,
        "graceful_timeout": 30.0,
        "lobby_timeout": 30.0,
        "keep_alive": 75.0,
        "http_protocols": ["h1", "h2"],
        "http2_max_concurrent_streams": 100,
        "header_timeout": 10.0,
        "body_min_rate": 500,
        "send_timeout": 60.0,
        "max_spill": 1 << 30,
        "max_spill_total": 4 << 30,
        "max_head_memory": 64 << 20,
        "limit_request_line": 8190,
        "limit_request_fields": 100,
        "limit_request_field_size": 8190,
        "ws_max_size": 16 << 20,
        "ws_ping_interval": 20.0,
        "ws_ping_timeout": 20.0,
        "ws_per_message_deflate": True,
        "max_requests": 0,
        "max_requests_jitter": 0,
        "max_worker_memory": 0,
        "max_worker_lifetime": None,
        "max_worker_lifetime_jitter": 0.0,
        "access_logfile": None,
        "access_log_format": '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"',
        "error_logfile": "-",
        "log_level": "info",
        "max_body": None,
        "queue_timeout": None,
        "queue_policy": "adaptive",
        "request_deadline": None,
        "half_close": "abandon",
        "wsgi_chunked_body": "stream",
        "max_connections": None,
        "stats": None,
        "forwarded_allow_ips": ["127.0.0.1", "::1"],
        "secure_scheme_headers": {"X-FORWARDED-PROTOCOL": "ssl", "X-FORWARDED-PROTO": "https", "X-FORWARDED-SSL": "on"},
        "proxy_protocol": "off",
        "proxy_allow_ips": ["127.0.0.1", "::1"],
        "certfile": None,
        "keyfile": None,
        "ca_certs": None,
        "cert_reqs": "none",
        "ciphers": None,
        "preload": False,
        "app": "hello:app",
        "plain_binds": [],
        "drop_to": None,
    }
    for key in ("timeout", "graceful_timeout", "keep_alive", "header_timeout"):
        assert type(lobby[key]) is float
    assert settings["preload"] is False
    assert settings["env"] == []
    assert settings["error_logfile"] == "-"


def test_every_value_converted_for_the_lobby(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    listener = socket.socket()
    fd = listener.fileno()
    try:
        settings = config.resolve(
            [
                "-b",
                "localhost",
                "-b",
                ":8080",
                "-b",
                "[::1]:8443",
                "-b",
                "unix:run/../s.sock",
                "-b",
                f"fd://{fd}",
                "--backlog",
                "100",
                "-t",
                "2.5",
                "--keep-alive",
                "0",
                "--queue-timeout",
                "1",
                "--max-body",
                "0",
                "--max-connections",
                "10",
                "--access-logfile",
                "access.log",
                "--log-level",
                "DEBUG",
                "hello:create_app()",
            ]
        )
    finally:
        listener.close()
    lobby = config.lobby_settings(settings)
    assert lobby["bind"] == [
        "localhost:8000",
        "0.0.0.0:8080",
        "[::1]:8443",
        f"unix:{tmp_path}/s.sock",
        f"fd://{fd}",
    ]
    assert (lobby["backlog"], lobby["timeout"], lobby["keep_alive"]) == (100, 2.5, 0.0)
    assert (lobby["queue_timeout"], lobby["max_body"], lobby["max_connections"]) == (1.0, 0, 10)
    assert lobby["access_logfile"] == str(tmp_path / "access.log")
    assert lobby["log_level"] == "debug"
    assert lobby["app"] == "hello:create_app()"


def test_zero_line_and_field_size_limits_mean_no_limit(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    settings = config.resolve(["--limit-request-line", "0", "--limit-request-field_size", "0", "hello:app"])
    lobby = config.lobby_settings(settings)
    assert (lobby["limit_request_line"], lobby["limit_request_field_size"]) == (0, 0)
    (tmp_path / "conf.py").write_text("limit_request_line = 0\nlimit_request_field_size = 0\n")
    from_file = config.resolve(["-c", "conf.py", "hello:app"])
    assert (from_file["limit_request_line"], from_file["limit_request_field_size"]) == (0, 0)


def test_zero_limits_leave_only_the_head_ceiling(maitred_server, app_dir):
    (app_dir / "hello.py").write_text(HELLO)
    server = maitred_server(
        "--limit-request-line",
        "0",
        "--limit-request-field_size",
        "0",
        "hello:app",
        cwd=app_dir,
    )
    # Far beyond the default limits, inside the 64 KiB head ceiling, which still holds.
    long_target = "/" + "a" * 20000
    response = requests.get(server.url + long_target, headers={"X-Long": "b" * 40000}, timeout=20)
    assert (response.status_code, response.text) == (200, "hello\n")
    assert requests.get(server.url + "/" + "a" * 70000, timeout=20).status_code == 414
    too_big = requests.get(server.url, headers={"X-Long": "b" * 70000}, timeout=20)
    assert too_big.status_code == 431


def test_command_line_overrides_config_file_overrides_default(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf.py").write_text(
        textwrap.dedent("""\
        import multiprocessing
        from os import cpu_count
        workers = 3
        timeout = 5
        bind = "0.0.0.0:9000"
        env = ["A=1", "B=two=2"]
        preload = True
        max_body = None
        _private_helper = 42
    """)
    )
    settings = config.resolve(["-c", "conf.py", "-w", "4", "hello:app"])
    assert settings["workers"] == 4  # command line
    assert settings["timeout"] == 5.0  # config file
    assert settings["bind"] == ["0.0.0.0:9000"]
    assert settings["env"] == ["A=1", "B=two=2"]
    assert settings["preload"] is True
    assert settings["keep_alive"] == 75.0  # default


# ---------------------------------------------------------------------------------------------
# load_app, in process.


@pytest.fixture
def module_dir(monkeypatch, tmp_path):
    """cwd for load_app; sys.path and the modules it imports are restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def unique_module(directory: Path, source: str) -> str:
    name = f"app_{uuid.uuid4().hex}"
    (directory / f"{name}.py").write_text(textwrap.dedent(source))
    return name


def test_load_app_forms(module_dir):
    name = unique_module(
        module_dir,
        """\
        def application(environ, start_response): pass
        def app(environ, start_response): pass
        def create_app():
            return app
        class Holder:
            wsgi = app
    """,
    )
    assert load_app(name).__name__ == "application"
    assert load_app(f"{name}:app").__name__ == "app"
    assert load_app(f"{name}:create_app()").__name__ == "app"
    assert load_app(f"{name}:Holder.wsgi").__name__ == "app"


def test_load_app_looks_in_the_current_directory_first(module_dir, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    name = f"app_{uuid.uuid4().hex}"
    (elsewhere / f"{name}.py").write_text("def other(environ, start_response): pass\n")
    (module_dir / f"{name}.py").write_text("def here(environ, start_response): pass\n")
    sys.path.insert(0, str(elsewhere))
    assert load_app(f"{name}:here").__name__ == "here"
    assert sys.path[0] == str(module_dir)


@pytest.mark.parametrize(
    "source, attribute, message",
    [
        ("x = 1\n", "app", "has no attribute 'app'"),
        ("app = 'hello'\n", "app", ".app is a str, not a WSGI application"),
        ("def make(): raise ValueError('no config')\n", "make()", "ValueError: no config"),
        ("def make(): return None\n", "make()", ".make() is a NoneType"),
        ("raise SystemExit(3)\n", "app", "called sys.exit(3)"),
        ("def app(:\n", "app", "SyntaxError"),
    ],
)
def test_load_app_errors_are_one_line(module_dir, source, attribute, message):
    name = unique_module(module_dir, source)
    with pytest.raises(AppLoadError) as raised:
        load_app(f"{name}:{attribute}")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_load_app_missing_module(module_dir):
    with pytest.raises(AppLoadError, match=r"^no module named 'no_such_module_here' \(looked in "):
        load_app("no_such_module_here:app")


# ---------------------------------------------------------------------------------------------
# The zygote, driven over a real control channel (docs/PROTOCOL.md section 1).

ZYGOTE = """\
import functools, socket, sys
from maitred import log, zygote
from maitred.app import load_app
log.configure(sys.argv[4])  # debug: the line that says the zygote waits for its last worker
control = socket.socket(fileno=int(sys.argv[1]))
settings = {
    "preload": sys.argv[3] == "preload",
    "graceful_timeout": 5.0,
    "timeout": 30.0,
    "capture_output": "auto",
    "interface": "auto",
    "loop": "asyncio",
    "gc_freeze": True,
    "gc_threshold": 2000,
}
sys.exit(zygote.run(control, settings, functools.partial(load_app, sys.argv[2])))
"""


class ZygoteProcess:
    def __init__(self, app_dir: Path, spec: str, preload: bool, level: str = "info") -> None:
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.control.settimeout(20)
        self.process = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE, str(theirs.fileno()), spec, "preload" if preload else "lazy", level],
            cwd=app_dir,
            pass_fds=[theirs.fileno()],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        theirs.close()

    def receive(self) -> tuple[list[str], list[int]]:
        message, fds, _, _ = socket.recv_fds(self.control, 4096, 64)
        return message.decode().split(" "), fds

    def spawn(self, slot: int) -> tuple[int, socket.socket]:
        self.control.send(f"spawn {slot} 1 1".encode())
        fields, fds = self.receive()
        assert fields[:2] == ["spawned", str(slot)] and len(fds) == 1, fields
        channel = socket.socket(fileno=fds[0])
        channel.settimeout(20)
        return int(fields[2]), channel


def read_until(stream, text: str, timeout: float = 20) -> str:
    """What `stream` (a pipe) gives until `text` has come, within `timeout` seconds."""
    got = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in got:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {text!r} within {timeout} s: {got.decode(errors='replace')}"
        if select.select([stream], [], [], remaining)[0]:
            chunk = os.read(stream.fileno(), 65536)
            assert chunk, f"the stream ended before {text!r}: {got.decode(errors='replace')}"
            got += chunk
    return got.decode()


def read_frame(channel: socket.socket) -> tuple[int, bytes]:
    def exactly(count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = channel.recv(count - len(data))
            assert chunk, "channel closed mid-frame"
            data += chunk
        return data

    kind, _flags, _reserved, length = struct.unpack("<BBHI", exactly(8))
    return kind, exactly(length)


@pytest.fixture
def zygotes():
    started: list[ZygoteProcess] = []
    yield started
    for zygote in started:
        zygote.control.close()
        try:
            os.killpg(zygote.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        zygote.process.wait(timeout=10)


@pytest.mark.parametrize("preload", [False, True], ids=["lazy", "preload"])
def test_zygote_spawns_kills_reaps_and_exits_after_the_lobby(app_dir, zygotes, preload):
    (app_dir / "hello.py").write_text(HELLO)
    zygote = ZygoteProcess(app_dir, "hello:app", preload, level="debug")
    zygotes.append(zygote)
    first_pid, first = zygote.spawn(0)
    second_pid, second = zygote.spawn(1)
    for pid, channel in ((first_pid, first), (second_pid, second)):
        kind, payload = read_frame(channel)
        assert (kind, struct.unpack("<I", payload[:4])[0]) == (1, pid)  # READY from that pid

    # Ctrl-C and SIGTERM reach the whole group; the zygote and the workers stay.
    os.killpg(zygote.process.pid, signal.SIGTERM)
    os.killpg(zygote.process.pid, signal.SIGINT)
    zygote.control.send(f"kill {second_pid} {int(signal.SIGKILL)}".encode())
    assert zygote.receive() == (["exited", str(second_pid), "signal", str(int(signal.SIGKILL))], [])
    first.close()  # a worker exits 0 at end-of-file of its channel
    assert zygote.receive() == (["exited", str(first_pid), "code", "0"], [])

    third_pid, third = zygote.spawn(2)
    assert read_frame(third)[0] == 1
    zygote.control.send(b"kill 1 9")  # not its child: ignored
    zygote.control.send(b"nonsense")  # malformed: logged and ignored
    zygote.control.close()
    # The zygote has seen the lobby go, and waits: the event that proves it did not exit.
    waiting = f"the lobby has gone; waiting for its workers to exit (pids {third_pid})"
    stderr = read_until(zygote.process.stderr, waiting)
    assert zygote.process.poll() is None, "the zygote must wait for its last worker"
    third.close()
    assert zygote.process.wait(timeout=20) == 0
    assert wait_for_empty_group(zygote.process.pid, 5) == []
    stderr += zygote.process.stderr.read().decode()
    assert 'malformed control message "nonsense"' in stderr


def test_zygote_gives_a_worker_a_channel_per_thread(app_dir, zygotes):
    (app_dir / "hello.py").write_text(HELLO)
    zygote = ZygoteProcess(app_dir, "hello:app", preload=False)
    zygotes.append(zygote)
    # spawn SLOT WORKERS THREADS CONNECTIONS: a WSGI application gets a channel per thread.
    zygote.control.send(b"spawn 0 1 3")
    fields, fds = zygote.receive()
    assert fields[:2] == ["spawned", "0"] and len(fds) == 3, (fields, fds)
    channels = [socket.socket(fileno=fd) for fd in fds]
    for channel in channels:
        channel.settimeout(20)
        kind, payload = read_frame(channel)
        # READY from that pid, its flags saying WSGI.
        assert (kind, payload) == (1, struct.pack("<IB", int(fields[2]), 0))
    # The worker goes once the lobby has let go of every channel.
    for channel in channels:
        channel.close()
    assert zygote.receive() == (["exited", fields[2], "code", "0"], [])


def test_zygote_gives_an_asgi_worker_one_channel_whatever_its_connections(app_dir, zygotes):
    # The zygote imports the application once in a child, to tell its interface, and keeps
    # none of it. An ASGI worker carries every request on one channel (docs/PROTOCOL.md,
    # section 4): 8 worker connections and 3 threads still make one.
    (app_dir / "hello_asgi.py").write_text("async def app(scope, receive, send):\n    pass\n")
    zygote = ZygoteProcess(app_dir, "hello_asgi:app", preload=False)
    zygotes.append(zygote)
    zygote.control.send(b"spawn 0 1 3")
    fields, fds = zygote.receive()
    assert fields[:2] == ["spawned", "0"] and len(fds) == 1, (fields, fds)
    (channel,) = [socket.socket(fileno=fd) for fd in fds]
    channel.settimeout(20)
    kind, payload = read_frame(channel)
    assert (kind, payload) == (1, struct.pack("<IB", int(fields[2]), 1))  # READY, ASGI
    channel.close()
    assert zygote.receive() == (["exited", fields[2], "code", "0"], [])


def test_zygote_reports_a_failed_preload(app_dir, zygotes):
    (app_dir / "hello.py").write_text(HELLO)
    zygote = ZygoteProcess(app_dir, "hello:nothing", preload=True)
    zygotes.append(zygote)
    fields, fds = zygote.receive()
    assert fields[0] == "failed" and fds == []
    assert " ".join(fields[1:]).startswith("module hello has no attribute 'nothing'")
    assert zygote.process.wait(timeout=20) == 1
    assert zygote.process.stderr.read() == b""  # the lobby reports it, nobody else


def test_worker_that_cannot_load_the_app_reports_boot_failed(app_dir, zygotes):
    (app_dir / "hello.py").write_text(HELLO)
    zygote = ZygoteProcess(app_dir, "hello:nothing", preload=False)
    zygotes.append(zygote)
    pid, channel = zygote.spawn(0)
    kind, payload = read_frame(channel)
    assert kind == 2  # BOOT_FAILED
    assert payload.decode().startswith("module hello has no attribute 'nothing'")
    fields, _ = zygote.receive()
    assert fields[:3] == ["exited", str(pid), "code"] and fields[3] != "0"


# ---------------------------------------------------------------------------------------------
# A real server: the fixture, the pid file, the error log, -e and --chdir.


def test_serves_and_stops_on_sigterm_removing_its_pid_file(maitred_server, app_dir, tmp_path):
    (app_dir / "greet.py").write_text(
        textwrap.dedent("""\
        import os
        def app(environ, start_response):
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [os.environ["GREETING"].encode()]
    """)
    )
    pid_file = tmp_path / "maitred.pid"
    error_log = tmp_path / "error.log"
    server = maitred_server(
        "--chdir",
        str(app_dir),
        "-e",
        "GREETING=bonjour",
        "-p",
        str(pid_file),
        "--error-logfile",
        str(error_log),
        "-w",
        "2",
        "greet:app",
    )
    response = requests.get(server.url, timeout=20)
    assert (response.status_code, response.text) == (200, "bonjour")
    assert pid_file.read_text() == f"{server.pid}\n"
    assert server.stop(timeout=30) == 0
    assert not pid_file.exists()
    assert wait_for_empty_group(server.pid, 10) == []
    assert server.stderr() == ""  # everything went to --error-logfile
    assert error_log.read_text() != ""
