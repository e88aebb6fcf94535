"""maitred's settings: one table, read from the command line and from a config file.

Every setting is one row of `SETTINGS`. The row gives the name (used in config files and as the
key of the resolved settings), the command-line flags, the parser that turns text into a value
(and rejects bad text with a specific message), the default and the help. The argument parser,
the config-file reader, ``--help`` and the README's flag table are all made from these rows, so
they cannot disagree.

Precedence, as gunicorn's: built-in default (or what WEB_CONCURRENCY and PORT say) < config file
(``-c``, or ./maitred.conf.py) < MAITRED_CMD_ARGS < command line.
"""

from __future__ import annotations

import argparse
import difflib
import grp
import importlib
import ipaddress
import math
import os
import pwd
import re
import shlex
import stat
import sys
import types
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from maitred import __version__, _native, gunicorn, hooks, privileges
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


def seconds(*, allow_zero: bool) -> Callable[[str], float]:
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


def _config_location(text: str) -> str:
    """A config file's path (made absolute; ``file:`` may precede it, as in gunicorn), or
    ``python:MODULE``, a module importable from sys.path or the current directory."""
    if text.startswith("python:"):
        module = text[len("python:") :]
        if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", module):
            raise ValueError(f"expected python:MODULE, with MODULE a dotted module name, got {text!r}")
        return text
    return _existing_file(text.removeprefix("file:"))


# Largest id the kernel takes: (uid_t)-1 means "leave unchanged" to setresuid(2).
_MAX_ID = 2**32 - 2


def _user(text: str) -> int:
    """A user name or number, as its number. A number need not be in the user database."""
    if re.fullmatch(r"[0-9]+", text):
        return _whole_number(0, _MAX_ID)(text)
    try:
        return pwd.getpwnam(text).pw_uid
    except KeyError:
        raise ValueError(f"no such user: {text!r}") from None


def _group(text: str) -> int:
    """A group name or number, as its number. A number need not be in the group database."""
    if re.fullmatch(r"[0-9]+", text):
        return _whole_number(0, _MAX_ID)(text)
    try:
        return grp.getgrnam(text).gr_gid
    except KeyError:
        raise ValueError(f"no such group: {text!r}") from None


def _umask(text: str) -> int:
    """A file-mode mask read as gunicorn reads it: a leading 0 means octal (0022), Python's
    prefixes work (0o22, 0x12), and anything else is decimal."""
    digits = "0o" + text[1:] if re.fullmatch(r"0[0-9]+", text) else text
    try:
        value = int(digits, 0)
    except ValueError:
        raise ValueError(f"expected a file-mode mask such as 0022 or 0o027, got {text!r}") from None
    if not 0 <= value <= 0o777:
        raise ValueError(f"expected a file-mode mask from 0 to 0o777, got {text!r}")
    return value


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


def bind_parts(address: str) -> tuple[object, ...]:
    """A canonical listen address (what `_bind_address` returns) in the parsed form the lobby
    takes: ``("tcp", host, port)`` (an IPv6 host without its brackets), ``("unix", path)`` or
    ``("fd", n)``. This module owns the grammar: the lobby asks this function for the parts of
    each address it is given, and never parses one itself."""
    if address.startswith("unix:"):
        return ("unix", address[len("unix:") :])
    if address.startswith("fd://"):
        return ("fd", int(address[len("fd://") :]))
    host, _, port = address.rpartition(":")
    return ("tcp", host.removeprefix("[").removesuffix("]"), int(port))


def _stats_address(text: str) -> str:
    """A stats listener's address: a --bind address, but not an inherited descriptor."""
    address = _bind_address(text)
    if address.startswith("fd://"):
        raise ValueError(f"expected HOST:PORT or unix:PATH, got {text!r}")
    return address


def _address_list(text: str) -> list[str]:
    """Comma-separated IP addresses and networks (CIDR), or ``*`` for every peer, as gunicorn's
    --forwarded-allow-ips and --proxy-allow-from take them; empty: none."""
    entries = [entry.strip() for entry in text.split(",") if entry.strip()]
    for entry in entries:
        if entry == "*":
            continue
        try:
            ipaddress.ip_network(entry)
        except ValueError as error:
            detail = f" ({error})" if "host bits" in str(error) else ""
            raise ValueError(
                f"{entry!r} is neither an IP address, a network such as 10.0.0.0/8, nor *{detail}"
            ) from None
    return entries


def _address_list_value(value: object) -> list[str]:
    """A config file's allow list: a comma-separated string, as gunicorn's, or a list of strings."""
    if isinstance(value, str):
        return _address_list(value)
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return _address_list(",".join(value))
    raise ValueError(f"expected a comma-separated string or a list of strings, got {value!r}")


# gunicorn's default secure_scheme_headers: a trusted proxy's header that says https.
SECURE_SCHEME_HEADERS = {"X-FORWARDED-PROTOCOL": "ssl", "X-FORWARDED-PROTO": "https", "X-FORWARDED-SSL": "on"}


def _secure_scheme_headers(text: str) -> dict[str, str]:
    """``NAME=VALUE,NAME=VALUE`` (empty: none), the command line's form of gunicorn's dict."""
    pairs = [pair.strip() for pair in text.split(",") if pair.strip()]
    headers = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals:
            raise ValueError(f"expected NAME=VALUE, got {pair!r}")
        headers[name.strip()] = value.strip()
    return _checked_scheme_headers(headers)


def _checked_scheme_headers(headers: dict[str, str]) -> dict[str, str]:
    for name, value in headers.items():
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", name):
            raise ValueError(f"{name!r} is not a header name")
        if not value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise ValueError(f"{name}: {value!r} is not a header value")
    return {name.upper(): value for name, value in headers.items()}


def _secure_scheme_headers_value(value: object) -> dict[str, str]:
    """A config file's secure_scheme_headers: gunicorn's dict, or the command line's text."""
    if isinstance(value, str):
        return _secure_scheme_headers(value)
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return _checked_scheme_headers(value)
    raise ValueError(f"expected a dict of header names to values, got {value!r}")


PROXY_PROTOCOL_MODES = ("off", "v1", "v2", "auto")


def _proxy_protocol(text: str) -> str:
    mode = text.lower()
    if mode not in PROXY_PROTOCOL_MODES:
        raise ValueError(f"expected one of {', '.join(PROXY_PROTOCOL_MODES)}, got {text!r}")
    return mode


def _proxy_protocol_value(value: object) -> str:
    """A config file's proxy_protocol: a mode, or True (auto) and False (off) as gunicorn takes."""
    if isinstance(value, bool):
        return "auto" if value else "off"
    if isinstance(value, str):
        return _proxy_protocol(value)
    raise ValueError(f"expected one of {', '.join(PROXY_PROTOCOL_MODES)}, True or False, got {value!r}")


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
    show: Callable[[object], str] = repr
    """How --print-config writes its value."""
    from_python: Callable[[object], object] | None = None
    """Checks a config file's value when it may be other than text (a dict, a list, a bool)."""
    const: str | None = None
    """The value of the flag given without one: its value is optional (``--proxy-protocol``)."""
    environ: str | None = None
    """The environment variable that, when set, gives the default, as under gunicorn."""
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
        "Address of the stats listener, HOST:PORT or unix:PATH: Prometheus metrics at /metrics, the same "
        "with the worker scoreboard and the diagnoses at /status.json, and a live page at / "
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
        seconds(allow_zero=False),
        30.0,
        "A worker busy with one request for longer than this is killed and replaced.",
    ),
    Setting(
        "workers",
        "graceful_timeout",
        ("--graceful-timeout",),
        "SECONDS",
        seconds(allow_zero=True),
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
        seconds(allow_zero=False),
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
        seconds(allow_zero=True),
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
        seconds(allow_zero=True),
        75.0,
        "How long an idle keep-alive connection is held open (0: close after each response). "
        "An idle connection costs no worker; keep this above your proxy's idle timeout.",
    ),
    Setting(
        "requests",
        "header_timeout",
        ("--header-timeout",),
        "SECONDS",
        seconds(allow_zero=False),
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
        seconds(allow_zero=False),
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
        seconds(allow_zero=False),
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
        "proxies",
        "forwarded_allow_ips",
        ("--forwarded-allow-ips",),
        "LIST",
        _address_list,
        ["127.0.0.1", "::1"],
        "Peers trusted to say who the client is: comma-separated addresses and networks (10.0.0.0/8), or * "
        "for all. From them (and from any Unix-socket peer) X-Forwarded-For or Forwarded set REMOTE_ADDR, and "
        "secure_scheme_headers set wsgi.url_scheme (docs/PROXIES.md).",
        default_text="127.0.0.1,::1, or $FORWARDED_ALLOW_IPS",
        from_python=_address_list_value,
        environ="FORWARDED_ALLOW_IPS",
    ),
    Setting(
        "proxies",
        "secure_scheme_headers",
        ("--secure-scheme-headers",),
        "NAME=VALUE,...",
        _secure_scheme_headers,
        SECURE_SCHEME_HEADERS,
        "Headers by which a trusted peer says the client used https: with this value https, with any other "
        "http; headers that disagree get 400. A dict in a config file, as in gunicorn's; empty: none. The "
        "default is gunicorn's: X-FORWARDED-PROTO https, X-FORWARDED-SSL on, X-FORWARDED-PROTOCOL ssl.",
        default_text="gunicorn's three",
        from_python=_secure_scheme_headers_value,
    ),
    Setting(
        "proxies",
        "proxy_protocol",
        ("--proxy-protocol",),
        "MODE",
        _proxy_protocol,
        "off",
        "Every connection must begin with a PROXY protocol header (HAProxy's send-proxy), whose client becomes "
        "REMOTE_ADDR: v1, v2, or auto for either (the flag alone); off. Put the flag after the application, or "
        "give its mode, as its value is optional.",
        from_python=_proxy_protocol_value,
        const="auto",
    ),
    Setting(
        "proxies",
        "proxy_allow_ips",
        ("--proxy-allow-from",),
        "LIST",
        _address_list,
        ["127.0.0.1", "::1"],
        "Peers that may send a PROXY protocol header (addresses, networks, or *); under --proxy-protocol any "
        "other gets 400.",
        default_text="127.0.0.1,::1",
        from_python=_address_list_value,
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
        "user",
        ("-u", "--user"),
        "USER",
        _user,
        None,
        "Run as this user (name or number) once the listen sockets are bound: the lobby, the zygote and the "
        "workers. maitred must be started as root (docs/GUNICORN.md, Privileges).",
        default_text="the user maitred is started as",
        for_lobby=False,
    ),
    Setting(
        "process",
        "group",
        ("-g", "--group"),
        "GROUP",
        _group,
        None,
        "Run as this group (name or number) once the listen sockets are bound.",
        default_text="--user's primary group, or the group maitred is started as",
        for_lobby=False,
    ),
    Setting(
        "process",
        "initgroups",
        ("--initgroups",),
        None,
        None,
        False,
        "With --user, also keep the supplementary groups the group database gives that user (otherwise "
        "--group is the only group).",
        default_text="off",
        for_lobby=False,
    ),
    Setting(
        "process",
        "umask",
        ("-m", "--umask"),
        "MASK",
        _umask,
        None,
        "File-mode mask of every process of maitred and of the application (0022, 0o027; a leading 0 means "
        "octal, as in gunicorn).",
        default_text="the one maitred is started with",
        for_lobby=False,
        show=lambda mask: "None" if mask is None else f"0o{mask:03o}",
    ),
    Setting(
        "process",
        "config",
        ("-c", "--config"),
        "FILE",
        _config_location,
        None,
        "Python file of settings, or python:MODULE: its module-level names are setting names (the Setting "
        "column of the README's table), and gunicorn's (docs/GUNICORN.md). MAITRED_CMD_ARGS and the command "
        "line override it.",
        default_text="./maitred.conf.py if there is one",
        for_lobby=False,
        file_settable=False,
    ),
    Setting(
        "process",
        "check_config",
        ("--check-config",),
        None,
        None,
        False,
        "Read the settings and load the application, then exit: 0 if both are right, 1 with one line saying "
        "what is wrong.",
        default_text="off",
        for_lobby=False,
    ),
    Setting(
        "process",
        "print_config",
        ("--print-config",),
        None,
        None,
        False,
        "Print every setting's value and where it came from, then exit.",
        default_text="off",
        for_lobby=False,
    ),
    Setting(
        "development",
        "reload",
        ("--reload",),
        None,
        None,
        False,
        "For development only: when a source file of the application changes, new workers import it and "
        "take over, as on SIGHUP (docs/SIGNALS.md, --reload). Needs watchfiles: pip install 'maitred[reload]'.",
        default_text="off",
        for_lobby=False,
    ),
    Setting(
        "development",
        "reload_extra_files",
        ("--reload-extra-file",),
        "FILE",
        _existing_file,
        (),
        "With --reload, also reload when this file changes (a template, a data file). Repeatable.",
        default_text="none",
        repeatable=True,
        for_lobby=False,
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

# Read like gunicorn's GUNICORN_CMD_ARGS: command-line arguments, split as a shell would.
CMD_ARGS_VARIABLE = "MAITRED_CMD_ARGS"

# Read from the current directory when no config file is named, as gunicorn reads
# ./gunicorn.conf.py.
DEFAULT_CONFIG_FILE = "maitred.conf.py"

APP_METAVAR = "MODULE[:CALLABLE]"

# The module name a config file runs as.
_CONFIG_MODULE = "__maitred_config__"


# ---------------------------------------------------------------------------------------------
# The command line.


class ArgumentParser(argparse.ArgumentParser):
    """An argument parser whose errors are UsageError, so that the CLI prints one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def argument_type(parse: Callable[[str], object], name: str) -> Callable[[str], object]:
    """A value parser (text -> value, raising ValueError) as an argparse type: argparse prints
    a parser's own message only when it raises ArgumentTypeError."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = name
    return convert


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
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
        elif setting.const is not None:
            group.add_argument(
                *setting.flags,
                dest=setting.name,
                metavar=setting.metavar,
                type=argument_type(setting.parse, setting.name),
                nargs="?",
                const=setting.const,
                help=text,
            )
        else:
            group.add_argument(
                *setting.flags,
                dest=setting.name,
                metavar=setting.metavar,
                type=argument_type(setting.parse, setting.name),
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
    if setting.from_python is not None:
        return setting.from_python(value)
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


def _unknown_setting_message(origin: str, name: str) -> str:
    message = f"{origin}: unknown setting {name!r}"
    known = [s.name for s in SETTINGS if s.file_settable] + list(gunicorn.BY_NAME)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    if close:
        return message + f" (did you mean {close[0]!r}?)"
    return message


@dataclass
class ConfigFile:
    """What a config file says: settings by maitred's names, checked and converted."""

    values: dict[str, object] = field(default_factory=dict)
    app: str | None = None
    """gunicorn's wsgi_app: the application, when the command line gives none."""
    warnings: list[str] = field(default_factory=list)
    """One line per gunicorn setting the file sets that maitred ignores, saying why."""


def read_config(location: str) -> ConfigFile:
    """Runs a config file (a path) or imports a config module (python:MODULE) and returns the
    settings it sets, checked and converted."""
    if location.startswith("python:"):
        module_name = location[len("python:") :]
        return _settings_from(f"config module {module_name}", vars(_import_config_module(module_name)), module_name)
    try:
        with open(location, "rb") as file:
            source = file.read()
    except OSError as error:
        raise UsageError(f"cannot read config file {location}: {error.strerror}") from None
    try:
        code = compile(source, location, "exec")
    except SyntaxError as error:
        raise UsageError(f"config file {location}, line {error.lineno}: {error.msg}") from None
    namespace: dict[str, object] = {"__file__": location, "__name__": _CONFIG_MODULE}
    try:
        exec(code, namespace)  # noqa: S102 - a config file is Python by design, as gunicorn's is
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the operator's code: any failure is one line
        raise UsageError(f"config file {location} raised {_exception_summary(error)}") from None
    return _settings_from(f"config file {location}", namespace, _CONFIG_MODULE)


def _import_config_module(name: str) -> types.ModuleType:
    """Imports (or, for a reload, imports again) a config module, with the current directory
    searched first, as gunicorn's own directory is."""
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        loaded = sys.modules.get(name)
        return importlib.reload(loaded) if loaded is not None else importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is not None and (name == error.name or name.startswith(error.name + ".")):
            raise UsageError(f"cannot import config module {name}: no module named {error.name!r}") from None
        raise UsageError(f"config module {name} raised {_exception_summary(error)}") from None
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the operator's code: any failure is one line
        raise UsageError(f"config module {name} raised {_exception_summary(error)}") from None
    finally:
        if added:
            sys.path.remove(here)


def _settings_from(origin: str, namespace: Mapping[str, object], module_name: str) -> ConfigFile:
    """The settings among a config file's module-level names. maitred's names come first; a
    gunicorn name is taken, ignored with a warning or refused as docs/GUNICORN.md's table says."""
    found = ConfigFile()
    given_as: dict[str, str] = {}

    def take(name: str, value: object, written: str) -> None:
        if name in given_as:
            raise UsageError(f"{origin} sets both {given_as[name]!r} and {written!r}: keep one")
        given_as[name] = written
        try:
            found.values[name] = _from_python(BY_NAME[name], value)
        except ValueError as error:
            raise UsageError(f"{origin}: {written}: {error}") from None

    for name, value in namespace.items():
        setting = BY_NAME.get(name)
        # A hook may be imported from a module of the operator's (from myhooks import post_fork).
        if name.startswith("_") or (_is_imported(value, module_name) and not (setting is not None and setting.hook)):
            continue
        if setting is not None and setting.file_settable:
            take(name, value, name)
            continue
        theirs = gunicorn.BY_NAME.get(name)
        if theirs is None:
            raise UsageError(_unknown_setting_message(origin, name))
        if theirs.verdict is gunicorn.Verdict.MAPPED and theirs.target == "app":
            if not isinstance(value, str):
                raise UsageError(f"{origin}: {name}: expected {APP_METAVAR} as a string, got {value!r}")
            found.app = value
        elif theirs.verdict is gunicorn.Verdict.MAPPED:
            assert theirs.target is not None
            take(theirs.target, value, name)
        elif theirs.verdict is gunicorn.Verdict.SAME:
            # A name maitred knows but not from a config file: where the config file is.
            found.warnings.append(f"{origin}: {name} is ignored: it only has effect on the command line")
        elif theirs.verdict is gunicorn.Verdict.IGNORED and not _harmless(value, theirs):
            found.warnings.append(f"{origin}: {name} is ignored: {theirs.why}")
        elif theirs.verdict is gunicorn.Verdict.REFUSED and not _harmless(value, theirs):
            raise UsageError(f"{origin}: {name} cannot be honoured: {theirs.why}")
    return found


def _harmless(value: object, theirs: gunicorn.GunicornSetting) -> bool:
    # Compared with the type too: True == 1, but `threads = True` is not `threads = 1`.
    return any(type(value) is type(quiet) and value == quiet for quiet in theirs.harmless)


def _is_imported(value: object, module_name: str) -> bool:
    """A module, or a function or class imported by the config file (``from multiprocessing
    import cpu_count``), is not a setting. One defined in the file is checked like any other
    name, so that a misspelt server hook is reported instead of silently never called."""
    if isinstance(value, types.ModuleType):
        return True
    return callable(value) and getattr(value, "__module__", None) != module_name


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


# Keys of the resolved settings besides the settings themselves.
SOURCES = "sources"
"""Where each setting's value came from, by name, for --print-config."""
WARNINGS = "warnings"
"""The config file's warnings (ConfigFile.warnings), for the log."""


def resolve(argv: Sequence[str], upgrading: bool = False) -> dict[str, object]:
    """Every setting's value, by name, plus "app", SOURCES and WARNINGS: defaults (or
    WEB_CONCURRENCY and PORT), then the config file, then MAITRED_CMD_ARGS, then the command
    line. Raises UsageError; --help and --version print and exit. `upgrading`: this maitred
    was started by a binary upgrade (SIGUSR2), and inherits socket activation's sockets from
    the one it replaces."""
    parser = build_parser()
    command_line = _parse_arguments(parser, list(argv), "")
    app = command_line.pop("app", None)
    layers = _layers_below_the_file(parser, os.environ, command_line)
    location = layers.config_location
    config_file = read_config(location) if location is not None else ConfigFile()
    file_origin = f"config file {location}"
    if location is not None and location.startswith("python:"):
        file_origin = f"config module {location[len('python:') :]}"
    app_origin = "command line"
    if app is None:
        app, app_origin = config_file.app, f"{file_origin} (wsgi_app)"
    if app is None:
        raise UsageError(f"no application given: maitred [OPTIONS] {APP_METAVAR}")
    try:
        parse_spec(app)
    except AppLoadError as error:
        raise UsageError(str(error)) from None
    settings, sources = _merge([*layers.below, (file_origin, config_file.values), *layers.above])
    sources["app"] = app_origin
    _complete(settings, sources)
    try:
        activated = activated_sockets(os.environ, upgrading)
    except ValueError as error:
        raise UsageError(f"socket activation: {error}") from None
    if activated:
        settings["bind"] = activated
        sources["bind"] = "LISTEN_FDS (socket activation)"
    duplicates = sorted({b for b in settings["bind"] if settings["bind"].count(b) > 1})
    if duplicates:
        raise UsageError(f"address given twice: {', '.join(duplicates)}")
    if settings["stats"] is not None and settings["stats"] in settings["bind"]:
        raise UsageError(f"--stats {settings['stats']} is also an application address (--bind): give it one of its own")
    if settings["reload_extra_files"] and not settings["reload"]:
        raise UsageError("--reload-extra-file is given without --reload, which it needs")
    settings["app"] = app
    settings[SOURCES] = sources
    settings[WARNINGS] = config_file.warnings
    return settings


Layer = tuple[str, Mapping[str, object]]
"""Where some settings came from, and their values by name."""


@dataclass
class _Layers:
    below: list[Layer]
    """Under the config file: what the environment says the defaults are."""
    above: list[Layer]
    """Over the config file: MAITRED_CMD_ARGS, then the command line."""
    config_location: str | None


def _layers_below_the_file(
    parser: argparse.ArgumentParser, environ: Mapping[str, str], command_line: Mapping[str, object]
) -> _Layers:
    """Everything but the config file, and where the config file is: -c on the command line,
    else -c in MAITRED_CMD_ARGS, else ./maitred.conf.py if there is one (as gunicorn)."""
    below: list[Layer] = []
    concurrency = environ.get("WEB_CONCURRENCY")
    if concurrency is not None:
        try:
            below.append(("WEB_CONCURRENCY", {"workers": BY_NAME["workers"].parse(concurrency)}))
        except ValueError as error:
            raise UsageError(f"WEB_CONCURRENCY: {error}") from None
    port = environ.get("PORT")
    if port is not None:
        try:
            below.append(("PORT", {"bind": [_bind_address(f"0.0.0.0:{port}")]}))
        except ValueError as error:
            raise UsageError(f"PORT: {error}") from None
    from_variable: dict[str, object] = {}
    if CMD_ARGS_VARIABLE in environ:
        try:
            words = shlex.split(environ[CMD_ARGS_VARIABLE])
        except ValueError as error:
            raise UsageError(f"{CMD_ARGS_VARIABLE}: {error}") from None
        from_variable = _parse_arguments(parser, words, f"{CMD_ARGS_VARIABLE}: ")
        if "app" in from_variable:
            raise UsageError(
                f"{CMD_ARGS_VARIABLE}: unexpected argument {from_variable['app']!r}: give the application on the "
                "command line"
            )
    above: list[Layer] = [(CMD_ARGS_VARIABLE, from_variable), ("command line", command_line)]
    location = command_line.get("config", from_variable.get("config"))
    if location is None and os.path.isfile(DEFAULT_CONFIG_FILE):
        location = _config_location(DEFAULT_CONFIG_FILE)
        below.append((f"./{DEFAULT_CONFIG_FILE} in the working directory", {"config": location}))
    assert location is None or isinstance(location, str)
    return _Layers(below, above, location)


def _parse_arguments(parser: argparse.ArgumentParser, words: list[str], where: str) -> dict[str, object]:
    try:
        parsed, extra = parser.parse_known_args(words)
    except UsageError as error:
        raise UsageError(f"{where}{error}") from None
    if extra:
        raise UsageError(where + _unexpected_argument_message(parser, extra))
    return vars(parsed)


def _merge(layers: Sequence[Layer]) -> tuple[dict[str, object], dict[str, str]]:
    """Each setting's value from the last layer that has it, else its default."""
    settings: dict[str, object] = {}
    sources: dict[str, str] = {}
    for setting in SETTINGS:
        value = default(setting)
        source = setting.environ if setting.environ is not None and setting.environ in os.environ else "default"
        for where, values in layers:
            if setting.name in values:
                value, source = values[setting.name], where
        settings[setting.name] = list(value) if setting.repeatable else value
        sources[setting.name] = source
    return settings, sources


def _complete(settings: dict[str, object], sources: dict[str, str]) -> None:
    """Fills in what one setting implies for another: --user without --group means the
    user's primary group (not the group maitred was started as, which is root's)."""
    user, group = settings["user"], settings["group"]
    if user is None or group is not None:
        return
    assert isinstance(user, int)
    try:
        entry = pwd.getpwuid(user)
    except KeyError:
        raise UsageError(
            f"--user {user} is in no user database, so it has no primary group: give --group too"
        ) from None
    settings["group"] = entry.pw_gid
    sources["group"] = f"the primary group of user {entry.pw_name}"


def default(setting: Setting) -> object:
    """A setting's default: its environment variable's value when it has one that is set."""
    text = os.environ.get(setting.environ) if setting.environ is not None else None
    if text is None:
        return setting.default
    assert setting.parse is not None
    try:
        return setting.parse(text)
    except ValueError as error:
        raise UsageError(f"{setting.environ} (the default of {setting.flags[-1]}): {error}") from None


def _unexpected_argument_message(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    """Names the first unknown option, or else the first surplus argument. (argparse lists
    them all, including the value that followed an unknown option.)"""
    for argument in extra:
        if argument.startswith("-") and argument != "-":
            option = argument.partition("=")[0]
            known = [flag for action in parser._actions for flag in action.option_strings]
            theirs = gunicorn.BY_FLAG.get(option)
            if theirs is not None and theirs.verdict in (gunicorn.Verdict.IGNORED, gunicorn.Verdict.REFUSED):
                return f"unknown option {option!r}: gunicorn's {theirs.name} is not supported: {theirs.why}"
            close = difflib.get_close_matches(option, known, n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return f"unknown option {option!r}{hint}"
    return f"unexpected argument {extra[0]!r}: give one application, MODULE[:CALLABLE]"


# ---------------------------------------------------------------------------------------------
# A service manager's environment (docs/SYSTEMD.md).

# The first descriptor socket activation passes (SD_LISTEN_FDS_START in sd_listen_fds(3)); the
# lobby, which names the sockets it serves by it too, owns the number.
LISTEN_FDS_START = _native.LISTEN_FDS_START

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
    wanted = privileges.credentials(settings)
    chosen["drop_to"] = wanted.as_lobby_setting() if wanted is not None else None
    return chosen


def printed(settings: Mapping[str, object]) -> str:
    """--print-config's output: one line per setting, ``name = value  # where it came from``,
    a config file's syntax, the application first."""
    sources = settings[SOURCES]
    assert isinstance(sources, dict)
    width = max(len(setting.name) for setting in SETTINGS)
    lines = [f"{'app':<{width}} = {settings['app']!r}  # {sources['app']}"]
    for setting in SETTINGS:
        value = setting.show(settings[setting.name])
        lines.append(f"{setting.name:<{width}} = {value}  # {sources[setting.name]}")
    return "\n".join(lines) + "\n"


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
    "user",
    "group",
    "initgroups",
    "umask",
    "reload",
    "reload_extra_files",
)

Reread = Callable[[], tuple[dict[str, object], list[str]]]


def rereader(
    argv: Sequence[str], settings: Mapping[str, object], adopt: Callable[[Mapping[str, object]], None]
) -> Reread | None:
    """What the lobby calls to read the config file again for a reload: None when there is no
    config file. Call it where `resolve` was called, before --chdir is applied: it reads the
    command line and MAITRED_CMD_ARGS again, relative to the directory maitred was started in.
    `adopt` is given every setting of a file read without error (the lobby's server hooks among
    them)."""
    location = settings["config"]
    if location is None:
        return None
    assert isinstance(location, str)  # made absolute by _config_location, or python:MODULE
    parser = build_parser()
    command_line = _parse_arguments(parser, list(argv), "")
    command_line.pop("app", None)
    layers = _layers_below_the_file(parser, os.environ, command_line)
    started = dict(settings)
    return lambda: reread(location, layers.below, layers.above, started, adopt)


def reread(
    location: str,
    below: Sequence[Layer],
    above: Sequence[Layer],
    started: Mapping[str, object],
    adopt: Callable[[Mapping[str, object]], None],
) -> tuple[dict[str, object], list[str]]:
    """Reads the config file at `location` again and returns the lobby's new settings (as
    `lobby_settings` makes them) and the names of the settings in KEPT_ON_RELOAD that the file
    changes, which keep their values from `started`. MAITRED_CMD_ARGS and the command line
    (`above`) still override the file. Raises UsageError, with one line, when the file cannot
    be read or is wrong."""
    from_file = read_config(location)
    merged, sources = _merge([*below, ("config file", from_file.values), *above])
    _complete(merged, sources)
    settings = dict(started)
    settings.update({s.name: merged[s.name] for s in SETTINGS if s.file_settable})
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
        value = f"[{setting.metavar}]" if setting.const is not None else setting.metavar
        flags = ", ".join(f"`{flag}`" if setting.is_flag else f"`{flag} {value}`" for flag in setting.flags)
        if setting.hook:
            flags = "(config file only)"
        name = f"`{setting.name}`" if setting.file_settable else ""
        default = setting.default_text if setting.default_text is not None else f"`{setting.shown_default}`"
        help_text = setting.help.replace("|", "\\|")
        rows.append(f"| {flags} | {name} | {default} | {help_text} |")
    return "\n".join(rows)
