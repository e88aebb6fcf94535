"""Load tools (ab, wrk, h2load, bench/deadline-clients): their command lines and how to read their output,
plus the kernel's TCP counters read around each run.

Every tool's output is reduced to the same dict, a "measurement":
    requests       completed requests
    rps            completed requests per second of the run
    duration_s     length of the run
    failed         requests that got no complete response (the tool's own count, detail below)
    failed_detail  the tool's breakdown of `failed`
    non2xx         responses with a status the tool counts as an error
    keepalive      requests the tool sent on a reused connection (ab -k only, else None)
    latency_ms     {percentile: milliseconds}, percentile as a string ("50", "99.9")
    max_ms, mean_ms
    connect_max_ms the slowest TCP connect (ab only: shows SYN retransmits, 1 s / 3 s / 7 s steps)
    gave_up        None, or why the tool stopped before the end of its load (then the requests it
                   never got an answer for count as failed, and latencies are unknown)
    figures        (deadline-clients and mixed_clients.py only) the tool's own figures, which the
                   run moves into its "extra" for the scenario's Columns
    good_per_second (deadline-clients only) good answers in each second of the run (O1's chart)
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

HERE = Path(__file__).resolve().parent
# O1's load generator, a Rust program of its own (its own cargo workspace, not the project's):
# bench/run.py builds it with cargo before any scenario that uses it.
DEADLINE_CLIENTS_MANIFEST = HERE / "deadline-clients" / "Cargo.toml"
DEADLINE_CLIENTS = HERE / "deadline-clients" / "target" / "release" / "deadline-clients"


class ParseError(Exception):
    """The tool's output holds no result; str(error) quotes the end of it."""


@dataclass(frozen=True)
class Ab:
    """ApacheBench: HTTP/1.0, a fixed number of requests. The seed measurements used it.

    Quirks: ab counts a response whose length differs from the first one as a failed request
    ("Length"), which is how closed keep-alive connections show up in S4; and it aborts on the
    first socket error unless given -r, so overload scenarios need ignore_errors."""

    concurrency: int
    requests: int
    keepalive: bool = False
    ignore_errors: bool = False

    tool = "ab"

    def argv(self, url: str, workdir: Path) -> list[str]:
        flags = ["-k"] if self.keepalive else []
        flags += ["-r"] if self.ignore_errors else []
        return [
            "ab",
            *flags,
            "-c",
            str(self.concurrency),
            "-n",
            str(self.requests),
            "-e",
            str(workdir / "percentiles.csv"),
            url,
        ]

    def describe(self) -> str:
        flags = " -k" if self.keepalive else ""
        flags += " -r" if self.ignore_errors else ""
        return f"ab{flags} -c {self.concurrency} -n {self.requests} -e percentiles.csv http://127.0.0.1:PORT/"

    def shortened(self) -> Ab:
        return replace(self, requests=max(self.concurrency, min(self.requests, 2000)))

    def default_time_limit(self) -> float:
        return 120.0

    def parse(self, output: str, workdir: Path, seconds: float) -> dict:
        gave_up = re.search(r"^(.*)\nTotal of (\d+) requests completed", output, re.MULTILINE)
        if gave_up and "Complete requests:" not in output:
            # Even with -r, ab stops when no socket makes progress for its -s timeout (30 s) and
            # then prints only this count: the server stalled every connection ab had open.
            completed = int(gave_up.group(2))
            return {
                "requests": completed,
                "rps": completed / seconds,
                "duration_s": seconds,
                "failed": self.requests - completed,
                "failed_detail": {"unanswered": self.requests - completed},
                "non2xx": None,
                "keepalive": None,
                "latency_ms": {},
                "max_ms": None,
                "mean_ms": None,
                "connect_max_ms": None,
                "gave_up": f"ab gave up after {completed} requests: {gave_up.group(1).strip()}",
            }

        def number(label: str, default: float | None = None) -> float:
            found = re.search(rf"^{re.escape(label)}:\s+([\d.]+)", output, re.MULTILINE)
            if found:
                return float(found.group(1))
            if default is None:
                raise ParseError(f"no '{label}' in ab's output:\n{_tail(output)}")
            return default

        detail = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: (\d+), Exceptions: (\d+)\)", output)
        totals = re.search(r"^Total:\s+([\d.]+)\s+([\d.]+)\s+\[?[\d.]+\]?\s+([\d.]+)\s+([\d.]+)", output, re.MULTILINE)
        connect = re.search(r"^Connect:\s+(?:[\d.]+\s+){4}([\d.]+)", output, re.MULTILINE)
        return {
            "requests": int(number("Complete requests")),
            "rps": number("Requests per second"),
            "duration_s": number("Time taken for tests"),
            "failed": int(number("Failed requests")),
            "failed_detail": dict(zip(("connect", "receive", "length", "exceptions"), map(int, detail.groups())))
            if detail
            else {},
            "non2xx": int(number("Non-2xx responses", 0)),
            "keepalive": int(number("Keep-Alive requests", 0)) if self.keepalive else None,
            "latency_ms": _ab_percentiles(workdir / "percentiles.csv"),
            "max_ms": float(totals.group(4)) if totals else None,
            "mean_ms": float(totals.group(2)) if totals else None,
            "connect_max_ms": float(connect.group(1)) if connect else None,
            "gave_up": None,
        }


def _ab_percentiles(path: Path) -> dict[str, float]:
    """ab -e writes "percent served,time in ms" for 0..100; 100 is the longest request."""
    if not path.exists():
        return {}
    points = {}
    for line in path.read_text().splitlines()[1:]:
        percent, milliseconds = line.split(",")
        if 0 < float(percent) < 100:
            points[f"{float(percent):g}"] = float(milliseconds)
    return points


@dataclass(frozen=True)
class Wrk:
    """wrk: HTTP/1.1 keep-alive, a fixed duration, latency from wrk's own histogram (via
    wrk_report.lua, which prints it as JSON). close=True sends "Connection: close" so that every
    request opens a new connection."""

    threads: int
    connections: int
    seconds: int
    close: bool = False

    tool = "wrk"
    # wrk's default is 2 s, after which a slow response counts as a timeout and its latency is
    # lost; 30 s matches ab's default, so both tools see the same stalls.
    timeout = "30s"

    def argv(self, url: str, workdir: Path) -> list[str]:
        header = ["-H", "Connection: close"] if self.close else []
        return [
            "wrk",
            f"-t{self.threads}",
            f"-c{self.connections}",
            f"-d{self.seconds}s",
            f"--timeout={self.timeout}",
            *header,
            "-s",
            str(HERE / "wrk_report.lua"),
            url,
        ]

    def describe(self) -> str:
        header = " -H 'Connection: close'" if self.close else ""
        return (
            f"wrk -t{self.threads} -c{self.connections} -d{self.seconds}s --timeout={self.timeout}"
            f"{header} -s wrk_report.lua http://127.0.0.1:PORT/"
        )

    def shortened(self) -> Wrk:
        return replace(self, seconds=min(self.seconds, 3))

    def default_time_limit(self) -> float:
        return self.seconds + 40.0

    def parse(self, output: str, workdir: Path, seconds: float) -> dict:
        found = re.search(r"^BENCH-JSON (.*)$", output, re.MULTILINE)
        if not found:
            raise ParseError(f"no report from wrk_report.lua in wrk's output:\n{_tail(output)}")
        report = json.loads(found.group(1))
        errors = report["errors"]
        latency = report["latency_us"]
        duration = report["duration_us"] / 1e6
        answered = report["requests"] > 0  # with no response, wrk's histogram holds only zeros
        return {
            "requests": report["requests"],
            "rps": report["requests"] / duration,
            "duration_s": duration,
            "failed": errors["connect"] + errors["read"] + errors["write"] + errors["timeout"],
            "failed_detail": {k: errors[k] for k in ("connect", "read", "write", "timeout")},
            # wrk counts a status of 400 or more as an error.
            "non2xx": errors["status"],
            "keepalive": None,
            "latency_ms": {p: us / 1000 for p, us in latency["percentiles"].items()} if answered else {},
            "max_ms": latency["max"] / 1000 if answered else None,
            "mean_ms": latency["mean"] / 1000 if answered else None,
            "connect_max_ms": None,
            "gave_up": None,
        }


@dataclass(frozen=True)
class H2Load:
    """h2load (nghttp2's, Debian's nghttp2-client): HTTP/2 with prior knowledge on a plain
    listener, `clients` connections of `streams` concurrent requests each, for `seconds` (-D).
    It reports the mean and max latency, no percentiles. A server that does not take the preface
    makes h2load negotiate nothing: the run is an error, not a slow HTTP/1.1 figure."""

    clients: int
    streams: int
    seconds: int
    threads: int = 1

    tool = "h2load"

    def argv(self, url: str, workdir: Path) -> list[str]:
        return [
            "h2load",
            "-t",
            str(self.threads),
            "-c",
            str(self.clients),
            "-m",
            str(self.streams),
            "-D",
            str(self.seconds),
            url,
        ]

    def describe(self) -> str:
        return f"h2load -t {self.threads} -c {self.clients} -m {self.streams} -D {self.seconds} http://127.0.0.1:PORT/"

    def shortened(self) -> H2Load:
        return replace(self, seconds=min(self.seconds, 3))

    def default_time_limit(self) -> float:
        return self.seconds + 40.0

    def parse(self, output: str, workdir: Path, seconds: float) -> dict:
        protocol = re.search(r"^Application protocol: (\S+)", output, re.MULTILINE)
        if not protocol or protocol.group(1) not in ("h2c", "h2"):
            raise ParseError(f"h2load did not speak HTTP/2 with the server:\n{_tail(output)}")
        finished = re.search(r"^finished in ([\d.]+)s, ([\d.]+) req/s", output, re.MULTILINE)
        requests = re.search(
            r"^requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, "
            r"(\d+) timeout",
            output,
            re.MULTILINE,
        )
        statuses = re.search(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", output, re.MULTILINE)
        latency = re.search(r"^time for request:\s+(\S+)\s+(\S+)\s+(\S+)", output, re.MULTILINE)
        if not (finished and requests and statuses):
            raise ParseError(f"no result in h2load's output:\n{_tail(output)}")
        _done, succeeded, failed, errored, timeout = map(int, requests.groups())
        return {
            "requests": succeeded,
            "rps": float(finished.group(2)),
            "duration_s": float(finished.group(1)),
            # h2load's failed counts the errored and timed-out requests too.
            "failed": failed,
            "failed_detail": {"errored": errored, "timeout": timeout},
            "non2xx": sum(map(int, statuses.groups()[1:])),
            "keepalive": None,
            "latency_ms": {},
            "max_ms": _h2load_ms(latency.group(2)) if latency else None,
            "mean_ms": _h2load_ms(latency.group(3)) if latency else None,
            "connect_max_ms": None,
            "gave_up": None,
        }


def _h2load_ms(value: str) -> float:
    """h2load's durations ("110us", "30.89ms", "1.02s") in milliseconds."""
    for unit, factor in (("us", 0.001), ("ms", 1.0), ("s", 1000.0)):
        if value.endswith(unit):
            return float(value[: -len(unit)]) * factor
    raise ParseError(f"an h2load duration without a known unit: {value!r}")


@dataclass(frozen=True)
class DeadlineClients:
    """bench/deadline-clients: each request on a new connection and given up after `deadline` s,
    requests starting for `seconds`; ClosedLoop and OpenLoop say when each one starts."""

    seconds: float
    deadline: float

    tool = "deadline-clients"
    mode: ClassVar[str]

    def pace(self) -> list[str]:
        """The flag that sets when requests start."""
        raise NotImplementedError

    def arguments(self, url: str) -> list[str]:
        return [self.mode, "--seconds", f"{self.seconds:g}", "--deadline", f"{self.deadline:g}", *self.pace(), url]

    def argv(self, url: str, workdir: Path) -> list[str]:
        return [str(DEADLINE_CLIENTS), *self.arguments(url)]

    def describe(self) -> str:
        return " ".join([self.tool, *self.arguments("http://127.0.0.1:PORT/")])

    def default_time_limit(self) -> float:
        return self.seconds + self.deadline + 10.0

    def parse(self, output: str, workdir: Path, seconds: float) -> dict:
        return _deadline_clients_measurement(output)


@dataclass(frozen=True)
class ClosedLoop(DeadlineClients):
    """`concurrency` clients, each starting its next request as soon as its last one is over: its
    req/s is the server's capacity for this client (O1)."""

    concurrency: int = 16

    mode = "closed"

    def pace(self) -> list[str]:
        return ["--concurrency", str(self.concurrency)]

    def shortened(self) -> ClosedLoop:
        return replace(self, seconds=min(self.seconds, 1))


@dataclass(frozen=True)
class OpenLoop(DeadlineClients):
    """Requests arriving at `rate` per second, each started at its due time whatever the earlier
    ones are doing. O1 sets the rate per round (at_rate): `times_capacity` x the best capacity
    measured just before (O1-WSGI: one rate for every server), or x each server's own, measured
    just before its own run (own_capacity, O1-ASGI: where the capacities differ twofold, the best
    one's would overload the slowest several times over; and on a machine shared with other work,
    a capacity measured minutes earlier may be another machine's)."""

    times_capacity: float = 1.0
    own_capacity: bool = False
    rate: float | None = None

    mode = "open"

    def pace(self) -> list[str]:
        return ["--rate", "RATE" if self.rate is None else f"{self.rate:g}"]

    def describe(self) -> str:
        whose = (
            "the server's own capacity, measured just before" if self.own_capacity else "the best capacity of the round"
        )
        unset = f" (RATE: {self.times_capacity:g} x {whose})" if self.rate is None else ""
        return super().describe() + unset

    def at_rate(self, rate: float) -> OpenLoop:
        return replace(self, rate=round(rate))

    def shortened(self) -> OpenLoop:
        return replace(self, seconds=min(self.seconds, 3))


@dataclass(frozen=True)
class MixedClients:
    """bench/mixed_clients.py (HOL): `slow_clients` keep-alive clients asking for `slow_path` back
    to back, beside requests for `quick_path` arriving at `quick_rate` per second for `seconds`, on
    a pool of keep-alive connections (`quick_connections` opened beforehand, more when none is
    idle). The measurement is the quick requests' (each one's latency counted from its due time);
    the slow ones' are in its figures."""

    slow_clients: int
    quick_rate: float
    quick_connections: int
    seconds: float
    slow_path: str
    quick_path: str
    timeout: float = 10.0  # per request: one not answered by then counts as failed

    tool = "mixed_clients.py"

    def arguments(self, url: str) -> list[str]:
        return [
            "--slow-clients",
            str(self.slow_clients),
            "--quick-rate",
            f"{self.quick_rate:g}",
            "--quick-connections",
            str(self.quick_connections),
            "--seconds",
            f"{self.seconds:g}",
            "--slow-path",
            self.slow_path,
            "--quick-path",
            self.quick_path,
            "--timeout",
            f"{self.timeout:g}",
            url,
        ]

    def argv(self, url: str, workdir: Path) -> list[str]:
        # The harness's own Python (bench/.peers'): the client needs nothing else.
        return [sys.executable, str(HERE / "mixed_clients.py"), *self.arguments(url)]

    def describe(self) -> str:
        return " ".join(["python3 bench/mixed_clients.py", *self.arguments("http://127.0.0.1:PORT/")])

    def shortened(self) -> MixedClients:
        return replace(self, seconds=min(self.seconds, 3))

    def default_time_limit(self) -> float:
        # The client stops by itself after seconds, the last slow requests' timeout, and its start.
        return self.seconds + self.timeout + 10.0

    def parse(self, output: str, workdir: Path, seconds: float) -> dict:
        found = re.search(r"^MIXED-CLIENTS-JSON (.*)$", output, re.MULTILINE)
        if not found:
            raise ParseError(f"no report in mixed_clients.py's output:\n{_tail(output)}")
        report = json.loads(found.group(1))
        quick, slow = report["quick"], report["slow"]
        return {
            "requests": quick["answered"],
            "rps": quick["answered"] / report["seconds"],
            "duration_s": report["seconds"],
            "failed": quick["failed"],
            "failed_detail": quick["failed_detail"],
            "non2xx": quick["non2xx"],
            "keepalive": None,
            "latency_ms": quick["latency_ms"],
            "max_ms": quick["max_ms"],
            "mean_ms": quick["mean_ms"],
            "connect_max_ms": None,
            "gave_up": None,
            "figures": {
                "quick_p99_ms": quick["latency_ms"].get("99"),
                "quick_over_1s": quick["over_1s"],
                "quick_connections": report["quick_connections"],
                "slow_answered": slow["answered"],
                "slow_failed": slow["failed"],
                "slow_median_ms": slow["latency_ms"].get("50"),
                "slow_max_ms": slow["max_ms"],
                "retried": quick["retried"] + slow["retried"],
            },
        }


@dataclass(frozen=True)
class StreamClients:
    """bench/ll_clients.py (issue 47's long-lived streams): `clients` SSE streams, WebSockets or
    token streams against bench/ll_app.py, split over `processes` client processes, started over
    `ramp` seconds, with a paced prober asking `GET /` beside them. The measurement's latencies
    are the scenario's main figure (first event, echo or first chunk); the rest is in its figures.
    The harness reads the server's memory when the clients say every stream is open (runner.py)."""

    mode: str  # "sse", "ws" or "tokens"
    clients: int
    processes: int = 2
    ramp: float = 0.0
    events: int = 15  # sse: events per stream, one every `every` s
    every: float = 1.0
    tokens: int = 40  # tokens: chunks per stream, `gap` s apart
    gap: float = 0.025
    messages: int = 5  # ws: messages per client, one every `interval` s
    interval: float = 3.0
    probe_every: float = 0.05
    probe_timeout: float = 3.0
    slack: float = 10.0  # a client gives up this long past the end its load should have

    tool = "ll_clients.py"

    def arguments(self, url: str) -> list[str]:
        port = url.rsplit(":", 1)[1].strip("/")
        shape = {
            "sse": ["--events", str(self.events), "--every", f"{self.every:g}"],
            "ws": ["--messages", str(self.messages), "--interval", f"{self.interval:g}"],
            "tokens": ["--tokens", str(self.tokens), "--gap", f"{self.gap:g}"],
        }[self.mode]
        return [
            self.mode,
            "--port",
            port,
            "--clients",
            str(self.clients),
            "--processes",
            str(self.processes),
            "--ramp",
            f"{self.ramp:g}",
            *shape,
            "--probe-every",
            f"{self.probe_every:g}",
            "--probe-timeout",
            f"{self.probe_timeout:g}",
            "--slack",
            f"{self.slack:g}",
            "--limit",
            f"{self.default_time_limit() - 5:g}",
        ]

    def argv(self, url: str, workdir: Path) -> list[str]:
        return [sys.executable, str(HERE / "ll_clients.py"), *self.arguments(url)]

    def describe(self) -> str:
        return " ".join(["python3 bench/ll_clients.py", *self.arguments("http://127.0.0.1:PORT/")])

    def load_seconds(self) -> float:
        """How long the load lasts when the server keeps up: the ramp and one client's load."""
        per_client = {
            "sse": (self.events - 1) * self.every,
            "tokens": (self.tokens - 1) * self.gap,
            "ws": self.messages * self.interval,
        }[self.mode]
        return self.ramp + per_client

    def shortened(self) -> StreamClients:
        # --quick: a tenth of the clients (at least 100), a tenth of the events (at least 3), 2
        # messages 1 s apart.
        return replace(
            self,
            clients=max(100, self.clients // 10),
            ramp=min(self.ramp, 0.5),
            events=max(3, self.events // 10),
            messages=min(self.messages, 2),
            interval=min(self.interval, 1.0),
            tokens=min(self.tokens, 40),
            slack=min(self.slack, 5.0),
        )

    def default_time_limit(self) -> float:
        # The client's start, its load, its slack, the last echo's wait and the close, and the
        # report; it stops itself 5 s before this.
        return float(math.ceil(self.load_seconds() + self.slack + 25.0))

    def parse(self, output: str, workdir: Path, seconds: float) -> dict:
        found = re.search(r"^LL-CLIENTS-JSON (.*)$", output, re.MULTILINE)
        if not found:
            raise ParseError(f"no report in ll_clients.py's output:\n{_tail(output)}")
        return stream_measurement(json.loads(found.group(1)))


def stream_measurement(report: dict) -> dict:
    """The common measurement from ll_clients.py's report: requests are the streams (or
    WebSockets) that ran to their end without an error, failed the clients that got an error,
    latencies the scenario's main figure over every client (None where it falls among the clients
    that never got one); figures the columns of the LL scenarios."""
    mode = report["mode"]
    errors = report["errors"]
    failed = sum(errors.values())
    probe = report["probe"]
    main = report["echo"] if mode == "ws" else report["first"]
    figures = {
        "errors": failed + (report.get("late_first") or report.get("late_accepts") or 0) + report["missing"],
        "refused": errors.get("refused", 0),
        "reset": errors.get("reset", 0) + sum(v for k, v in errors.items() if k.startswith("connect: ")),
        "no_answer": errors.get("no answer in time", 0) + errors.get("connect timeout", 0),
        "missing": report["missing"],
        "probe_p99_ms": probe["latency_ms"]["99"],
        "probe_max_ms": probe["latency_ms"]["max"],
        "probe_sent": probe["sent"],
        "probe_failed": sum(probe["failed"].values()),
        "client_cpu_pct": report["client_cpu_pct"],
        "client_busiest_pct": report["client_busiest_pct"],
        "open_at_memory": report["opened"]["open"],
    }
    if mode == "ws":
        figures.update(
            accept_p99_ms=report["accept"]["99"],
            accept_max_ms=report["accept"]["max"],
            late_first=report["late_accepts"],
            accepted_in_time=report["clients"] - report["late_accepts"],
            not_101=report["not_101"],
            echo_p50_ms=report["echo"]["50"],
            echo_p99_ms=report["echo"]["99"],
            echoes=report["echoes"],
            wrong=report["wrong"],
            cut=errors.get("closed by the server", 0),
        )
    else:
        figures.update(
            first_p50_ms=report["first"]["50"],
            first_p99_ms=report["first"]["99"],
            first_max_ms=report["first"]["max"],
            late_first=report["late_first"],
            not_200=sum(count for error, count in errors.items() if error.startswith("status ")),
            cut=errors.get("cut", 0) + errors.get("no end in time", 0),
            complete=report["complete"],
            lateness_p99_ms=report["lateness"]["99"],
            batch_s=report["batch_s"],
        )
    latencies = {p: main[p] for p in ("50", "90", "99", "99.9") if main.get(p) is not None}
    return {
        "requests": report["echoes"] if mode == "ws" else report["complete"],
        "rps": None,
        "duration_s": report["seconds"],
        "failed": failed,
        "failed_detail": errors,
        # The statuses other than 200 (a stream) or 101 (a WebSocket), e.g. "status 503".
        "non2xx": sum(count for error, count in errors.items() if error.startswith("status ")),
        "keepalive": None,
        "latency_ms": latencies,
        "max_ms": main.get("max"),
        "mean_ms": None,
        "connect_max_ms": None,
        "gave_up": None,
        "figures": figures,
        "report": report,
    }


@dataclass(frozen=True)
class BodyLoad:
    """The BODY scenarios (issue 49): curl processes moving big bodies, run by bench/body.py from the
    harness itself: `clients` uploads of the body file to POST /hash (its Content-Length, or chunked)
    each answer checked against the file's sha256, or `clients` downloads of GET /file or
    /generated, each checked for its length; where `slow` is set, one more reader at
    `--limit-rate slow_rate` beside the fast ones. The body's size (MiB) is the invocation's
    (run.py --body-mib: 512, --quick 64). After the timed pass, a pass of one transfer with strace
    attached to every process of the server counts its system calls, apart from the timing."""

    kind: str  # "upload", "download" or "generated"
    clients: int
    chunked: bool = False  # upload: Transfer-Encoding: chunked instead of a Content-Length
    slow: bool = False  # one reader at slow_rate beside the fast ones
    slow_rate: str = "5M"
    # generated: how long the slow reader reads (download: until the fast ones are done).
    slow_seconds: float = 10.0
    mib: int = 512
    # generated: the bound on the server's memory growth and temp-file disk use (MiB), run.py
    # --body-bound-mib; docs/LIMITS.md will state the real one.
    bound_mib: float = 8.0

    tool = "curl"

    @property
    def path(self) -> str:
        return {"upload": "/hash", "download": "/file", "generated": "/generated"}[self.kind]

    @property
    def size(self) -> int:
        return self.mib * 1024 * 1024

    def curl_argv(self, url: str, body_file: str, out: str, *, rate: str | None = None) -> list[str]:
        """One client's curl: -w's line is `status uploaded downloaded seconds`."""
        argv = ["curl", "-sS", "-o", out, "-w", "%{http_code} %{size_upload} %{size_download} %{time_total}\\n"]
        if rate:
            argv += ["--limit-rate", rate]
        if self.kind == "upload":
            # -T streams the file (--data-binary @file would read all of it into curl's memory first,
            # inside the timed seconds); -X POST; no Expect: 100-continue, which curl sends for a body
            # over 1 MiB and then waits up to 1 s for, which servers answer differently.
            argv += ["-X", "POST", "-T", body_file, "-H", "Expect:", "-H", "Content-Type: application/octet-stream"]
            if self.chunked:
                argv += ["-H", "Transfer-Encoding: chunked"]
        target = url.rstrip("/") + self.path
        return [*argv, target + (f"?bytes={self.size}" if self.kind == "generated" else "")]

    def describe(self) -> str:
        out = "ANSWER" if self.kind == "upload" else "/dev/null"
        one = shlex.join(self.curl_argv("http://127.0.0.1:PORT", f"body-{self.mib}MiB.bin", out))
        text = f"{self.clients} x `{one}`" if self.clients > 1 else f"`{one}`"
        if self.slow:
            bound = f"for {self.slow_seconds:g} s" if self.kind == "generated" else "until the fast ones are done"
            text += f", beside one reader at --limit-rate {self.slow_rate} -o - ({bound})"
        return text

    def shortened(self) -> BodyLoad:
        # --quick: the smaller body (run.py sets it), and the slow reader for 3 s.
        return replace(self, slow_seconds=min(self.slow_seconds, 3.0))

    def default_time_limit(self) -> float:
        # Each pass is bounded on its own (bench/body.py); this is what one run may take at most.
        return float(body_pass_limit(self) * 4 + 60)

    def parse(self, output: str, workdir: Path, seconds: float) -> dict:
        raise ParseError("bench/body.py runs the BODY loads itself")


def body_pass_limit(load: BodyLoad) -> float:
    """The seconds one pass of a BODY load may take: its bytes at 20 MB/s, at least 30 s."""
    return max(30.0, load.clients * load.size / 20e6)


Load = Ab | Wrk | H2Load | ClosedLoop | OpenLoop | MixedClients | StreamClients | BodyLoad


def _deadline_clients_measurement(output: str) -> dict:
    """The common measurement from deadline-clients' report: requests and latencies are the
    good answers' (200 within the deadline), rps their rate; failed counts the requests given up and
    the connections refused or reset, non2xx the answers with another status (503: shed). Its own
    figures (shed, late, errors, the generator's schedule and CPU) are in "figures", the good
    answers per second in "good_per_second"."""
    found = re.search(r"^DEADLINE-CLIENTS-JSON (.*)$", output, re.MULTILINE)
    if not found:
        raise ParseError(f"no report in deadline-clients' output:\n{_tail(output)}")
    report = json.loads(found.group(1))
    lateness = report["lateness_ms"]
    return {
        "requests": report["good"],
        "rps": report["good_rps"],
        "duration_s": report["wall_s"],
        "failed": report["late"] + report["refused"] + report["reset"],
        "failed_detail": {key: report[key] for key in ("late", "refused", "reset")},
        "non2xx": report["shed"] + report["other_status"],
        "keepalive": None,
        "latency_ms": report["good_latency_ms"],
        "max_ms": report["good_max_ms"],
        "mean_ms": report["good_mean_ms"],
        "connect_max_ms": None,
        "gave_up": None,
        "good_per_second": report["good_per_second"],
        "figures": {
            "rate_asked": report["rate"],
            "pct_good": 100 * report["good"] / report["sent"] if report["sent"] else None,
            "pct_answered": (
                100 * (report["good"] + report["shed"] + report["other_status"]) / report["sent"]
                if report["sent"]
                else None
            ),
            "shed": report["shed"],
            "late": report["late"],
            "errors": report["refused"] + report["reset"],
            "arrival_rps": report["arrival_rps"],
            "lateness_p99_ms": lateness.get("99"),
            "lateness_max_ms": lateness.get("max"),
            "generator_cpu_pct": report["cpu_percent"],
        },
    }


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])


# Kernel counters that show connections lost or delayed before any server code sees them.
# They are counted for the whole network namespace: other traffic on the machine adds to them.
KERNEL_COUNTERS = {
    "ListenOverflows": "TcpExt",  # a SYN or final ACK arrived while the accept queue was full
    "ListenDrops": "TcpExt",  # every SYN dropped by a listener, overflows included
    "TCPSynRetrans": "TcpExt",  # SYNs the clients had to send again
}


def kernel_counters() -> dict[str, int]:
    """Reads KERNEL_COUNTERS from /proc/net/netstat and /proc/net/snmp (pairs of lines: a header
    line of names and a line of values, both starting with the section's name)."""
    values: dict[tuple[str, str], int] = {}
    for path in ("/proc/net/netstat", "/proc/net/snmp"):
        lines = Path(path).read_text().splitlines()
        for names, numbers in zip(lines[::2], lines[1::2]):
            section, *keys = names.split()
            _, *counts = numbers.split()
            values.update({(section.rstrip(":"), key): int(count) for key, count in zip(keys, counts)})
    return {name: values.get((section, name), 0) for name, section in KERNEL_COUNTERS.items()}


# The database scenarios: how many of a load's connections the server has answered nothing on,
# read this far into the load (as a share of its duration). wrk times only the requests that are
# answered, so a server that serves a few connections at a time and leaves the others waiting in
# its accept queue or unread (scenario 4 of docs/SCENARIOS.md) shows a low latency and no error
# as long as the wait is shorter than wrk's --timeout; this count is where it shows.
UNANSWERED_AT = 0.8


def unanswered_connections(port: int) -> tuple[int, int] | None:
    """(connections established to port, how many of them the server has sent nothing on), from
    the kernel's view of the server's side of each (ss, of iproute2, which every Debian has:
    tcp_info's bytes_sent, printed only when not 0). None when ss is missing or fails."""
    try:
        listing = subprocess.run(
            ["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    # One socket per line, its tcp_info on the indented lines after it.
    sockets = re.split(r"\n(?=\S)", listing) if listing else []
    return len(sockets), sum(1 for socket in sockets if not re.search(r"\bbytes_sent:[1-9]", socket))


# S3: how many accept calls a server makes per connection, counted by strace around the whole
# server. --seccomp-bpf stops the traced processes only at the calls counted, so everything else
# they do runs at full speed: the timing that decides how many processes wake up for a connection
# (and so how many accept calls lose the race) stays what it is without strace. -f follows every
# process and thread the server starts, workers forked later included.
ACCEPT_SYSCALLS = ("accept", "accept4")


def strace_argv(summary: Path) -> list[str]:
    """The prefix that runs a server under strace, writing the call counts to summary when the
    last traced process exits."""
    return [
        "strace",
        "-f",
        "-c",
        "-q",
        "--seccomp-bpf",
        "-e",
        f"trace={','.join(ACCEPT_SYSCALLS)}",
        *_strace_counts_to(summary),
        "--",
    ]


def _strace_counts_to(summary: Path) -> list[str]:
    """strace's flags that write its table of call counts (strace_counts reads it) to summary."""
    return ["-U", "name,calls,errors", "-o", str(summary)]


# H1-hop: every system call of running processes, counted by strace attached to them (-p; with
# -f, every thread of each, and any thread or child started while attached). --seccomp-bpf is of
# no use here: it needs the tracee started by strace (it installs its filter before exec), and it
# only spares the calls not counted, where this counts them all. So every call of the traced
# processes stops for strace, and they run slower: the figures per request are the calls the
# code makes, not its speed (the plain load, without strace, gives that).
def strace_attach_argv(summary: Path, pids: tuple[int, ...]) -> list[str]:
    """strace attached to pids until SIGINT, which makes it detach and write the call counts to
    summary."""
    return [
        "strace",
        "-f",
        "-c",
        "-q",
        *_strace_counts_to(summary),
        *(flag for pid in pids for flag in ("-p", str(pid))),
    ]


def strace_counts(text: str) -> dict[str, tuple[int, int]]:
    """{syscall: (calls, failed calls)} from the table `strace -c -U name,calls,errors` writes."""
    counts = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) in (2, 3) and fields[1].isdigit() and fields[0] != "total":
            counts[fields[0]] = (int(fields[1]), int(fields[2]) if len(fields) == 3 else 0)
    return counts


# C1, M1: bench/connections.py prints its counts as "CONNECTIONS-JSON {...}" lines, one when it
# holds its connections ("holding") and one when it ends ("end").
def crowd_reports(output: str) -> dict[str, dict]:
    return {
        report["event"]: report
        for report in (
            json.loads(line.split(" ", 1)[1]) for line in output.splitlines() if line.startswith("CONNECTIONS-JSON ")
        )
    }


def crowd_measurement(holding: dict, seconds: float) -> dict:
    """M1's measurement, where the crowd is the whole load: each idle connection made one request.
    Connections that never got their answer count as failed."""
    unanswered = holding["count"] - holding["answered"]
    return {
        "requests": holding["answered"],
        "rps": None,
        "duration_s": seconds,
        "failed": unanswered,
        "failed_detail": {
            "not started": holding["count"] - holding["started"],
            "refused": holding["refused"],
            "pending": holding["pending"],
            "closed unanswered": (holding["started"] - holding["refused"] - holding["pending"] - holding["answered"]),
        },
        "non2xx": holding["non2xx"],
        "keepalive": None,
        "latency_ms": {},
        "max_ms": None,
        "mean_ms": None,
        "connect_max_ms": None,
        "gave_up": None,
    }
