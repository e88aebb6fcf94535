"""The worker's side of the worker channel and its shared region (docs/PROTOCOL.md, sections 2
and 3), driven by hand.

Each test starts a real worker process (`maitred.worker.serve` on one end of a socketpair) and
plays the lobby on the other end: frames built here with `struct`, and a shared region (a
sealed memfd) whose request slots are written here by hand, independently of the Rust code, so
that a mistake shared by both sides cannot hide.

The applications live in this module too: the worker process imports it by name.
"""

from __future__ import annotations

import fcntl
import io
import json
import mmap
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from wsgiref.validate import validator

import pytest

# Frame kinds and flags (docs/PROTOCOL.md, section 2).
READY, BOOT_FAILED, RESPONSE_HEAD, RESPONSE_BODY, RESPONSE_FILE, RESPONSE_ABORT = 1, 2, 3, 4, 5, 6
REQUEST, CANCEL, REGION, BELL, ON_CHANNEL, LOBBY_BELL = 16, 17, 19, 20, 21, 22
END, FD, RECORDS = 1, 2, 8

# The shared region (crates/shm's tables): its layout, and the states of a request slot, in the
# low two bits of its state word (the ticket, the low 30 bits of the request's sequence number,
# above them). The lobby's ring is 256 KiB; this one is smaller, so that the 1 MiB answer of
# /big wraps it many times and finds it full.
SLOTS, SLOT_SIZE, RING_SIZE = 3, 64 * 1024, 64 * 1024
HEADER_BLOCK, SLOT_HEADER = 4096, 64
LOBBY_WAITING_AT, WORKER_WAITING_AT, RING_HEAD_AT, RING_TAIL_AT = 64, 128, 192, 256
PADDING_ID = 0xFFFFFFFF
EMPTY, QUEUED, TAKEN, RELEASED, STATE_BITS = 0, 1, 2, 3, 3

TIMEOUT = 10.0


# --- Applications, run inside the worker process -------------------------------------------


def app_environ(environ: dict, start_response: Callable) -> list[bytes]:
    """Reports every str value of the environ, the types of the wsgi.* values and the body."""
    report: dict[str, Any] = {key: value for key, value in environ.items() if isinstance(value, str)}
    report["wsgi"] = {
        "version": list(environ["wsgi.version"]),
        "multithread": environ["wsgi.multithread"],
        "multiprocess": environ["wsgi.multiprocess"],
        "run_once": environ["wsgi.run_once"],
        "input_terminated": environ["wsgi.input_terminated"],
        "file_wrapper": environ["wsgi.file_wrapper"].__name__,
        "errors": all(hasattr(environ["wsgi.errors"], m) for m in ("write", "writelines", "flush")),
    }
    report["body"] = environ["wsgi.input"].read().decode("latin-1")
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(report).encode()]


def app_input(environ: dict, start_response: Callable) -> list[bytes]:
    """Runs the wsgi.input calls named in the query, e.g. ``read:3,readline,iter``, and
    reports each result (bytes as latin-1 text)."""
    stream = environ["wsgi.input"]
    results: list[Any] = []
    for operation in environ["QUERY_STRING"].split(","):
        name, _, argument = operation.partition(":")
        if name == "iter":
            value: Any = list(stream)
        else:
            value = getattr(stream, name)(*([int(argument)] if argument else []))
        if isinstance(value, list):
            results.append([line.decode("latin-1") for line in value])
        else:
            results.append(value.decode("latin-1"))
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(results).encode()]


_kept_inputs: list[Any] = []


def app_keep_input(environ: dict, start_response: Callable) -> list[bytes]:
    """Keeps each request's wsgi.input and tries to read the previous one."""
    outcome = "nothing kept"
    if _kept_inputs:
        try:
            outcome = "read " + repr(_kept_inputs[0].read())
        except ValueError as error:
            outcome = f"ValueError: {error}"
    _kept_inputs[:] = [environ["wsgi.input"]]
    environ["wsgi.input"].read()
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [outcome.encode()]


class Closing:
    """An iterable whose close() leaves a mark in wsgi.errors (the worker's stderr)."""

    def __init__(self, environ: dict, chunks: Iterable[Any], fail_at: int | None = None) -> None:
        self.errors = environ["wsgi.errors"]
        self.path = environ["PATH_INFO"]
        self.chunks = chunks
        self.fail_at = fail_at

    def __iter__(self) -> Iterator[Any]:
        for index, chunk in enumerate(self.chunks):
            if index == self.fail_at:
                raise RuntimeError(f"failing at chunk {index}")
            yield chunk

    def close(self) -> None:
        self.errors.write(f"closed {self.path}\n")


def wait_for_file(path: str) -> None:
    """Waits until the test creates `path`. The test sends its CANCEL first, so the worker's
    next body frame finds it without any race."""
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)


def _routes() -> dict[str, Callable[[dict, Callable], Any]]:
    text = [("Content-Type", "text/plain")]

    def generator(environ: dict, start_response: Callable) -> Iterator[bytes]:
        yield b""  # before start_response: allowed, sends nothing
        start_response("200 OK", text)
        yield b"one"
        yield b""
        yield b"two"

    def generator_declared(environ: dict, start_response: Callable) -> Iterator[bytes]:
        start_response("200 OK", [*text, ("Content-Length", "6")])
        yield b"abc"
        yield b"def"
        environ["wsgi.errors"].write("generator ran to its end\n")

    def write(environ: dict, start_response: Callable) -> list[bytes]:
        write = start_response("200 OK", text)
        write(b"")
        write(b"ab")
        return [b"cd"]

    def file(environ: dict, start_response: Callable) -> Any:
        handle = open(environ["QUERY_STRING"], "rb")  # noqa: SIM115 - wsgi.file_wrapper owns and closes it
        handle.seek(3)
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return environ["wsgi.file_wrapper"](handle)

    def file_declared(environ: dict, start_response: Callable) -> Any:
        handle = open(environ["QUERY_STRING"], "rb")  # noqa: SIM115 - wsgi.file_wrapper owns and closes it
        start_response("200 OK", [("Content-Length", "4")])
        return environ["wsgi.file_wrapper"](handle)

    def file_too_short(environ: dict, start_response: Callable) -> Any:
        handle = open(environ["QUERY_STRING"], "rb")  # noqa: SIM115 - wsgi.file_wrapper owns and closes it
        start_response("200 OK", [("Content-Length", "1000000")])
        return environ["wsgi.file_wrapper"](handle)

    def file_in_memory(environ: dict, start_response: Callable) -> Any:
        start_response("200 OK", text)
        return environ["wsgi.file_wrapper"](io.BytesIO(b"x" * 20000), 8192)

    def raise_before(environ: dict, start_response: Callable) -> Any:
        raise RuntimeError("boom before the head")

    def raise_after(environ: dict, start_response: Callable) -> Any:
        start_response("200 OK", text)
        return Closing(environ, [b"part", b"never"], fail_at=1)

    def raise_at_first_chunk(environ: dict, start_response: Callable) -> Any:
        start_response("200 OK", text)
        return Closing(environ, [b"never"], fail_at=0)

    def closing(environ: dict, start_response: Callable) -> Any:
        start_response("200 OK", text)
        return Closing(environ, [b"x", b"y"])

    # The QUERY_STRING of the next four is the path of the file the test creates to let the
    # application go on (see wait_for_file).

    def stream_past_cancel(environ: dict, start_response: Callable) -> Any:
        def chunks() -> Iterator[bytes]:
            yield b"first"
            wait_for_file(environ["QUERY_STRING"])
            yield b"second"
            yield b"third"

        start_response("200 OK", text)
        return Closing(environ, chunks())

    def write_past_cancel(environ: dict, start_response: Callable) -> list[bytes]:
        write = start_response("200 OK", text)
        write(b"first")
        wait_for_file(environ["QUERY_STRING"])
        try:
            write(b"second")
        except OSError as error:  # what applications catch around write()
            environ["wsgi.errors"].write(f"write raised {type(error).__name__}, errno {error.errno}: {error}\n")
        return [b"after the error"]

    def file_past_cancel(environ: dict, start_response: Callable) -> Any:
        write = start_response("200 OK", text)
        write(b"first")
        wait_for_file(environ["QUERY_STRING"])
        return environ["wsgi.file_wrapper"](open(__file__, "rb"))

    def whole_after_wait(environ: dict, start_response: Callable) -> list[bytes]:
        wait_for_file(environ["QUERY_STRING"])
        start_response("200 OK", text)
        return [b"whole"]

    def header(name: Any, value: Any) -> Callable[[dict, Callable], list[bytes]]:
        def app(environ: dict, start_response: Callable) -> list[bytes]:
            start_response("200 OK", [(name, value)])
            return [b"unreachable"]

        return app

    def status(line: Any) -> Callable[[dict, Callable], list[bytes]]:
        def app(environ: dict, start_response: Callable) -> list[bytes]:
            start_response(line, text)
            return [b"unreachable"]

        return app

    def latin1(environ: dict, start_response: Callable) -> list[bytes]:
        start_response("200 Très bien", [("X-Name", "café")])
        return [b"ok"]

    def exc_info_replaces(environ: dict, start_response: Callable) -> list[bytes]:
        start_response("200 OK", text)
        try:
            raise ValueError("changed my mind")
        except ValueError:
            start_response("503 Service Unavailable", [("Retry-After", "1")], sys.exc_info())
        return [b"later"]

    def exc_info_after_head(environ: dict, start_response: Callable) -> list[bytes]:
        write = start_response("200 OK", text)
        write(b"partial")
        try:
            raise ValueError("too late to change")
        except ValueError:
            start_response("500 Internal Server Error", text, sys.exc_info())
        return [b"unreachable"]

    def twice(environ: dict, start_response: Callable) -> list[bytes]:
        start_response("200 OK", text)
        start_response("201 Created", text)
        return [b"unreachable"]

    def declared(length: str, chunks: list[bytes], *, stream: bool) -> Callable[[dict, Callable], Any]:
        def app(environ: dict, start_response: Callable) -> Any:
            start_response("200 OK", [*text, ("Content-Length", length)])
            return Closing(environ, chunks) if stream else chunks

        return app

    def str_chunk(environ: dict, start_response: Callable) -> Any:
        start_response("200 OK", text)
        return iter(["text"])

    def no_start(environ: dict, start_response: Callable) -> list[bytes]:
        return [b"x"]

    def big(environ: dict, start_response: Callable) -> list[bytes]:
        start_response("200 OK", text)
        return [bytes(range(256)) * 4096]  # 1 MiB, more than the socket buffer holds

    def huge_head(environ: dict, start_response: Callable) -> list[bytes]:
        start_response("200 OK", [("X-Huge", "h" * (RING_SIZE // 2))])  # more than the ring takes
        return [b"after"]

    def exit_worker(environ: dict, start_response: Callable) -> list[bytes]:
        raise SystemExit(3)

    def install_usr1_handler(environ: dict, start_response: Callable) -> list[bytes]:
        errors = environ["wsgi.errors"]
        signal.signal(signal.SIGUSR1, lambda signum, frame: errors.write("SIGUSR1 handled\n"))
        start_response("200 OK", text)
        return [b"installed"]

    kept_start_response: list[Callable] = []

    def keep_start_response(environ: dict, start_response: Callable) -> list[bytes]:
        kept_start_response[:] = [start_response]
        start_response("200 OK", text)
        return [b"kept"]

    def stale_start_response(environ: dict, start_response: Callable) -> list[bytes]:
        kept_start_response[0]("200 OK", text)
        return [b"unreachable"]

    def inherited_fds(environ: dict, start_response: Callable) -> list[bytes]:
        # What a program the application runs would inherit, with nothing closed on its behalf.
        listing = subprocess.run(["ls", "/proc/self/fd"], close_fds=False, capture_output=True, check=True)
        start_response("200 OK", text)
        return [b" ".join(sorted(listing.stdout.split()))]

    class HoldsItsBody:
        """As Django's HttpResponse: an object that iterates a list of the chunks it holds."""

        closed = False

        def __init__(self, chunks: list[bytes]) -> None:
            self._chunks = chunks

        def __iter__(self) -> Iterator[bytes]:
            return iter(self._chunks)

        def close(self) -> None:
            HoldsItsBody.closed = True

    def holds_its_body(environ: dict, start_response: Callable) -> HoldsItsBody:
        start_response("200 OK", text)
        return HoldsItsBody([b"held", b" body"])

    def was_closed(environ: dict, start_response: Callable) -> list[bytes]:
        start_response("200 OK", text)
        return [str(HoldsItsBody.closed).encode()]

    return {
        "/holds-its-body": holds_its_body,
        "/was-closed": was_closed,
        "/list": lambda e, s: (s("200 OK", text), [b"hello"])[1],
        "/list-declared": lambda e, s: (s("200 OK", [*text, ("Content-Length", "5")]), [b"hello"])[1],
        "/list-many": lambda e, s: (s("200 OK", text), [b"a", b"bc", b"def"])[1],
        "/tuple": lambda e, s: (s("200 OK", text), (b"x",))[1],
        "/echo": lambda e, s: (s("200 OK", text), [e["wsgi.input"].read()])[1],
        "/empty": lambda e, s: (s("200 OK", text), [])[1],
        "/empty-head": lambda e, s: (s("200 OK", text), [b""])[1],
        "/no-content": lambda e, s: (s("204 No Content", []), [])[1],
        "/not-modified": lambda e, s: (s("304 Not Modified", [("Content-Length", "99")]), [])[1],
        "/generator": generator,
        "/generator-declared": generator_declared,
        "/write": write,
        "/file": file,
        "/file-declared": file_declared,
        "/file-too-short": file_too_short,
        "/file-in-memory": file_in_memory,
        "/raise-before": raise_before,
        "/raise-after": raise_after,
        "/raise-at-first-chunk": raise_at_first_chunk,
        "/closing": closing,
        "/stream-past-cancel": stream_past_cancel,
        "/write-past-cancel": write_past_cancel,
        "/file-past-cancel": file_past_cancel,
        "/whole-after-wait": whole_after_wait,
        "/header-crlf": header("X-Bad", "a\r\nSet-Cookie: evil=1"),
        "/header-nul": header("X-Bad", "a\x00b"),
        "/header-hop-by-hop": header("Connection", "close"),
        "/header-keep-alive": header("Keep-Alive", "timeout=5"),
        "/header-transfer-encoding": header("Transfer-Encoding", "chunked"),
        "/header-not-latin1": header("X-Name", "\u0101"),
        "/header-bytes": header("X-Bytes", b"value"),
        "/header-bad-name": header("X Name", "v"),
        "/header-bad-length": header("Content-Length", "12abc"),
        "/status-long-code": status("2000 OK"),
        "/status-informational": status("100 Continue"),
        "/status-bytes": status(b"200 OK"),
        "/status-no-reason": lambda e, s: (s("200", text), [b"ok"])[1],
        "/latin1": latin1,
        "/exc-info-replaces": exc_info_replaces,
        "/exc-info-after-head": exc_info_after_head,
        "/twice": twice,
        "/short": declared("10", [b"12345"], stream=False),
        "/short-stream": declared("10", [b"12345"], stream=True),
        "/long": declared("2", [b"12345"], stream=False),
        "/long-stream": declared("4", [b"12", b"3456"], stream=True),
        "/str-chunk": str_chunk,
        "/no-start": no_start,
        "/big": big,
        "/huge-head": huge_head,
        "/exit": exit_worker,
        "/install-usr1-handler": install_usr1_handler,
        "/keep-start-response": keep_start_response,
        "/stale-start-response": stale_start_response,
        "/inherited-fds": inherited_fds,
    }


ROUTES = _routes()


def app_routes(environ: dict, start_response: Callable) -> Any:
    return ROUTES[environ["PATH_INFO"]](environ, start_response)


def app_validated_inner(environ: dict, start_response: Callable) -> Any:
    """Exercises every part of the interface under wsgiref's validator."""
    stream = environ["wsgi.input"]
    first = stream.readline(100)
    rest = b"".join(stream.readlines(1000)) if environ["PATH_INFO"] == "/lines" else stream.read(1 << 20)
    tail = b"".join(iter(stream))
    environ["wsgi.errors"].write("validated request\n")
    environ["wsgi.errors"].writelines(["two\n", "lines\n"])
    environ["wsgi.errors"].flush()
    body = first + rest + tail
    headers = [("Content-Type", "text/plain")]
    if environ["PATH_INFO"] == "/write":
        write = start_response("200 OK", headers)
        write(b"written:")
        return [body]
    if environ["PATH_INFO"] == "/stream":
        start_response("200 OK", headers)
        return iter([b"streamed:", body])
    start_response("200 OK", [*headers, ("Content-Length", str(len(body)))])
    return [body]


app_validated = validator(app_validated_inner)


# --- The lobby's side, in the test process -------------------------------------------------

CHILD = """
import sys, warnings
warnings.simplefilter("error")
sys.path.insert(0, sys.argv[3])
import test_worker_protocol as tests
from maitred.app import AppLoadError
from maitred.worker import serve
def load_app():
    if sys.argv[2] == "!fail":
        raise AppLoadError("no module named 'missing' (looked in /srv first, then sys.path)")
    return getattr(tests, sys.argv[2])
sys.exit(serve([int(sys.argv[1])], load_app))
"""


def str16(value: bytes) -> bytes:
    return struct.pack("<H", len(value)) + value


def bytes32(value: bytes) -> bytes:
    return struct.pack("<I", len(value)) + value


def frame(kind: int, flags: int, payload: bytes) -> bytes:
    return struct.pack("<BBHI", kind, flags, 0, len(payload)) + payload


def request_frame(
    method: str = "GET",
    target: str | bytes = "/",
    headers: list[tuple[str, bytes | str]] | None = None,
    body: bytes = b"",
    *,
    http_minor: int = 1,
    peer: tuple[str, int] = ("127.0.0.1", 40000),
    server: tuple[str, int] = ("localhost", 8000),
    https: bool = False,
    body_in_file: bool = False,
) -> bytes:
    """A REQUEST frame; with `body_in_file` the body is not inline (the FD flag is set)."""
    target_bytes = target if isinstance(target, bytes) else target.encode("latin-1")
    fields = [
        struct.pack("<B", http_minor),
        str16(method.encode()),
        str16(target_bytes),
        str16(peer[0].encode()),
        struct.pack("<H", peer[1]),
        str16(server[0].encode()),
        struct.pack("<H", server[1]),
        struct.pack("<B", https),
    ]
    headers = [("Host", b"localhost:8000")] if headers is None else headers
    fields.append(struct.pack("<H", len(headers)))
    for name, value in headers:
        fields.append(str16(name.encode()))
        fields.append(bytes32(value if isinstance(value, bytes) else value.encode("latin-1")))
    fields.append(struct.pack("<Q", len(body)))
    if not body_in_file:
        fields.append(body)
    return frame(REQUEST, FD if body_in_file else 0, b"".join(fields))


@dataclass
class Frame:
    kind: int
    flags: int
    payload: bytes
    fd: int | None = None


@dataclass
class Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    frames: list[Frame]
    aborted: str | None = None
    file: tuple[int, int, int] | None = None
    """(descriptor, offset, count) of a RESPONSE_FILE frame."""

    def header(self, name: str) -> str | None:
        values = [value for key, value in self.headers if key.lower() == name.lower()]
        assert len(values) <= 1, f"{name} appears {len(values)} times"
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


def parse_head(payload: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
    status, reason_len = struct.unpack_from("<HH", payload)
    at = 4
    reason = payload[at : at + reason_len].decode("latin-1")
    at += reason_len
    (count,) = struct.unpack_from("<H", payload, at)
    at += 2
    headers = []
    for _ in range(count):
        (name_len,) = struct.unpack_from("<H", payload, at)
        name = payload[at + 2 : at + 2 + name_len].decode("latin-1")
        at += 2 + name_len
        (value_len,) = struct.unpack_from("<I", payload, at)
        value = payload[at + 4 : at + 4 + value_len].decode("latin-1")
        at += 4 + value_len
        headers.append((name, value))
    return status, reason, headers, payload[at:]


class LobbyRegion:
    """The lobby's end of a worker's shared region, written by hand: a sealed memfd with its
    header, request slots filled and taken back here, the answer ring read here, the worker's
    bell and the lobby's (eventfds)."""

    def __init__(self) -> None:
        size = HEADER_BLOCK + SLOTS * SLOT_SIZE + RING_SIZE
        self.fd = os.memfd_create("test-region", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        self.map = mmap.mmap(self.fd, size)
        # The words the worker reads while this side writes them are stored whole, as the
        # lobby's atomics store them: struct.pack_into writes "<I" and "<Q" a byte at a time, and
        # a worker read between two bytes saw the ring's tail on its way from 0xfff8 to 0x10000
        # as 0, below its head by more than the ring, and stopped for a corrupt region (once,
        # in a CI rehearsal). A native memoryview's item is one store.
        self.words32 = memoryview(self.map).cast("I")
        self.words64 = memoryview(self.map).cast("Q")
        struct.pack_into("<8sIIII", self.map, 0, b"MAITRED\x01", 1, SLOTS, SLOT_SIZE, RING_SIZE)
        self.bell = os.eventfd(0, os.EFD_CLOEXEC)
        self.lobby_bell = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self.tail = 0
        self.next_id = 0
        self.slot_of: dict[int, int] = {}
        # The requests queued and not yet answered whole, oldest first: answers come in order.
        self.unanswered: deque[int] = deque()

    def word(self, slot: int) -> int:
        return struct.unpack_from("<I", self.map, HEADER_BLOCK + slot * SLOT_SIZE)[0]

    def state(self, slot: int) -> int:
        return self.word(slot) & STATE_BITS

    def queue(self, data: bytes) -> int:
        """Writes `data` into a free slot, the oldest in order, and rings the bell (always: the
        worker takes a bell it did not ask for as one more look); returns its request id. A slot
        the worker has taken (and released, once it copied the request out) counts as free: the
        tests read each answer before queueing more than the slots hold."""
        assert len(data) <= SLOT_SIZE - SLOT_HEADER
        slot = next((s for s in range(SLOTS) if self.state(s) == EMPTY), None)
        if slot is None:
            slot = next(s for s in range(SLOTS) if self.state(s) in (TAKEN, RELEASED))
        request_id, self.next_id = self.next_id, self.next_id + 1
        at = HEADER_BLOCK + slot * SLOT_SIZE
        struct.pack_into("<IIIIQ", self.map, at, EMPTY, len(data), request_id, 0, request_id)
        self.map[at + SLOT_HEADER : at + SLOT_HEADER + len(data)] = data
        self.words32[at // 4] = request_id << 2 | QUEUED
        os.eventfd_write(self.bell, 1)
        self.slot_of[request_id] = slot
        self.unanswered.append(request_id)
        return request_id

    def recall(self, request_id: int) -> bool:
        """Takes back a queued request, as the lobby does, while the worker is busy elsewhere
        (so that a plain read and write stand for the lobby's compare-and-swap)."""
        slot = self.slot_of[request_id]
        if self.word(slot) != request_id << 2 | QUEUED:
            return False
        self.words32[(HEADER_BLOCK + slot * SLOT_SIZE) // 4] = request_id << 2 | EMPTY
        self.unanswered.remove(request_id)
        return True

    def u32(self, at: int) -> int:
        return struct.unpack_from("<I", self.map, at)[0]

    def next_record_ready(self) -> bool:
        return struct.unpack_from("<Q", self.map, RING_HEAD_AT)[0] != self.tail

    def next_record(self) -> tuple[int, bytes] | None:
        """The next answer record in the ring, `(request id, frame)`, checked as the lobby checks
        it and consumed (padding skipped); then the worker's bell is rung (always, as `queue`
        rings it: a worker waiting for room takes it as one more look). None: the ring is empty."""
        while True:
            head = struct.unpack_from("<Q", self.map, RING_HEAD_AT)[0]
            if head == self.tail:
                return None
            assert head > self.tail and head - self.tail <= RING_SIZE and head % 8 == 0, (head, self.tail)
            at = HEADER_BLOCK + SLOTS * SLOT_SIZE + self.tail % RING_SIZE
            length, request_id = struct.unpack_from("<II", self.map, at)
            assert length % 8 == 0 and 0 < length <= head - self.tail, (length, head, self.tail)
            record = None
            if request_id == PADDING_ID:
                assert length == RING_SIZE - self.tail % RING_SIZE, "padding runs to the ring's end"
            else:
                assert length <= RING_SIZE // 2 and self.tail % RING_SIZE + length <= RING_SIZE
                (payload_len,) = struct.unpack_from("<I", self.map, at + 12)
                assert (8 + 8 + payload_len + 7) // 8 * 8 == length, "the record's length is its frame's"
                record = request_id, bytes(self.map[at + 8 : at + 16 + payload_len])
            self.tail += length
            self.words64[RING_TAIL_AT // 8] = self.tail
            os.eventfd_write(self.bell, 1)
            if record is not None:
                return record

    def close(self) -> None:
        self.words32.release()
        self.words64.release()
        self.map.close()
        os.close(self.fd)
        os.close(self.bell)
        os.close(self.lobby_bell)


class Worker:
    """A worker process and the lobby's end of its channel."""

    def __init__(self, app: str, stderr_path: Path, env: dict[str, str] | None = None) -> None:
        self.socket, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.settimeout(TIMEOUT)
        self.stderr_path = stderr_path
        tests_dir = str(Path(__file__).resolve().parent)
        with open(stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(child_end.fileno()), app, tests_dir],
                pass_fds=[child_end.fileno()],
                stdin=subprocess.DEVNULL,
                stderr=stderr,
                env={**os.environ, **(env or {})},
            )
        child_end.close()
        self._buffer = bytearray()
        self._fds: deque[int] = deque()
        self.received_fds: list[int] = []
        self.region = LobbyRegion()
        self.last_id = -1

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def send(self, data: bytes, fd: int | None = None) -> None:
        if fd is None:
            self.socket.sendall(data)
        else:
            sent = socket.send_fds(self.socket, [data], [fd])
            if sent < len(data):  # a worker that has read a whole frame may have gone already
                self.socket.sendall(data[sent:])

    def give_region(self) -> None:
        """Sends the worker its shared region and both bells, as the lobby does once it is ready."""
        self.send(frame(REGION, FD, b""), self.region.fd)
        self.send(frame(BELL, FD, b""), self.region.bell)
        self.send(frame(LOBBY_BELL, FD, b""), self.region.lobby_bell)

    def queue(self, data: bytes, fd: int | None = None) -> int:
        """Seats a request as the lobby does: in a slot, or, with a descriptor or too large for
        one, on the channel with its place in a slot. Returns its id."""
        if fd is None and len(data) <= SLOT_SIZE - SLOT_HEADER:
            self.last_id = self.region.queue(data)
        else:
            self.send(data, fd)
            self.last_id = self.region.queue(frame(ON_CHANNEL, 0, b""))
        return self.last_id

    def _fill(self, count: int) -> bytes:
        while len(self._buffer) < count:
            data, fds, _, _ = socket.recv_fds(self.socket, 1 << 20, 4)
            self._fds.extend(fds)
            self.received_fds.extend(fds)
            if not data:
                raise EOFError(f"the worker closed the channel; its stderr:\n{self.stderr()}")
            self._buffer += data
        taken = bytes(self._buffer[:count])
        del self._buffer[:count]
        return taken

    def read_frame(self) -> Frame:
        kind, flags, reserved, length = struct.unpack("<BBHI", self._fill(8))
        assert reserved == 0
        payload = self._fill(length)
        fd = self._fds.popleft() if flags & FD else None
        return Frame(kind, flags, payload, fd)

    def read_answer_frame(self) -> Frame:
        """The next frame of the answer to the oldest request not yet answered: from the ring, or
        from the channel where the ring says `ON_CHANNEL`. While the ring is empty it says so in
        the region and waits for the lobby's bell or the channel, looking at the ring again every
        50 ms (this side's plain stores and loads are not the lobby's sequentially consistent
        ones, so its flag alone cannot be trusted to get the bell rung)."""
        deadline = time.monotonic() + TIMEOUT
        while (record := self.region.next_record()) is None:
            struct.pack_into("<I", self.region.map, LOBBY_WAITING_AT, 1)
            if self.region.next_record_ready():
                continue
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no answer within {TIMEOUT} s; stderr:\n{self.stderr()}"
            readable, _, _ = select.select([self.region.lobby_bell, self.socket], [], [], min(remaining, 0.05))
            if self.region.lobby_bell in readable:
                os.eventfd_read(self.region.lobby_bell)
            if self.socket in readable and not self.region.next_record_ready():
                if not self.socket.recv(1, socket.MSG_PEEK):
                    raise EOFError(f"the worker closed the channel; its stderr:\n{self.stderr()}")
                raise AssertionError(f"a frame on the channel that the ring did not announce: {self.read_frame()}")
        struct.pack_into("<I", self.region.map, LOBBY_WAITING_AT, 0)
        request_id, data = record
        unanswered = self.region.unanswered
        assert unanswered and request_id == unanswered[0], (request_id, unanswered)
        kind, flags, reserved, length = struct.unpack_from("<BBHI", data)
        assert reserved == 0 and not flags & FD, data[:8]
        answer = self.read_frame() if kind == ON_CHANNEL else Frame(kind, flags, data[8 : 8 + length])
        if answer.flags & END or answer.kind == RESPONSE_ABORT:
            unanswered.popleft()
        return answer

    def ready(self) -> int:
        first = self.read_frame()
        assert first.kind == READY, f"expected READY, got {first}; stderr:\n{self.stderr()}"
        pid, flags = struct.unpack("<IB", first.payload)
        assert flags == 0, "a WSGI worker says READY without the ASGI flag"
        return pid

    def read_response(self) -> Response:
        head = self.read_answer_frame()
        assert head.kind == RESPONSE_HEAD, f"expected a head, got {head}; stderr:\n{self.stderr()}"
        status, reason, headers, body = parse_head(head.payload)
        response = Response(status, reason, headers, body, [head])
        last = head
        while not last.flags & END:
            last = self.read_answer_frame()
            response.frames.append(last)
            if last.kind == RESPONSE_BODY:
                response.body += last.payload
            elif last.kind == RESPONSE_FILE:
                assert last.flags & FD and last.fd is not None
                offset, count = struct.unpack("<QQ", last.payload)
                response.file = (last.fd, offset, count)
            elif last.kind == RESPONSE_ABORT:
                response.aborted = last.payload.decode()
                break
            else:
                raise AssertionError(f"unexpected frame in a response: {last}")
        return response

    def request(self, *args: Any, body_file: int | None = None, **kwargs: Any) -> Response:
        self.queue(request_frame(*args, body_in_file=body_file is not None, **kwargs), body_file)
        return self.read_response()

    def close_and_wait(self) -> int:
        self.socket.close()
        return self.process.wait(timeout=TIMEOUT)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=TIMEOUT)
        self.socket.close()
        self.region.close()
        for fd in self.received_fds:
            try:
                os.close(fd)
            except OSError:
                pass


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """``start_worker("app_routes")`` starts a worker serving that application of this module
    and waits for its READY; every worker is killed when the test ends."""
    started: list[Worker] = []

    def start(app: str = "app_routes", *, env: dict[str, str] | None = None, wait_ready: bool = True) -> Worker:
        worker = Worker(app, tmp_path / f"worker-{len(started)}.stderr", env)
        started.append(worker)
        if wait_ready:
            assert worker.ready() == worker.process.pid
            worker.give_region()
        return worker

    yield start
    for worker in started:
        worker.kill()


def records_pipe(pieces: Iterable[bytes], *, ended: bool = True) -> int:
    """The read end of a pipe holding a chunked body as the lobby streams one (docs/PROTOCOL.md,
    section 2): each piece a record, a `u32` length and its bytes, then the end record unless
    the body is cut short; written a byte at a time from another thread, so that the worker's
    reads find every record and header split at every offset. The write end closes after."""
    stream = b"".join(struct.pack("<I", len(piece)) + piece for piece in pieces)
    if ended:
        stream += struct.pack("<I", 0)
    reader, writer = os.pipe()

    def trickle() -> None:
        with os.fdopen(writer, "wb", buffering=0) as out:
            for at in range(len(stream)):
                out.write(stream[at : at + 1])

    threading.Thread(target=trickle, daemon=True).start()
    return reader


def records_request(target: str, headers: list[tuple[str, bytes | str]] | None = None) -> bytes:
    """A REQUEST frame whose body streams in records: the FD and RECORDS flags, body length 0."""
    request = bytearray(request_frame("POST", target, headers, body_in_file=True))
    request[1] |= RECORDS
    return bytes(request)


def body_file(content: bytes) -> int:
    """An unlinked temporary file holding `content`, positioned at its end (the worker must
    read it from offset 0 regardless)."""
    with tempfile.TemporaryFile() as handle:
        handle.write(content)
        handle.flush()
        return os.dup(handle.fileno())


# --- Lifecycle -----------------------------------------------------------------------------


def test_ready_then_end_of_file_exits_0(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    assert worker.request(target="/list").status == 200
    assert worker.close_and_wait() == 0
    assert worker.stderr() == ""


def test_boot_failure_sends_boot_failed_and_exits_1(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("!fail", wait_ready=False)
    failed = worker.read_frame()
    assert failed.kind == BOOT_FAILED
    assert failed.payload.decode() == "no module named 'missing' (looked in /srv first, then sys.path)"
    assert worker.process.wait(timeout=TIMEOUT) == 1


def test_lobby_gone_before_boot_failed_is_quiet(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("!fail", wait_ready=False)
    worker.socket.close()  # long before the worker has imported anything
    assert worker.process.wait(timeout=TIMEOUT) == 1
    assert worker.stderr() == ""


def test_lobby_closing_during_a_response_ends_the_worker_quietly(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    worker.queue(request_frame(target="/big"))
    worker.socket.close()
    assert worker.process.wait(timeout=TIMEOUT) == 0
    assert worker.stderr() == ""


def test_sigterm_and_sigint_are_ignored(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    worker.process.send_signal(signal.SIGTERM)
    worker.process.send_signal(signal.SIGINT)
    time.sleep(0.2)
    assert worker.process.poll() is None
    assert worker.request(target="/list").body == b"hello"


def test_application_signal_handlers_run_while_the_worker_waits(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    assert worker.request(target="/install-usr1-handler").body == b"installed"
    worker.process.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + TIMEOUT
    while "SIGUSR1 handled" not in worker.stderr():
        assert time.monotonic() < deadline, worker.stderr()
        time.sleep(0.05)
    assert worker.request(target="/list").body == b"hello"


def test_requests_queued_at_once_and_a_frame_split_across_writes(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    for target in ("/list", "/tuple", "/list"):
        worker.queue(request_frame(target=target))
    assert [worker.read_response().body for _ in range(3)] == [b"hello", b"x", b"hello"]
    # A request on the channel arrives in pieces, which the sleeping worker reads as they come;
    # its place in a slot comes after the whole frame, as the lobby queues it.
    reader = start_worker("app_input")
    data = request_frame("POST", "/?read", body=b"slow body")
    for piece in (data[:3], data[3:9], data[9:20], data[20:]):
        reader.send(piece)
        time.sleep(0.05)
    reader.region.queue(frame(ON_CHANNEL, 0, b""))
    assert reader.read_response().json() == ["slow body"]


def test_unknown_frame_kind_ends_the_worker(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    worker.send(frame(99, 0, b""))
    assert worker.process.wait(timeout=TIMEOUT) == 1
    assert "the lobby sent a bad frame: unknown frame kind 99" in worker.stderr()


def test_response_frame_from_the_lobby_ends_the_worker(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    worker.send(frame(RESPONSE_BODY, 0, b"x"))
    assert worker.process.wait(timeout=TIMEOUT) == 1
    assert "a worker only receives REQUEST, CANCEL, REGION, BELL and LOBBY_BELL" in worker.stderr()


def test_end_of_file_inside_a_frame_ends_the_worker(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    worker.send(request_frame(target="/list")[:12])
    assert worker.close_and_wait() == 1
    assert "the lobby closed the channel inside a frame" in worker.stderr()


def test_system_exit_in_the_application_answers_then_ends_the_worker(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    assert worker.request(target="/exit").status == 500
    assert worker.process.wait(timeout=TIMEOUT) == 3


# --- The environ ---------------------------------------------------------------------------


def test_environ_of_a_simple_get(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("app_environ")
    environ = worker.request(target="/a/b?x=1&y=2", headers=[("Host", "example.org")]).json()
    assert {key: environ[key] for key in environ if key not in ("wsgi", "SERVER_SOFTWARE")} == {
        "REQUEST_METHOD": "GET",
        "SCRIPT_NAME": "",
        "PATH_INFO": "/a/b",
        "QUERY_STRING": "x=1&y=2",
        "RAW_URI": "/a/b?x=1&y=2",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "8000",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "40000",
        "HTTP_HOST": "example.org",
        "wsgi.url_scheme": "http",
        "body": "",
    }
    assert environ["SERVER_SOFTWARE"].startswith("maitred/")
    assert environ["wsgi"] == {
        "version": [1, 0],
        "multithread": False,
        "multiprocess": True,
        "run_once": False,
        "input_terminated": True,
        "file_wrapper": "FileWrapper",
        "errors": True,
    }


def test_path_is_percent_decoded_as_latin1_query_stays_raw_fragment_is_dropped(
    start_worker: Callable[..., Worker],
) -> None:
    worker = start_worker("app_environ")
    environ = worker.request(target="/caf%C3%A9/a%2Fb/%zz%4?q=%20x+y#frag").json()
    assert environ["PATH_INFO"] == "/caf\u00c3\u00a9/a/b/%zz%4"
    assert environ["QUERY_STRING"] == "q=%20x+y"
    assert environ["RAW_URI"] == "/caf%C3%A9/a%2Fb/%zz%4?q=%20x+y#frag"


def test_headers_become_http_variables(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("app_environ")
    environ = worker.request(
        "POST",
        "/",
        headers=[
            ("Host", "example.org"),
            ("Accept", "text/html"),
            ("X-Forwarded-For", "10.0.0.1"),
            ("accept", "text/plain"),
            ("X_Forwarded_For", "6.6.6.6"),
            ("Content-Type", "text/plain; charset=latin-1"),
            ("Content-Length", "4"),
            ("X-Latin", b"caf\xe9"),
            ("X-Empty", b""),
        ],
        body=b"data",
    ).json()
    assert environ["HTTP_ACCEPT"] == "text/html, text/plain"
    assert environ["HTTP_X_FORWARDED_FOR"] == "10.0.0.1"  # the underscore spoof is dropped
    assert environ["CONTENT_TYPE"] == "text/plain; charset=latin-1"
    assert environ["CONTENT_LENGTH"] == "4"
    assert environ["HTTP_X_LATIN"] == "caf\u00e9"
    assert environ["HTTP_X_EMPTY"] == ""
    assert "HTTP_CONTENT_TYPE" not in environ and "HTTP_CONTENT_LENGTH" not in environ
    assert environ["body"] == "data"


def test_content_length_is_the_body_length(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("app_environ")
    # A de-chunked body arrives with its length and without its coding, as behind nginx.
    chunked = worker.request("POST", "/", headers=[("Transfer-Encoding", "chunked")], body=b"12345").json()
    assert chunked["CONTENT_LENGTH"] == "5"
    assert "HTTP_TRANSFER_ENCODING" not in chunked
    empty_chunked = worker.request("POST", "/", headers=[("Transfer-Encoding", "chunked")]).json()
    assert empty_chunked["CONTENT_LENGTH"] == "0"
    empty_declared = worker.request("POST", "/", headers=[("Content-Length", "0")]).json()
    assert empty_declared["CONTENT_LENGTH"] == "0"
    no_body = worker.request("GET", "/").json()
    assert "CONTENT_LENGTH" not in no_body and "CONTENT_TYPE" not in no_body


def test_http_1_0(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("app_environ")
    assert worker.request(target="/", http_minor=0, headers=[]).json()["SERVER_PROTOCOL"] == "HTTP/1.0"


def test_absolute_form_target_takes_the_place_of_host(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("app_environ")
    environ = worker.request(target="http://example.org:8080/p/q?x=1", headers=[("Host", "other")]).json()
    assert (environ["PATH_INFO"], environ["QUERY_STRING"], environ["HTTP_HOST"]) == ("/p/q", "x=1", "example.org:8080")
    assert environ["RAW_URI"] == "http://example.org:8080/p/q?x=1"
    bare = worker.request(target="https://example.org", headers=[]).json()
    assert (bare["PATH_INFO"], bare["QUERY_STRING"], bare["HTTP_HOST"]) == ("/", "", "example.org")


def test_asterisk_target(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("app_environ")
    environ = worker.request("OPTIONS", "*").json()
    assert (environ["REQUEST_METHOD"], environ["PATH_INFO"], environ["QUERY_STRING"], environ["RAW_URI"]) == (
        "OPTIONS",
        "*",
        "",
        "*",
    )


def test_script_name_is_stripped_at_a_segment_boundary(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("app_environ", env={"SCRIPT_NAME": "/app/"})
    paths = {}
    for target in ("/app/x/y", "/app", "/application", "/other", "/app%2Fz"):
        environ = worker.request(target=target).json()
        assert environ["SCRIPT_NAME"] == "/app"
        paths[target] = environ["PATH_INFO"]
    assert paths == {
        "/app/x/y": "/x/y",
        "/app": "",
        "/application": "/application",
        "/other": "/other",
        "/app%2Fz": "/z",
    }


def test_unix_socket_peer_has_no_port(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("app_environ")
    environ = worker.request(peer=("", 0), server=("/run/app.sock", 0)).json()
    assert environ["REMOTE_ADDR"] == "" and "REMOTE_PORT" not in environ
    assert (environ["SERVER_NAME"], environ["SERVER_PORT"]) == ("/run/app.sock", "0")


def test_the_scheme_and_a_forwarded_address_without_port(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("app_environ")
    assert worker.request().json()["wsgi.url_scheme"] == "http"
    # What the lobby sends for a trusted proxy's https and an address it forwarded without port.
    forwarded = worker.request(peer=("203.0.113.7", 0), https=True).json()
    assert forwarded["wsgi.url_scheme"] == "https"
    assert forwarded["REMOTE_ADDR"] == "203.0.113.7" and "REMOTE_PORT" not in forwarded


# --- wsgi.input ----------------------------------------------------------------------------

BODY = b"first line\nsecond\n\nlast without newline"
INPUT_CASES = {
    "read": ["first line\nsecond\n\nlast without newline"],
    "read:6,read:0,read:-1,read": ["first ", "", "line\nsecond\n\nlast without newline", ""],
    "readline,readline:3,readline,readline,readline,readline": [
        "first line\n",
        "sec",
        "ond\n",
        "\n",
        "last without newline",
        "",
    ],
    "readlines": [["first line\n", "second\n", "\n", "last without newline"]],
    "readlines:12,readlines": [["first line\n", "second\n"], ["\n", "last without newline"]],
    "iter,read,readline,readlines": [["first line\n", "second\n", "\n", "last without newline"], "", "", []],
}


@pytest.mark.parametrize("in_file", [False, True], ids=["inline", "file"])
@pytest.mark.parametrize("operations", list(INPUT_CASES))
def test_input_methods(start_worker: Callable[..., Worker], operations: str, in_file: bool) -> None:
    worker = start_worker("app_input")
    if in_file:
        response = worker.request("POST", f"/?{operations}", body=BODY, body_file=body_file(BODY))
    else:
        response = worker.request("POST", f"/?{operations}", body=BODY)
    assert response.json() == INPUT_CASES[operations]


@pytest.mark.parametrize("in_file", [False, True], ids=["inline", "file"])
def test_large_bodies_line_by_line(start_worker: Callable[..., Worker], in_file: bool) -> None:
    # Long lines cross the worker's 64 KiB read-ahead; a large inline body takes the path
    # where the receive buffer is handed over rather than copied.
    lines = [b"%06d:" % n + b"x" * (n * 37 % 50000) + b"\n" for n in range(40)]
    body = b"".join(lines)
    worker = start_worker("app_input")
    if in_file:
        response = worker.request("POST", "/?readlines", body=body, body_file=body_file(body))
    else:
        response = worker.request("POST", "/?readlines", body=body)
    assert response.json() == [[line.decode() for line in lines]]
    after = worker.request("POST", "/?read:5,read", body=b"next request")
    assert after.json() == ["next ", "request"]


@pytest.mark.parametrize("operations", list(INPUT_CASES))
def test_input_methods_on_a_body_in_records(start_worker: Callable[..., Worker], operations: str) -> None:
    """A fast chunked upload streams to a WSGI application in records (docs/PROXIES.md): every
    read waits for what it asked for, across records and split headers, as on a whole body."""
    worker = start_worker("app_input")
    pieces = [BODY[:1], BODY[1:5], BODY[5:13], BODY[13:14], BODY[14:]]
    worker.queue(records_request(f"/?{operations}"), records_pipe(pieces))
    assert worker.read_response().json() == INPUT_CASES[operations]


def test_a_body_in_records_has_no_length_and_is_read_to_its_end(start_worker: Callable[..., Worker]) -> None:
    """Its length is not known while it streams: no CONTENT_LENGTH (nor its coding), and the
    application reads to the end record, a large read gathered past 1 MiB and a long line
    across the 64 KiB read-ahead; a body cut short is `ClientDisconnected`, never an end."""
    worker = start_worker("app_environ")
    headers = [("Host", b"localhost:8000"), ("Transfer-Encoding", b"chunked")]
    worker.queue(records_request("/", headers), records_pipe([b"12", b"345"]))
    environ = worker.read_response().json()
    assert "CONTENT_LENGTH" not in environ and "HTTP_TRANSFER_ENCODING" not in environ
    assert (environ["body"], environ["wsgi"]["input_terminated"]) == ("12345", True)
    reader = start_worker("app_input")
    line = b"x" * 200_000 + b"\n"
    big = bytes(range(256)) * 6000
    pipe = records_pipe([line[:70_000], line[70_000:] + big[:1000], big[1000:]])
    reader.queue(records_request(f"/?readline,read:{2 << 20},read"), pipe)
    assert reader.read_response().json() == [line.decode(), big.decode("latin-1"), ""]
    reader.queue(records_request("/?read"), records_pipe([b"half", b"way"], ended=False))
    assert reader.read_response().status == 500
    assert "client went away during POST /?read HTTP/1.1; response abandoned" in reader.stderr()


def test_input_of_a_finished_request_is_released(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker("app_keep_input")
    assert worker.request("POST", "/", body=b"one", body_file=body_file(b"one")).body == b"nothing kept"
    assert worker.request("POST", "/", body=b"two").body == b"ValueError: wsgi.input of a finished request was read"


# --- Responses -----------------------------------------------------------------------------


def test_single_chunk_is_one_frame_with_content_length(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    response = worker.request(target="/list")
    assert len(response.frames) == 1 and response.frames[0].flags == END
    assert (response.status, response.reason, response.body) == (200, "OK", b"hello")
    assert response.headers == [("Content-Type", "text/plain"), ("Content-Length", "5")]


@pytest.mark.parametrize(
    ("path", "body", "length"),
    [
        ("/list-declared", b"hello", "5"),
        ("/list-many", b"abcdef", "6"),
        ("/tuple", b"x", "1"),
        ("/empty", b"", "0"),
    ],
)
def test_whole_bodies_are_one_frame(start_worker: Callable[..., Worker], path: str, body: bytes, length: str) -> None:
    response = start_worker().request(target=path)
    assert len(response.frames) == 1 and response.frames[0].flags == END
    assert (response.body, response.header("Content-Length")) == (body, length)


def test_an_object_iterating_a_list_it_holds_is_one_frame_and_is_closed(start_worker: Callable[..., Worker]) -> None:
    """Django's HttpResponse iterates the list of chunks it holds: its whole body is known, and
    goes out as one frame with a Content-Length, as a list's does (one wake of the lobby, not
    two); the object is still closed, as PEP 3333 asks."""
    worker = start_worker()
    response = worker.request(target="/holds-its-body")
    assert len(response.frames) == 1 and response.frames[0].flags == END
    assert (response.body, response.header("Content-Length")) == (b"held body", "9")
    assert worker.request(target="/was-closed").body == b"True"


def test_head_requests_send_no_body(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    whole = worker.request("HEAD", "/list")
    assert (whole.body, whole.header("Content-Length"), len(whole.frames)) == (b"", "5", 1)
    declared = worker.request("HEAD", "/list-declared")
    assert (declared.body, declared.header("Content-Length")) == (b"", "5")
    empty = worker.request("HEAD", "/empty-head")
    assert (empty.body, empty.header("Content-Length")) == (b"", None)
    streamed = worker.request("HEAD", "/generator")
    assert streamed.body == b"" and streamed.header("Content-Length") is None
    assert all(frame.payload == b"" for frame in streamed.frames[1:])


def test_no_content_and_not_modified_get_no_content_length(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    no_content = worker.request(target="/no-content")
    assert (no_content.status, no_content.headers, no_content.body) == (204, [], b"")
    not_modified = worker.request(target="/not-modified")
    assert (not_modified.status, not_modified.header("Content-Length"), not_modified.body) == (304, "99", b"")


def test_streamed_response(start_worker: Callable[..., Worker]) -> None:
    response = start_worker().request(target="/generator")
    assert [(f.kind, f.flags, f.payload[-3:]) for f in response.frames] == [
        (RESPONSE_HEAD, 0, b"one"),
        (RESPONSE_BODY, 0, b"two"),
        (RESPONSE_BODY, END, b""),
    ]
    assert response.body == b"onetwo" and response.header("Content-Length") is None


def test_streamed_response_ends_with_its_content_length(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    response = worker.request(target="/generator-declared")
    assert [(f.kind, f.flags) for f in response.frames] == [(RESPONSE_HEAD, 0), (RESPONSE_BODY, END)]
    assert response.body == b"abcdef"
    # The generator still runs to its end.
    assert worker.request(target="/list").status == 200
    assert "generator ran to its end" in worker.stderr()


def test_write_sends_the_head_at_once(start_worker: Callable[..., Worker]) -> None:
    response = start_worker().request(target="/write")
    assert [(f.kind, f.flags) for f in response.frames] == [
        (RESPONSE_HEAD, 0),
        (RESPONSE_BODY, 0),
        (RESPONSE_BODY, END),
    ]
    first_bytes = parse_head(response.frames[0].payload)[3]
    assert [first_bytes, response.frames[1].payload, response.frames[2].payload] == [b"", b"ab", b"cd"]
    assert response.header("Content-Length") is None


def test_big_response_arrives_whole(start_worker: Callable[..., Worker]) -> None:
    response = start_worker().request(target="/big")
    assert response.body == bytes(range(256)) * 4096
    assert response.header("Content-Length") == str(1 << 20)


def test_latin1_status_and_headers(start_worker: Callable[..., Worker]) -> None:
    response = start_worker().request(target="/latin1")
    head = response.frames[0].payload
    assert b"Tr\xe8s bien" in head and b"caf\xe9" in head
    assert (response.reason, response.header("X-Name")) == ("Très bien", "café")


def test_status_without_reason(start_worker: Callable[..., Worker]) -> None:
    response = start_worker().request(target="/status-no-reason")
    assert (response.status, response.reason) == (200, "")


def test_file_wrapper_passes_the_file_descriptor(start_worker: Callable[..., Worker], tmp_path: Path) -> None:
    path = tmp_path / "served.bin"
    path.write_bytes(b"0123456789")
    worker = start_worker()
    response = worker.request(target=f"/file?{path}")
    assert [(f.kind, f.flags) for f in response.frames] == [(RESPONSE_HEAD, 0), (RESPONSE_FILE, END | FD)]
    assert response.file is not None
    fd, offset, count = response.file
    assert (offset, count) == (3, 7)
    assert os.pread(fd, count, offset) == b"3456789"
    assert response.header("Content-Length") == "7"

    declared = worker.request(target=f"/file-declared?{path}")
    assert declared.file is not None and declared.file[1:] == (0, 4)
    assert declared.header("Content-Length") == "4"
    headed = worker.request("HEAD", f"/file?{path}")
    assert (len(headed.frames), headed.header("Content-Length"), headed.file) == (1, "7", None)


def test_file_wrapper_shorter_than_its_content_length_is_an_error(
    start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    path = tmp_path / "short.bin"
    path.write_bytes(b"0123456789")
    worker = start_worker()
    assert worker.request(target=f"/file-too-short?{path}").status == 500
    assert "Content-Length 1000000 needs 1000000 more bytes, but its file has 10 after offset 0" in worker.stderr()


def test_file_wrapper_around_a_non_file_is_iterated(start_worker: Callable[..., Worker]) -> None:
    response = start_worker().request(target="/file-in-memory")
    assert response.body == b"x" * 20000
    assert [len(f.payload) for f in response.frames[1:]] == [8192, 3616, 0]


# --- Application errors --------------------------------------------------------------------


def test_exception_before_the_head_is_a_500(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    response = worker.request(target="/raise-before?q=1")
    assert (response.status, response.body) == (500, b"500 Internal Server Error\n")
    assert response.header("Content-Type") == "text/plain; charset=utf-8"
    assert response.header("Content-Length") == "26"
    log = worker.stderr()
    assert "[ERROR] Error handling request GET /raise-before?q=1 HTTP/1.1" in log
    assert "RuntimeError: boom before the head" in log and "Traceback" in log
    assert worker.request(target="/list").status == 200  # the worker goes on


def test_exception_after_the_head_aborts(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    response = worker.request(target="/raise-after")
    assert response.body == b"part"
    assert response.aborted == "RuntimeError: failing at chunk 1"
    assert "closed /raise-after" in worker.stderr()
    assert worker.request(target="/list").status == 200


def test_close_is_always_called(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    assert worker.request(target="/closing").body == b"xy"
    assert worker.request(target="/raise-at-first-chunk").status == 500
    log = worker.stderr()
    assert "closed /closing" in log and "closed /raise-at-first-chunk" in log


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/header-crlf", 'ValueError: the value of response header "X-Bad" holds a control character'),
        ("/header-nul", 'ValueError: the value of response header "X-Bad" holds a control character'),
        ("/header-not-latin1", 'ValueError: the value of response header "X-Name" is not latin-1'),
        ("/header-bytes", 'TypeError: the value of response header "X-Bytes" must be a str, not bytes'),
        ("/header-bad-name", 'ValueError: invalid response header name "X Name"'),
        ("/header-bad-length", 'ValueError: invalid Content-Length "12abc"'),
        ("/status-long-code", 'ValueError: invalid status "2000 OK": it must be a three-digit code'),
        (
            "/status-informational",
            'ValueError: invalid status "100 Continue": the code of a final response is 200 to 599',
        ),
        ("/status-bytes", "TypeError: the status must be a str, not bytes"),
        ("/twice", "RuntimeError: start_response() was called twice; a second call must pass exc_info"),
        ("/short", "ValueError: the application's body ended after 5 bytes, short of its Content-Length 10"),
        ("/long", "ValueError: the application's body is longer than its Content-Length 2"),
        ("/str-chunk", "TypeError: the response body must be bytes, and the application gave str"),
        ("/no-start", "RuntimeError: the application returned without calling start_response()"),
    ],
)
def test_bad_responses_become_500s_with_a_clear_error(
    start_worker: Callable[..., Worker], path: str, message: str
) -> None:
    worker = start_worker()
    response = worker.request(target=path)
    assert (response.status, response.body) == (500, b"500 Internal Server Error\n")
    assert message in worker.stderr()


@pytest.mark.parametrize(
    ("path", "passed_on"),
    [
        ("/header-hop-by-hop", [("Connection", "close")]),
        ("/header-keep-alive", []),
        ("/header-transfer-encoding", []),
    ],
)
def test_hop_by_hop_headers_are_dropped_but_connection_which_the_lobby_reads(
    start_worker: Callable[..., Worker], path: str, passed_on: list[tuple[str, str]]
) -> None:
    # The lobby frames the answer: it closes the connection after it when Connection lists
    # close, then drops that header too (crates/protocol's write_response_head).
    worker = start_worker()
    response = worker.request(target=path)
    assert (response.status, response.body) == (200, b"unreachable")
    assert [(name, value) for name, value in response.headers if name != "Content-Length"] == passed_on


def test_start_response_of_an_earlier_request_is_refused(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    assert worker.request(target="/keep-start-response").body == b"kept"
    assert worker.request(target="/stale-start-response").status == 500
    assert "RuntimeError: start_response() or write() of a finished request was called" in worker.stderr()


def test_channel_and_body_file_are_not_inherited(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    response = worker.request("POST", "/inherited-fds", body=b"body", body_file=body_file(b"body"))
    # 0-2 are the standard streams, 3 is ls's own listing of the directory.
    assert response.body == b"0 1 2 3"


def test_exc_info_replaces_a_head_not_yet_sent(start_worker: Callable[..., Worker]) -> None:
    response = start_worker().request(target="/exc-info-replaces")
    assert (response.status, response.header("Retry-After"), response.body) == (503, "1", b"later")


def test_exc_info_after_the_head_reraises(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    response = worker.request(target="/exc-info-after-head")
    assert (response.status, response.body, response.aborted) == (200, b"partial", "ValueError: too late to change")
    assert "ValueError: too late to change" in worker.stderr()


def test_content_length_mismatch_after_the_head(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    short = worker.request(target="/short-stream")
    assert (short.body, short.aborted) == (
        b"12345",
        "ValueError: the application's body ended after 5 bytes, short of its Content-Length 10",
    )
    # Too long: the client gets exactly Content-Length bytes; the rest is dropped and logged.
    long = worker.request(target="/long-stream")
    assert (long.body, long.aborted, long.frames[-1].flags) == (b"1234", None, END)
    assert worker.request(target="/list").status == 200
    assert (
        "ValueError: the application produced 2 more bytes than its Content-Length 4; they were dropped"
        in worker.stderr()
    )


# --- CANCEL: the client went away ----------------------------------------------------------


def cancel_frame(request_id: int) -> bytes:
    return frame(CANCEL, 0, struct.pack("<I", request_id))


@pytest.mark.parametrize("path", ["/stream-past-cancel", "/write-past-cancel", "/file-past-cancel"])
def test_cancel_mid_response_aborts_it(start_worker: Callable[..., Worker], tmp_path: Path, path: str) -> None:
    worker = start_worker()
    go = tmp_path / "go"
    request_id = worker.queue(request_frame(target=f"{path}?{go}"))
    head = worker.read_answer_frame()
    assert (head.kind, head.flags, parse_head(head.payload)[3]) == (RESPONSE_HEAD, 0, b"first")
    worker.send(cancel_frame(request_id))
    go.touch()
    # Nothing more of the body: the next frame the worker sends ends the response.
    assert worker.read_answer_frame() == Frame(RESPONSE_ABORT, 0, b"the client went away")
    assert worker.request(target="/generator").body == b"onetwo"  # the worker goes on
    assert worker.close_and_wait() == 0
    log = worker.stderr()
    assert f"[INFO] client went away during GET {path}?{go} HTTP/1.1; response abandoned\n" in log
    assert log.count("client went away") == 1
    assert "Traceback" not in log and "[ERROR]" not in log
    if path == "/stream-past-cancel":
        assert "closed /stream-past-cancel" in log  # close() was called
    if path == "/write-past-cancel":
        assert "write raised ClientDisconnected, errno 32: [Errno 32] the client has gone away" in log


def test_cancel_after_the_response_ended_is_ignored(start_worker: Callable[..., Worker], tmp_path: Path) -> None:
    worker = start_worker()
    assert worker.request(target="/generator").body == b"onetwo"
    worker.send(cancel_frame(worker.last_id))
    time.sleep(0.05)  # usually the worker reads the CANCEL alone, then waits again
    streamed = worker.request(target="/generator")
    assert (streamed.body, streamed.aborted, streamed.frames[-1].flags) == (b"onetwo", None, END)

    # A CANCEL that arrives before the head: a response in one frame goes out whole, and the
    # CANCEL, read after it, is skipped like any other that came too late.
    go = tmp_path / "go"
    worker.send(cancel_frame(worker.queue(request_frame(target=f"/whole-after-wait?{go}"))))
    go.touch()
    whole = worker.read_response()
    assert (whole.body, len(whole.frames), whole.frames[0].flags) == (b"whole", 1, END)
    assert worker.request(target="/generator").body == b"onetwo"
    assert worker.close_and_wait() == 0
    assert worker.stderr() == ""


def test_cancels_for_earlier_requests_are_skipped(start_worker: Callable[..., Worker], tmp_path: Path) -> None:
    worker = start_worker()
    worker.send(cancel_frame(7) + cancel_frame(8))
    worker.queue(request_frame(target="/generator"))
    response = worker.read_response()
    assert (response.body, response.aborted, response.frames[-1].flags) == (b"onetwo", None, END)
    # During a response: a CANCEL naming the request before it (which crossed the end of its
    # own response) does not stop this one.
    go = tmp_path / "go"
    earlier = worker.last_id
    worker.queue(request_frame(target=f"/stream-past-cancel?{go}"))
    assert worker.read_answer_frame().kind == RESPONSE_HEAD
    worker.send(cancel_frame(earlier))
    go.touch()
    rest = worker.read_answer_frame()
    while not rest.flags & END:
        assert rest.kind == RESPONSE_BODY, rest
        rest = worker.read_answer_frame()
    assert "client went away" not in worker.stderr()

    # A large inline body is handed over with the copy of the slot it came in.
    reader = start_worker("app_input")
    body = bytes(range(256)) * 100
    reader.send(cancel_frame(3))
    reader.queue(request_frame("POST", "/?read", body=body))
    assert reader.read_response().json() == [body.decode("latin-1")]
    assert worker.close_and_wait() == 0 and reader.close_and_wait() == 0
    # The streamed response ran to its end: its iterable was closed, and nothing else was said.
    assert worker.stderr().endswith("[INFO] [app] closed /stream-past-cancel\n")
    assert worker.stderr().count("\n") == 1 and reader.stderr() == ""


def test_a_cancel_without_a_request_id_breaks_the_channel(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    worker.send(frame(CANCEL, 0, b"x"))
    assert worker.process.wait(timeout=TIMEOUT) == 1
    assert "the lobby sent a bad CANCEL frame: a CANCEL frame cannot have a 1-byte payload" in worker.stderr()


def test_a_request_during_a_response_breaks_the_channel(start_worker: Callable[..., Worker], tmp_path: Path) -> None:
    worker = start_worker()
    go = tmp_path / "go"
    worker.queue(request_frame(target=f"/stream-past-cancel?{go}"))
    assert worker.read_answer_frame().kind == RESPONSE_HEAD
    worker.send(request_frame(target="/list"))
    go.touch()
    assert worker.process.wait(timeout=TIMEOUT) == 1
    log = worker.stderr()
    assert "the lobby sent a Request frame while a response was in progress; only CANCEL may come then" in log
    assert "closed /stream-past-cancel" in log


# --- The shared region (docs/PROTOCOL.md, section 3) -----------------------------------------


def test_requests_queued_while_the_worker_is_busy_are_taken_in_order(
    start_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    worker = start_worker()
    for turn in range(3):
        go = tmp_path / f"go-{turn}"
        worker.queue(request_frame(target=f"/whole-after-wait?{go}"))
        worker.queue(request_frame(target="/list-many"))
        worker.queue(request_frame(target="/generator"))
        go.touch()
        # All three answers, in order, with no other word from the lobby.
        assert [worker.read_response().body for _ in range(3)] == [b"whole", b"abcdef", b"onetwo"]
    assert worker.close_and_wait() == 0
    assert worker.stderr() == ""


def test_a_request_on_the_channel_keeps_its_place(start_worker: Callable[..., Worker], tmp_path: Path) -> None:
    worker = start_worker()
    go = tmp_path / "go"
    worker.queue(request_frame(target=f"/whole-after-wait?{go}"))
    content = b"q" * 1000
    worker.queue(request_frame("POST", "/echo", body=content, body_in_file=True), body_file(content))
    worker.queue(request_frame(target="/list"))
    go.touch()
    assert [worker.read_response().body for _ in range(3)] == [b"whole", content, b"hello"]
    assert worker.close_and_wait() == 0


def test_a_request_the_lobby_took_back_is_never_served(start_worker: Callable[..., Worker], tmp_path: Path) -> None:
    worker = start_worker()
    go = tmp_path / "go"
    worker.queue(request_frame(target=f"/whole-after-wait?{go}"))
    taken_back = worker.queue(request_frame(target="/list"))
    assert worker.region.recall(taken_back)
    go.touch()
    assert worker.read_response().body == b"whole"
    assert worker.request(target="/list-many").body == b"abcdef"
    assert worker.close_and_wait() == 0
    assert worker.stderr() == ""


@pytest.mark.parametrize(
    "setup, message",
    [
        (frame(REGION, 0, b""), "the lobby sent a REGION frame without a descriptor, with a payload, or a second time"),
        (frame(BELL, FD, b"x"), "the lobby sent a BELL frame without a descriptor, with a payload, or a second time"),
        (frame(BELL, FD, b""), "the lobby sent a BELL frame without a descriptor, with a payload, or a second time"),
        (
            frame(LOBBY_BELL, 0, b""),
            "the lobby sent a LOBBY_BELL frame without a descriptor, with a payload, or a second time",
        ),
        (
            frame(LOBBY_BELL, FD, b""),
            "the lobby sent a LOBBY_BELL frame without a descriptor, with a payload, or a second time",
        ),
    ],
)
def test_a_bad_or_second_region_or_bell_breaks_the_channel(
    start_worker: Callable[..., Worker], setup: bytes, message: str
) -> None:
    worker = start_worker()
    spare = os.open(os.devnull, os.O_RDONLY)
    worker.send(setup, spare if setup[1] & FD else None)
    os.close(spare)
    assert worker.process.wait(timeout=TIMEOUT) == 1
    assert message in worker.stderr()


def test_a_region_without_its_seals_breaks_the_channel(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker(wait_ready=False)
    assert worker.ready() == worker.process.pid
    unsealed = os.memfd_create("unsealed", os.MFD_CLOEXEC)
    os.ftruncate(unsealed, HEADER_BLOCK + SLOTS * SLOT_SIZE + RING_SIZE)
    worker.send(frame(REGION, FD, b""), unsealed)
    os.close(unsealed)
    assert worker.process.wait(timeout=TIMEOUT) == 1
    assert "the shared region cannot be used" in worker.stderr()


def test_a_slot_that_holds_no_request_breaks_the_channel(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    worker.region.queue(cancel_frame(0))
    assert worker.process.wait(timeout=TIMEOUT) == 1
    assert "the lobby queued 12 bytes that are not one whole REQUEST frame or ON_CHANNEL" in worker.stderr()


# --- PEP 3333 conformance, checked by wsgiref's validator ----------------------------------


@pytest.mark.parametrize("path", ["/", "/lines", "/write", "/stream"])
def test_wsgiref_validator_finds_nothing(start_worker: Callable[..., Worker], path: str) -> None:
    worker = start_worker("app_validated")  # warnings are errors in the worker
    content = b"line one\nline two\n" + b"z" * 3000
    cases = [
        worker.request("POST", path, headers=[("Content-Type", "text/plain")], body=content),
        worker.request(
            "POST", path, headers=[("Content-Type", "text/plain")], body=content, body_file=body_file(content)
        ),
        worker.request("GET", path + "?x=1"),
        worker.request("HEAD", path),
    ]
    prefix = {"/write": b"written:", "/stream": b"streamed:"}.get(path, b"")
    assert [(r.status, r.body) for r in cases] == [
        (200, prefix + content),
        (200, prefix + content),
        (200, prefix),
        (200, b""),
    ]
    assert worker.close_and_wait() == 0
    log = worker.stderr()
    # wsgi.errors' lines, each marked as the application's (docs/LIMITS.md).
    assert log.count("[app] validated request\n") == log.count("[app] two\n") == log.count("[app] lines\n") == 4
    assert "Error" not in log and "Warning" not in log and "Exception" not in log


# --- The answer ring: the lobby's bell, a full ring, frames too large for it -----------------


def test_the_lobby_bell_rings_only_when_the_lobby_said_it_sleeps(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    region = worker.region
    # Not sleeping: the answer lands in the ring, and the bell stays silent.
    worker.queue(request_frame(target="/list"))
    deadline = time.monotonic() + TIMEOUT
    while not region.next_record_ready():
        assert time.monotonic() < deadline, worker.stderr()
        time.sleep(0.01)
    assert select.select([region.lobby_bell], [], [], 0)[0] == []
    assert worker.read_response().body == b"hello"
    # Sleeping (the flag set before the request is queued, so no race): the worker rings once
    # and clears the flag itself.
    while region.next_record() is not None:
        pass
    struct.pack_into("<I", region.map, LOBBY_WAITING_AT, 1)
    worker.queue(request_frame(target="/list"))
    assert select.select([region.lobby_bell], [], [], TIMEOUT)[0] == [region.lobby_bell]
    assert os.eventfd_read(region.lobby_bell) == 1
    assert region.u32(LOBBY_WAITING_AT) == 0
    assert worker.read_response().body == b"hello"
    assert worker.close_and_wait() == 0


def test_a_worker_waiting_for_room_in_the_ring_still_hears_cancel(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    request_id = worker.queue(request_frame(target="/big"))
    # The 1 MiB answer fills the 64 KiB ring, and the worker says it sleeps until there is room
    # (2; 1 is for a request).
    deadline = time.monotonic() + TIMEOUT
    while worker.region.u32(WORKER_WAITING_AT) != 2:
        assert time.monotonic() < deadline, worker.stderr()
        time.sleep(0.01)
    worker.send(cancel_frame(request_id))
    frames = [worker.read_answer_frame()]
    while frames[-1].kind != RESPONSE_ABORT:
        assert not frames[-1].flags & END, "the whole answer came, despite the CANCEL"
        frames.append(worker.read_answer_frame())
    assert frames[-1].payload == b"the client went away"
    assert sum(len(frame.payload) for frame in frames[1:-1]) < 1 << 20
    assert worker.request(target="/list").body == b"hello"  # the worker goes on
    assert worker.close_and_wait() == 0
    assert "client went away during GET /big HTTP/1.1" in worker.stderr()


def test_a_frame_larger_than_the_ring_goes_on_the_channel_in_its_turn(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker()
    response = worker.request(target="/huge-head")
    assert (response.header("X-Huge"), response.body) == ("h" * (RING_SIZE // 2), b"after")
    # The head came on the channel, announced by ON_CHANNEL; the body after it, in the ring.
    assert [(f.kind, f.flags) for f in response.frames] == [(RESPONSE_HEAD, 0), (RESPONSE_BODY, END)]
    assert worker.request(target="/big").body == bytes(range(256)) * 4096
    assert worker.close_and_wait() == 0
