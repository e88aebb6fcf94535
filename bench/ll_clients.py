"""The long-lived streams' clients (issue 47: LL-SSE, LL-SSE-60, LL-WS, LL-TOKENS), against
bench/ll_app.py on 127.0.0.1.

    python3 bench/ll_clients.py sse --port PORT --clients 5000 --events 15 --every 1 --ramp 2.5
    python3 bench/ll_clients.py ws --port PORT --clients 5000 --messages 5 --interval 3 --ramp 2.5
    python3 bench/ll_clients.py tokens --port PORT --clients 1000 --tokens 40 --gap 0.025

The clients are split over --processes processes (asyncio, uvloop where installed, raw protocols:
no HTTP or WebSocket library between the socket and the count), client k of all of them started
k x ramp / clients seconds after the common start, each on a connection of its own. Beside them
the parent process probes `GET /` on a new connection every --probe-every seconds, each due at
its time whatever the others do (an open loop), each given up after --probe-timeout.

Every loop is bounded: a client gives up --slack seconds past the end its load should have, the
prober stops with the last client, and the whole run ends by --limit seconds at the latest.

Lines on stdout: "LL-OPEN {json}" once every client has its stream open (its first event, its
first chunk or its 101) or has failed, or --open-wait seconds after the ramp (the harness reads the
server's memory then), and at the end "LL-CLIENTS-JSON {json}", the report.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import math
import os
import resource
import subprocess
import sys
import time

OPEN_MARKER = "LL-OPEN "
REPORT_MARKER = "LL-CLIENTS-JSON "
PART_OPEN = "PART-OPEN "
PART_REPORT = "PART-JSON "
DATA = b"data: "
CONNECT_TIMEOUT = 5.0
# A first event, chunk or 101 later than this is late (issue 47's targets: within 1 s).
LATE_SECONDS = 1.0
# A Sec-WebSocket-Key is 16 bytes in base64 (RFC 6455).
WS_KEY = base64.b64encode(b"maitred-bench-ll").decode()
WS_ACCEPT = base64.b64encode(hashlib.sha1((WS_KEY + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
ECHO_TIMEOUT = 5.0


def main() -> None:
    args = _parse_args()
    try:
        import uvloop

        uvloop.install()
        loop_name = "uvloop"
    except ImportError:
        loop_name = "asyncio"
    _raise_open_files_limit()
    if args.part is None:
        report = asyncio.run(_parent(args))
        report["client_loop"] = loop_name
        print(REPORT_MARKER + json.dumps(report), flush=True)
    else:
        asyncio.run(_child(args))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("sse", "ws", "tokens"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--ramp", type=float, default=0.0, help="seconds over which the clients start")
    parser.add_argument("--events", type=int, default=15)
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--gap", type=float, default=0.025)
    parser.add_argument("--messages", type=int, default=5)
    parser.add_argument("--interval", type=float, default=3.0)
    parser.add_argument("--probe-every", type=float, default=0.05)
    parser.add_argument("--probe-timeout", type=float, default=3.0)
    parser.add_argument("--open-wait", type=float, default=3.0)
    parser.add_argument("--slack", type=float, default=10.0)
    parser.add_argument("--limit", type=float, default=180.0)
    # Internal: one client process's share and the common start (CLOCK_MONOTONIC, shared by all).
    parser.add_argument("--part", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    return parser.parse_args()


def _raise_open_files_limit() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _expected_seconds(args: argparse.Namespace) -> float:
    """How long a client's load lasts once it has started, when the server keeps up."""
    if args.mode == "sse":
        return (args.events - 1) * args.every
    if args.mode == "tokens":
        return (args.tokens - 1) * args.gap
    return args.interval + (args.messages - 1) * args.interval


# ---------------------------------------------------------------------------------------------
# The parent: the client processes, the prober, the report.


async def _parent(args: argparse.Namespace) -> dict:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    start_at = time.monotonic() + 1.0  # the children's imports and their loops' start
    argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--start-at", repr(start_at)]
    children = [
        # Each process's report is one line of JSON: hundreds of KB for thousands of clients.
        await asyncio.create_subprocess_exec(*argv, "--part", str(part), stdout=subprocess.PIPE, limit=1 << 26)
        for part in range(args.processes)
    ]
    opened: list[dict | None] = [None] * len(children)
    reports: list[dict | None] = [None] * len(children)
    open_event = asyncio.Event()

    async def read(index: int, child) -> None:
        async for raw in child.stdout:
            line = raw.decode(errors="replace")
            if line.startswith(PART_OPEN):
                opened[index] = json.loads(line[len(PART_OPEN) :])
                if all(o is not None for o in opened):
                    open_event.set()
            elif line.startswith(PART_REPORT):
                reports[index] = json.loads(line[len(PART_REPORT) :])
        await child.wait()

    readers = [asyncio.create_task(read(i, c)) for i, c in enumerate(children)]
    probes: list[tuple[float | None, str]] = []
    stop_probing = asyncio.Event()
    prober = asyncio.create_task(_probe(args, start_at, probes, stop_probing))

    async def announce() -> None:
        await open_event.wait()
        total = {key: sum(o[key] for o in opened) for key in opened[0]}
        total["at_s"] = round(time.monotonic() - start_at, 3)
        print(OPEN_MARKER + json.dumps(total), flush=True)

    announcer = asyncio.create_task(announce())
    cpu_began = _cpu_seconds()
    try:
        await asyncio.wait_for(asyncio.gather(*readers), timeout=args.limit)
    except asyncio.TimeoutError:
        for child in children:
            if child.returncode is None:
                child.kill()
        await asyncio.gather(*(child.wait() for child in children))
    ended = time.monotonic()
    stop_probing.set()
    await prober
    announcer.cancel()
    parent_cpu = _cpu_seconds() - cpu_began
    got = [r for r in reports if r is not None]
    return _aggregate(args, got, len(children) - len(got), probes, parent_cpu, ended - start_at, hard, opened)


async def _probe(args: argparse.Namespace, start_at: float, probes: list, stop: asyncio.Event) -> None:
    """GET / on a new connection every probe_every seconds from the start until the last client
    is done, each at its due time; (latency from the due time or None, outcome)."""
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    tasks = []
    due = start_at
    while not stop.is_set() and due < start_at + args.limit:
        delay = due - time.monotonic()
        if delay > 0:
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
                break
            except asyncio.TimeoutError:
                pass
        tasks.append(asyncio.create_task(_one_probe(args.port, due, args.probe_timeout, probes)))
        due += args.probe_every
    await asyncio.gather(*tasks)


async def _one_probe(port: int, due: float, timeout: float, probes: list) -> None:
    writer = None
    try:

        async def ask() -> bytes:
            nonlocal writer
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return await reader.read()

        answer = await asyncio.wait_for(ask(), timeout=timeout)
        status = answer[9:12]
        probes.append(
            (time.monotonic() - due, "ok" if status == b"200" else f"status {status.decode(errors='replace')}")
        )
    except asyncio.TimeoutError:
        probes.append((None, "timed out"))
    except ConnectionRefusedError:
        probes.append((None, "refused"))
    except OSError:
        probes.append((None, "reset"))
    finally:
        if writer is not None:
            writer.transport.abort()


# ---------------------------------------------------------------------------------------------
# A client process: its share of the clients.


async def _child(args: argparse.Namespace) -> None:
    mine = list(range(args.part, args.clients, args.processes))
    expected = _expected_seconds(args)
    outcomes: list[dict] = []
    open_count = {"clients": len(mine), "open": 0, "failed": 0}
    settled = asyncio.Event()

    def note_open(ok: bool) -> None:
        open_count["open" if ok else "failed"] += 1
        if open_count["open"] + open_count["failed"] >= len(mine):
            settled.set()

    async def announce() -> None:
        # All open or failed, or open_wait seconds after the ramp: the harness reads memory then.
        try:
            wait_until = args.start_at + args.ramp + args.open_wait
            await asyncio.wait_for(settled.wait(), timeout=max(0.1, wait_until - time.monotonic()))
        except asyncio.TimeoutError:
            pass
        print(PART_OPEN + json.dumps(open_count), flush=True)

    announcer = asyncio.create_task(announce())
    cpu_began = _cpu_seconds()
    tasks = []
    for k in mine:
        due = args.start_at + (k * args.ramp / args.clients if args.clients else 0)
        run = _ws_client if args.mode == "ws" else _stream_client
        tasks.append(asyncio.create_task(run(args, k, due, expected, outcomes, note_open)))
    await asyncio.gather(*tasks)
    await announcer
    cpu = _cpu_seconds() - cpu_began
    ended = time.monotonic()
    print(
        PART_REPORT + json.dumps({"outcomes": outcomes, "cpu_s": cpu, "wall_s": ended - args.start_at}),
        flush=True,
    )


class _StreamProtocol(asyncio.Protocol):
    """An SSE or token stream: the request, the status line, and each "data: " counted as it
    arrives, with the time of the first and how late each later one is against its schedule."""

    def __init__(self, request: bytes, every: float, expected: int, done: asyncio.Future) -> None:
        self.request = request
        self.every = every
        self.expected = expected
        self.done = done
        self.head = b""
        self.status: bytes | None = None
        self.tail = b""
        self.count = 0
        self.first: float | None = None
        self.last: float | None = None
        self.max_lateness = 0.0
        self.loop = asyncio.get_running_loop()
        self.opened = self.loop.create_future()  # the first piece, or the connection's end
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if self.status is None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.status = self.head[9:12]
            data, self.head = self.head[end + 4 :], b""
            if self.status != b"200":
                self.transport.abort()
                return
        text = self.tail + data
        found = text.count(DATA)
        if found:
            if self.first is None:
                self.first = now
                if not self.opened.done():
                    self.opened.set_result(True)
            else:
                lateness = now - (self.first + self.count * self.every)
                self.max_lateness = max(self.max_lateness, lateness)
            self.count += found
            self.last = now
        self.tail = text[-(len(DATA) - 1) :]
        if self.count >= self.expected and text.endswith(b"0\r\n\r\n"):
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if not self.opened.done():
            self.opened.set_result(False)
        if not self.done.done():
            self.done.set_result(exc)


async def _stream_client(args, k: int, due: float, expected_seconds: float, outcomes: list, note_open) -> None:
    loop = asyncio.get_running_loop()
    if args.mode == "sse":
        target, pieces, every = f"/sse?n={args.events}&every={args.every:g}", args.events, args.every
    else:
        target, pieces, every = f"/tokens?n={args.tokens}&gap={args.gap:g}", args.tokens, args.gap
    request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n"
    await asyncio.sleep(max(0.0, due - time.monotonic()))
    began = time.monotonic()
    give_up_at = began + expected_seconds + args.slack
    done = loop.create_future()
    protocol = _StreamProtocol(request.encode(), every, pieces, done)
    outcome = {"error": None, "first_s": None, "count": 0, "max_lateness_s": None, "last_s": None}
    opened = False
    try:
        await asyncio.wait_for(
            loop.create_connection(lambda: protocol, "127.0.0.1", args.port), timeout=CONNECT_TIMEOUT
        )
        # Wait for the first piece (the stream is open then), then for the end.
        await asyncio.wait([protocol.opened], timeout=max(0.0, give_up_at - time.monotonic()))
        if protocol.first is not None:
            opened = True
            note_open(True)
        remaining = give_up_at - time.monotonic()
        if not done.done() and remaining > 0:
            await asyncio.wait([done], timeout=remaining)
        if not done.done():
            outcome["error"] = "no end in time" if protocol.status else "no answer in time"
            protocol.transport.abort()
        elif protocol.status is None:
            outcome["error"] = "reset" if done.result() else "closed unanswered"
        elif protocol.status != b"200":
            outcome["error"] = f"status {protocol.status.decode(errors='replace')}"
        elif protocol.count < pieces:
            outcome["error"] = "cut" if done.result() is None else "reset"
    except asyncio.TimeoutError:
        outcome["error"] = "connect timeout"
    except ConnectionRefusedError:
        outcome["error"] = "refused"
    except OSError as error:
        outcome["error"] = f"connect: {error.__class__.__name__}"
    if not opened:
        note_open(False)
    outcome["count"] = protocol.count
    if protocol.first is not None:
        outcome["first_s"] = protocol.first - began
        outcome["last_s"] = protocol.last - args.start_at
        outcome["max_lateness_s"] = protocol.max_lateness
    outcome["began_s"] = began - args.start_at
    outcomes.append(outcome)


class _WsProtocol(asyncio.Protocol):
    """A WebSocket client: the handshake, then masked text frames out and the server's frames in;
    each echo matched, in order, with the message it answers."""

    def __init__(self, request: bytes, accepted: asyncio.Future, done: asyncio.Future) -> None:
        self.request = request
        self.accepted = accepted
        self.done = done
        self.head = b""
        self.status: bytes | None = None
        self.buffer = b""
        self.sent: list[tuple[bytes, float]] = []  # awaiting their echo, oldest first
        self.latencies: list[float] = []
        self.wrong = 0
        self.closed_by_server: int | None = None
        self.loop = asyncio.get_running_loop()
        self.drained: asyncio.Future | None = None  # set once no echo is awaited
        self.transport = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.write(self.request)

    def send_text(self, payload: bytes) -> None:
        self.sent.append((payload, time.monotonic()))
        self.transport.write(_masked_frame(0x1, payload))

    def data_received(self, data: bytes) -> None:
        if self.status is None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data, self.head = self.head[:end], self.head[end + 4 :], b""
            self.status = head[9:12]
            if self.status != b"101" or WS_ACCEPT not in head:
                if not self.accepted.done():
                    self.accepted.set_result(False)
                self.transport.abort()
                return
            if not self.accepted.done():
                self.accepted.set_result(True)
        self.buffer += data
        now = time.monotonic()
        while len(self.buffer) >= 2:
            first, second = self.buffer[0], self.buffer[1]
            length, at = second & 0x7F, 2
            if length == 126:
                if len(self.buffer) < 4:
                    return
                length, at = int.from_bytes(self.buffer[2:4], "big"), 4
            elif length == 127:
                if len(self.buffer) < 10:
                    return
                length, at = int.from_bytes(self.buffer[2:10], "big"), 10
            if len(self.buffer) < at + length:
                return
            payload, self.buffer = self.buffer[at : at + length], self.buffer[at + length :]
            opcode = first & 0x0F
            if opcode in (0x1, 0x2):
                if self.sent:
                    expected, sent_at = self.sent.pop(0)
                    if payload == expected:
                        self.latencies.append(now - sent_at)
                    else:
                        self.wrong += 1
                else:
                    self.wrong += 1
                if not self.sent and self.drained is not None and not self.drained.done():
                    self.drained.set_result(True)
            elif opcode == 0x8:
                self.closed_by_server = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
                self.transport.close()
            elif opcode == 0x9:
                self.transport.write(_masked_frame(0xA, payload))

    def connection_lost(self, exc) -> None:
        if not self.accepted.done():
            self.accepted.set_result(False)
        if not self.done.done():
            self.done.set_result(exc)


def _masked_frame(opcode: int, payload: bytes) -> bytes:
    assert len(payload) < 126
    mask = os.urandom(4)
    masked = bytes(byte ^ mask[i & 3] for i, byte in enumerate(payload))
    return bytes((0x80 | opcode, 0x80 | len(payload))) + mask + masked


async def _ws_client(args, k: int, due: float, expected_seconds: float, outcomes: list, note_open) -> None:
    loop = asyncio.get_running_loop()
    request = (
        "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {WS_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    await asyncio.sleep(max(0.0, due - time.monotonic()))
    began = time.monotonic()
    give_up_at = began + expected_seconds + args.slack
    accepted, done = loop.create_future(), loop.create_future()
    protocol = _WsProtocol(request, accepted, done)
    outcome = {"error": None, "accept_s": None, "latencies": [], "missing": args.messages, "wrong": 0}
    opened = False
    try:
        await asyncio.wait_for(
            loop.create_connection(lambda: protocol, "127.0.0.1", args.port), timeout=CONNECT_TIMEOUT
        )
        await asyncio.wait([accepted], timeout=max(0.0, give_up_at - time.monotonic()))
        if not accepted.done():
            outcome["error"] = "no answer in time"
            protocol.transport.abort()
        elif not accepted.result():
            outcome["error"] = (
                "reset" if protocol.status is None else f"status {protocol.status.decode(errors='replace')}"
            )
        else:
            opened = True
            note_open(True)
            outcome["accept_s"] = time.monotonic() - began
            # Each client at its own phase of the interval, so that the messages spread evenly.
            phase = (k * 0.618034 % 1.0) * args.interval
            for index in range(args.messages):
                send_at = began + outcome["accept_s"] + phase + index * args.interval
                await asyncio.wait([done], timeout=max(0.0, send_at - time.monotonic()))
                if done.done():
                    break
                protocol.send_text(f"{k}:{index}:".encode().ljust(32, b"."))
            # The last echo, then a clean close.
            if protocol.sent and not done.done():
                protocol.drained = loop.create_future()
                echo_by = min(time.monotonic() + ECHO_TIMEOUT, give_up_at)
                await asyncio.wait(
                    [done, protocol.drained],
                    timeout=max(0.0, echo_by - time.monotonic()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            if done.done():
                outcome["error"] = "closed by the server" if protocol.closed_by_server else "reset"
            else:
                protocol.transport.write(_masked_frame(0x8, (1000).to_bytes(2, "big")))
                await asyncio.wait([done], timeout=2.0)
                if not done.done():
                    protocol.transport.abort()
    except asyncio.TimeoutError:
        outcome["error"] = "connect timeout"
    except ConnectionRefusedError:
        outcome["error"] = "refused"
    except OSError as error:
        outcome["error"] = f"connect: {error.__class__.__name__}"
    if not opened:
        note_open(False)
    outcome["latencies"] = protocol.latencies
    outcome["missing"] = args.messages - len(protocol.latencies)
    outcome["wrong"] = protocol.wrong
    outcomes.append(outcome)


# ---------------------------------------------------------------------------------------------
# The report.


def _percentiles(values: list[float], count: int | None = None) -> dict[str, float | None]:
    """p50, p90, p99, p99.9 and max in ms over `count` clients (default: the values'), those
    without a value counted as slower than any: a percentile that falls among them is None."""
    ordered = sorted(values)
    total = len(ordered) if count is None else count
    result: dict[str, float | None] = {}
    for name, share in (("50", 0.5), ("90", 0.9), ("99", 0.99), ("99.9", 0.999)):
        index = max(0, min(total - 1, math.ceil(share * total) - 1)) if total else 0
        result[name] = ordered[index] * 1000 if total and index < len(ordered) else None
    result["max"] = ordered[-1] * 1000 if ordered and len(ordered) == total else None
    return result


def _aggregate(args, reports, lost_parts, probes, parent_cpu, wall, hard, opened) -> dict:
    outcomes = [o for r in reports for o in r["outcomes"]]
    errors: dict[str, int] = {}
    for outcome in outcomes:
        if outcome["error"]:
            errors[outcome["error"]] = errors.get(outcome["error"], 0) + 1
    lost = args.clients - len(outcomes)  # a client process that did not report
    if lost:
        errors["client process lost"] = lost
    cpu = parent_cpu + sum(r["cpu_s"] for r in reports)
    report = {
        "mode": args.mode,
        "clients": args.clients,
        "processes": args.processes,
        "seconds": wall,
        "errors": errors,
        "client_cpu_s": cpu,
        "client_cpu_pct": 100 * cpu / wall if wall else None,
        # The busiest client process: near 100% of a core, the clients were the bottleneck.
        "client_busiest_pct": max((100 * r["cpu_s"] / r["wall_s"] for r in reports if r["wall_s"]), default=None),
        "open_files_limit": hard,
        "opened": {key: sum(o[key] for o in opened if o) for key in ("clients", "open", "failed")},
    }
    late_first = 0
    if args.mode in ("sse", "tokens"):
        pieces = args.events if args.mode == "sse" else args.tokens
        firsts = [o["first_s"] for o in outcomes if o["first_s"] is not None]
        late_first = sum(1 for value in firsts if value > LATE_SECONDS) + (args.clients - len(firsts))
        report["first"] = _percentiles(firsts, args.clients)
        report["late_first"] = late_first
        report["pieces_expected"] = pieces * args.clients
        report["pieces"] = sum(o["count"] for o in outcomes)
        report["missing"] = report["pieces_expected"] - report["pieces"]
        report["complete"] = sum(1 for o in outcomes if o["count"] >= pieces and not o["error"])
        lateness = [o["max_lateness_s"] for o in outcomes if o["max_lateness_s"] is not None]
        report["lateness"] = _percentiles(lateness)
        lasts = [o["last_s"] for o in outcomes if o["last_s"] is not None]
        begins = [o["began_s"] for o in outcomes]
        # The batch: from the first client's start to the last piece of the last stream, only
        # where every stream ran to its end; the last piece that came in either way.
        report["last_piece_s"] = (max(lasts) - min(begins)) if lasts and begins else None
        report["batch_s"] = report["last_piece_s"] if report["complete"] == args.clients else None
    else:
        accepts = [o["accept_s"] for o in outcomes if o["accept_s"] is not None]
        latencies = [value for o in outcomes for value in o["latencies"]]
        late_first = sum(1 for value in accepts if value > LATE_SECONDS) + (args.clients - len(accepts))
        report["accept"] = _percentiles(accepts, args.clients)
        report["late_accepts"] = late_first
        report["not_101"] = sum(count for error, count in errors.items() if error.startswith("status "))
        report["echo"] = _percentiles(latencies, args.messages * args.clients)
        report["echo_answered"] = _percentiles(latencies)
        report["echoes"] = len(latencies)
        report["missing"] = sum(o["missing"] for o in outcomes) + lost * args.messages
        report["wrong"] = sum(o["wrong"] for o in outcomes)
    answered = [latency for latency, outcome in probes if outcome == "ok"]
    failed: dict[str, int] = {}
    for _latency, outcome in probes:
        if outcome != "ok":
            failed[outcome] = failed.get(outcome, 0) + 1
    report["probe"] = {
        "sent": len(probes),
        "failed": failed,
        "latency_ms": _percentiles(answered, len(probes)),
        "answered_ms": _percentiles(answered),
    }
    return report


if __name__ == "__main__":
    main()
