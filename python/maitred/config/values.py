"""The value parsers: text -> value, raising ValueError with a message that names what was
expected; and the constants they check against.

One parser per kind of value: whole numbers and seconds within bounds, paths, users and groups,
the file-mode mask, log levels, the access-log format (which the lobby checks), listen addresses
(the --bind grammar, whose parsed parts the lobby asks `bind_parts` for rather than parse an
address itself), peer address lists, secure scheme headers and PROXY protocol modes. A value a
config file may give as other than text (a list, a dict, a bool) has a `..._value` parser too.

May import: maitred._native and maitred.log; none of this package.
"""

from __future__ import annotations

import grp
import ipaddress
import math
import os
import pwd
import re
import stat
from collections.abc import Callable

from maitred import _native, log

# Longest path that fits in `sockaddr_un.sun_path` (108 bytes with the terminating NUL).
UNIX_PATH_MAX = 107

DEFAULT_PORT = 8000

# A --bind address that speaks plain HTTP beside TLS listeners (config/table_tls.py).
PLAIN_PREFIX = "http://"


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


def seconds_off_or_at_least(least: float) -> Callable[[str], float]:
    """0 (off), or a number of seconds no smaller than `least`."""
    expected = f"0 (off) or a number of seconds of at least {least:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"expected {expected}, got {text!r}") from None
        if not math.isfinite(value) or (value != 0 and value < least):
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
    (crates/lobby/src/log/access_format.rs): this asks it, so that a wrong format is refused here,
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
    if level not in log.LEVELS:
        raise ValueError(f"expected one of {', '.join(log.LEVELS)}, got {text!r}")
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
    missing host 0.0.0.0. Written ``http://ADDRESS``, the listener speaks plain HTTP when the
    others speak TLS (docs/TLS.md); the prefix stays in the canonical form."""
    if text.startswith(PLAIN_PREFIX):
        return PLAIN_PREFIX + _bind_address(text[len(PLAIN_PREFIX) :])
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
    each address it is given, and never parses one itself. An ``http://`` prefix is not part
    of the address (the lobby is told which listeners are plain apart)."""
    address = address.removeprefix(PLAIN_PREFIX)
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


def _http_protocols(text: str) -> list[str]:
    """Comma-separated protocols, h1 (HTTP/1.0 and 1.1) and h2 (HTTP/2), as gunicorn's
    --http-protocols takes them; their order does not matter (maitred prefers none)."""
    entries = [entry.strip().lower() for entry in text.split(",") if entry.strip()]
    unknown = [entry for entry in entries if entry not in ("h1", "h2")]
    if unknown:
        raise ValueError(f"expected h1, h2 or h1,h2, got {unknown[0]!r}")
    if not entries:
        raise ValueError("expected h1, h2 or h1,h2: at least one protocol")
    return sorted(set(entries))


def _http_protocols_value(value: object) -> list[str]:
    """A config file's protocols: a comma-separated string, as gunicorn's, or a list of strings."""
    if isinstance(value, str):
        return _http_protocols(value)
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return _http_protocols(",".join(value))
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


# --workers' word for as many workers as the CPUs maitred may use (maitred.cpus), resolved with
# the other settings (precedence.py).
WORKERS_AUTO = "auto"


def _workers(text: str) -> int | str:
    if text == WORKERS_AUTO:
        return text
    try:
        return _whole_number(1)(text)
    except ValueError:
        raise ValueError(f"expected a whole number of at least 1, or {WORKERS_AUTO}, got {text!r}") from None


def one_of(*choices: str) -> Callable[[str], str]:
    """A parser for a setting that takes one of `choices`, in any case."""

    def parse(text: str) -> str:
        choice = text.lower()
        if choice not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return choice

    return parse


_TRUTHS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def _boolean(text: str) -> bool:
    """true or false (1, yes, on; 0, no, off), in any case, as uvicorn's boolean flags take them."""
    truth = _TRUTHS.get(text.lower())
    if truth is None:
        raise ValueError(f"expected true or false, got {text!r}")
    return truth


def _boolean_value(value: object) -> bool:
    """A config file's boolean: True or False, or the command line's words for them."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _boolean(value)
    raise ValueError(f"expected True or False, got {value!r}")


PROXY_PROTOCOL_MODES = ("off", "v1", "v2", "auto")

_proxy_protocol = one_of(*PROXY_PROTOCOL_MODES)


def _proxy_protocol_value(value: object) -> str:
    """A config file's proxy_protocol: a mode, or True (auto) and False (off) as gunicorn takes."""
    if isinstance(value, bool):
        return "auto" if value else "off"
    if isinstance(value, str):
        return _proxy_protocol(value)
    raise ValueError(f"expected one of {', '.join(PROXY_PROTOCOL_MODES)}, True or False, got {value!r}")
