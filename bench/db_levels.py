"""DB-DJANGO, DB-FLASK, DB-FASTAPI: TechEmpower's database test types against one server, run as
TechEmpower's harness runs them.

One server serves every test type of a run, one after the other: for each, a warm-up at the
highest concurrency, then each concurrency in turn, every load a fixed duration of wrk, 2 s apart
(the harness's pause between its levels). Around each measured load the CPU time of the server's
process tree and of the database's (the postmaster and its backends) is read, from /proc, ended
processes included (procs.tree_cpu_seconds), and divided by the requests wrk completed; so are
the times the server's threads went to sleep (procs.tree_sleeps), each ended by a wake-up: the
figure that says how much of a server's CPU goes to waking up rather than to work. Beside each
load, 80% into it, the harness counts the load's connections the server has sent nothing on yet
(measure.unanswered_connections): wrk's own figures cannot show a connection left waiting.

A run's measurement is the sum over its measured loads (requests, and their rate over the loads'
time), with failures and non-2xx counted over every load, warm-ups included; each load's own
figures are in the run's "levels", which the report shows per test type, concurrency and server.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import procs
from measure import UNANSWERED_AT, Wrk, unanswered_connections

# TechEmpower's harness sleeps this long between two loads.
PAUSE_SECONDS = 2.0
# The N of /queries and /updates: the largest of TechEmpower's own levels (1, 5, 10, 15, 20).
QUERIES = 20


@dataclass(frozen=True)
class DbTests:
    """The test types (name, path), the concurrencies each is measured at, and the warm-up before
    each test type (wrk at the highest concurrency, not measured)."""

    tests: tuple[tuple[str, str], ...] = (
        ("db", "/db"),
        ("queries", f"/queries?queries={QUERIES}"),
        ("fortunes", "/fortunes"),
        ("updates", f"/updates?queries={QUERIES}"),
    )
    connections: tuple[int, ...] = (64, 256)
    warm_up_seconds: int = 5

    def shortened(self) -> DbTests:
        return replace(self, warm_up_seconds=1)

    def describe(self, load: Wrk) -> str:
        command = replace(load, connections=0).describe().replace("-c0", "-cC").replace("PORT/", "PORT/PATH")
        levels = ", ".join(str(connections) for connections in self.connections)
        paths = ", ".join(path for _name, path in self.tests)
        return (
            f"{command}; PATH each of {paths} in turn, C = {levels} after a warm-up of "
            f"{self.warm_up_seconds} s at {max(self.connections)}, every load {PAUSE_SECONDS:g} s after the last"
        )


def level_key(test: str, connections: int, warm_up: bool = False) -> str:
    """How a load is named in a run's levels and in the report: "fortunes c=64"."""
    return f"{test}{' warm-up' if warm_up else ''} c={connections}"


def run(
    tests: DbTests,
    load: Wrk,
    server: int,
    port: int,
    database_cpu: Callable[[], float],
    run_load: Callable[[Wrk, str, Path], tuple[dict, bool]],
    workdir: Path,
) -> tuple[dict, bool, dict[str, dict]]:
    """Runs every test type's warm-up and loads against the server (`server` its pid, `port`
    the port it listens on; run_load: wrk's measurement of a load against a path, into the
    directory given, and whether the time limit cut it short). Returns the run's
    measurement, whether any load was cut short, and each load's figures by level_key."""
    levels: dict[str, dict] = {}
    measured: list[dict] = []
    cut_short = False
    first = True
    for test, path in tests.tests:
        stages = [(max(tests.connections), True), *((connections, False) for connections in tests.connections)]
        for connections, warm_up in stages:
            if not first:
                time.sleep(PAUSE_SECONDS)
            first = False
            key = level_key(test, connections, warm_up)
            shaped = replace(load, connections=connections)
            if warm_up:
                shaped = replace(shaped, seconds=tests.warm_up_seconds)
            server_before, database_before = procs.tree_cpu_seconds(server), database_cpu()
            sleeps_before = procs.tree_sleeps(server)
            look = _LookLater(port, shaped.seconds * UNANSWERED_AT)
            measurement, cut = run_load(shaped, path, workdir / key.replace(" ", "-").replace("=", ""))
            connections_seen = look.result()
            server_cpu = procs.tree_cpu_seconds(server) - server_before
            database = database_cpu() - database_before
            sleeps = procs.tree_sleeps(server) - sleeps_before
            cut_short |= cut
            levels[key] = _figures(measurement, server_cpu, database, sleeps, connections_seen, cut)
            levels[key].update(test=test, connections=connections, warm_up=warm_up)
            if not warm_up:
                measured.append(levels[key])
            print(f"    {key:<22} {_brief(levels[key])}", file=sys.stderr)
    return _total(levels, measured), cut_short, levels


class _LookLater:
    """unanswered_connections(port), read once, `after` seconds from now, beside the load."""

    def __init__(self, port: int, after: float) -> None:
        self._seen: tuple[int, int] | None = None
        self._timer = threading.Timer(after, self._look, (port,))
        self._timer.daemon = True
        self._timer.start()

    def _look(self, port: int) -> None:
        self._seen = unanswered_connections(port)

    def result(self) -> tuple[int, int] | None:
        """What was seen; None when the load ended before the look (or ss was missing)."""
        self._timer.cancel()
        self._timer.join()
        return self._seen


def _figures(
    measurement: dict,
    server_cpu: float,
    database_cpu: float,
    sleeps: int,
    connections_seen: tuple[int, int] | None,
    cut_short: bool,
) -> dict:
    requests = measurement["requests"]
    return {
        "requests": requests,
        "duration_s": measurement["duration_s"],
        "rps": measurement["rps"],
        "p50_ms": measurement["latency_ms"].get("50"),
        "p99_ms": measurement["latency_ms"].get("99"),
        "max_ms": measurement["max_ms"],
        "non2xx": measurement["non2xx"],
        "socket_errors": measurement["failed"],
        "socket_detail": measurement["failed_detail"],
        "server_cpu_s": server_cpu,
        "database_cpu_s": database_cpu,
        "server_cpu_us": server_cpu * 1e6 / requests if requests else None,
        "database_cpu_us": database_cpu * 1e6 / requests if requests else None,
        "server_sleeps": sleeps / requests if requests else None,
        # 80% into the load: the connections established to the server, and those it had sent
        # nothing on.
        "connections": connections_seen[0] if connections_seen else None,
        "unanswered": connections_seen[1] if connections_seen else None,
        "cut_short": cut_short,
    }


def _total(levels: dict[str, dict], measured: list[dict]) -> dict:
    """The run's measurement: the measured loads' requests and rate; every load's failures."""
    requests = sum(level["requests"] for level in measured)
    seconds = sum(level["duration_s"] for level in measured)
    server_cpu = sum(level["server_cpu_s"] for level in measured)
    database_cpu = sum(level["database_cpu_s"] for level in measured)
    detail: dict[str, int] = {}
    for level in levels.values():
        for kind, count in level["socket_detail"].items():
            detail[kind] = detail.get(kind, 0) + count
    return {
        "requests": requests,
        "rps": requests / seconds if seconds else None,
        "duration_s": seconds,
        "failed": sum(level["socket_errors"] for level in levels.values()),
        "failed_detail": detail,
        "non2xx": sum(level["non2xx"] for level in levels.values()),
        "keepalive": None,
        "latency_ms": {},
        "max_ms": max((level["max_ms"] for level in measured if level["max_ms"] is not None), default=None),
        "mean_ms": None,
        "connect_max_ms": None,
        "gave_up": None,
        "figures": {
            "server_cpu_us": server_cpu * 1e6 / requests if requests else None,
            "database_cpu_us": database_cpu * 1e6 / requests if requests else None,
        },
    }


def _brief(level: dict) -> str:
    def shown(value: float | None, unit: str, digits: int = 1) -> str:
        return "-" if value is None else f"{value:.{digits}f}{unit}"

    return (
        f"{level['rps']:9.0f} req/s  non-2xx {level['non2xx']}  socket errors {level['socket_errors']}  "
        f"p99 {shown(level['p99_ms'], ' ms')}  server CPU {shown(level['server_cpu_us'], ' us')}/req  "
        f"database CPU {shown(level['database_cpu_us'], ' us')}/req  "
        f"server sleeps {shown(level['server_sleeps'], '', 2)}/req  "
        f"unanswered {shown(level['unanswered'], '', 0)} of {shown(level['connections'], '', 0)} connections"
    )
