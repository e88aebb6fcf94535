"""The scenarios: which app, how many workers, which load, which servers, and what maitred must show.

Adding a scenario is adding one Scenario to SCENARIOS. The ids follow issue 3 (S1-S5 from
shared/SCENARIOS.md, T1, L1, T2, C1, M1); T1-ab and T2-wrk complete the first comparison that
issue 2 asks for: hello world with and without keep-alive, with both wrk and ab.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from measure import Ab, Load, Wrk


@dataclass(frozen=True)
class Entry:
    """One server in a scenario's line-up; threads=None leaves the server's production default.
    Its label in the results comes from Server.label."""

    server: str
    threads: int | None = None


# A summary is a dict of medians over a server's runs (see report.summarize): rps, failed,
# non2xx, max_ms, latency_ms, and the kernel counters by name.
Summary = dict


@dataclass(frozen=True)
class Target:
    """A claim maitred's medians must satisfy, given the best of the peers' medians."""

    text: str
    holds: Callable[[Summary, list[Summary]], bool]


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    app: str
    workers: int
    load: Load
    lineup: tuple[Entry, ...]
    backlog: int | None = None  # None: each server's default
    time_limit: float | None = None  # None: the load tool's default bound
    targets: tuple[Target, ...] = ()
    note: str = ""

    def limit(self) -> float:
        return self.time_limit if self.time_limit is not None else self.load.default_time_limit()


# Equal worker processes; each server with its production threading. nginx runs no app: it
# answers with hello's body itself, the ceiling of what this machine serves over HTTP.
SAME_WORKERS = (Entry("maitred"), Entry("gunicorn-sync"), Entry("gunicorn-gthread"), Entry("uwsgi"),
                Entry("granian"), Entry("waitress"), Entry("meinheld"), Entry("bjoern"), Entry("nginx"))
# Equal application slots (processes x threads), with the threaded defaults beside them. waitress
# is one process: threads=1 gives it as many threads as the others have processes.
SAME_SLOTS = (Entry("maitred"), Entry("gunicorn-sync"), Entry("gunicorn-gthread", threads=1),
              Entry("gunicorn-gthread"), Entry("uwsgi"), Entry("granian", threads=1), Entry("granian"),
              Entry("waitress", threads=1), Entry("bjoern"))
# Apache httpd with mod_wsgi under its event and worker MPMs, 3 threads per process by default
# (S4: MaxRequestWorkers 6 = 2 workers x ThreadsPerChild 3).
S4_LINEUP_APACHE = (Entry("apache-event"), Entry("apache-worker"))


def _no_failures(summary: Summary, peers: list[Summary]) -> bool:
    return summary["failed"] == 0 and summary["non2xx"] == 0


def _no_overflows(summary: Summary, peers: list[Summary]) -> bool:
    return summary["ListenOverflows"] == 0


def _leads(summary: Summary, peers: list[Summary]) -> bool:
    return all(summary["rps"] >= peer["rps"] for peer in peers)


LEADS = Target("req/s >= every peer", _leads)
NO_FAILURES = Target("0 failed, 0 non-2xx", _no_failures)

# S1: 3 slots x 1 ms allow 3000 req/s; 1000 clients then wait 1000/rps seconds each round.
S1_TARGETS = (
    NO_FAILURES,
    Target("0 listen overflows", _no_overflows),
    Target("max latency <= 1.5 x (1000 / req/s) s",
           lambda summary, peers: summary["max_ms"] is not None
           and summary["max_ms"] <= 1.5 * 1000 / summary["rps"] * 1000),
    Target("req/s >= 2700 (90% of 3 slots x 1 ms)", lambda summary, peers: summary["rps"] >= 2700),
)

SCENARIOS: dict[str, Scenario] = {scenario.id: scenario for scenario in (
    Scenario(
        id="T1", title="hello world, keep-alive, wrk (throughput)",
        app="apps:hello", workers=2, load=Wrk(threads=2, connections=100, seconds=10),
        lineup=SAME_WORKERS, targets=(NO_FAILURES, LEADS),
    ),
    Scenario(
        id="T1-ab", title="hello world, keep-alive, ab",
        app="apps:hello", workers=2, load=Ab(concurrency=100, requests=50000, keepalive=True),
        lineup=SAME_WORKERS, targets=(NO_FAILURES, LEADS),
        note="gunicorn's sync worker does not keep connections alive: ab reconnects for it.",
    ),
    Scenario(
        id="T2", title="hello world, no keep-alive, ab",
        app="apps:hello", workers=2, load=Ab(concurrency=50, requests=50000),
        lineup=SAME_WORKERS, targets=(NO_FAILURES, LEADS),
    ),
    Scenario(
        id="T2-wrk", title="hello world, no keep-alive, wrk",
        app="apps:hello", workers=2, load=Wrk(threads=2, connections=50, seconds=10, close=True),
        lineup=SAME_WORKERS, targets=(NO_FAILURES, LEADS),
    ),
    Scenario(
        id="L1", title="hello world, keep-alive, one client (latency-bound)",
        app="apps:hello", workers=2, load=Wrk(threads=1, connections=1, seconds=10),
        lineup=SAME_WORKERS, targets=(NO_FAILURES, LEADS),
    ),
    Scenario(
        id="S1", title="the worker that waits for nothing: 1 ms app, 1000 clients, default backlog",
        app="apps:sleep_1ms", workers=3, load=Ab(concurrency=1000, requests=10000, ignore_errors=True),
        lineup=SAME_SLOTS, targets=S1_TARGETS,
        note="3 slots x 1 ms allow 3000 req/s; each of 1000 clients then waits about 0.33 s.",
    ),
    Scenario(
        id="S1-b10", title="the worker that waits for nothing: 1 ms app, 1000 clients, --backlog 10",
        app="apps:sleep_1ms", workers=3, load=Ab(concurrency=1000, requests=10000, ignore_errors=True),
        lineup=SAME_SLOTS, backlog=10, time_limit=60.0, targets=S1_TARGETS,
        note="A run still going after 60 s is stopped (ab then reports what completed), and ab gives "
             "up by itself when no connection moves for 30 s: either way the run is incomplete, "
             "the server stalled, and its latencies cover only the requests it finished.",
    ),
)}
