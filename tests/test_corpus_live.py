"""The request corpora of gunicorn and llhttp, sent byte for byte to a live maitred.

crates/protocol/tests/ checks the decoder alone against the same corpora; this module checks
what a WSGI application behind the whole server sees (tests/apps/environ_echo.py answers with
its environ as JSON) and what a client gets back, over real TCP connections:

- gunicorn tests/requests/valid: every request of a case reaches the application, in order, on
  one connection, with the method, target, version, headers and body the case's .py file gives.
- gunicorn tests/requests/invalid: no case is answered 2xx; each gets a 4xx or 5xx (or, where
  listed, a closed connection), and the server is unharmed: a new connection is served 200 by
  the same worker processes.
- llhttp test/request/*.md, strict cases (meta type exactly "request"): a log ending in
  "message complete" means every logged message is served 2xx with what llhttp parsed; a log
  ending in an error means the messages before it are served and the rest is refused.

Where maitred deliberately differs from a corpus, the case is in an allowlist below with the
outcome it gets instead and why (the same reasons as the decoder's allowlists and
docs/CONFORMANCE.md). A listed case that starts to behave as the corpus expects fails, so the
lists cannot go stale.

Neither gunicorn nor llhttp requires Host in HTTP/1.1 requests; RFC 9112 §3.2 does, and so
does maitred. A case answered "400 ... missing Host header" is sent again, on a new
connection, with a Host field added to the request that lacked it, and judged on that (as the
decoder's corpus tests do). Those cases are counted, not listed.

The counts are printed at the end of the module ("gunicorn valid: N/63 served as expected").
"""

from __future__ import annotations

import ast
import base64
import json
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import pytest
from conftest import HOST, processes_in_group
from corpora import locate, skip_line

ROOT = Path(__file__).resolve().parent.parent
APPS = Path(__file__).resolve().parent / "apps"

# Every socket operation gives up after this long; a whole exchange after EXCHANGE_TIMEOUT.
SOCKET_TIMEOUT = 5.0
EXCHANGE_TIMEOUT = 10.0

ADDED_HOST_VALUE = b"maitred-corpus.invalid"
ADDED_HOST = b"Host: " + ADDED_HOST_VALUE + b"\r\n"
MISSING_HOST = b"missing Host header"

# An outcome other than 2xx: a status code, or the connection closed without an answer.
CLOSED = "closed without an answer"


# ---------------------------------------------------------------------------------------------
# Allowlists. Keys are case names (gunicorn) or "file: title" (llhttp); values are the outcome
# maitred gives instead of the corpus's (a status, CLOSED, or SERVED for an invalid case that
# is answered 2xx) and why.
#
# They match the decoder's allowlists (crates/protocol/tests/) but where the environ or the
# connection, not the decoder, decides:
# - gunicorn valid 040 is served as gunicorn expects: the decoder passes Transfer_Encoding and
#   Content_Length on, the environ drops them. 040_compat, which expects them kept
#   (header_map=dangerous), is a difference here instead.
# - gunicorn invalid 001 and rfc9112_chunked_missing_final_crlf_01 end inside a request: the
#   decoder reports that at the end of input, and the server, having no answer to give, closes.
# - gunicorn invalid limit_header_default_01 sets limit_request_field_size to 0, which the
#   decoder reads as "no limit" but maitred's command line does not take (its limits are 1 to
#   65535): the case runs with the default limit and is refused, as gunicorn expects.

SERVED = "served 2xx"

CHUNKED_ONLY = "transfer codings other than chunked are not supported (RFC 9112 §6.1)"
NO_IDENTITY = "'identity' is not a transfer coding since RFC 7230"
NO_CONNECT = "CONNECT (tunnels) is not supported"
NO_PROXY_PROTOCOL = "the PROXY protocol is not supported (gunicorn's proxy_protocol setting)"
NO_OBS_FOLD = (
    "obsolete line folding is refused (RFC 9112 §5.2 allows a server to); gunicorn "
    "accepts it only with permit_obsolete_folding"
)
UNDERSCORE_DROPPED = (
    "header names with '_' never reach the environ (CGI would read X_User as "
    "X-User); gunicorn passes them on only with header_map=dangerous"
)
UNDERSCORE_IGNORED = (
    "header names with '_' are valid tokens: the request is served and the "
    "environ drops them; gunicorn refuses them only with header_map=refuse"
)
INCOMPLETE = "the input ends inside the request: no answer is due, the connection closes"
ANY_TOKEN_METHOD = "any token is a method (RFC 9110 §9.1)"
ONLY_HTTP1 = "only HTTP/1.x is spoken"

GUNICORN_VALID_DIFFERENCES: dict[str, tuple[int | str, str]] = {
    "009": (
        400,
        (
            "Content-Length with Transfer-Encoding is refused whatever the coding (RFC 9112 "
            "§6.1 allows it; the classic smuggling vector)"
        ),
    ),
    "025": (501, CHUNKED_ONLY),
    "025_line": (501, CHUNKED_ONLY),
    "027": (400, "raw non-ASCII bytes in the request target are refused (RFC 9112 §3.2: percent-encode them)"),
    "028": (
        400,
        (
            "whitespace before a field's colon is refused (RFC 9112 §5.1 MUST); gunicorn "
            "accepts it only with strip_header_spaces"
        ),
    ),
    "029": (501, NO_IDENTITY),
    "030": (501, NO_IDENTITY),
    "031compat": (
        SERVED,
        (
            "methods are case-sensitive (RFC 9110 §9.1): the app sees '-blargh'; "
            "gunicorn upper-cases them only with casefold_http_method"
        ),
    ),
    "040_compat": (SERVED, UNDERSCORE_DROPPED),
    "099": (
        CLOSED,
        (
            "the file holds 8599 body bytes for Content-Length: 17914: the request is "
            "incomplete when the client closes, so it is never served"
        ),
    ),
    "compat_obs_fold": (400, NO_OBS_FOLD),
    "compat_obs_fold_huge": (400, NO_OBS_FOLD),
    "pp_01": (400, NO_PROXY_PROTOCOL),
    "pp_02": (400, NO_PROXY_PROTOCOL),
    "pp_04": (400, NO_PROXY_PROTOCOL),
    "pp_05": (400, NO_PROXY_PROTOCOL),
    "rfc9112_smuggle_gzip_chunked_01": (501, CHUNKED_ONLY),
    "rfc9112_smuggle_te_identity_chunked_01": (501, NO_IDENTITY),
    "rfc9112_target_authority_connect_01": (501, NO_CONNECT),
    "rfc9112_target_authority_ipv6_01": (501, NO_CONNECT),
}

GUNICORN_INVALID_DIFFERENCES: dict[str, tuple[int | str, str]] = {
    "001": (CLOSED, INCOMPLETE),
    "003c": (SERVED, ANY_TOKEN_METHOD + ", '-bl' included; gunicorn insists on upper case"),
    "006": (
        SERVED,
        (
            "its 4112-byte request line is within the default --limit-request-line of 8190 "
            "(RFC 9112 §3 recommends at least 8000); gunicorn's default is 4094"
        ),
    ),
    "040": (SERVED, UNDERSCORE_IGNORED),
    "chunked_07": (SERVED, UNDERSCORE_IGNORED),
    "rfc9112_chunked_missing_final_crlf_01": (CLOSED, INCOMPLETE),
}

UPGRADE_IGNORED = (
    "Upgrade is ignored (RFC 9110 §7.8 allows it; WSGI cannot switch protocols): the request is served as plain HTTP"
)

LLHTTP_DIFFERENCES: dict[str, tuple[int | str, str]] = {
    "connection.md: Setting a flag and pausing": (SERVED, UPGRADE_IGNORED + "; llhttp stops for the switch"),
    "connection.md: Emitting part of body and pausing": (
        SERVED,
        UPGRADE_IGNORED + "; the bytes after the body start a next request, never completed",
    ),
    "content-length.md: Content-Length reset when no body is received": (
        CLOSED,
        (
            "skipBody is an llhttp callback feature (skipping the body of a response to HEAD); "
            "a server reads a request's body, here the next request's bytes, and never gets "
            "all 123"
        ),
    ),
    "invalid.md: HTTP protocol and ANNOUNCE method": (
        SERVED,
        ANY_TOKEN_METHOD + "; llhttp knows a fixed list per protocol",
    ),
    "invalid.md: Invalid method": (SERVED, ANY_TOKEN_METHOD + ", MKCOLA included; llhttp knows a fixed list"),
    "invalid.md: Invalid HTTP version": (
        CLOSED,
        (
            "the input stops right after 'HTTP/5.6' with no line end: maitred waits for the "
            "line end to tell 505 (well-formed) from 400, and the client closes first"
        ),
    ),
    "method.md: CONNECT request": (501, NO_CONNECT),
    "method.md: CONNECT request with CAPS": (501, NO_CONNECT),
    "method.md: CONNECT with body": (501, NO_CONNECT),
    "method.md: M-SEARCH request": (
        400,
        "'*' is only a target for OPTIONS (RFC 9112 §3.2.4); M-SEARCH * is SSDP over UDP, not HTTP",
    ),
    "method.md: SOURCE request with ICE": (400, ONLY_HTTP1 + ", not ICE"),
    "method.md: OPTIONS request with RTSP": (400, ONLY_HTTP1 + ", not RTSP"),
    "method.md: ANNOUNCE request with RTSP": (400, ONLY_HTTP1 + ", not RTSP"),
    "sample.md: No HTTP version": (400, "HTTP/0.9 requests (no version) are refused"),
    "transfer-encoding.md: POST with `chunked` as last transfer-encoding": (501, CHUNKED_ONLY + " (deflate)"),
    "transfer-encoding.md: POST with `chunked` as last transfer-encoding (multiple headers)": (
        501,
        CHUNKED_ONLY + " (deflate)",
    ),
    "uri.md: Underscore in hostname": (501, NO_CONNECT + " (the case is a CONNECT request)"),
}

# gunicorn settings that map to maitred flags; the other cfg.set() settings turn on leniencies
# maitred does not offer, and the allowlists say where that changes the outcome.
GUNICORN_LIMIT_FLAGS = {
    "limit_request_line": "--limit-request-line",
    "limit_request_field_size": "--limit-request-field_size",
    "limit_request_fields": "--limit-request-fields",
}


# ---------------------------------------------------------------------------------------------
# What the application should see of one request.


@dataclass
class Expected:
    method: bytes
    target: bytes
    version: bytes
    """As in the request line: b"1.1"."""
    headers: list[tuple[bytes, bytes]]
    body: bytes


def split_target(target: bytes) -> tuple[bytes, bytes, bytes | None]:
    """PATH_INFO (still percent-encoded), QUERY_STRING and, for an absolute-form target, the
    authority that stands in for Host (RFC 9112 §3.2.2). A fragment is no part of either."""
    target = target.split(b"#", 1)[0]
    authority = None
    absolute = re.fullmatch(rb"[A-Za-z][A-Za-z0-9+.-]*://([^/?]*)(.*)", target, re.DOTALL)
    if absolute:
        authority = absolute.group(1).rpartition(b"@")[2]
        target = absolute.group(2) or b"/"
        if target.startswith(b"?"):
            target = b"/" + target
    path, _, query = target.partition(b"?")
    return path, query, authority


def expected_environ(request: Expected, keep_underscores: bool) -> dict[str, bytes]:
    """The environ entries (as bytes) the echo application reports for `request`. Header names
    with '_' are dropped (CGI would read X_User as X-User), as gunicorn does unless its
    header_map setting is "dangerous" (`keep_underscores`)."""
    path, query, authority = split_target(request.target)
    environ = {
        "REQUEST_METHOD": request.method,
        "RAW_URI": request.target,
        "PATH_INFO": unquote_to_bytes(path),
        "QUERY_STRING": query,
        "SERVER_PROTOCOL": b"HTTP/" + request.version,
    }
    body_framed = False
    for name, value in request.headers:
        if b"_" in name and not keep_underscores:
            continue
        upper = name.upper()
        # The lobby has read and de-chunked the body: the application sees its length only.
        if upper in (b"CONTENT-LENGTH", b"TRANSFER-ENCODING"):
            body_framed = True
            continue
        if upper == b"CONTENT-TYPE":
            key = "CONTENT_TYPE"
        else:
            key = "HTTP_" + upper.replace(b"-", b"_").decode("latin-1")
        environ[key] = environ[key] + b", " + value if key in environ else value
    if authority is not None:
        environ["HTTP_HOST"] = authority
    if request.body or body_framed:
        environ["CONTENT_LENGTH"] = str(len(request.body)).encode()
    environ["body"] = request.body
    return environ


def received_environ(echo: dict) -> dict[str, bytes]:
    return {key: base64.b64decode(value) if key == "body" else value.encode("latin-1") for key, value in echo.items()}


def environ_differences(expected: Expected, echo: dict, keep_underscores: bool) -> list[str]:
    want, got = expected_environ(expected, keep_underscores), received_environ(echo)
    differences = []
    for key in sorted(want.keys() | got.keys()):
        if key == "HTTP_HOST" and key not in want and got[key] == ADDED_HOST_VALUE:
            continue
        if want.get(key) != got.get(key):
            differences.append(f"{key}: got {got.get(key)!r}, expected {want.get(key)!r}")
    return differences


# ---------------------------------------------------------------------------------------------
# The wire: send a case, read the answers strictly.


class MalformedResponse(Exception):
    pass


@dataclass
class Response:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        values = [v for n, v in self.headers if n.lower() == name.lower()]
        if len(values) > 1:
            raise MalformedResponse(f"{name!r} given {len(values)} times")
        return values[0] if values else None

    def echo(self) -> dict:
        """What the echo application received (see tests/apps/environ_echo.py)."""
        in_header = self.header(b"echo-environ")
        return json.loads(base64.b64decode(in_header) if in_header is not None else self.body)

    def show(self) -> str:
        if self.header(b"echo-method") is not None:
            return f"{self.status} (served)"
        return f"{self.status} {self.body.decode('utf-8', 'replace').strip()!r}"


@dataclass
class Exchange:
    responses: list[Response]
    ending: str
    """How the connection ended after the last response: "closed", "reset" (the server reset
    it), or "open" (neither an answer nor a close within the timeout)."""

    def show(self) -> str:
        return ", ".join([r.show() for r in self.responses] + [self.ending])


TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9]) [\t !-~\x80-\xff]*")
FIELD_VALUE = rb"(?:[!-~\x80-\xff](?:[ \t]*[!-~\x80-\xff])*)?"
FIELD_LINE = re.compile(rb"(" + TOKEN + rb"):[ \t]*(" + FIELD_VALUE + rb")[ \t]*")


class ResponseReader:
    """Reads HTTP/1.1 responses from a socket, refusing anything not well-formed."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = b""
        self.eof = False

    def _fill(self) -> None:
        if self.eof:
            raise MalformedResponse(f"connection closed inside a response: {self.buf[:200]!r}")
        self.sock.settimeout(max(0.05, min(SOCKET_TIMEOUT, self.deadline - time.monotonic())))
        data = self.sock.recv(65536)
        if not data:
            self.eof = True
        self.buf += data

    def _line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._fill()
        line, self.buf = self.buf[:end], self.buf[end + 2 :]
        if b"\n" in line or b"\r" in line:
            raise MalformedResponse(f"bare CR or LF in {line!r}")
        return line

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def at_clean_end(self) -> bool:
        """Whether the server closed here, between responses."""
        while not self.buf and not self.eof:
            self._fill()
        return not self.buf and self.eof

    def response(self) -> Response:
        """The next final response; interim (1xx) ones before it are skipped."""
        while True:
            status, headers = self._head()
            if status >= 200:
                break
            if status == 101:
                raise MalformedResponse("101 Switching Protocols")
        response = Response(status, headers, b"")
        length = response.header(b"content-length")
        transfer_encoding = response.header(b"transfer-encoding")
        no_body = response.header(b"echo-method") == b"HEAD" or status in (204, 304)
        if length is not None and transfer_encoding is not None:
            raise MalformedResponse("both Content-Length and Transfer-Encoding")
        if no_body:
            return response
        if transfer_encoding is not None:
            if transfer_encoding != b"chunked":
                raise MalformedResponse(f"Transfer-Encoding {transfer_encoding!r}")
            response.body = self._chunked()
        elif length is not None:
            if not re.fullmatch(rb"[0-9]+", length):
                raise MalformedResponse(f"Content-Length {length!r}")
            response.body = self._exactly(int(length))
        else:
            if (response.header(b"connection") or b"").lower() != b"close":
                raise MalformedResponse("a body delimited by the close of a keep-alive connection")
            while not self.eof:
                self._fill()
            response.body, self.buf = self.buf, b""
        return response

    def _head(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        line = self._line()
        status_line = STATUS_LINE.fullmatch(line)
        if not status_line:
            raise MalformedResponse(f"status line {line!r}")
        headers = []
        while line := self._line():
            field_line = FIELD_LINE.fullmatch(line)
            if not field_line:
                raise MalformedResponse(f"field line {line!r}")
            headers.append((field_line.group(1), field_line.group(2)))
        return int(status_line.group(1)), headers

    def _chunked(self) -> bytes:
        body = b""
        while True:
            size_line = self._line()
            size = re.fullmatch(rb"([0-9A-Fa-f]+)(?:;.*)?", size_line)
            if not size:
                raise MalformedResponse(f"chunk size line {size_line!r}")
            if int(size.group(1), 16) == 0:
                break
            body += self._exactly(int(size.group(1), 16))
            if self._exactly(2) != b"\r\n":
                raise MalformedResponse("chunk data not followed by CRLF")
        while line := self._line():
            if not FIELD_LINE.fullmatch(line):
                raise MalformedResponse(f"trailer line {line!r}")
        return body


def exchange(port: int, data: bytes) -> Exchange:
    """Sends `data` on a new connection, closes the sending side (so that input ending inside a
    request is seen as the end of it), and reads responses until the server closes."""
    deadline = time.monotonic() + EXCHANGE_TIMEOUT
    with socket.create_connection((HOST, port), timeout=SOCKET_TIMEOUT) as sock:
        responses: list[Response] = []
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server answered and closed before taking everything; read the answer
        reader = ResponseReader(sock, deadline)
        try:
            while not reader.at_clean_end():
                responses.append(reader.response())
        except ConnectionResetError:
            return Exchange(responses, "reset")
        except TimeoutError:
            return Exchange(responses, "open")
        return Exchange(responses, "closed")


def is_served(response: Response) -> bool:
    return 200 <= response.status < 300 and response.header(b"echo-method") is not None


def request_start(data: bytes, served: list[Response]) -> int:
    """Where the request after the `served` ones starts in `data`: each served request's head
    ends at the first empty line, its body is as long as the application saw, or chunked."""
    at = 0
    for response in served:
        at = skip_empty_lines(data, at)
        head_end = data.index(b"\r\n\r\n", at)
        # The application sees a de-chunked body's length, not its coding: the head says.
        chunked = re.search(rb"(?im)^transfer-encoding:[^\r]*chunked", data[at:head_end]) is not None
        at = head_end + 4
        echo = response.echo()
        if chunked:
            at = skip_chunked(data, at)
        else:
            at += int(echo.get("CONTENT_LENGTH", "0"))
    return skip_empty_lines(data, at)


def skip_empty_lines(data: bytes, at: int) -> int:
    while data.startswith(b"\r\n", at):
        at += 2
    return at


def skip_chunked(data: bytes, at: int) -> int:
    while True:
        line_end = data.index(b"\r\n", at)
        size = int(data[at:line_end].split(b";")[0].strip(b" \t"), 16)
        at = line_end + 2
        if size == 0:
            return data.index(b"\r\n\r\n", at - 2) + 4
        at += size + 2


@dataclass
class Sent:
    exchange: Exchange
    hosts_added: int

    @property
    def note(self) -> str:
        return " (once given a Host)" if self.hosts_added else ""


def send(port: int, data: bytes) -> Sent:
    """`exchange`, again with a Host field added to each request refused only for lacking it."""
    hosts_added = 0
    while True:
        result = exchange(port, data)
        responses = result.responses
        if not responses or responses[-1].status != 400 or MISSING_HOST not in responses[-1].body:
            return Sent(result, hosts_added)
        served = responses[:-1]
        assert all(is_served(r) for r in served), result.show()
        start = request_start(data, served)
        line_end = data.index(b"\r\n", start) + 2
        data = data[:line_end] + ADDED_HOST + data[line_end:]
        hosts_added += 1


# ---------------------------------------------------------------------------------------------
# The servers: one per set of limit flags (most cases use the defaults), shared by the module.


# A request within the smallest limits the corpus sets (no header field at all).
HEALTH_CHECK = b"GET /health HTTP/1.0\r\n\r\n"


@dataclass
class LiveServer:
    port: int
    group: int
    processes: set[int]
    """The lobby, the zygote and the worker, once it served a first request."""

    def check_unharmed(self) -> None:
        """A new connection is served 200, by the processes that were there at the start."""
        result = exchange(self.port, HEALTH_CHECK)
        assert [r.status for r in result.responses] == [200], f"health check: {result.show()}"
        assert set(processes_in_group(self.group)) == self.processes, "a process was replaced"


class Servers:
    def __init__(self, launch) -> None:
        self.launch = launch
        self.by_flags: dict[tuple[str, ...], LiveServer] = {}

    def get(self, flags: tuple[str, ...] = ()) -> LiveServer:
        if flags not in self.by_flags:
            server = self.launch(
                "-w",
                "1",
                "--log-level",
                "warning",
                *flags,
                "environ_echo:app",
                cwd=APPS,
            )
            live = LiveServer(server.port, server.pid, set())
            # The worker exists once it has answered.
            first = exchange(server.port, HEALTH_CHECK)
            assert [r.status for r in first.responses] == [200], first.show()
            live.processes = set(processes_in_group(server.pid))
            self.by_flags[flags] = live
        return self.by_flags[flags]


@pytest.fixture(scope="module")
def servers(maitred_module_server) -> Servers:
    return Servers(maitred_module_server)


# ---------------------------------------------------------------------------------------------
# The gunicorn corpus: .http files (escaped text) and .py files (read as data with ast).


def decode_gunicorn_http(raw: bytes) -> bytes:
    """Literal newlines are dropped; \\r \\n \\t \\0 and \\xHH stand for their bytes."""
    text = raw.replace(b"\n", b"")
    escapes = {b"r": b"\r", b"n": b"\n", b"t": b"\t", b"0": b"\0"}

    def unescape(match: re.Match) -> bytes:
        code = match.group(1)
        if code.startswith(b"x"):
            return bytes([int(code[1:], 16)])
        return escapes[code]

    out = re.sub(rb"\\(x[0-9A-Fa-f]{2}|[rnt0])", unescape, text)
    rest = re.sub(rb"\\(x[0-9A-Fa-f]{2}|[rnt0])", b"", text)
    if b"\\" in rest:
        at = rest.index(b"\\")
        raise ValueError(f"unknown escape near {rest[at : at + 6]!r}")
    return out


@dataclass(frozen=True)
class Outside:
    """A name the .py file takes from gunicorn (an exception class, Config)."""

    name: str


class PyCase:
    """A gunicorn .py case as data: the names it binds, and its cfg.set() settings."""

    def __init__(self, source: str) -> None:
        self.names: dict[str, object] = {}
        self.settings: dict[str, object] = {}
        for statement in ast.parse(source).body:
            match statement:
                case ast.Import() | ast.ImportFrom():
                    pass
                case ast.Assign(targets=[ast.Name(id=name)], value=value):
                    self.names[name] = self.evaluate(value)
                case ast.Expr(
                    value=ast.Call(
                        func=ast.Attribute(value=ast.Name(id="cfg"), attr="set"),
                        args=[setting, value],
                    )
                ):
                    self.settings[self.evaluate(setting)] = self.evaluate(value)
                case _:
                    raise ValueError(f"unexpected statement: {ast.dump(statement)[:200]}")

    def evaluate(self, node: ast.expr) -> object:
        match node:
            case ast.Constant(value=value):
                return value
            case ast.Tuple(elts=items):
                return tuple(self.evaluate(item) for item in items)
            case ast.List(elts=items):
                return [self.evaluate(item) for item in items]
            case ast.Dict(keys=keys, values=values):
                return {self.evaluate(k): self.evaluate(v) for k, v in zip(keys, values)}
            case ast.Name(id=name):
                return self.names.get(name, Outside(name))
            case ast.BinOp(left=left, op=ast.Add(), right=right):
                return self.evaluate(left) + self.evaluate(right)
            case ast.Call(func=ast.Name(id="uri"), args=[target]):
                return self.evaluate(target)  # the raw request-target
            case ast.Call(func=ast.Name(id=name), args=[]):
                return Outside(name)  # Config()
            case ast.Call(
                func=ast.Attribute(value=obj, attr="encode" | "decode" | "replace" as method),
                args=args,
            ):
                return getattr(self.evaluate(obj), method)(*(self.evaluate(a) for a in args))
        raise ValueError(f"unexpected expression: {ast.dump(node)[:200]}")


def as_bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("latin-1")


@dataclass
class GunicornCase:
    name: str
    data: bytes
    module: PyCase

    @property
    def flags(self) -> tuple[str, ...]:
        flags: list[str] = []
        for setting, value in sorted(self.module.settings.items()):
            # gunicorn reads 0 as "the default" (once: "unlimited"); maitred's limits are 1 to
            # 65535 (the worker channel's bound), so 0 leaves the default in place.
            if setting in GUNICORN_LIMIT_FLAGS and value != 0:
                flags += [GUNICORN_LIMIT_FLAGS[setting], str(value)]
        return tuple(flags)

    def expected(self) -> list[Expected]:
        request = self.module.names["request"]
        return [
            Expected(
                method=as_bytes(r["method"]),
                target=as_bytes(r["uri"]),
                version=b"%d.%d" % r["version"],
                headers=[(as_bytes(n), as_bytes(v)) for n, v in r["headers"]],
                body=as_bytes(r["body"]),
            )
            for r in (request if isinstance(request, list) else [request])
        ]


def gunicorn_cases(root: Path, kind: str) -> list[GunicornCase]:
    directory = root / "tests" / "requests" / kind
    cases = [
        GunicornCase(http.stem, decode_gunicorn_http(http.read_bytes()), PyCase(http.with_suffix(".py").read_text()))
        for http in sorted(directory.glob("*.http"))
    ]
    if not cases:
        pytest.fail(f"no .http files in {directory}")
    return cases


# ---------------------------------------------------------------------------------------------
# The llhttp corpus: markdown sections with an http block and a log block.


def decode_llhttp_input(text: str) -> bytes:
    """A backslash at a line end joins the lines, every line break is CRLF, and \\r \\n \\t
    \\f \\xHH and \\NNN (octal) stand for their bytes; other backslashes are literal."""
    joined = text.replace("\\\n", "").replace("\n", "\r\n").encode("utf-8")
    simple = {b"r": b"\r", b"n": b"\n", b"t": b"\t", b"f": b"\f"}

    def unescape(match: re.Match) -> bytes:
        code = match.group(1)
        if code in simple:
            return simple[code]
        if code.startswith(b"x"):
            return bytes([int(code[1:], 16)])
        return bytes([int(code, 8)])

    return re.sub(rb"\\(x[0-9A-Fa-f]{2}|[0-7]{1,3}|[rntf])", unescape, joined)


@dataclass
class Logged:
    """What llhttp's log says about one message."""

    method: bytes = b""
    url: bytes = b""
    version: bytes = b""
    headers: list[list[bytes]] = field(default_factory=list)
    body: bytes = b""
    headers_complete: bool = False
    complete: bool = False


@dataclass
class LlhttpCase:
    key: str
    data: bytes
    messages: list[Logged]
    error: str | None
    """The reason of the error the log ends with, if it does."""


LOG_ESCAPES = {"t": "\t", "f": "\f", "r": "\r", "n": "\n"}


def span_bytes(shown: str, data: bytes) -> bytes:
    """The bytes of a logged span: the log shows \\t \\f \\r \\n for those controls, and other
    bytes as UTF-8 where the input has UTF-8 text, as Latin-1 characters where it has single
    bytes (written \\xHH); whichever of the two is in the input is the one."""
    text = re.sub(r"\\([tfrn])", lambda m: LOG_ESCAPES[m.group(1)], shown)
    utf8 = text.encode("utf-8")
    return utf8 if utf8 in data else text.encode("latin-1")


def read_log(lines: list[str], data: bytes) -> tuple[list[Logged], str | None]:
    messages: list[Logged] = []
    error = None
    last_span = ""
    for line in lines:
        event = line.split(" ", 1)[1] if " " in line else ""
        if event == "message begin":
            messages.append(Logged())
            last_span = ""
        elif event.startswith("headers complete"):
            messages[-1].headers_complete = True
        elif event == "message complete":
            messages[-1].complete = True
        elif event.startswith("error "):
            error = event.split('reason="', 1)[1].rstrip('"') if 'reason="' in event else ""
        elif span := re.fullmatch(r'len=\d+ span\[(\w+)\]="(.*)"', event):
            kind, value = span.group(1), span_bytes(span.group(2), data)
            message = messages[-1]
            if kind in ("method", "url", "version", "body"):
                setattr(message, kind, getattr(message, kind) + value)
            # Fields logged after the head are trailers, which WSGI has no place for.
            elif kind == "header_field" and not message.headers_complete:
                if last_span == "header_field":
                    message.headers[-1][0] += value
                else:
                    message.headers.append([value, b""])
            elif kind == "header_value" and not message.headers_complete:
                message.headers[-1][1] += value
            last_span = kind
    return messages, error


def llhttp_cases(root: Path) -> list[LlhttpCase]:
    directory = root / "test" / "request"
    cases = []
    for path in sorted(directory.glob("*.md")):
        lines = path.read_text().split("\n")
        title, meta_type, i = "", None, 0
        while i < len(lines):
            line = lines[i]
            if line.startswith("#"):
                title = line.lstrip("#").strip()
            elif line.startswith("<!-- meta="):
                meta_type = json.loads(line[len("<!-- meta=") :].removesuffix("-->").strip())["type"]
            elif line == "```http":
                end = lines.index("```", i + 1)
                log_start = lines.index("```log", end) + 1
                log_end = lines.index("```", log_start)
                if meta_type == "request":
                    data = decode_llhttp_input("\n".join(lines[i + 1 : end]))
                    messages, error = read_log(lines[log_start:log_end], data)
                    cases.append(LlhttpCase(f"{path.name}: {title}", data, messages, error))
                meta_type, i = None, log_end
            i += 1
    if not cases:
        pytest.fail(f"no strict request cases in {directory}")
    return cases


def llhttp_expected(message: Logged) -> Expected:
    return Expected(
        method=message.method,
        target=message.url,
        version=message.version,
        headers=[(name, value.strip(b" \t")) for name, value in message.headers],
        body=message.body,
    )


# ---------------------------------------------------------------------------------------------
# Judging a case, and the tally printed at the end.


def outcome(result: Exchange) -> int | str:
    """What maitred did, in brief: SERVED (every answer came from the application), the status
    of the refusal that ends the exchange (after any served requests), CLOSED (no answer at
    all), or, for anything else, the whole exchange."""
    responses = result.responses
    served = served_count(result)
    if result.ending == "closed" and not responses:
        return CLOSED
    if result.ending == "closed" and served == len(responses):
        return SERVED
    # After a refusal the server closes at once; with input it did not read, the kernel
    # resets the connection once the answer is out.
    if result.ending in ("closed", "reset") and served == len(responses) - 1 and 400 <= responses[-1].status < 600:
        return responses[-1].status
    return result.show()


def served_count(result: Exchange) -> int:
    """How many answers in a row, from the first, came from the application."""
    count = 0
    while count < len(result.responses) and is_served(result.responses[count]):
        count += 1
    return count


def environ_problems(
    result: Exchange,
    expected: list[Expected],
    keep_underscores: bool = False,
) -> list[str]:
    """How what the application saw differs from `expected`, request by request."""
    problems = []
    for i, (response, request) in enumerate(zip(result.responses, expected)):
        differences = environ_differences(request, response.echo(), keep_underscores)
        problems += [f"request {i}: {difference}" for difference in differences]
    return problems


TALLY_KINDS = ("as expected", "given a Host", "documented", "failed")
TALLY: dict[str, dict[str, list[str]]] = {}
"""Per corpus, the names of the cases of each kind."""


def judge(
    corpus: str,
    name: str,
    problems: list[str],
    result: Exchange,
    sent: Sent,
    allowlist: dict[str, tuple[int | str, str]],
) -> None:
    """Records the case and fails it if it neither behaves as the corpus expects (no
    `problems`) nor as its allowlist entry says."""
    tally = TALLY.setdefault(corpus, {kind: [] for kind in TALLY_KINDS})
    what = f"{result.show()}{sent.note}"

    def fail(message: str) -> None:
        tally["failed"].append(name)
        pytest.fail(message)

    listed = allowlist.get(name)
    if listed is None:
        if problems:
            fail(f"{what}: " + "; ".join(problems))
        tally["as expected"].append(name)
        if sent.hosts_added:
            tally["given a Host"].append(name)
        return
    documented, reason = listed
    if not problems:
        fail(f"behaves as the corpus expects now ({what}), but is allowlisted: {reason}")
    if outcome(result) != documented:
        fail(f"allowlisted as {documented!r} ({reason}), but: {what}: " + "; ".join(problems))
    tally["documented"].append(name)


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or not TALLY:
        return
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        reporter.write("\n")  # end the line of progress dots
        reporter.section("maitred against the request corpora, live", sep="-")
        for corpus, tally in TALLY.items():
            total = sum(len(tally[k]) for k in ("as expected", "documented", "failed"))
            reporter.write_line(
                f"{corpus}: {len(tally['as expected'])}/{total} {VERDICTS[corpus]} "
                f"({len(tally['given a Host'])} of them once given the Host field RFC 9112 "
                f"requires), {len(tally['documented'])} documented differences, "
                f"{len(tally['failed'])} failed" + (f": {', '.join(tally['failed'])}" if tally["failed"] else "")
            )


VERDICTS = {
    "gunicorn valid": "served as expected",
    "gunicorn invalid": "refused as expected",
    "llhttp strict": "as expected",
}


def corpus_cases(name: str, cases_of: Callable[[Path], list], case_id: Callable[[Any], str]) -> list:
    """The corpus's cases as test parameters; a corpus that cannot be had (tests/corpora.py)
    is one skipped parameter whose reason says which and why."""
    found = locate(name)
    if found.root is None:
        return [pytest.param(None, id=name, marks=pytest.mark.skip(reason=skip_line(name, found)))]
    return [pytest.param(case, id=case_id(case)) for case in cases_of(found.root)]


GUNICORN_VALID = corpus_cases("gunicorn", lambda root: gunicorn_cases(root, "valid"), lambda case: case.name)
GUNICORN_INVALID = corpus_cases("gunicorn", lambda root: gunicorn_cases(root, "invalid"), lambda case: case.name)
LLHTTP = corpus_cases("llhttp", llhttp_cases, lambda case: case.key)


@pytest.mark.parametrize("case", GUNICORN_VALID)
def test_gunicorn_valid(case: GunicornCase, servers: Servers) -> None:
    sent = send(servers.get(case.flags).port, case.data)
    result, expected = sent.exchange, case.expected()
    if outcome(result) != SERVED or len(result.responses) != len(expected):
        problems = [f"expected {len(expected)} requests served"]
    else:
        keep_underscores = case.module.settings.get("header_map") == "dangerous"
        problems = environ_problems(result, expected, keep_underscores)
    judge("gunicorn valid", case.name, problems, result, sent, GUNICORN_VALID_DIFFERENCES)


@pytest.mark.parametrize("case", GUNICORN_INVALID)
def test_gunicorn_invalid(case: GunicornCase, servers: Servers) -> None:
    server = servers.get(case.flags)
    sent = send(server.port, case.data)
    result = sent.exchange
    problems = []
    if not isinstance(outcome(result), int) or len(result.responses) != 1:
        problems.append(f"expected a 4xx or 5xx ({case.module.names['request'].name})")
    try:
        judge("gunicorn invalid", case.name, problems, result, sent, GUNICORN_INVALID_DIFFERENCES)
    finally:
        server.check_unharmed()


@pytest.mark.parametrize("case", LLHTTP)
def test_llhttp_strict(case: LlhttpCase, servers: Servers) -> None:
    server = servers.get()
    sent = send(server.port, case.data)
    result = sent.exchange
    expected = [llhttp_expected(m) for m in case.messages if m.complete]
    served = served_count(result)
    # "Data after `Connection: close`" is llhttp being handed the bytes after a request that
    # closes the connection; a server never reads them.
    if case.error is None or case.error == "Data after `Connection: close`":
        if served != len(expected) or outcome(result) not in (SERVED, CLOSED):
            problems = [f"expected {len(expected)} requests served, and nothing else"]
        else:
            problems = environ_problems(result, expected)
    elif served != len(expected) or not isinstance(outcome(result), int):
        problems = [f"expected {len(expected)} requests served, then a 4xx or 5xx ({case.error})"]
    else:
        problems = environ_problems(result, expected)
    try:
        judge("llhttp strict", case.key, problems, result, sent, LLHTTP_DIFFERENCES)
    finally:
        server.check_unharmed()
