"""Slow and quick requests side by side against a server on 127.0.0.1, for scenario HOL: how long
the quick requests wait behind the slow ones.

    python3 bench/mixed_clients.py --slow-clients 3 --quick-clients 8 --quick-interval 0.02 \\
        --seconds 10 --slow-path /slow --quick-path /quick http://127.0.0.1:PORT/

Every client has a keep-alive connection of its own (HTTP/1.1), opened before the load starts.
Each slow client asks for --slow-path again as soon as its last answer is in. Each quick client
asks for --quick-path every --quick-interval seconds, the clients' schedules spread evenly over
the interval; a request whose turn comes while the client still waits for its last answer goes as
soon as that answer is in, and its latency counts from when it was due, not from when it could be
sent (as wrk2 does). Otherwise a quick client stuck behind a slow request would send fewer
requests meanwhile, and its wait would weigh less in the percentiles than it did for the client.

The slow clients start 0.2 s ahead, so that the quick ones meet slow requests already running.
The load is bounded: the quick clients make seconds / interval requests each, the slow clients
start none after the quick schedule's end (and at most seconds / 2 + 1 each, whatever their
answers take), every request is given up after --timeout seconds, and what is still unsent or
unanswered one --timeout after the schedule's end is cut off (counted as failed). A request that fails on a
reused connection before any byte of its answer is sent once more on a new connection (as HTTP
clients do for a GET: the server closed the idle connection, as uWSGI's --http-socket does after
every answer); the retries are counted. At the end the program prints one line,
"MIXED-CLIENTS-JSON {...}":

    seconds   length of the quick schedule
    quick, slow: answered   requests with a complete answer
                 non2xx     of them, answers with a status outside 200-299
                 failed     requests without one (failed_detail: timeout, closed, refused,
                            cut off)
                 retried    requests sent again on a new connection
                 latency_ms {percentile: ms} over the answered requests; max_ms, mean_ms
    quick:       over_1s    answered requests that took over 1 s (a quick request that long
                            waited behind a slow one)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

SLOW_LEAD_SECONDS = 0.2
# The fewest seconds a slow request is taken to last, for bounding how many a slow client makes.
SLOW_REQUEST_FLOOR_SECONDS = 2.0
PERCENTILES = (50, 90, 99, 99.9)


class Failure(Exception):
    """A request without a complete answer; str(error) is its kind (timeout, closed, refused)."""


@dataclass
class Tally:
    """What one kind of request (quick or slow) came to."""

    latencies_ms: list[float] = field(default_factory=list)
    non2xx: int = 0
    failures: Counter = field(default_factory=Counter)
    retried: int = 0

    def report(self) -> dict:
        ordered = sorted(self.latencies_ms)
        return {
            "answered": len(ordered),
            "non2xx": self.non2xx,
            "failed": sum(self.failures.values()),
            "failed_detail": dict(self.failures),
            "retried": self.retried,
            "latency_ms": {f"{p:g}": _nearest_rank(ordered, p) for p in PERCENTILES} if ordered else {},
            "max_ms": ordered[-1] if ordered else None,
            "mean_ms": statistics.fmean(ordered) if ordered else None,
            "over_1s": sum(latency > 1000 for latency in ordered),
        }


def _nearest_rank(ordered: list[float], percentile: float) -> float:
    return ordered[max(0, math.ceil(percentile / 100 * len(ordered)) - 1)]


class Client:
    """One keep-alive connection, reopened when the server closes it."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        try:
            self.reader, self.writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), self.timeout
            )
        except (OSError, asyncio.TimeoutError):
            raise Failure("refused") from None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def get(self, path: str, tally: Tally) -> int:
        """GET path; returns the answer's status. Raises Failure when there is no complete answer
        within the timeout (the connection is then closed)."""
        reused = self.writer is not None
        if not reused:
            await self.connect()
        try:
            return await self._answer(path)
        except _ClosedBeforeAnswer:
            if not reused:
                raise Failure("closed") from None
        tally.retried += 1
        await self.connect()
        try:
            return await self._answer(path)
        except _ClosedBeforeAnswer:
            raise Failure("closed") from None

    async def _answer(self, path: str) -> int:
        """One exchange within the timeout; the connection is closed when it fails."""
        try:
            return await asyncio.wait_for(self._exchange(path), self.timeout)
        except asyncio.TimeoutError:
            self.close()
            raise Failure("timeout") from None
        except (_ClosedBeforeAnswer, Failure):
            self.close()
            raise

    async def _exchange(self, path: str) -> int:
        try:
            self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n\r\n".encode())
            await self.writer.drain()
            head = await self.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as error:
            if error.partial:
                raise Failure("closed") from None
            raise _ClosedBeforeAnswer from None
        except (ConnectionError, asyncio.LimitOverrunError):
            raise _ClosedBeforeAnswer from None
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in header_lines if line)
        }
        try:
            if "content-length" in headers:
                await self.reader.readexactly(int(headers["content-length"]))
            else:  # no length: the body runs to the end of the connection
                await self.reader.read()
                self.close()
        except (asyncio.IncompleteReadError, ConnectionError):
            raise Failure("closed") from None
        if headers.get("connection", "").lower() == "close":
            self.close()
        return int(status_line.split(" ", 2)[1])


class _ClosedBeforeAnswer(Exception):
    """The connection ended before any byte of the answer: the request may be sent again."""


async def _timed(client: Client, path: str, tally: Tally, since: float) -> None:
    """One request, its latency counted from `since` (a monotonic time)."""
    try:
        status = await client.get(path, tally)
    except Failure as failure:
        tally.failures[str(failure)] += 1
        return
    tally.latencies_ms.append((time.monotonic() - since) * 1000)
    tally.non2xx += not 200 <= status < 300


async def _slow_client(client: Client, path: str, tally: Tally, end: float, most: int) -> None:
    for _ in range(most):
        if time.monotonic() >= end:
            return
        await _timed(client, path, tally, time.monotonic())


async def _quick_client(client: Client, path: str, tally: Tally, first_due: float, interval: float, count: int) -> None:
    for number in range(count):
        due = first_due + number * interval
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        await _timed(client, path, tally, due)


async def run(args: argparse.Namespace) -> dict:
    address = urlsplit(args.url)
    host, port = address.hostname, address.port or 80
    slow = [Client(host, port, args.timeout) for _ in range(args.slow_clients)]
    quick = [Client(host, port, args.timeout) for _ in range(args.quick_clients)]
    slow_tally, quick_tally = Tally(), Tally()

    async def opened(client: Client) -> None:
        # One that fails is opened again by its first request.
        with contextlib.suppress(Failure):
            await client.connect()

    # The connections are opened before the load starts.
    await asyncio.gather(*(opened(client) for client in slow + quick))
    start = time.monotonic() + SLOW_LEAD_SECONDS
    end = start + args.seconds
    per_quick_client = round(args.seconds / args.quick_interval)
    most_slow = int(args.seconds / SLOW_REQUEST_FLOOR_SECONDS) + 1
    load = asyncio.gather(
        *(_slow_client(client, args.slow_path, slow_tally, end, most_slow) for client in slow),
        *(
            _quick_client(
                client,
                args.quick_path,
                quick_tally,
                start + index * args.quick_interval / len(quick),
                args.quick_interval,
                per_quick_client,
            )
            for index, client in enumerate(quick)
        ),
    )
    # Late answers make the quick clients send their last requests late: past the schedule's end
    # and one timeout, what is still unsent or unanswered is cut off and counted as failed.
    try:
        await asyncio.wait_for(load, end + args.timeout - time.monotonic())
    except asyncio.TimeoutError:
        settled = len(quick_tally.latencies_ms) + sum(quick_tally.failures.values())
        quick_tally.failures["cut off"] += per_quick_client * len(quick) - settled
    for client in slow + quick:
        client.close()
    return {"seconds": args.seconds, "quick": quick_tally.report(), "slow": slow_tally.report()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/mixed_clients.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--slow-clients", type=int, required=True)
    parser.add_argument("--quick-clients", type=int, required=True)
    parser.add_argument("--quick-interval", type=float, required=True, help="seconds between a quick client's requests")
    parser.add_argument("--seconds", type=float, required=True, help="length of the quick schedule")
    parser.add_argument("--slow-path", required=True)
    parser.add_argument("--quick-path", required=True)
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds before a request is given up")
    parser.add_argument("url")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    print("MIXED-CLIENTS-JSON " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
