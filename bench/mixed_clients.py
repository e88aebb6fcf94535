"""Slow and quick requests side by side against a server on 127.0.0.1, for scenario HOL: how long
the quick requests wait behind the slow ones.

    python3 bench/mixed_clients.py --slow-clients 3 --quick-rate 400 --quick-connections 8 \\
        --seconds 10 --slow-path /slow --quick-path /quick http://127.0.0.1:PORT/

Each slow client has a keep-alive connection of its own (HTTP/1.1) and asks for --slow-path again
as soon as its last answer is in. The quick requests arrive at --quick-rate per second, each at
its due time whatever the earlier ones are doing (an open loop), as a proxy's or a page's requests
do: each goes on an idle keep-alive connection of the quick requests' pool, the one last used
first, or on a new one added to the pool when none is idle (--quick-connections are opened before
the load). A quick request's latency counts from its due time, so it includes a connect where one
was needed. A quick request stuck behind a slow one holds its connection meanwhile, so the others
go on without it: the figure is the wait of the requests that were stuck, not a client's backlog.

The slow clients start 0.2 s ahead, so that the quick requests meet slow ones already running.
The load is bounded: seconds x rate quick requests, no slow request started after the quick
schedule's end (and at most seconds / 2 + 1 per slow client, whatever their answers take), every
request given up after --timeout seconds, and whatever is still unanswered one --timeout after the
schedule's end cut off (counted as failed). A request that fails on a reused connection before any
byte of its answer is sent once more on a new connection (as HTTP clients do for a GET: the server
closed the idle connection, as uWSGI's --http-socket does after every answer); the retries are
counted. At the end the program prints one line, "MIXED-CLIENTS-JSON {...}":

    seconds   length of the quick schedule
    quick_connections  connections the quick requests used (the pool's size at the end)
    quick, slow: answered   requests with a complete answer
                 non2xx     of them, answers with a status outside 200-299
                 failed     requests without one (failed_detail: timeout, closed, refused,
                            cut off)
                 retried    requests sent again on a new connection
                 latency_ms {percentile: ms} over the answered requests; max_ms, mean_ms
                 over_1s    answered requests that took over 1 s (for a quick request: it waited
                            behind a slow one)
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


class Pool:
    """The quick requests' keep-alive connections."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.idle: list[Client] = []
        self.size = 0

    def take(self) -> Client:
        """The idle connection last used, or a new one (it connects on its first request)."""
        if self.idle:
            return self.idle.pop()
        self.size += 1
        return Client(self.host, self.port, self.timeout)

    def give_back(self, client: Client) -> None:
        if client.writer is not None:  # still open
            self.idle.append(client)


async def _quick_request(pool: Pool, path: str, tally: Tally, due: float) -> None:
    client = pool.take()
    await _timed(client, path, tally, due)
    pool.give_back(client)


async def _quick_arrivals(pool: Pool, path: str, tally: Tally, start: float, rate: float, count: int) -> None:
    requests = []
    for number in range(count):
        due = start + number / rate
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        requests.append(asyncio.create_task(_quick_request(pool, path, tally, due)))
    await asyncio.gather(*requests)


async def run(args: argparse.Namespace) -> dict:
    address = urlsplit(args.url)
    host, port = address.hostname, address.port or 80
    slow = [Client(host, port, args.timeout) for _ in range(args.slow_clients)]
    pool = Pool(host, port, args.timeout)
    pool.idle = [pool.take() for _ in range(args.quick_connections)]
    slow_tally, quick_tally = Tally(), Tally()

    async def opened(client: Client) -> None:
        # One that fails is opened again by its first request.
        with contextlib.suppress(Failure):
            await client.connect()

    # The connections are opened before the load starts.
    await asyncio.gather(*(opened(client) for client in slow + pool.idle))
    start = time.monotonic() + SLOW_LEAD_SECONDS
    end = start + args.seconds
    quick_count = round(args.seconds * args.quick_rate)
    most_slow = int(args.seconds / SLOW_REQUEST_FLOOR_SECONDS) + 1
    load = asyncio.gather(
        *(_slow_client(client, args.slow_path, slow_tally, end, most_slow) for client in slow),
        _quick_arrivals(pool, args.quick_path, quick_tally, start, args.quick_rate, quick_count),
    )
    # Past the schedule's end and one timeout, what is still unanswered is cut off.
    try:
        await asyncio.wait_for(load, end + args.timeout - time.monotonic())
    except asyncio.TimeoutError:
        settled = len(quick_tally.latencies_ms) + sum(quick_tally.failures.values())
        quick_tally.failures["cut off"] += quick_count - settled
    for client in slow + pool.idle:
        client.close()
    return {
        "seconds": args.seconds,
        "quick_connections": pool.size,
        "quick": quick_tally.report(),
        "slow": slow_tally.report(),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/mixed_clients.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--slow-clients", type=int, required=True)
    parser.add_argument("--quick-rate", type=float, required=True, help="quick requests per second")
    parser.add_argument(
        "--quick-connections", type=int, required=True, help="keep-alive connections opened for them beforehand"
    )
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
