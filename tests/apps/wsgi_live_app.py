"""The application tests/test_wsgi_live.py drives through a live maitred.

The first segment of PATH_INFO picks a behaviour (``/stream``, ``/input``, ...); any other
path answers with a JSON description of the environ, so that the environ of any request
target can be inspected. Paths under ``/v/`` reach a few plain routes through
`wsgiref.validate.validator`, with its warnings turned into errors: a breach of PEP 3333 on
either side becomes an exception, which the server answers with 500 and logs.

Files the tests look at (what ``close()`` saw, a gate a route waits on, the file a route
serves) live in the directory named by the environment variable WSGI_LIVE_DIR.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from urllib.parse import parse_qs
from wsgiref.validate import WSGIWarning, validator

warnings.simplefilter("error", WSGIWarning)

SHARED_DIR = Path(os.environ["WSGI_LIVE_DIR"])
SERVED_FILE = SHARED_DIR / "served.bin"
GATE_TIMEOUT = 10.0

StartResponse = Callable[..., Callable[[bytes], None]]
TEXT = ("Content-Type", "text/plain")


def query(environ: dict) -> dict[str, str]:
    return {key: values[-1] for key, values in parse_qs(environ["QUERY_STRING"]).items()}


def shared_path(name: str) -> Path:
    """A file of the shared directory; `name` comes from the test, so it may not climb out."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad shared file name {name!r}")
    return SHARED_DIR / name


def record(name: str, event: str) -> None:
    with open(shared_path(name), "a") as file:
        file.write(event + "\n")


# --- the environ --------------------------------------------------------------------------


def describe(value: object) -> object:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, tuple):
        return [describe(item) for item in value]
    return repr(value)


def public_methods(thing: object) -> list[str]:
    return sorted(
        name
        for name in dir(thing)
        if callable(getattr(thing, name)) and (not name.startswith("_") or name in ("__iter__", "__next__"))
    )


def environ_dump(environ: dict, start_response: StartResponse) -> list[bytes]:
    described = {
        "environ": {key: {"type": type(value).__name__, "value": describe(value)} for key, value in environ.items()},
        "key_types": sorted({type(key).__name__ for key in environ}),
        "input_methods": public_methods(environ["wsgi.input"]),
        "errors_methods": public_methods(environ["wsgi.errors"]),
        "body": environ["wsgi.input"].read().decode("latin-1"),
    }
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(described).encode()]


# --- wsgi.input ---------------------------------------------------------------------------


def read_input(stream, mode: str, size: int) -> bytes:
    """All of `stream`, read the way `mode` names."""
    if mode == "read-n":
        parts = []
        while part := stream.read(size):
            assert len(part) <= size, f"read({size}) gave {len(part)} bytes"
            parts.append(part)
        return b"".join(parts)
    if mode == "read-all":
        return stream.read()
    if mode == "readline":
        lines = []
        while line := stream.readline():
            assert line.endswith(b"\n") or b"\n" not in line
            lines.append(line)
        return b"".join(lines)
    if mode == "readline-n":
        parts = []
        while part := stream.readline(size):
            assert len(part) <= size, f"readline({size}) gave {len(part)} bytes"
            assert b"\n" not in part[:-1], "readline() went past a newline"
            parts.append(part)
        return b"".join(parts)
    if mode == "readlines":
        return b"".join(stream.readlines())
    if mode == "iter":
        return b"".join(stream)
    if mode == "mixed":
        # Every method in turn, so that what one buffers the next must take into account.
        parts = [stream.read(3), stream.readline(), stream.read(size), stream.readline(7)]
        parts.extend(stream.readlines(size))
        parts.append(stream.readline())
        parts.extend(iter(stream.readline, b""))
        parts.append(stream.read())
        return b"".join(parts)
    raise ValueError(f"unknown input mode {mode!r}")


def input_echo(environ: dict, start_response: StartResponse) -> list[bytes]:
    """Answers with the request body as read in the mode the query names; X-Eof says whether
    every way of reading returns b"" after that."""
    params = query(environ)
    stream = environ["wsgi.input"]
    body = read_input(stream, params["mode"], int(params.get("size", "8192")))
    after = [stream.read(), stream.read(1), stream.readline(), stream.readlines(), list(stream)]
    eof = all(not leftover for leftover in after)
    start_response("200 OK", [TEXT, ("X-Eof", "yes" if eof else repr(after)[:200])])
    return [body]


# --- responses ----------------------------------------------------------------------------


def hello(environ: dict, start_response: StartResponse) -> list[bytes]:
    start_response("200 OK", [TEXT])
    return [b"hello, world\n"]


def several(environ: dict, start_response: StartResponse) -> list[bytes]:
    start_response("200 OK", [TEXT])
    return [b"one ", b"", b"two ", b"three\n"]


def stream(environ: dict, start_response: StartResponse) -> Iterator[bytes]:
    count = int(query(environ).get("n", "5"))
    start_response("200 OK", [TEXT])
    for index in range(count):
        yield f"chunk {index}\n".encode()


def hop_by_hop(environ: dict, start_response: StartResponse) -> Iterator[bytes]:
    """What a WSGI proxy that copies its upstream's headers sends: hop-by-hop ones among them,
    which PEP 3333 forbids and gunicorn drops (with ``?close=1``, ``Connection: close``)."""
    connection = "close" if "close" in query(environ) else "keep-alive"
    start_response("200 OK", [TEXT, ("Connection", connection), ("Transfer-Encoding", "chunked"), ("Keep-Alive", "5")])
    yield b"hop "
    yield b"by hop\n"


def write_callable(environ: dict, start_response: StartResponse) -> list[bytes]:
    """Sends through write(), then returns the rest of the body as an iterable."""
    write = start_response("200 OK", [TEXT])
    write(b"written 1\n")
    write(b"")
    write(b"written 2\n")
    return [b"returned 1\n", b"returned 2\n"]


def write_only(environ: dict, start_response: StartResponse) -> list[bytes]:
    write = start_response("200 OK", [TEXT, ("Content-Length", "12")])
    write(b"hello ")
    write(b"world\n")
    return []


def status(environ: dict, start_response: StartResponse) -> list[bytes]:
    """Answers with the status the query names, and the body it names, which a response of
    that status may not carry. A 204 or 304 has a Content-Type only if the query asks for
    one (``content_type=1``), which wsgiref.validate forbids."""
    params = query(environ)
    code = int(params["status"][:3])
    bodiless = code in (204, 304) and "content_type" not in params
    start_response(params["status"], [] if bodiless else [TEXT])
    return [params.get("body", "").encode()]


def file_response(environ: dict, start_response: StartResponse) -> Iterable[bytes]:
    """Serves SERVED_FILE through wsgi.file_wrapper, from the offset the query names, with
    the Content-Length it names (none when absent)."""
    params = query(environ)
    file = open(SERVED_FILE, "rb")  # noqa: SIM115 - wsgi.file_wrapper owns and closes it
    file.seek(int(params.get("offset", "0")))
    headers = [("Content-Type", "application/octet-stream")]
    if "length" in params:
        headers.append(("Content-Length", params["length"]))
    start_response("200 OK", headers)
    return environ["wsgi.file_wrapper"](file, 65536)


def memory_file(environ: dict, start_response: StartResponse) -> Iterable[bytes]:
    """wsgi.file_wrapper around a file-like object that has no descriptor."""
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    return environ["wsgi.file_wrapper"](io.BytesIO(SERVED_FILE.read_bytes()), 100_000)


def gated(environ: dict, start_response: StartResponse) -> Iterator[bytes]:
    """Yields a first chunk, then waits until the test creates the gate file (which it does
    only once that chunk has reached it), then yields the last one."""
    gate = shared_path(query(environ)["gate"])
    start_response("200 OK", [TEXT])
    yield b"first chunk\n"
    deadline = time.monotonic() + GATE_TIMEOUT
    while not gate.exists():
        if time.monotonic() > deadline:
            yield b"the gate never opened\n"
            return
        time.sleep(0.01)
    yield b"last chunk\n"


class Closing:
    """A response iterable that records its close() in the shared file the query names."""

    def __init__(self, environ: dict, start_response: StartResponse) -> None:
        params = query(environ)
        self.name = params["record"]
        self.chunks = int(params.get("chunks", "3"))
        self.pause = float(params.get("pause", "0"))
        self.fail_at = int(params["fail"]) if "fail" in params else None
        record(self.name, "called")
        start_response("200 OK", [TEXT])

    def __iter__(self) -> Iterator[bytes]:
        for index in range(self.chunks):
            if index == self.fail_at:
                raise RuntimeError(f"failing at chunk {index}, as asked")
            if index and self.pause:
                time.sleep(self.pause)
            yield f"chunk {index}\n".encode()
        record(self.name, "exhausted")

    def close(self) -> None:
        record(self.name, "closed")


def exc_info_before_head(environ: dict, start_response: StartResponse) -> list[bytes]:
    start_response("200 OK", [TEXT, ("X-First", "yes")])
    try:
        raise ValueError("the application changed its mind")
    except ValueError:
        start_response("503 Service Unavailable", [TEXT, ("X-Replaced", "yes")], sys.exc_info())
    return [b"replaced\n"]


def exc_info_after_head(environ: dict, start_response: StartResponse) -> list[bytes]:
    """The head is out when the error comes: start_response(exc_info) re-raises it."""
    write = start_response("200 OK", [TEXT])
    write(b"partial\n")
    try:
        raise ValueError("too late to change the status")
    except ValueError:
        start_response("500 Internal Server Error", [TEXT], sys.exc_info())
    return [b"never sent\n"]


# --- through wsgiref.validate -------------------------------------------------------------


def validated_echo(environ: dict, start_response: StartResponse) -> list[bytes]:
    stream = environ["wsgi.input"]
    length = int(environ.get("CONTENT_LENGTH") or "0")
    parts = []
    while length > 0:
        part = stream.read(min(length, 4096))
        if not part:
            break
        parts.append(part)
        length -= len(part)
    start_response("200 OK", [TEXT])
    return [b"".join(parts)]


VALIDATED_ROUTES = {
    "hello": hello,
    "several": several,
    "echo": validated_echo,
    "stream": stream,
    "write": write_callable,
    "file": file_response,
    "status": status,
}


def validated_routes(environ: dict, start_response: StartResponse) -> Iterable[bytes]:
    name = environ["PATH_INFO"].removeprefix("/v/")
    route = VALIDATED_ROUTES.get(name)
    if route is None:
        start_response("404 Not Found", [TEXT])
        return [b"no such validated route\n"]
    return route(environ, start_response)


validated = validator(validated_routes)


ROUTES = {
    "v": validated,
    "input": input_echo,
    "hello": hello,
    "several": several,
    "stream": stream,
    "hop-by-hop": hop_by_hop,
    "write": write_callable,
    "write-only": write_only,
    "status": status,
    "file": file_response,
    "memory-file": memory_file,
    "gated": gated,
    "closing": Closing,
    "exc-info-before-head": exc_info_before_head,
    "exc-info-after-head": exc_info_after_head,
}


def application(environ: dict, start_response: StartResponse) -> Iterable[bytes]:
    first_segment = environ["PATH_INFO"].split("/")[1] if environ["PATH_INFO"] else ""
    route = ROUTES.get(first_segment, environ_dump)
    return route(environ, start_response)
