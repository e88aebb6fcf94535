"""Clients with a deadline, one new TCP connection per request, for scenario O1.

    python3 bench/deadline_clients.py closed --concurrency 16 --seconds 3 http://127.0.0.1:P/
    python3 bench/deadline_clients.py open --rate 800 --seconds 15 http://127.0.0.1:P/

closed: --concurrency clients, each sending its next request as soon as its last one is over, for
--seconds: the most the server answers this client (O1's capacity).
open: requests arrive at --rate per second for --seconds, each started at its due time whatever
the earlier ones are doing (an open loop, as users arriving are), so a slow server faces a growing
crowd rather than a client that waits for it.

Each request opens its own connection, sends `GET /` with "Connection: close" and gives up after
--deadline seconds (1 s) from its start, closing its socket, as a user or a proxy with a deadline
does. Both modes stop by themselves: the last request starts before --seconds have passed and is
over one --deadline later. Then the program prints one line "DEADLINE-CLIENTS-JSON {...}":

    sent            requests started
    good            answered 200 within the deadline
    shed            answered 503 within the deadline (the server refused them quickly)
    other_status    answered with another status within the deadline
    late            no complete answer within the deadline (given up)
    refused, reset  the connection was refused, or reset or closed before a complete answer
    good_rps        good answers per second: open, all of them over --seconds (each request
                    started within them); closed, those that arrived within --seconds
    good_per_second good answers by the second (since the start) in which they arrived
    good_latency_ms percentiles of the good answers' latency, from the request's start; good_max_ms
    arrival_rps     requests started per second, first to last
    lateness_ms     how long after its due time each request started (open): the generator's
                    own delay, percentiles and max
    cpu_percent     this program's CPU time (user and system) over its run, in % of one core
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import sys
from urllib.parse import urlsplit

from connections import response_status

PERCENTILES = (50, 90, 99, 99.9)
# How far ahead of the first due time the schedule is laid, so that the first arrivals are not
# already late when the loop starts.
LEAD_SECONDS = 0.05


class Response(asyncio.Protocol):
    """Sends the request and reads one response on a connection; `status` resolves to its status
    code ("200") once the whole body is in, or to None if the connection ends first."""

    def __init__(self, request: bytes, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.status: asyncio.Future[str | None] = loop.create_future()
        self.received = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # a few dozen bytes: they fit in an empty send buffer

    def data_received(self, data: bytes) -> None:
        # A malformed answer raises here; asyncio then closes the connection, which ends it.
        self.received += data
        if not self.status.done() and (status := response_status(self.received)) is not None:
            self.status.set_result(status)

    def eof_received(self) -> None:
        self._end()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    def _end(self) -> None:
        # Also after the request was given up (the future is cancelled then) or answered.
        if not self.status.done():
            self.status.set_result(None)


class Clients:
    def __init__(self, args: argparse.Namespace) -> None:
        address = urlsplit(args.url)
        self.host, self.port = address.hostname, address.port or 80
        self.request_bytes = (
            f"GET {address.path or '/'} HTTP/1.1\r\nHost: {address.netloc}\r\nConnection: close\r\n\r\n"
        ).encode()
        self.args = args
        self.loop = asyncio.get_running_loop()
        self.counts = dict.fromkeys(("good", "shed", "other_status", "late", "refused", "reset"), 0)
        self.good_latencies: list[float] = []
        self.good_at: list[float] = []  # when each good answer arrived
        self.starts: list[float] = []
        self.lateness: list[float] = []
        self.began = 0.0

    async def request(self, due: float | None = None) -> None:
        started = self.loop.time()
        self.starts.append(started)
        if due is not None:
            self.lateness.append(started - due)
        transport = None
        try:
            # The deadline covers the connect too: a SYN the server's full accept queue dropped is
            # sent again only after 1 s, which a user with a 1 s deadline never sees answered.
            async with asyncio.timeout_at(started + self.args.deadline):
                transport, response = await self.loop.create_connection(
                    lambda: Response(self.request_bytes, self.loop), self.host, self.port
                )
                status = await response.status
        except TimeoutError:
            self.counts["late"] += 1
        except ConnectionRefusedError:
            self.counts["refused"] += 1
        except OSError:  # reset while connecting
            self.counts["reset"] += 1
        else:
            answered = self.loop.time()
            if status is None:  # reset, or closed before a complete answer
                self.counts["reset"] += 1
            elif status == "200":
                self.counts["good"] += 1
                self.good_latencies.append(answered - started)
                self.good_at.append(answered)
            else:
                self.counts["shed" if status == "503" else "other_status"] += 1
        finally:
            if transport is not None:
                transport.abort()  # given up or answered: nothing more is read or written on it

    async def closed(self) -> None:
        """--concurrency clients, each starting a request when its last one is over, until
        --seconds have passed."""
        end = self.began + self.args.seconds

        async def client() -> None:
            while self.loop.time() < end:
                await self.request()

        await asyncio.gather(*(client() for _ in range(self.args.concurrency)))

    async def open(self) -> None:
        """Starts request i at began + i / --rate, whatever the earlier ones are doing."""
        count = round(self.args.rate * self.args.seconds)
        in_flight = set()
        for number in range(count):
            due = self.began + number / self.args.rate
            if (wait := due - self.loop.time()) > 0:
                await asyncio.sleep(wait)
            task = self.loop.create_task(self.request(due))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        # Each request ends by its own deadline; waiting for them is bounded by it.
        await asyncio.gather(*in_flight)

    async def run(self) -> dict:
        cpu_before = _cpu_seconds()
        self.began = self.loop.time() + LEAD_SECONDS
        await asyncio.sleep(LEAD_SECONDS)
        await (self.open() if self.args.mode == "open" else self.closed())
        wall = self.loop.time() - self.began
        cpu = _cpu_seconds() - cpu_before
        per_second = [0] * math.ceil(self.args.seconds + self.args.deadline)
        for answered in self.good_at:
            per_second[min(int(answered - self.began), len(per_second) - 1)] += 1
        window = (self.starts[-1] - self.starts[0]) if len(self.starts) > 1 else 0.0
        if self.args.mode == "open":
            good = self.counts["good"]
        else:  # the answers to the last requests, after --seconds, would add to the rate
            good = sum(answered < self.began + self.args.seconds for answered in self.good_at)
        return {
            "mode": self.args.mode,
            "seconds": self.args.seconds,
            "deadline_s": self.args.deadline,
            "rate": self.args.rate,
            "concurrency": self.args.concurrency,
            "sent": len(self.starts),
            **self.counts,
            "good_rps": good / self.args.seconds,
            "good_per_second": per_second,
            "good_latency_ms": _percentiles(self.good_latencies),
            "good_max_ms": max(self.good_latencies) * 1000 if self.good_latencies else None,
            "good_mean_ms": sum(self.good_latencies) / len(self.good_latencies) * 1000 if self.good_latencies else None,
            "arrival_rps": (len(self.starts) - 1) / window if window else None,
            "lateness_ms": dict(_percentiles(self.lateness), max=max(self.lateness) * 1000) if self.lateness else {},
            "cpu_percent": 100 * cpu / wall,
            "wall_s": wall,
        }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _percentiles(seconds: list[float]) -> dict[str, float]:
    """{"50": ms, ...}: the nearest-rank percentiles of seconds, in milliseconds."""
    if not seconds:
        return {}
    ordered = sorted(seconds)
    return {f"{p:g}": ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000 for p in PERCENTILES}


async def _main(args: argparse.Namespace) -> dict:
    return await Clients(args).run()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/deadline_clients.py", description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("closed", "open"))
    parser.add_argument("url")
    parser.add_argument("--seconds", type=float, required=True, help="how long requests are started")
    parser.add_argument("--deadline", type=float, default=1.0, help="seconds after which a request is given up")
    parser.add_argument("--rate", type=float, help="open: requests started per second")
    parser.add_argument("--concurrency", type=int, default=16, help="closed: clients at once")
    args = parser.parse_args(argv)
    if args.mode == "open" and not args.rate:
        parser.error("open needs --rate")
    # Up to --rate x --deadline connections are open at once.
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # The clients share the machine's cores with the server. At the normal priority they wait for
    # the CPU behind the server's processes and threads, and start requests hundreds of ms late
    # (measured beside granian's and gthread's threads): the server would set the pace of the
    # arrivals. At a real-time priority each request starts at its due time, as it would from
    # clients on machines of their own; the CPU they use is the same, and shown.
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except PermissionError:
        print("deadline_clients.py: no real-time priority (needs root); requests may start late", file=sys.stderr)
    print("DEADLINE-CLIENTS-JSON " + json.dumps(asyncio.run(_main(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
