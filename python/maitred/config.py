"""maitred's settings: one table, read from the command line and from a config file.

Every setting is one row of `SETTINGS`. The row gives the name (used in config files and as the
key of the resolved settings), the command-line flags, the parser that turns text into a value
(and rejects bad text with a specific message), the default and the help. The argument parser,
the config-file reader, ``--help`` and the README's flag table are all made from these rows, so
they cannot disagree.

Precedence: built-in default < config file (``-c``) < command line.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import math
import os
import re
import stat
import types
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from maitred import __version__, _native, hooks
from maitred.app import AppLoadError, parse_spec

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

# The worker channel carries the request-target and header names as `str16` and the header
# count as `u16` (docs/PROTOCOL.md section 2), so no request limit may exceed 65535. A limit of
# 0 (none of its own) is safe too: the lobby never takes a head larger than 64 KiB
# (crates/protocol MAX_HEAD_SIZE), and no target or name that fits in one reaches 65535 bytes.
WIRE_LIMIT = 65535

# Longest path that fits in `sockaddr_un.sun_path` (108 bytes with the terminating NUL).
UNIX_PATH_MAX = 107

DEFAULT_PORT = 8000


class UsageError(Exception):
    """A setting is missing or malformed; str(error) is one line for the operator."""


# ---------------------------------------------------------------------------------------------
# Parsers: text -> value, raising ValueError with a message that names what was expected.


def _whole_number(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    expected = (
        f"a whole number from {minimum} to {maximum}"
        if maximum is not None
        else f"a whole number of at least {minimum}"
    )

    def parse(text: str) -> int:
        if not re.fullmatch(r"[0-9]+", text):
            raise ValueError(f"expected {expected}, got {text!r}")
        value = int(text)
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(f"expected {expected}, got {text!r}")
        return value

    return parse


def _seconds(*, allow_zero: bool) -> Callable[[str], float]:
    expected = "a number of seconds" + (" (0 or more)" if allow_zero else " greater than 0")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"expected {expected}, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise ValueError(f"expected {expected}, got {text!r}")
        return value

    return parse


def _existing_parent(path: str) -> str:
    """Makes `path` absolute (relative to the directory maitred was started in) and checks
    that the directory that will hold it exists and that it is not itself a directory."""
    absolute = os.path.abspath(path)
    parent = os.path.dirname(absolute)
    if not os.path.isdir(parent):
        raise ValueError(f"directory {parent!r} does not exist (for {path!r})")
    if os.path.isdir(absolute):
        raise ValueError(f"{path!r} is a directory")
    return absolute


def _file_path(text: str) -> str:
    if not text:
        raise ValueError("expected a file path, got ''")
    return _existing_parent(text)


def _log_destination(text: str) -> str:
    """'-' for the process's own standard stream, or a file path."""
    return text if text == "-" else _file_path(text)


# gunicorn's default access-log format, and maitred's: the combined log format.
ACCESS_LOG_FORMAT = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'


def _access_log_format(text: str) -> str:
    """A format the lobby can write. The lobby owns the format's grammar
    (crates/lobby/src/access_format.rs): this asks it, so that a wrong format is refused here,
    with one line, rather than when the lobby starts or reloads."""
    _native.check_access_log_format(text)
    return text


def _existing_directory(text: str) -> str:
    if not os.path.isdir(text):
        raise ValueError(f"no such directory: {text!r}")
    return os.path.abspath(text)


def _existing_file(text: str) -> str:
    if not os.path.isfile(text):
        raise ValueError(f"no such file: {text!r}")
    return os.path.abspath(text)


def _log_level(text: str) -> str:
    level = text.lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


def _environment_pair(text: str) -> str:
    key, sep, _ = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    if "\0" in text:
        raise ValueError(f"an environment variable cannot contain a NUL byte: {text!r}")
    return text


_HOSTNAME_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def _port(text: str, address: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", text) or int(text) > 65535:
        raise ValueError(f"bad port in {address!r}: expected 0 to 65535, got {text!r}")
    return int(text)


def _bind_address(text: str) -> str:
    """Checks one listen address and returns it in canonical form: ``HOST:PORT``,
    ``[IPV6]:PORT``, ``unix:/ABSOLUTE/PATH`` or ``fd://N``. A missing port means 8000, a
    missing host 0.0.0.0."""
    if not text:
        raise ValueError("expected HOST:PORT, [IPV6]:PORT, unix:PATH or fd://N, got ''")
    if text.startswith("unix:"):
        path = text[len("unix:") :]
        if not path:
            raise ValueError(f"expected unix:PATH, got {text!r}")
        absolute = _existing_parent(path)
        if len(os.fsencode(absolute)) > UNIX_PATH_MAX:
            raise ValueError(f"unix socket path {absolute!r} is longer than {UNIX_PATH_MAX} bytes")
        return f"unix:{absolute}"
    if text.startswith("fd://"):
        digits = text[len("fd://") :]
        if not re.fullmatch(r"[0-9]+", digits):
            raise ValueError(f"expected fd://N with N a file descriptor number, got {text!r}")
        fd = int(digits)
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            raise ValueError(f"{text!r}: file descriptor {fd} is not open") from None
        if not stat.S_ISSOCK(mode):
            raise ValueError(f"{text!r}: file descriptor {fd} is not a socket")
        return f"fd://{fd}"
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket:
            raise ValueError(f"missing ']' in {text!r}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in {text!r} is not an IPv6 address") from None
        if rest and not rest.startswith(":"):
            raise ValueError(f"expected [IPV6]:PORT, got {text!r}")
        port = _port(rest[1:], text) if rest else DEFAULT_PORT
        return f"[{host}]:{port}"
    host, colon, port_text = text.rpartition(":")
    if not colon:
        host, port_text = text, str(DEFAULT_PORT)
    if ":" in host:
        raise ValueError(f"an IPv6 address needs brackets, as in [::1]:8000; got {text!r}")
    if not host:
        host = "0.0.0.0"  # ":PORT" means every IPv4 interface, as in gunicorn
    if not all(_HOSTNAME_LABEL.fullmatch(label) for label in host.removesuffix(".").split(".")):
        raise ValueError(f"{host!r} in {text!r} is neither an IPv4 address nor a host name")
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in {text!r} is not an IPv4 address") from None
    return f"{host}:{_port(port_text, text)}"


def _stats_address(text: str) -> str:
    """A stats listener's address: a --bind address, but not an inherited descriptor."""
    address = _bind_address(text)
    if address.startswith("fd://"):
        raise ValueError(f"expected HOST:PORT or unix:PATH, got {text!r}")
    return address


# ---------------------------------------------------------------------------------------------
# The table.


@dataclass(frozen=True)
class Setting:
    section: str
    """The heading it is listed under in --help."""
    name: str
    """The config-file name and the key in the resolved settings."""
    flags: tuple[str, ...]
    metavar: str | None
    """None for an on/off flag, which takes no value."""
    parse: Callable[[Any], object] | None
    """Text -> value; for a hook, the config file's function -> the function to call."""
    default: object
    help: str
    default_text: str | None = None
    """How the default reads in --help and the README, when str(default) would not say it."""
    repeatable: bool = False
    """Each use of the flag adds a value; the setting is a list."""
    for_lobby: bool = True
    """The lobby (maitred._native.serve) receives this setting."""
    file_settable: bool = True
    hook: bool = False
    """A server hook (docs/HOOKS.md): a function, set only in a config file."""

    @property
    def is_flag(self) -> bool:
        return self.metavar is None

    @property
    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if isinstance(self.default, tuple):
            return " ".join(self.default)
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "listening",
        "bind",
        ("-b", "--bind"),
        "ADDRESS",
        _bind_address,
        ("127.0.0.1:8000",),
        "Address to listen on: HOST:PORT, [IPV6]:PORT, unix:PATH or fd://N (an inherited "
        "listening socket). Repeat the flag to listen on several. Under socket activation (LISTEN_FDS, "
        "docs/SYSTEMD.md) the sockets passed are served instead.",
        repeatable=True,
    ),
    Setting(
        "listening",
        "backlog",
        ("--backlog",),
        "INT",
        _whole_number(1, 2**31 - 1),
        None,
        "Length of the listen queue. The kernel caps it at net.core.somaxconn; the log says what was granted.",
        default_text="net.core.somaxconn",
    ),
    Setting(
        "listening",
        "max_connections",
        ("--max-connections",),
        "INT",
        _whole_number(1),
        None,
        "Most client connections held open at once.",
        default_text="as many as the file-descriptor limit allows",
    ),
    Setting(
        "listening",
        "stats",
        ("--stats",),
        "ADDRESS",
        _stats_address,
        None,
        "Address of the stats listener, HOST:PORT or unix:PATH: Prometheus metrics at /metrics "
        "(docs/METRICS.md), answered by the lobby without touching a worker. Keep it off the "
        "public network.",
        default_text="off",
    ),
    Setting(
        "workers",
        "workers",
        ("-w", "--workers"),
        "INT",
        _whole_number(1),
        1,
        "Number of worker processes running the application.",
    ),
    Setting(
        "workers",
        "timeout",
        ("-t", "--timeout"),
        "SECONDS",
        _seconds(allow_zero=False),
        30.0,
        "A worker busy with one request for longer than this is killed and replaced.",
    ),
    Setting(
        "workers",
        "graceful_timeout",
        ("--graceful-timeout",),
        "SECONDS",
        _seconds(allow_zero=True),
        30.0,
        "On SIGTERM or SIGINT, how long requests in progress may run before their workers are killed.",
    ),
    Setting(
        "workers",
        "max_requests",
        ("--max-requests",),
        "INT",
        _whole_number(0),
        0,
        "Replace a worker after it has served this many requests (0: never).",
    ),
    Setting(
        "workers",
        "max_requests_jitter",
        ("--max-requests-jitter",),
        "INT",
        _whole_number(0),
        0,
        "Add a random 0 to N to each worker's --max-requests, so that workers do not all restart at once.",
    ),
    Setting(
        "workers",
        "max_worker_memory",
        ("--max-worker-memory",),
        "MB",
        _whole_number(0),
        0,
        "Replace a worker whose resident memory is above this many megabytes (MiB) after a request: it takes "
        "no further request (0: no limit).",
    ),
    Setting(
        "workers",
        "max_worker_lifetime",
        ("--max-worker-lifetime",),
        "SECONDS",
        _seconds(allow_zero=False),
        None,
        "Replace a worker after it has served for this long: once it has answered the request it holds, "
        "at once if it is idle.",
        default_text="off",
    ),
    Setting(
        "workers",
        "max_worker_lifetime_jitter",
        ("--max-worker-lifetime-jitter",),
        "SECONDS",
        _seconds(allow_zero=True),
        0.0,
        "Add a random 0 to N seconds to each worker's --max-worker-lifetime, so that workers do not all "
        "restart at once.",
    ),
    Setting(
        "workers",
        "preload",
        ("--preload",),
        None,
        None,
        False,
        "Import the application once, before forking the workers.",
        default_text="off",
    ),
    Setting(
        "requests",
        "keep_alive",
        ("--keep-alive",),
        "SECONDS",
        _seconds(allow_zero=True),
        75.0,
        "How long an idle keep-alive connection is held open (0: close after each response). "
        "An idle connection costs no worker; keep this above your proxy's idle timeout.",
    ),
    Setting(
        "requests",
        "header_timeout",
        ("--header-timeout",),
        "SECONDS",
        _seconds(allow_zero=False),
        10.0,
        "Time allowed for a request's head, and for each gap in its body, to arrive; the client gets 408 after that.",
    ),
    Setting(
        "requests",
        "body_min_rate",
        ("--body-min-rate",),
        "BYTES",
        _whole_number(0),
        500,
        "Slowest a request body may arrive, in bytes per second, after its first --header-timeout: a body "
        "must be complete within --header-timeout plus its size divided by this, or the client gets 408 "
        "(0: no such deadline; the gap limit of --header-timeout still applies).",
    ),
    Setting(
        "requests",
        "send_timeout",
        ("--send-timeout",),
        "SECONDS",
        _seconds(allow_zero=False),
        60.0,
        "A client that takes no byte of its answer for this long is disconnected. A client that keeps reading "
        "is never cut, however slowly it reads.",
    ),
    Setting(
        "requests",
        "max_spill",
        ("--max-spill",),
        "BYTES",
        _whole_number(0),
        1 << 30,
        "Most bytes of one answer that wait for a slow client in a temporary file (past the 256 KiB kept in "
        "memory); beyond it the lobby stops reading that answer from its worker until the client has caught up "
        "(0: no file; the worker waits for the client).",
    ),
    Setting(
        "requests",
        "max_spill_total",
        ("--max-spill-total",),
        "BYTES",
        _whole_number(0),
        4 << 30,
        "Most bytes of all answers waiting in temporary files at once; beyond it, answers that spill wait for "
        "their clients as with --max-spill.",
    ),
    Setting(
        "requests",
        "max_head_memory",
        ("--max-head-memory",),
        "BYTES",
        _whole_number(1),
        64 << 20,
        "Memory shared by all requests whose head has not fully arrived; beyond it the oldest incomplete heads "
        "get 408 first, and complete requests are served as usual.",
    ),
    Setting(
        "requests",
        "queue_timeout",
        ("--queue-timeout",),
        "SECONDS",
        _seconds(allow_zero=False),
        None,
        "A request that has waited longer than this for a free worker gets 503 with Retry-After.",
        default_text="off",
    ),
    Setting(
        "requests",
        "max_body",
        ("--max-body",),
        "BYTES",
        _whole_number(0),
        None,
        "Largest request body accepted.",
        default_text="unlimited",
    ),
    Setting(
        "requests",
        "limit_request_line",
        ("--limit-request-line",),
        "BYTES",
        _whole_number(0, WIRE_LIMIT),
        8190,
        "Longest request line (method, target and version) accepted (0: no limit beyond the 64 KiB head ceiling).",
    ),
    Setting(
        "requests",
        "limit_request_fields",
        ("--limit-request-fields",),
        "INT",
        _whole_number(1, WIRE_LIMIT),
        100,
        "Most header fields accepted in one request.",
    ),
    Setting(
        "requests",
        "limit_request_field_size",
        ("--limit-request-field_size",),
        "BYTES",
        _whole_number(0, WIRE_LIMIT),
        8190,
        "Longest header field (name and value) accepted (0: no limit beyond the 64 KiB head ceiling).",
    ),
    Setting(
        "logging",
        "access_logfile",
        ("--access-logfile",),
        "FILE",
        _log_destination,
        None,
        "Where to write one line per request ('-': standard output).",
        default_text="off",
    ),
    Setting(
        "logging",
        "access_log_format",
        ("--access-logformat",),
        "FORMAT",
        _access_log_format,
        ACCESS_LOG_FORMAT,
        "What each access-log line says: gunicorn's atoms, maitred's queue_ms and app_ms, or 'json' for "
        "one JSON object per line (docs/LIMITS.md, The access log's format).",
        default_text="gunicorn's combined log format",
    ),
    Setting(
        "logging",
        "error_logfile",
        ("--error-logfile",),
        "FILE",
        _log_destination,
        "-",
        "Where every process of maitred writes its log ('-': standard error).",
    ),
    Setting(
        "logging",
        "log_level",
        ("--log-level",),
        "LEVEL",
        _log_level,
        "info",
        f"Lowest level written to the error log: {', '.join(LOG_LEVELS)}.",
    ),
    Setting(
        "process",
        "chdir",
        ("--chdir",),
        "DIR",
        _existing_directory,
        None,
        "Change to this directory before loading the application, and look for its module there first.",
        default_text="the current directory",
        for_lobby=False,
    ),
    Setting(
        "process",
        "env",
        ("-e", "--env"),
        "KEY=VALUE",
        _environment_pair,
        (),
        "Set an environment variable for the application. Repeatable.",
        default_text="none",
        repeatable=True,
        for_lobby=False,
    ),
    Setting(
        "process",
        "pid",
        ("-p", "--pid"),
        "FILE",
        _file_path,
        None,
        "Write the server's process id to this file, and remove it at exit.",
        default_text="none",
        for_lobby=False,
    ),
    Setting(
        "process",
        "config",
        ("-c", "--config"),
        "FILE",
        _existing_file,
        None,
        "Python file of settings: its module-level names are setting names (the Setting "
        "column of the README's table). The command line overrides it.",
        default_text="none",
        for_lobby=False,
        file_settable=False,
    ),
    *(
        Setting(
            "server hooks",
            name,
            (),
            "FUNCTION",
            hooks.checker(name),
            None,
            f"Server hook: a function of ({', '.join(hooks.ARGUMENTS[name])}), called {when} (docs/HOOKS.md).",
            default_text="none",
            for_lobby=False,
            hook=True,
        )
        for name, when in (
            ("on_starting", "in the maitred command before the server starts"),
            ("when_ready", "in the lobby once every worker is ready"),
            ("on_reload", "in the lobby on SIGHUP, before the new workers start"),
            ("pre_fork", "in the zygote before it forks a worker"),
            ("post_fork", "in a new worker before it loads the application"),
            ("post_worker_init", "in a worker once it has loaded the application"),
            ("worker_int", "in a worker on SIGINT or SIGQUIT"),
            ("worker_abort", "in a worker on SIGABRT, which --timeout sends"),
            ("pre_exec", "in the lobby as SIGUSR2 starts a new maitred"),
            ("pre_request", "in a worker before each request"),
            ("post_request", "in a worker after each answer (the last two arguments may be left out)"),
            ("child_exit", "in the lobby when a worker has exited"),
            ("worker_exit", "in a worker as it exits"),
            ("nworkers_changed", "in the lobby when the number of workers changes"),
            ("on_exit", "in the maitred command once the server has stopped"),
        )
    ),
)

BY_NAME: Mapping[str, Setting] = {setting.name: setting for setting in SETTINGS}

# gunicorn's config-file names for the settings that maitred names after their flags; used only
# to point someone bringing a gunicorn config file at the right name.
_GUNICORN_NAMES = {
    "keepalive": "keep_alive",
    "accesslog": "access_logfile",
    "errorlog": "error_logfile",
    "loglevel": "log_level",
    "raw_env": "env",
    "pidfile": "pid",
    "preload_app": "preload",
    "wsgi_app": None,
}

APP_METAVAR = "MODULE[:CALLABLE]"

# The module name a config file runs as.
_CONFIG_MODULE = "__maitred_config__"


# ---------------------------------------------------------------------------------------------
# The command line.


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are exceptions, so that the CLI prints one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _argparse_type(setting: Setting) -> Callable[[str], object]:
    def convert(text: str) -> object:
        assert setting.parse is not None
        try:
            return setting.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = setting.name
    return convert


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="maitred",
        usage=f"maitred [OPTIONS] {APP_METAVAR}",
        description="Serve a WSGI application. The application is the callable CALLABLE "
        "(default: application) of the Python module MODULE, e.g. myproject.wsgi:application.",
        epilog="Signals: SIGTERM or SIGINT stops gracefully (requests in progress finish, up to "
        "--graceful-timeout); SIGQUIT stops at once; SIGHUP reloads the application and the config file; "
        "SIGUSR1 reopens the log files; SIGTTIN and SIGTTOU add and remove a worker.",
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=36),
    )
    parser.add_argument("app", nargs="?", metavar=APP_METAVAR, help=argparse.SUPPRESS)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for setting in SETTINGS:
        if setting.hook:
            continue  # a function, given in a config file only
        if setting.section not in groups:
            groups[setting.section] = parser.add_argument_group(setting.section)
        group = groups[setting.section]
        text = f"{setting.help} (default: {setting.shown_default})"
        if setting.is_flag:
            group.add_argument(*setting.flags, dest=setting.name, action="store_true", help=text)
        else:
            group.add_argument(
                *setting.flags,
                dest=setting.name,
                metavar=setting.metavar,
                type=_argparse_type(setting),
                action="append" if setting.repeatable else "store",
                help=text,
            )
    parser.add_argument(
        "--version",
        action="version",
        version=f"maitred {__version__}",
        help="Print the version and exit.",
    )
    return parser


# ---------------------------------------------------------------------------------------------
# The config file.


def _from_python(setting: Setting, value: object) -> object:
    """Checks a value given in a config file, with the same parser as the command line."""
    if setting.is_flag:
        if not isinstance(value, bool):
            raise ValueError(f"expected True or False, got {value!r}")
        return value
    assert setting.parse is not None
    if setting.hook:
        return setting.parse(value)
    if value is None:
        if setting.default is None:
            return None
        raise ValueError("cannot be None")
    if setting.repeatable:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"expected a string or a list of strings, got {value!r}")
        return [setting.parse(item) for item in items]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        # ValueError, as for every other bad value: the caller makes each into one usage line.
        raise ValueError(f"expected {setting.metavar}, got a {type(value).__name__}: {value!r}")  # noqa: TRY004
    return setting.parse(str(value))


def _unknown_setting_message(path: str, name: str) -> str:
    message = f"config file {path}: unknown setting {name!r}"
    if name in _GUNICORN_NAMES:
        ours = _GUNICORN_NAMES[name]
        if ours is None:
            return message + " (give the application on the command line)"
        return message + f" (maitred calls it {ours!r})"
    close = difflib.get_close_matches(name, [s.name for s in SETTINGS if s.file_settable], n=1, cutoff=0.75)
    if close:
        return message + f" (did you mean {close[0]!r}?)"
    return message


def read_config_file(path: str) -> dict[str, object]:
    """Runs a config file and returns the settings it sets, checked and converted."""
    try:
        with open(path, "rb") as file:
            source = file.read()
    except OSError as error:
        raise UsageError(f"cannot read config file {path}: {error.strerror}") from None
    try:
        code = compile(source, path, "exec")
    except SyntaxError as error:
        raise UsageError(f"config file {path}, line {error.lineno}: {error.msg}") from None
    namespace: dict[str, object] = {"__file__": path, "__name__": _CONFIG_MODULE}
    try:
        exec(code, namespace)  # noqa: S102 - a config file is Python by design, as gunicorn's is
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the operator's code: any failure is one line
        raise UsageError(f"config file {path} raised {_exception_summary(error)}") from None
    values: dict[str, object] = {}
    for name, value in namespace.items():
        setting = BY_NAME.get(name)
        # A hook may be imported from a module of the operator's (from myhooks import post_fork).
        if name.startswith("_") or (_is_imported(value) and not (setting is not None and setting.hook)):
            continue
        if setting is None or not setting.file_settable:
            raise UsageError(_unknown_setting_message(path, name))
        try:
            values[name] = _from_python(setting, value)
        except ValueError as error:
            raise UsageError(f"config file {path}: {name}: {error}") from None
    return values


def _is_imported(value: object) -> bool:
    """A module, or a function or class imported by the config file (``from multiprocessing
    import cpu_count``), is not a setting. One defined in the file is checked like any other
    name, so that a misspelt server hook is reported instead of silently never called."""
    if isinstance(value, types.ModuleType):
        return True
    return callable(value) and getattr(value, "__module__", None) != _CONFIG_MODULE


def _exception_summary(error: BaseException) -> str:
    """'Type: message (line N)' on one line, N being the config file's line that raised."""
    summary = type(error).__name__
    message = " ".join(str(error).split())
    if message:
        summary += f": {message}"
    traceback = error.__traceback__
    line = None
    while traceback is not None:
        if traceback.tb_frame.f_code.co_name == "<module>":
            line = traceback.tb_lineno
        traceback = traceback.tb_next
    return summary + (f" (line {line})" if line is not None else "")


# ---------------------------------------------------------------------------------------------
# Resolution.


def resolve(argv: Sequence[str], upgrading: bool = False) -> dict[str, object]:
    """Every setting's value, by name, plus "app": defaults, then the config file, then the
    command line. Raises UsageError; --help and --version print and exit. `upgrading`: this
    maitred was started by a binary upgrade (SIGUSR2), and inherits socket activation's
    sockets from the one it replaces."""
    parser = build_parser()
    parsed, extra = parser.parse_known_args(list(argv))
    if extra:
        raise UsageError(_unexpected_argument_message(parser, extra))
    namespace = vars(parsed)
    app = namespace.pop("app", None)
    if app is None:
        raise UsageError(f"no application given: maitred [OPTIONS] {APP_METAVAR}")
    try:
        parse_spec(app)
    except AppLoadError as error:
        raise UsageError(str(error)) from None
    from_file = read_config_file(namespace["config"]) if "config" in namespace else {}
    settings: dict[str, object] = {}
    for setting in SETTINGS:
        if setting.name in namespace:
            value = namespace[setting.name]
        elif setting.name in from_file:
            value = from_file[setting.name]
        else:
            value = setting.default
        settings[setting.name] = list(value) if setting.repeatable else value
    try:
        activated = activated_sockets(os.environ, upgrading)
    except ValueError as error:
        raise UsageError(f"socket activation: {error}") from None
    if activated:
        settings["bind"] = activated
    duplicates = sorted({b for b in settings["bind"] if settings["bind"].count(b) > 1})
    if duplicates:
        raise UsageError(f"address given twice: {', '.join(duplicates)}")
    if settings["stats"] is not None and settings["stats"] in settings["bind"]:
        raise UsageError(f"--stats {settings['stats']} is also an application address (--bind): give it one of its own")
    settings["app"] = app
    return settings


def _unexpected_argument_message(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """Names the first unknown option, or else the first surplus argument. (argparse lists
    them all, including the value that followed an unknown option.)"""
    for argument in extra:
        if argument.startswith("-") and argument != "-":
            option = argument.partition("=")[0]
            known = [flag for action in parser._actions for flag in action.option_strings]
            close = difflib.get_close_matches(option, known, n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return f"unknown option {option!r}{hint}"
    return f"unexpected argument {extra[0]!r}: give one application, MODULE[:CALLABLE]"


# ---------------------------------------------------------------------------------------------
# A service manager's environment (docs/SYSTEMD.md).

# The first descriptor socket activation passes (SD_LISTEN_FDS_START in sd_listen_fds(3)).
LISTEN_FDS_START = 3

# What systemd tells the process it starts: the sockets passed by socket activation, the notify
# socket and the watchdog. They are the lobby's; the zygote, and so the workers and the
# application, must not see them (see without_service_manager).
SERVICE_MANAGER_VARIABLES = (
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "NOTIFY_SOCKET",
    "WATCHDOG_PID",
    "WATCHDOG_USEC",
)


def activated_sockets(environ: MutableMapping[str, str], upgrading: bool = False) -> list[str]:
    """The sockets a service manager passed to this process by socket activation, as
    ``fd://N`` binds: LISTEN_FDS descriptors from fd 3 on, when LISTEN_PID is this process (as
    sd_listen_fds(3) reads them). Empty when there are none for this process. They replace
    every --bind, as gunicorn's do. Raises ValueError when the variables are malformed or a
    descriptor is not an open socket; the lobby checks that each listens for streams."""
    pid_text, count_text = environ.get("LISTEN_PID"), environ.get("LISTEN_FDS")
    if pid_text is None or count_text is None:
        return []
    if not re.fullmatch(r"[0-9]+", pid_text):
        raise ValueError(f"LISTEN_PID: expected a process id, got {pid_text!r}")
    # A binary upgrade's new maitred is started by the lobby that was given them.
    if int(pid_text) != os.getpid() and not (upgrading and int(pid_text) == os.getppid()):
        return []  # meant for another process (one that started maitred without exec)
    # They are this process's now, and so the next upgrade's.
    environ["LISTEN_PID"] = str(os.getpid())
    if not re.fullmatch(r"[0-9]+", count_text):
        raise ValueError(f"LISTEN_FDS: expected a number of descriptors, got {count_text!r}")
    count = int(count_text)
    names = environ.get("LISTEN_FDNAMES")
    if count and names is not None and len(names.split(":")) != count:
        raise ValueError(f"LISTEN_FDNAMES names {len(names.split(':'))} sockets, LISTEN_FDS passes {count}")
    binds = []
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + count):
        try:
            binds.append(_bind_address(f"fd://{fd}"))
        except ValueError as error:
            raise ValueError(f"LISTEN_FDS={count}: {error}") from None
    return binds


def without_service_manager(environ: MutableMapping[str, str]) -> None:
    """Removes the service manager's variables from `environ`, as sd_listen_fds(3) and
    sd_notify(3) do when told to unset them. The CLI calls it in the zygote, right after the
    fork: the lobby keeps them (it notifies, and names the sockets it serves), while the
    application, in the zygote or a worker, neither sees sockets that are the lobby's nor
    speaks to the service manager in the lobby's name."""
    for name in SERVICE_MANAGER_VARIABLES:
        environ.pop(name, None)


def lobby_settings(settings: Mapping[str, object]) -> dict[str, object]:
    """The dict that maitred._native.serve takes: the lobby's settings and the app spec."""
    chosen = {s.name: settings[s.name] for s in SETTINGS if s.for_lobby}
    chosen["app"] = settings["app"]
    return chosen


# ---------------------------------------------------------------------------------------------
# The config file read again, for a reload (SIGHUP; docs/SIGNALS.md).

# Settings a reload cannot change: they need new listeners, a new lobby or a new zygote (an
# upgrade). When the config file read again changes one, the log names it and it keeps its value.
KEPT_ON_RELOAD = (
    "bind",
    "backlog",
    "max_connections",
    "stats",
    "max_spill_total",
    "max_head_memory",
    "access_logfile",
    "error_logfile",
    "preload",
    "chdir",
    "env",
    "pid",
)

Reread = Callable[[], tuple[dict[str, object], list[str]]]


def rereader(
    argv: Sequence[str], settings: Mapping[str, object], adopt: Callable[[Mapping[str, object]], None]
) -> Reread | None:
    """What the lobby calls to read the config file again for a reload: None when there is no
    config file. Call it where `resolve` was called, before --chdir is applied: it reads the
    command line again, relative to the directory maitred was started in. `adopt` is given
    every setting of a file read without error (the lobby's server hooks among them)."""
    path = settings["config"]
    if path is None:
        return None
    assert isinstance(path, str)  # made absolute by _existing_file
    parsed, _ = build_parser().parse_known_args(list(argv))
    command_line = vars(parsed)
    command_line.pop("app", None)
    started = dict(settings)
    return lambda: reread(path, command_line, started, adopt)


def reread(
    path: str,
    command_line: Mapping[str, object],
    started: Mapping[str, object],
    adopt: Callable[[Mapping[str, object]], None],
) -> tuple[dict[str, object], list[str]]:
    """Reads the config file at `path` again and returns the lobby's new settings (as
    `lobby_settings` makes them) and the names of the settings in KEPT_ON_RELOAD that the file
    changes, which keep their values from `started`. The command line still overrides the file.
    Raises UsageError, with one line, when the file cannot be read or is wrong."""
    from_file = read_config_file(path)
    settings = dict(started)
    for setting in SETTINGS:
        if setting.name in command_line or not setting.file_settable:
            continue
        value = from_file.get(setting.name, setting.default)
        settings[setting.name] = list(value) if setting.repeatable else value
    try:
        activated = activated_sockets(os.environ)
    except ValueError:
        activated = []
    if activated:
        # Socket activation replaces every bind, as `resolve` does: the file's do not count.
        settings["bind"] = activated
    kept = [name for name in KEPT_ON_RELOAD if settings[name] != started[name]]
    for name in kept:
        settings[name] = started[name]
    adopt(settings)
    return lobby_settings(settings), kept


def markdown_table() -> str:
    """The README's table of flags, made from SETTINGS."""
    rows = [
        "| Flag | Setting | Default | Meaning |",
        "|---|---|---|---|",
    ]
    for setting in SETTINGS:
        flags = ", ".join(f"`{flag}`" if setting.is_flag else f"`{flag} {setting.metavar}`" for flag in setting.flags)
        if setting.hook:
            flags = "(config file only)"
        name = f"`{setting.name}`" if setting.file_settable else ""
        default = setting.default_text if setting.default_text is not None else f"`{setting.shown_default}`"
        help_text = setting.help.replace("|", "\\|")
        rows.append(f"| {flags} | {name} | {default} | {help_text} |")
    return "\n".join(rows)
