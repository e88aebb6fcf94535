"""The scenarios: which app, how many workers, which load, which servers, and what maitred must show.

Adding a scenario is adding one Scenario to SCENARIOS. The ids are bench/README.md's (S1-S5 from
docs/SCENARIOS.md, T1, L1, T2, C1, M1, the lifecycle's R1 and U1, O1-WSGI, H1-hop, the cost
of the lobby-worker hop, IO1, IO1-mem and HOL, for threads per worker, A1, A1-c1 and O1-ASGI
for ASGI applications, H2-T1, H2-L1 and M1-H2 for HTTP/2, and BODY-* for big bodies up and down,
bench/body.py); where a scenario needs two measurements, each is a scenario of its own
(S1 and S1-b10, S2-c1000 and S2-c5000, S3 and S3-accept, S5-c5 and S5-c50, R1 and R1-broken,
A1 and A1-c1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import apps
import db_levels
import lifecycle
from db_levels import DbTests, level_key
from front import HAProxyFront, NginxFront
from lifecycle import Lifecycle, Reload, Upgrade
from measure import Ab, BodyLoad, ClosedLoop, H2Load, Load, MixedClients, OpenLoop, StreamClients, Wrk
from servers import SERVERS, Launch

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Entry:
    """One server in a scenario's line-up; threads=None leaves the server's production default,
    workers=None runs the scenario's worker count (Apache in S4 runs fewer processes of several
    threads each). Its label in the results comes from Server.label."""

    server: str
    threads: int | None = None
    workers: int | None = None
    # The server's own settings under test, named in its label: "maitred --queue-timeout 0.5"
    # (O1-WSGI), "uvicorn --limit-concurrency 40" (O1-ASGI).
    options: tuple[str, ...] = ()
    # The load's concurrency for this entry, named in its label: "maitred c=4" (H1-hop measures
    # maitred alone at several); None: the scenario's load as it is.
    clients: int | None = None

    def __post_init__(self) -> None:
        if self.options and not SERVERS[self.server].takes_options:
            raise ValueError(f"options given to {self.server}, whose command does not take them")


# A summary is a dict of medians over a server's runs (see report.summarize): rps, failed,
# non2xx, max_ms, latency_ms, and the kernel counters by name.
Summary = dict


@dataclass(frozen=True)
class Target:
    """A claim maitred's medians must satisfy, given the best of the peers' medians."""

    text: str
    holds: Callable[[Summary, list[Summary]], bool]


@dataclass(frozen=True)
class Column:
    """A figure a scenario adds to its table: a key of the summary (and of each run's "extra"),
    its header, and how to print it."""

    key: str
    header: str
    digits: int = 0  # decimals shown
    suffix: str = ""

    def format(self, value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value:,.{self.digits}f}{self.suffix}"


@dataclass(frozen=True)
class Crowd:
    """Connections held open by bench/connections.py while the run lasts: "slow" ones whose request
    head never ends (C1), or "idle" keep-alive ones after one request each (M1; "idle-h2", the
    same over HTTP/2, M1-H2)."""

    kind: str  # "slow", "idle" or "idle-h2"
    count: int
    interval: float = 5.0  # slow: seconds between the bytes of the endless head
    open_seconds: float = 15.0  # how long opening them may take before the run goes on regardless
    # M1: how long they have all been held before the server's memory is read, so that it is
    # the memory of idle connections, not of ones answered a moment ago.
    idle_seconds: float = 0.0

    def argv(self, python: str, port: int, seconds: float) -> list[str]:
        interval = ["--interval", f"{self.interval:g}"] if self.kind == "slow" else []
        return [
            python,
            str(HERE / "connections.py"),
            self.kind,
            "--port",
            str(port),
            "--count",
            str(self.count),
            *interval,
            "--open-seconds",
            f"{self.open_seconds:g}",
            "--seconds",
            f"{seconds:g}",
        ]

    def describe(self) -> str:
        argv = self.argv("python3", 0, 0)
        argv[1] = "bench/connections.py"
        return " ".join(argv[:-2]).replace("--port 0", "--port PORT")

    def shortened(self) -> Crowd:
        # C1's point is its 2,000 slow clients, which cost little to open; M1's 10,000 take longer.
        return replace(self, count=min(self.count, 2000), open_seconds=min(self.open_seconds, 5.0))


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    app: str
    workers: int
    load: Load | None  # None: the crowd is the whole load (M1)
    lineup: tuple[Entry, ...]
    backlog: int | None = None  # None: each server's default
    time_limit: float | None = None  # None: the load tool's default bound
    targets: tuple[Target, ...] = ()
    note: str = ""
    # S3's second half: the server runs under `strace -f -c` counting accept calls.
    trace_accepts: bool = False
    # S5, O1-HAPROXY: a proxy the load goes through, started for each run after the server is ready.
    front: NginxFront | HAProxyFront | None = None
    # O1-HAPROXY: the app counts the requests it runs (apps.cpu_3ms_counted), and the run compares
    # them with the proxy's log: how many of those the proxy gave up on were run all the same.
    count_runs: bool = False
    # C1, M1: connections held open while the load runs (C1) or as the load (M1).
    crowd: Crowd | None = None
    # C1: the figure the crowd's effect is measured against, the load without the crowd: taken
    # from the runs of scenario `alone_from` in the same invocation where it ran (same app,
    # workers and load: the same measurement), else measured on the same server instance first.
    alone_first: bool = False
    alone_from: str | None = None
    # The open-files limit the scenario needs (the load tool's and the server's own descriptors);
    # the results say so when the limit is lower.
    open_files: int = 0
    # The LL scenarios: where the open-files limit or the ephemeral port range (each client
    # connection takes a port of it) is below open_files, run nothing and say why, rather than
    # measure the limit.
    skip_without_room: bool = False
    # Figures beyond the load tool's, added to the table (keys of each run's "extra").
    columns: tuple[Column, ...] = ()
    # The figure the summary and the bar chart compare (None: req/s, higher is better).
    headline: Column | None = None
    headline_lower_is_better: bool = False
    # R1, U1: reloads or a binary upgrade while the load runs (bench/lifecycle.py).
    lifecycle: Lifecycle | None = None
    # O1: each round of runs first measures every server's capacity with this load, each on a
    # fresh server; the scenario's load (an OpenLoop) then arrives at its times_capacity x the
    # best of them, the same rate for every server of the round.
    capacity: ClosedLoop | None = None
    # H1-hop: the load runs twice on each server, plain with each side's voluntary context switches
    # read around it, then with strace attached to each side counting its system calls
    # (bench/hop.py).
    count_hop: bool = False
    # IO1-mem: the server's memory (every process of it) is read once the load is over, with every
    # thread it starts for the load started, before it is stopped.
    memory_after_load: bool = False
    # The app's interface (A1, O1-ASGI: ASGI 3, bench/asgi_apps.py); every server of the line-up
    # must serve it.
    interface: Literal["wsgi", "asgi"] = "wsgi"
    # DB-DJANGO, DB-FLASK, DB-FASTAPI: TechEmpower's test types against one server per run, each at
    # several concurrencies of the load (a Wrk), on the harness's PostgreSQL (bench/db_levels.py).
    db_tests: DbTests | None = None
    # H2-T1, H2-L1: the HTTP/1.1 scenario of the same app, workers and clients (T1, L1) whose runs in
    # the same invocation each server's HTTP/2 figure is set beside: its run of the same number,
    # the server matched by its label without the entry's options (gunicorn's HTTP/2 flags).
    http1_from: str | None = None

    def __post_init__(self) -> None:
        if wrong := [e.server for e in self.lineup if self.interface not in SERVERS[e.server].interfaces]:
            raise ValueError(f"{self.id}: {', '.join(wrong)} cannot serve {self.interface.upper()}")

    def load_for(self, entry: Entry, load: Load | None) -> Load | None:
        """The load this entry is given: the scenario's, at the entry's own concurrency where it
        names one (only ab's loads have one to change)."""
        return load if entry.clients is None else replace(load, concurrency=entry.clients)

    def describe_load(self, load: Load, entries: list[Entry] | tuple[Entry, ...]) -> str:
        """The load as the entries run it: its command, or one per concurrency (H1-hop), or per test
        type and concurrency (the database scenarios)."""
        if self.db_tests:
            return self.db_tests.describe(load)
        return "; ".join(dict.fromkeys(self.load_for(entry, load).describe() for entry in entries))

    def launch(self, entry: Entry, port: int) -> Launch:
        workers = self.workers if entry.workers is None else entry.workers
        pid_file = lifecycle.PID_FILE if isinstance(self.lifecycle, Upgrade) else None
        return Launch(self.app, port, workers, entry.threads, self.backlog, pid_file, entry.options, self.interface)

    def limit(self) -> float:
        if self.time_limit is not None:
            return self.time_limit
        return self.load.default_time_limit() if self.load else 60.0


# The line-ups: which servers each scenario measures, chosen so that the suite fits in 30
# minutes. Every server that runs an app is in the headline (T1); elsewhere a server is in a
# line-up where the scenario has something to say about it. nginx runs no app: it answers with
# hello's body itself, the ceiling of what this machine serves over HTTP, so it is in the
# throughput scenarios only. Equal worker processes unless a line-up says otherwise; each server
# with its production threading unless an entry names threads.
MAITRED = Entry("maitred")
GUNICORN_SYNC = Entry("gunicorn-sync")
GTHREAD = Entry("gunicorn-gthread")  # 4 threads per worker (servers.py says why)
GTHREAD_1 = Entry("gunicorn-gthread", threads=1)  # as many apps at once as a prefork server
UWSGI = Entry("uwsgi")
GRANIAN = Entry("granian")  # its own blocking-thread count
GRANIAN_1 = Entry("granian", threads=1)
WAITRESS = Entry("waitress")
# waitress is one process of threads: threads=1 per worker gives it as many threads in all as the
# others have processes.
WAITRESS_1 = Entry("waitress", threads=1)
MEINHELD = Entry("meinheld")
BJOERN = Entry("bjoern")
NGINX = Entry("nginx")

# T1, the headline: every server that runs an app, and nginx's ceiling.
HEADLINE = (MAITRED, GUNICORN_SYNC, GTHREAD, UWSGI, GRANIAN, WAITRESS, MEINHELD, BJOERN, NGINX)
# T2, connection set-up per request: T1's servers less waitress (the slowest in T1) and gthread
# and meinheld (both gunicorn, whose sync worker is here), for time.
NO_KEEPALIVE = (MAITRED, GUNICORN_SYNC, UWSGI, GRANIAN, BJOERN, NGINX)
# L1, one client's latency: granian, bjoern and gthread; the others are left out for time.
ONE_CLIENT = (MAITRED, GTHREAD, GRANIAN, BJOERN)
# S1 at backlog 10: equal app slots (3 workers x 1), so that the queueing in front of the apps is
# compared, not how many apps run at once. waitress (one process) is left out for time.
EQUAL_SLOTS = (MAITRED, GUNICORN_SYNC, GTHREAD_1, UWSGI, GRANIAN_1, BJOERN)
# S1 at the default backlog: the same, with the threaded peers' default threading beside them
# (a peer whose default threading differs is reported at it too).
EQUAL_SLOTS_AND_DEFAULTS = EQUAL_SLOTS + (GTHREAD, GRANIAN)
# S2, the accept queue under 1,000 and 5,000 clients: the prefork servers (gunicorn's sync
# worker, uWSGI, bjoern), granian, and nginx's listen queue as the reference.
ACCEPT_QUEUE = (MAITRED, GUNICORN_SYNC, UWSGI, GRANIAN, BJOERN, NGINX)
# S3, processes woken for one connection: the prefork servers (gunicorn's sync worker, meinheld
# under gunicorn, uWSGI, bjoern, nginx) and granian's per-worker sockets; gunicorn's gthread and
# waitress are left out for time.
SHARED_SOCKET = (MAITRED, GUNICORN_SYNC, UWSGI, GRANIAN, MEINHELD, BJOERN, NGINX)
# S4, 6 app slots against 1,000 keep-alive clients: uWSGI, granian at 1 thread per worker, bjoern,
# and Apache httpd with mod_wsgi under its event and worker MPMs, 2 processes x 3 threads
# (ThreadsPerChild 3, MaxRequestWorkers 6, as in the Apache runs docs/SCENARIOS.md describes for S4).
KEEPALIVE_SLOTS = (
    MAITRED,
    UWSGI,
    GRANIAN_1,
    BJOERN,
    Entry("apache-event", workers=2),
    Entry("apache-worker", workers=2),
)
# S5, 5 app slots behind nginx: the prefork servers and the threaded ones at 1 thread per worker.
BEHIND_PROXY = (MAITRED, GUNICORN_SYNC, GTHREAD_1, UWSGI, GRANIAN_1, BJOERN)
# C1, slow clients: bjoern, granian, gthread and gunicorn's sync worker.
SLOW_CLIENTS = (MAITRED, GUNICORN_SYNC, GTHREAD, GRANIAN, BJOERN)
# M1, memory per idle connection: granian, gthread, bjoern, uWSGI, and nginx as the reference.
IDLE_CONNECTIONS = (MAITRED, GTHREAD, GRANIAN, BJOERN, UWSGI, NGINX)
# R1, the reload under load: the prefork servers' SIGHUP (gunicorn's sync and gthread workers) and
# granian's (it respawns its workers one at a time). uWSGI is left out for time.
RELOAD = (MAITRED, GUNICORN_SYNC, GTHREAD, GRANIAN)
# U1, the binary upgrade: gunicorn's USR2 with both its workers (the sync worker keeps no
# connection alive, gthread does), and granian, which has none (the results say why).
UPGRADE = (MAITRED, GUNICORN_SYNC, GTHREAD, GRANIAN)
# O1, overload: maitred with its defaults and with each queue policy it offers, the prefork peers
# (gunicorn's sync worker, uWSGI), and the threaded ones at their default threading (gthread,
# granian), whose queues are their threads' and the listen socket's.
OVERLOAD = (
    MAITRED,
    Entry("maitred", options=("--queue-policy", "fifo")),
    Entry("maitred", options=("--queue-timeout", "0.5")),
    GUNICORN_SYNC,
    GTHREAD,
    GRANIAN,
    UWSGI,
)
# H1-hop, the hop between the lobby and the workers: maitred alone (the hop is its own), at one
# client (every request waits for the hop), 4 (as many as the 2 cores and 2 workers can keep busy)
# and 100 (T1's connections: the queue is never empty, and workers are offered requests ahead).
HOP_LEVELS = tuple(Entry("maitred", clients=clients) for clients in (1, 4, 100))
# IO1, IO1-mem and HOL, threads per worker (issue 19): maitred, and the threaded peers at the same
# workers x threads (gunicorn's gthread worker, granian's blocking threads, uWSGI's threads). A
# maitred build without --threads runs its workers one request at a time each (the results say so).
IO_THREADS = 4
THREADED_IO = tuple(Entry(name, threads=IO_THREADS) for name in ("maitred", "gunicorn-gthread", "granian", "uwsgi"))
# IO1-mem: the same 2 workers x 4 threads against 8 single-threaded processes, the prefork way to
# serve 8 requests at once (maitred, gunicorn's sync worker, uWSGI).
PREFORK_PROCESSES = 8
THREADS_OR_PROCESSES = THREADED_IO + tuple(
    Entry(name, workers=PREFORK_PROCESSES) for name in ("maitred", "gunicorn-sync", "uwsgi")
)
HOL_THREADS = 2
THREADED_HOL = tuple(Entry(name, threads=HOL_THREADS) for name in ("maitred", "gunicorn-gthread", "granian", "uwsgi"))
# A1, the ASGI hello: maitred against uvicorn (httptools and uvloop, its own --workers), granian's
# ASGI interface and gunicorn with uvicorn's worker, each with 2 worker processes.
UVICORN = Entry("uvicorn")
ASGI_HELLO = (MAITRED, UVICORN, GRANIAN, Entry("gunicorn-uvicorn"))
# O1-ASGI, overload: the same, and uvicorn with --limit-concurrency, its way to refuse requests
# past a bound (503). The bound is per worker and counts connections as well as requests (each of
# O1's requests has its own connection). UVICORN_LIMIT is the concurrency a worker's capacity
# needs, by Little's law: about 350 req/s a worker (half of the 700 req/s that 2 workers of
# uvicorn or granian served in the capacity runs on a quiet machine) x 52 ms (2 ms of CPU and the
# 50 ms await) = 18, rounded up. A lower bound refuses requests the worker could serve in time; a
# higher one lets more requests share the loop's CPU, each slower.
UVICORN_LIMIT = 20
# maitred runs also with --request-deadline 1, the clients' deadline told rather than learned from
# the clients that leave (docs/TUNING.md, Overload: set it when the deadline is known).
ASGI_OVERLOAD = (
    *ASGI_HELLO,
    Entry("maitred", options=("--request-deadline", "1")),
    Entry("uvicorn", options=("--limit-concurrency", str(UVICORN_LIMIT))),
)
# H2-T1, H2-L1, M1-H2: HTTP/2 with prior knowledge on a plain listener, as h2load's http:// URLs
# and HAProxy's `proto h2` speak it, against the peers that serve HTTP/2 on one: granian (its
# default --http auto takes the preface beside HTTP/1.1) and gunicorn's gthread worker (gunicorn's
# sync worker has no HTTP/2) with it turned on. gunicorn's `--http2-cleartext both`, not
# `prior-knowledge`: with the latter alone it answers 400 to every HTTP/1.1 request from a peer it
# trusts (127.0.0.1 by default), the harness's readiness check among them; `both` also honours
# `Upgrade: h2c`, which no client here sends. All three over cleartext, so that TLS's cost (T1-TLS,
# bench/tls.py) is not in the figures, and gunicorn needs no certificate to speak HTTP/2.
GUNICORN_H2 = Entry("gunicorn-gthread", options=("--http-protocols", "h2,h1", "--http2-cleartext", "both"))
HTTP2 = (MAITRED, GUNICORN_H2, GRANIAN)
# LL-SSE, LL-SSE-60, LL-WS, LL-TOKENS (issue 47, long-lived streams): uvicorn with its WebSocket
# library named (uvicorn[standard]'s websockets; without one uvicorn refuses every upgrade),
# granian's ASGI interface, maitred at its defaults; 2 workers each, every other setting the
# server's default.
UVICORN_WS = Entry("uvicorn", options=("--ws", "websockets"))
LONG_LIVED = (MAITRED, UVICORN_WS, GRANIAN)
# BODY-* (issue 49, big bodies): the WSGI servers (maitred, gunicorn's gthread worker at its 4
# threads, granian --interface wsgi) and the ASGI ones (maitred, granian --interface asgi, uvicorn
# with httptools and uvloop, gunicorn with uvicorn's worker), 2 workers each, every other setting
# the server's default.
BODY_WSGI = (MAITRED, GTHREAD, GRANIAN)
BODY_ASGI = (MAITRED, GRANIAN, UVICORN, Entry("gunicorn-uvicorn"))
# T1's load; C1 runs the same one, which lets it take its figure without the slow clients from
# T1's runs.
T1_LOAD = Wrk(threads=2, connections=100, seconds=10)


def _no_failures(summary: Summary, peers: list[Summary]) -> bool:
    return summary["failed"] == 0 and summary["non2xx"] == 0


def _no_overflows(summary: Summary, peers: list[Summary]) -> bool:
    return summary["ListenOverflows"] == 0


def _at_least(peer: str) -> Target:
    """req/s at least the named peer's (its label in the results); not met when it measured nothing."""
    return Target(
        f"req/s >= {peer}'s",
        lambda summary, peers: (
            any(p["label"] == peer for p in peers)
            and all(summary["rps"] >= p["rps"] for p in peers if p["label"] == peer)
        ),
    )


def _leads(summary: Summary, peers: list[Summary]) -> bool:
    return all(summary["rps"] >= peer["rps"] for peer in peers)


LEADS = Target("req/s >= every peer", _leads)

# H2-T1: HTTP/2 must not cost a server its HTTP/1.1 throughput (each server's own, from T1's run of
# the same number in the same invocation: Scenario.http1_from).
AT_LEAST_ITS_OWN_HTTP1 = Target(
    "req/s >= its own HTTP/1.1 T1's (the same invocation)",
    lambda summary, peers: summary.get("http1_rps") is not None and summary["rps"] >= summary["http1_rps"],
)
HTTP1_COLUMNS = (
    Column("http1_rps", "HTTP/1.1 req/s"),
    Column("h2_over_http1", "HTTP/2 / HTTP/1.1", digits=2),
)


def _percent_at_least(key: str, percent: float, text: str) -> Target:
    """A share (the summary's `key`, in %) that must reach `percent`."""
    return Target(text, lambda summary, peers: summary[key] is not None and summary[key] >= percent)


NO_FAILURES = Target("0 failed, 0 non-2xx", _no_failures)


def _max_latency_within(rounds: float) -> Target:
    """Nobody waits more than `rounds` times what serving every client once takes at the
    measured rate: the tail of a fair queue."""
    return Target(
        f"max latency <= {rounds:g} x (1000 / req/s) s",
        lambda summary, peers: (
            summary["max_ms"] is not None and summary["max_ms"] <= rounds * 1000 / summary["rps"] * 1000
        ),
    )


# S1: 3 slots x 1 ms allow 3000 req/s; 1000 clients then wait 1000/rps seconds each round.
S1_TARGETS = (
    NO_FAILURES,
    Target("0 listen overflows", _no_overflows),
    _max_latency_within(1.5),
    Target("req/s >= 2700 (90% of 3 slots x 1 ms)", lambda summary, peers: summary["rps"] >= 2700),
)

S2_TARGETS = (Target("0 listen overflows", _no_overflows), NO_FAILURES)
S2_NOTE = (
    "Each server keeps its own listen backlog; the kernel grants min(backlog, "
    "net.core.somaxconn) (see the machine line). ab runs with -r so that a refused or reset "
    "connection is counted as failed instead of ending the run. A run still going after 10 s "
    "(under 2,000 req/s, where every peer serves hello at several thousand) is stopped."
)

S5_TARGETS = (
    NO_FAILURES,
    Target(
        "no request over 100 ms (max latency)",
        lambda summary, peers: summary["max_ms"] is not None and summary["max_ms"] <= 100,
    ),
    LEADS,
)
S5_NOTE = (
    "The load goes to nginx (Debian's, started per run once the server is ready, stopped "
    "after it), which keeps up to 32 idle HTTP/1.1 connections per nginx worker process to "
    "the server (configuration below). Threaded servers run 5 app slots like the others "
    "(1 thread per worker)."
)

# O1's figures from deadline-clients (measure.py), beside the goodput and its latencies.
OVERLOAD_COLUMNS = (
    Column("capacity_rps", "capacity, req/s"),
    Column("pct_capacity", "goodput / capacity", suffix="%"),
    Column("rate_asked", "arrivals asked, /s"),
    Column("shed", "shed (503)"),
    Column("late", "late (given up at 1 s)"),
    Column("errors", "errors (refused, reset)"),
    Column("arrival_rps", "arrivals made, /s"),
    Column("lateness_p99_ms", "arrival lateness p99", digits=1, suffix=" ms"),
    Column("lateness_max_ms", "max", digits=1, suffix=" ms"),
    Column("generator_cpu_pct", "generator CPU, % of a core"),
)
WRK_ERROR_COLUMNS = (
    Column("wrk_connect", "wrk connect errors"),
    Column("wrk_read", "read"),
    Column("wrk_write", "write"),
    Column("wrk_timeout", "timeout"),
)
RELOAD_COLUMNS = (
    Column("hups", "SIGHUPs"),
    Column("new_code_median_ms", "first answer of the new code after SIGHUP, median", suffix=" ms"),
    Column("new_code_max_ms", "max", suffix=" ms"),
    Column("hups_unseen", "SIGHUPs whose code never answered"),
    Column("hups_mixed", "SIGHUPs after which old code answered after new"),
    Column("probe_failed", "probe requests failed"),
    Column("alive_at_end", "server alive at the end (1 = yes)"),
    *WRK_ERROR_COLUMNS,
)
RELOAD_TARGETS = (
    NO_FAILURES,
    Target(
        "every clean SIGHUP's code answers the probe within 2 s",
        lambda summary, peers: (
            summary["hups_unseen"] == 0
            and summary["new_code_max_ms"] is not None
            and summary["new_code_max_ms"] <= 2000
        ),
    ),
    Target("no probe request fails", lambda summary, peers: summary["probe_failed"] == 0),
)
RELOAD_NOTE = (
    "The app (bench/generation.py) takes 1 s to import and answers with its generation, read from "
    "the file VERSION at import, and its pid. Each run serves a copy of it from the run's directory. "
    "Every 2 s of the load (the first at 2 s, the last at least 2 s before the end) the harness "
    "writes the next generation into VERSION and sends SIGHUP to the server's master; a probe asks "
    "GET / on a new connection every 20 ms, and the delay is from the SIGHUP to the first answer "
    "from the new generation. gunicorn starts the new workers and stops the old ones at once, "
    "without waiting for the new ones to import the app; granian replaces its workers one at a "
    "time, 3.5 s apart (its --respawn-interval default), so that one reload outlasts the next "
    "SIGHUP. Each granian worker has its own listen socket, and net.ipv4.tcp_migrate_req is 0 "
    "here: connections still queued on a stopped worker's socket can be reset (granian warns of "
    "it for its other respawns)."
)

ASGI_HELLO_NOTE = (
    "The app is bench/asgi_apps.py hello, a plain ASGI 3 callable (no framework) that answers the "
    "13-byte body Hello, world!; every server runs 2 worker processes, each with its event loop. "
    "uvicorn runs with httptools and uvloop (what its --http and --loop auto pick with "
    "uvicorn[standard], named on its command line) and without its access log, which it writes by "
    "default and no other server here does; granian with --interface asgi and its other defaults "
    "(--loop auto: uvloop, installed for uvicorn); gunicorn with uvicorn-worker's "
    "uvicorn_worker.UvicornWorker, which picks httptools and uvloop as uvicorn does. maitred tells "
    "an ASGI app from a WSGI one by its signature, so its command line is T1's."
)
# O1-ASGI's capacity run: enough clients that the 50 ms await does not bound the rate before the
# CPU does (each client makes at most 1 / 52 ms = 19 requests a second).
ASGI_CAPACITY_CLIENTS = 64

# DB-DJANGO, DB-FLASK, DB-FASTAPI: TechEmpower's test types on PostgreSQL (bench/db_levels.py),
# wrk's duration per load (run.py --db-seconds changes it), at each of DB_TESTS' concurrencies.
DB_TESTS = DbTests()
DB_LOAD = Wrk(threads=2, connections=max(DB_TESTS.connections), seconds=10)
# The WSGI applications: 2 workers of 4 threads where the server has threads (maitred --threads 4,
# gunicorn's gthread worker --threads 4: gunicorn's docs advise 2-4 threads per core), and granian
# with its default blocking threads and --backpressure 4: granian's docs advise leaving the threads
# alone and bounding a WSGI worker's concurrent requests with --backpressure, and 4 is the others'
# threads and the 4 connections of each worker's pool (DB-FLASK).
DB_THREADS = 4
DB_WSGI = (
    Entry("maitred", threads=DB_THREADS),
    # Issue 47, item 9: --threads 4, as gunicorn's configuration for these sets, answers at least
    # what one thread a worker does, since a second thread gets a request only while its worker
    # has CPU to spare (docs/DEPLOY.md, Threads or workers).
    Entry("maitred", options=("--threads", "1")),
    Entry("gunicorn-gthread", threads=DB_THREADS),
    Entry("granian", options=("--backpressure", str(DB_THREADS))),
    # granian as it comes: with --backpressure 4 it answers 8 connections at a time and leaves
    # the others waiting through the whole load (the "connections unanswered" column), so its
    # default, which answers every one, is measured beside it.
    Entry("granian"),
)
# The ASGI application: A1's line-up (maitred, uvicorn, granian, gunicorn with uvicorn's worker).
DB_ASGI = ASGI_HELLO


# O1-HAPROXY, overload behind a proxy that gives up after 1 s: O1-WSGI's prefork and threaded
# peers, each behind HAProxy.
HAPROXY_OVERLOAD = (MAITRED, GUNICORN_SYNC, GTHREAD, GRANIAN)
# The clients' own deadline: past HAProxy's 1 s, so that they see what HAProxy answers (504 when it
# gives up) rather than give up first themselves.
HAPROXY_CLIENT_DEADLINE = 2.0
HAPROXY_COLUMNS = (
    *OVERLOAD_COLUMNS[:4],
    Column("late", f"late (no answer within {HAPROXY_CLIENT_DEADLINE:g} s)"),
    *OVERLOAD_COLUMNS[5:],
    Column("proxy_gave_up", "HAProxy gave up (504)"),
    Column("proxy_no_connection", "HAProxy could not connect (503)"),
    Column("ran", "requests the app ran"),
    Column("ran_unanswered", "ran after HAProxy gave up"),
    Column("pct_ran_unanswered", "% of the requests through HAProxy", digits=1, suffix="%"),
)


# LL-SSE, LL-SSE-60, LL-WS, LL-TOKENS (issue 47): the clients (bench/ll_clients.py) and their
# figures. 5,000 clients open over LL_RAMP seconds (2,000 a second), each on its own connection.
LL_CLIENTS = 5000
LL_RAMP = 2.5
LL_UVICORN = "uvicorn --ws websockets"
LL_MEMORY_COLUMNS = (
    Column("open_at_memory", "streams open at the memory reading"),
    Column("rss_before_mb", "RSS before", digits=1, suffix=" MB"),
    Column("rss_growth_mb", "RSS growth", digits=1, suffix=" MB"),
    Column("rss_kb_per_stream", "RSS KB per open stream", digits=1),
    Column("pss_kb_per_stream", "PSS KB per open stream", digits=1),
    Column("held_at_memory", "connections held then (open or waiting)"),
    Column("rss_kb_per_held", "RSS KB per connection held", digits=1),
)
LL_PROBE_COLUMNS = (
    Column("probe_p99_ms", "GET / p99", digits=1, suffix=" ms"),
    Column("probe_max_ms", "GET / max", digits=1, suffix=" ms"),
    Column("probe_failed", "GET / failed (3 s)"),
    Column("probe_sent", "GET / sent"),
)
LL_CLIENT_COLUMNS = (
    Column("client_cpu_pct", "client CPU, % of a core"),
    Column("client_busiest_pct", "busiest client process, % of a core"),
)
LL_ERROR_COLUMNS = (
    # Summed in the target's units: each client that failed, each late or missing first event
    # (or accept), each missing event (or echo).
    Column("errors", "errors: failed + late + missing"),
    Column("refused", "refused"),
    Column("reset", "reset"),
    Column("no_answer", "no answer in time"),
    Column("cut", "cut short"),
)
LL_STREAM_COLUMNS = (
    Column("complete", "streams complete"),
    Column("first_p50_ms", "first event p50", suffix=" ms"),
    Column("first_p99_ms", "first event p99", suffix=" ms"),
    Column("first_max_ms", "first event max", suffix=" ms"),
    Column("late_first", "first event late (> 1 s) or never"),
    Column("missing", "events missing"),
    Column("lateness_p99_ms", "event lateness p99 (worst per stream)", suffix=" ms"),
    *LL_ERROR_COLUMNS,
    Column("not_200", "not 200"),
)
LL_WS_COLUMNS = (
    Column("accepted_in_time", "accepted within 1 s"),
    Column("accept_p99_ms", "accept p99", suffix=" ms"),
    Column("accept_max_ms", "accept max", suffix=" ms"),
    Column("echo_p50_ms", "echo p50", digits=1, suffix=" ms"),
    Column("echo_p99_ms", "echo p99", digits=1, suffix=" ms"),
    Column("echoes", "echoes"),
    Column("missing", "echoes missing"),
    Column("wrong", "wrong echoes"),
    *LL_ERROR_COLUMNS,
    Column("not_101", "not 101"),
)
LL_TOKEN_COLUMNS = (
    Column("complete", "streams complete"),
    Column("first_p50_ms", "first chunk p50", suffix=" ms"),
    Column("first_p99_ms", "first chunk p99", suffix=" ms"),
    Column("first_max_ms", "first chunk max", suffix=" ms"),
    Column("batch_s", "whole batch", digits=2, suffix=" s"),
    Column("missing", "chunks missing"),
    *LL_ERROR_COLUMNS,
)


def _figure_at_most(key: str, bound: float, text: str) -> Target:
    """A figure of maitred's (lower is better) within a bound; not met where it is missing (a
    percentile that fell among the clients that never got theirs)."""
    return Target(text, lambda summary, peers: summary.get(key) is not None and summary[key] <= bound)


def _figure_within_peer(key: str, peer: str, slack: float, text: str) -> Target:
    """A figure of maitred's at most the named peer's plus slack; not met where either is missing."""

    def holds(summary: Summary, peers: list[Summary]) -> bool:
        theirs = [p.get(key) for p in peers if p["label"] == peer]
        return (
            summary.get(key) is not None
            and bool(theirs)
            and all(value is not None and summary[key] <= value + slack for value in theirs)
        )

    return Target(text, holds)


LL_NO_ERRORS = Target(
    "0 errors: none refused, reset, unanswered, cut short, late or missing",
    lambda summary, peers: summary.get("errors") == 0,
)
LL_MEMORY = _figure_at_most("rss_kb_per_stream", 16, "RSS at most 16 KB per open stream (5,000 open)")
LL_SSE_TARGETS = (
    _figure_at_most("first_p99_ms", 1000, "every client's first event within 1 s (p99)"),
    Target("every event delivered", lambda summary, peers: summary.get("missing") == 0),
    LL_NO_ERRORS,
    _figure_at_most("probe_p99_ms", 50, "GET / p99 at most 50 ms throughout (a failed probe counts as slower)"),
    LL_MEMORY,
)
LL_SSE_NOTE = (
    "bench/ll_clients.py sse: 5,000 clients over 2 client processes (asyncio on uvloop, raw "
    "protocols), client k starting k x 2.5 s / 5,000 after the common start, each on a connection "
    "of its own, GET /sse of bench/ll_app.py (plain ASGI 3): N events, the first at once, one a "
    "second. Beside them the parent process asks GET / on a new connection every 50 ms, each at "
    "its due time and given up after 3 s; its p99 counts a failed probe as slower than any. The "
    "first event's latency is from the client's connect; a client that never got one counts as "
    "slower than any (a p99 among those is -). A client gives up 10 s past the end its stream "
    "should have had. Errors: refused or reset connections, no answer, a status other than 200, "
    "a stream cut short, a first event later than 1 s or never, and each missing event. The "
    "server's memory (VmRSS and Pss summed over its process group: master or lobby, zygote, "
    "workers) is read just before the clients start and again once every stream is open (its "
    "first event in) or has failed, or 3 s after the ramp; the growth is divided by the streams "
    "open then (left out under 1% of them), and by the connections held then, open or still waiting. The client's CPU is its processes' own, over the load."
)


# BODY-* (issue 49): bench/body.py's figures.
BODY_COLUMNS = (
    Column("mb_s", "MB/s"),
    Column("cpu_s_per_gib", "server CPU s / GiB", digits=2),
    Column("worker_cpu_s_per_gib", "workers' CPU s / GiB", digits=2),
    Column("calls_per_gib", "system calls / GiB (strace pass)"),
    Column("transfers", "transfers"),
    Column("errors", "failed or wrong"),
    Column("pass_s", "pass", digits=2, suffix=" s"),
    Column("client_cpu_s", "curl CPU", digits=2, suffix=" s"),
    Column("rss_before_mb", "RSS before", digits=1, suffix=" MiB"),
    Column("rss_growth_mb", "RSS growth, peak", digits=1, suffix=" MiB"),
    Column("disk_mb", "temp-file disk, peak", digits=1, suffix=" MiB"),
)
BODY_SLOW_COLUMNS = (
    Column("slow_mb", "slow reader's MB"),
    Column("slow_mb_s", "slow reader's MB/s", digits=2),
)
BODY_GENERATED_COLUMNS = (
    Column("held_mb", "RSS growth + temp-file disk, peak", digits=1, suffix=" MiB"),
    Column("bound_mib", "bound", digits=0, suffix=" MiB"),
    Column("fast_worker_cpu_s", "workers' CPU, one fast reader alone", digits=2, suffix=" s"),
    Column("slow_worker_cpu_s", "workers' CPU, the slow reader alone", digits=2, suffix=" s"),
    Column("slow_alone_mb", "the slow reader alone read", digits=1, suffix=" MB"),
)
BODY_HEADLINE = Column("mb_s", "MB/s")
GRANIAN_DEFAULT = "granian (default threads)"
BODY_NO_ERRORS = Target(
    "every transfer 200, of the right length, every upload's sha256 right",
    lambda summary, peers: summary.get("errors") == 0 and summary["failed"] == 0,
)


def _mb_s_at_least(share: float, peer: str | None = None) -> Target:
    """maitred's MB/s at least share x the best peer's (or the named peer's)."""

    def holds(summary: Summary, peers: list[Summary]) -> bool:
        theirs = [p.get("mb_s") for p in peers if peer is None or p["label"] == peer]
        theirs = [value for value in theirs if value is not None]
        return summary.get("mb_s") is not None and bool(theirs) and summary["mb_s"] >= share * max(theirs)

    who = f"{peer}'s" if peer else "the best peer's"
    return Target(f"MB/s >= {share:g} x {who}" if share != 1 else f"MB/s >= {who}", holds)


def _cpu_within(factor: float, slack: float, peer: str | None = None) -> Target:
    """maitred's server CPU per GiB at most factor x the lowest peer's (or the named peer's), or
    within slack s/GiB of it."""

    def holds(summary: Summary, peers: list[Summary]) -> bool:
        theirs = [p.get("cpu_s_per_gib") for p in peers if peer is None or p["label"] == peer]
        theirs = [value for value in theirs if value is not None]
        if summary.get("cpu_s_per_gib") is None or not theirs:
            return False
        best = min(theirs)
        return summary["cpu_s_per_gib"] <= max(factor * best, best + slack)

    who = f"{peer}'s" if peer else "the best peer's"
    text = f"server CPU per GiB <= {factor:g} x {who}" + (f" (or within {slack:g} s/GiB of it)" if slack else "")
    return Target(text, holds)


BODY_UPLOAD_TARGETS = (BODY_NO_ERRORS, _mb_s_at_least(0.9), _cpu_within(1.2, 0.25))
BODY_ASGI_DOWNLOAD_TARGETS = (BODY_NO_ERRORS, _mb_s_at_least(1, GRANIAN_DEFAULT), _cpu_within(1.2, 0, GRANIAN_DEFAULT))
BODY_GENERATED_TARGETS = (
    BODY_NO_ERRORS,
    Target(
        "the server's RSS growth (peak) within the bound (the bound column; --body-bound-mib)",
        lambda summary, peers: (
            summary.get("rss_growth_mb") is not None and summary["rss_growth_mb"] <= summary["bound_mib"]
        ),
    ),
    Target(
        "its temp-file disk (peak) within the bound",
        lambda summary, peers: summary.get("disk_mb") is not None and summary["disk_mb"] <= summary["bound_mib"],
    ),
    Target(
        "the workers' CPU for the slow reader's answer <= for a fast reader's",
        lambda summary, peers: (
            summary.get("slow_worker_cpu_s") is not None
            and summary.get("fast_worker_cpu_s") is not None
            and summary["slow_worker_cpu_s"] <= summary["fast_worker_cpu_s"]
        ),
    ),
)
BODY_NOTE = (
    "bench/body.py runs curl (Debian's) itself: N clients at once, each a process of its own on a "
    "connection of its own, every one bounded by --max-time and stopped by process group at its "
    "pass's end. The body file is random bytes made once in bench/.work (the size is the "
    "invocation's: run.py --body-mib, 512 MiB, 64 with --quick). MB/s: the fast clients' bytes (10^6 "
    "a MB) over the wall seconds from the first client's start to the last one's exit. Server CPU "
    "per GiB: user + system time of every process of the server's tree (those reaped meanwhile "
    "included) around the pass, over the fast clients' GiB; the workers' is the same less the "
    "process the harness started (maitred's lobby, the peers' master). RSS (VmRSS summed over the "
    "tree) and temp-file disk (the blocks of deleted regular files any process of the tree holds "
    "open, from /proc/PID/fd) are read every 50 ms; the peaks are shown, RSS as growth over the "
    "reading before the pass. System calls: a second, untimed pass of one transfer with strace -f -c "
    "attached to every process of the server (Debian's strace, installed by the harness when "
    "missing, as H1-hop's; perf trace -s runs on this machine too, but the pass is untimed, so "
    "ptrace's cost does not matter and the counts are read as H1-hop reads them), its calls over that "
    "transfer's GiB; the calls by name are in latest.json."
)
BODY_UPLOAD_NOTE = (
    "Uploads: curl -T FILE -X POST (curl streams the file; --data-binary @FILE would read all of it "
    "into curl's memory before connecting, inside the timed seconds) with -H 'Expect:' (curl sends "
    "Expect: 100-continue for a body over 1 MiB and waits up to 1 s for the 100, which servers "
    "answer differently); chunked with -H 'Transfer-Encoding: chunked'. The app hashes the body "
    "(WSGI: wsgi.input in 64 KiB reads, up to CONTENT_LENGTH where there is one; ASGI: each "
    "receive()'d body) and answers the sha256, which is checked against the file's: a wrong one is "
    "a failure."
)


def _body_scenario(
    scenario_id: str,
    title: str,
    load: BodyLoad,
    interface: Literal["wsgi", "asgi"],
    targets: tuple[Target, ...],
    note: str,
    columns: tuple[Column, ...] = (),
    headline: Column = BODY_HEADLINE,
    lower_is_better: bool = False,
) -> Scenario:
    return Scenario(
        id=scenario_id,
        title=title,
        app=f"body_app:{interface}",
        interface=interface,
        workers=2,
        load=load,
        lineup=BODY_WSGI if interface == "wsgi" else BODY_ASGI,
        targets=targets,
        columns=(*columns, *BODY_COLUMNS),
        headline=headline,
        headline_lower_is_better=lower_is_better,
        note=f"{note} {BODY_NOTE}",
    )


def _body_scenarios() -> list[Scenario]:
    scenarios = []
    for interface in ("wsgi", "asgi"):
        for chunked in (False, True):
            for clients in (1, 4):
                framing = "chunked" if chunked else "with its Content-Length"
                scenarios.append(
                    _body_scenario(
                        f"BODY-UP-{interface.upper()}-{'CHUNKED' if chunked else 'CL'}-{clients}",
                        f"{interface.upper()}: uploads of the body file {framing}, {clients} at once, hashed",
                        BodyLoad("upload", clients, chunked=chunked),
                        interface,
                        BODY_UPLOAD_TARGETS,
                        BODY_UPLOAD_NOTE,
                    )
                )
    for clients in (1, 8):
        scenarios.append(
            _body_scenario(
                f"BODY-DOWN-ASGI-{clients}",
                f"ASGI: Starlette's FileResponse of the body file, {clients} client{'s' if clients > 1 else ''} at once",
                BodyLoad("download", clients),
                "asgi",
                BODY_ASGI_DOWNLOAD_TARGETS,
                "Downloads: GET /file, Starlette's FileResponse (which uses the http.response.pathsend "
                "extension where the server offers it), each body's length checked.",
            )
        )
    scenarios.append(
        _body_scenario(
            "BODY-DOWN-ASGI-SLOW",
            "ASGI: FileResponse of the body file to 4 fast clients beside a 5 MB/s reader",
            BodyLoad("download", 4, slow=True),
            "asgi",
            BODY_ASGI_DOWNLOAD_TARGETS,
            "Downloads as BODY-DOWN-ASGI-1's; the slow reader (curl --limit-rate 5M, its body on a pipe "
            "the harness counts) starts with the 4 fast ones and is stopped once they are done. MB/s and "
            "CPU per GiB are the fast ones'.",
            columns=BODY_SLOW_COLUMNS,
        )
    )
    for clients in (1, 8):
        scenarios.append(
            _body_scenario(
                f"BODY-DOWN-WSGI-{clients}",
                f"WSGI: wsgi.file_wrapper of the body file, {clients} client{'s' if clients > 1 else ''} at once",
                BodyLoad("download", clients),
                "wsgi",
                (BODY_NO_ERRORS,),
                "Downloads: GET /file, the open file returned through wsgi.file_wrapper (64 KiB blocks) "
                "with its Content-Length, each body's length checked. The issue sets no ratio target here: "
                "the table shows the ratio.",
            )
        )
    scenarios.append(
        _body_scenario(
            "BODY-SLOW-GENERATED",
            "ASGI: a generated 512 MiB answer to a 5 MB/s reader, beside 4 fast readers",
            BodyLoad("generated", 4, slow=True),
            "asgi",
            BODY_GENERATED_TARGETS,
            "GET /generated: the app sends the body's size (the invocation's, as the file's) in 256 KiB "
            "pieces, each as soon as the server takes the last (no Content-Length). Three passes on one "
            "server: one fast reader alone (the workers' CPU for one fast answer); the slow reader "
            "(curl --limit-rate 5M --max-time 10, 3 with --quick) alone, its workers' CPU counted until "
            "the tree's CPU has been still for 1 s after it left (at most 30 s more: an answer the "
            "server goes on taking from the app after its client has gone costs that); then the slow "
            "reader beside 4 fast readers (the timed pass: MB/s is theirs). The memory and disk peaks "
            "are the highest of the three passes; the bound is run.py --body-bound-mib (8 MiB unless "
            "told; docs/LIMITS.md will state the real one).",
            columns=BODY_GENERATED_COLUMNS + BODY_SLOW_COLUMNS,
            headline=Column("held_mb", "RSS growth + temp-file disk, peak, MiB", digits=1),
            lower_is_better=True,
        )
    )
    return scenarios


def _no_non2xx_in_any_run(summary: Summary, peers: list[Summary]) -> bool:
    return summary["non2xx_worst"] == 0


def _leads_at(test: str, connections: int, figure: str, lower_is_better: bool, text: str) -> Target:
    """maitred's figure for one test type at one concurrency at least as good as every peer's; not
    met when no peer measured it."""
    key = level_key(test, connections)

    def holds(summary: Summary, peers: list[Summary]) -> bool:
        ours = summary["levels"].get(key, {}).get(figure)
        theirs = [p["levels"][key][figure] for p in peers if p["levels"].get(key, {}).get(figure) is not None]
        if ours is None or not theirs:
            return False
        return ours <= min(theirs) if lower_is_better else ours >= max(theirs)

    return Target(f"{test} at {connections} connections: {text}", holds)


def _every_connection_answered(summary: Summary, peers: list[Summary]) -> bool:
    return summary["unanswered_worst"] == 0


DB_TARGETS = (
    Target("0 non-2xx in every run (every load, warm-ups included)", _no_non2xx_in_any_run),
    Target(
        "every connection answered in every run: none of a load's connections without an answer 80% into it",
        _every_connection_answered,
    ),
    *(
        target
        for test in ("db", "fortunes")
        for connections in DB_TESTS.connections
        for target in (
            _leads_at(test, connections, "rps", False, "req/s >= the best peer's"),
            _leads_at(test, connections, "server_cpu_us", True, "server CPU per request <= the best peer's"),
        )
    ),
)
DB_COLUMNS = (
    Column("server_cpu_us", "server CPU µs / request"),
    Column("database_cpu_us", "database CPU µs / request"),
)
DB_NOTE = (
    "PostgreSQL is Debian's, a throw-away cluster the harness makes for the invocation "
    "(bench/postgres.py: TechEmpower's world table of 10,000 rows and fortune table of 12), reached "
    "over its Unix socket. Each run starts the server once and runs TechEmpower's four test types "
    f"against it in turn: /db (one random row), /queries?queries={db_levels.QUERIES} (as many rows, "
    "one query each), /fortunes (the 12 rows and one added at request time, sorted, through the "
    f"framework's templates), /updates?queries={db_levels.QUERIES} (as many rows read, changed and "
    "written back in one transaction). Each test type gets a warm-up at the highest concurrency, "
    "then each concurrency in turn, 2 s apart, as TechEmpower's harness runs its levels; the "
    "warm-ups are not measured, but their non-2xx and socket errors count. The table above sums each "
    "run's measured loads (req/s over their time; CPU per request: the server's process tree, "
    "and the postmaster and its backends, read from /proc around each load, ended processes "
    "included); the table below has each load's figures, medians over the runs."
)


def _db_scenario(
    scenario_id: str,
    framework: str,
    app: str,
    lineup: tuple[Entry, ...],
    note: str,
    interface: Literal["wsgi", "asgi"] = "wsgi",
) -> Scenario:
    """A database scenario: the application, its line-up and what its note says of it; the rest is
    the three's."""
    return Scenario(
        id=scenario_id,
        title=f"{framework}: TechEmpower's test types",
        app=app,
        interface=interface,
        workers=2,
        load=DB_LOAD,
        lineup=lineup,
        db_tests=DB_TESTS,
        targets=DB_TARGETS,
        columns=DB_COLUMNS,
        note=f"{note} {DB_NOTE}",
    )


# M1, M1-H2: the idle connections held and what holding them costs.
IDLE_COLUMNS = (
    Column("crowd_held", "held"),
    Column("crowd_closed", "closed by the server"),
    Column("rss_before_mb", "RSS before", digits=1, suffix=" MB"),
    Column("rss_growth_mb", "RSS growth", digits=1, suffix=" MB"),
    Column("kb_per_held", "KB per held connection", digits=2),
)
IDLE_HEADLINE = Column("kb_per_held", "KB per held idle connection", digits=2)
ALL_HELD = Target(
    "all 10,000 connections answered and held open",
    lambda summary, peers: summary["crowd_held"] == summary["crowd_count"],
)
H2_NOTE = (
    "HTTP/2 with prior knowledge on each server's plain listener (h2load's http:// URL sends the "
    "preface at once). gunicorn serves HTTP/2 with its gthread worker only, turned on by "
    "--http-protocols h2,h1 and --http2-cleartext both (prior-knowledge alone answers 400 to "
    "HTTP/1.1 from a trusted peer, the harness's readiness check among them); granian takes the "
    "preface with its default --http auto; maitred with its defaults."
)


def _hop(scenario_id: str, title: str, app: str, interface: Literal["wsgi", "asgi"]) -> Scenario:
    """H1-hop and A1-hop: the hop, measured under one interface's hello world."""
    return Scenario(
        id=scenario_id,
        title=title,
        app=app,
        interface=interface,
        workers=2,
        # Each entry runs it at its own concurrency (HOP_LEVELS).
        load=Ab(concurrency=1, requests=20000, keepalive=True),
        lineup=HOP_LEVELS,
        count_hop=True,
        # Per load: the run under strace is the slower, 1,000-3,500 req/s here (20 s at most).
        time_limit=60.0,
        columns=(
            Column("lobby_calls", "lobby calls / request", digits=2),
            Column("worker_calls", "workers' calls / request", digits=2),
            Column("lobby_switches", "lobby voluntary switches / request", digits=2),
            Column("worker_switches", "workers' voluntary switches / request", digits=2),
            Column("zygote_switches", "zygote's voluntary switches"),
            Column("lobby_cpu_us", "lobby CPU µs / request", digits=1),
            Column("workers_cpu_us", "workers' CPU µs / request", digits=1),
            Column("server_cpu_us", "server CPU µs / request (lobby, zygote, workers)", digits=1),
            Column("traced_rps", "req/s under strace"),
        ),
        headline=Column("hop_calls", "calls / request, both sides", digits=1),
        headline_lower_is_better=True,
        note="maitred alone, at 1, 4 and 100 keep-alive clients, each on a fresh server that serves "
        "the load twice. First plain: the voluntary context switches (sleeps) of every thread of "
        "each side are read from /proc/PID/task/*/status, and the CPU time (utime and stime, "
        "every thread's) of each process from /proc/PID/stat, just before and just after it; "
        "req/s, the latencies and the CPU per request are this load's. Then the same load with strace attached to each side "
        "apart, `strace -f -c -p LOBBY` and `strace -f -c -p WORKER1 -p WORKER2`, counting every "
        "system call of every thread. Each figure is divided by the requests ab completed in its "
        "own load. The lobby is the process started, the zygote its only child, the workers the "
        "zygote's children (from /proc); the zygote takes no part in a request: its calls are not "
        "counted, and its voluntary switches over the plain load are shown whole. Every call of a "
        "traced process stops it for strace, so the second load is slower (its req/s is shown); "
        "where a call serves whatever is ready at once (c=4, c=100), how many requests one call "
        "finds ready, and so the calls per request, can differ from a run at full speed.",
    )


SCENARIOS: dict[str, Scenario] = {
    scenario.id: scenario
    for scenario in (
        Scenario(
            id="T1",
            title="hello world, keep-alive, wrk (throughput)",
            app="apps:hello",
            workers=2,
            load=T1_LOAD,
            lineup=HEADLINE,
            targets=(NO_FAILURES, LEADS),
        ),
        Scenario(
            id="T2",
            title="hello world, no keep-alive, ab",
            app="apps:hello",
            workers=2,
            load=Ab(concurrency=50, requests=50000),
            lineup=NO_KEEPALIVE,
            targets=(NO_FAILURES, LEADS),
            note="On loopback the server's side of each handshake and teardown runs inside ab's own "
            "connect and close, and ab, single-threaded, takes a whole core: every server fast "
            "enough stops at the rate ab can open connections (docs/PERFORMANCE.md, \"T2: ab's "
            "ceiling\"). nginx's fixed answer shows where that is.",
        ),
        Scenario(
            id="L1",
            title="hello world, keep-alive, one client (latency-bound)",
            app="apps:hello",
            workers=2,
            load=Wrk(threads=1, connections=1, seconds=10),
            lineup=ONE_CLIENT,
            targets=(NO_FAILURES, LEADS),
        ),
        _hop(
            "H1-hop",
            "the hop between lobby and workers: system calls and sleeps per request, each side",
            "apps:hello",
            "wsgi",
        ),
        _hop(
            "A1-hop",
            "the hop under ASGI: system calls and sleeps per request, each side",
            "asgi_apps:hello",
            "asgi",
        ),
        Scenario(
            id="S1",
            title="the worker that waits for nothing: 1 ms app, 1000 clients, default backlog",
            app="apps:sleep_1ms",
            workers=3,
            load=Ab(concurrency=1000, requests=10000, ignore_errors=True),
            lineup=EQUAL_SLOTS_AND_DEFAULTS,
            time_limit=10.0,
            targets=S1_TARGETS,
            note="3 slots x 1 ms allow 3000 req/s; each of 1000 clients then waits about 0.33 s. A "
            "server still going after 10 s (under 1,000 req/s; maitred needs about 4 s) is stopped: "
            "uWSGI, whose listen queue is 100 by default, overflows it and stalls until ab gives up.",
        ),
        Scenario(
            id="S1-b10",
            title="the worker that waits for nothing: 1 ms app, 1000 clients, --backlog 10",
            app="apps:sleep_1ms",
            workers=3,
            load=Ab(concurrency=1000, requests=10000, ignore_errors=True),
            lineup=EQUAL_SLOTS,
            backlog=10,
            time_limit=10.0,
            targets=S1_TARGETS,
            note="A run still going after 10 s is stopped (ab then reports what completed): by then it "
            "has run at under 1,000 req/s where 3 slots allow 3000, and maitred finishes in about "
            "4 s, so the stall is plain without spending a minute on it. Such a run is "
            "incomplete, and its latencies cover only the requests the server finished. The "
            "threaded peers' default threading is in S1, at the default backlog. The 11 slots "
            "hold 0.3-0.5 ms of ab's opening burst of connects: a server kept from accepting that "
            "long, even by another process on its CPU, overflows the queue.",
        ),
        Scenario(
            id="S2-c1000",
            title="SYNs dropped on the floor: hello, 1000 clients, default backlogs",
            app="apps:hello",
            workers=2,
            load=Ab(concurrency=1000, requests=20000, ignore_errors=True),
            lineup=ACCEPT_QUEUE,
            time_limit=10.0,
            targets=S2_TARGETS,
            open_files=2100,
            note=S2_NOTE,
        ),
        Scenario(
            id="S2-c5000",
            title="SYNs dropped on the floor: hello, 5000 clients, default backlogs",
            app="apps:hello",
            workers=2,
            load=Ab(concurrency=5000, requests=20000, ignore_errors=True),
            lineup=ACCEPT_QUEUE,
            time_limit=10.0,
            targets=S2_TARGETS,
            open_files=11000,
            note=S2_NOTE,
        ),
        Scenario(
            id="S3",
            title="the thundering herd: hello, 4 workers, no keep-alive, 4 clients",
            app="apps:hello",
            workers=4,
            load=Ab(concurrency=4, requests=20000),
            lineup=SHARED_SOCKET,
            time_limit=30.0,
            targets=(NO_FAILURES, LEADS),
        ),
        Scenario(
            id="S3-accept",
            title="the thundering herd: accept calls per connection, 4 workers, one client",
            app="apps:hello",
            workers=4,
            load=Ab(concurrency=1, requests=1000),
            lineup=SHARED_SOCKET,
            trace_accepts=True,
            time_limit=30.0,
            targets=(
                Target(
                    "<= 1.1 accept calls per connection",
                    lambda summary, peers: (
                        summary["accepts_per_conn"] is not None and summary["accepts_per_conn"] <= 1.1
                    ),
                ),
            ),
            columns=(
                Column("accept_calls", "accept calls"),
                Column("accept_failed", "of them failed"),
                Column("connections", "connections"),
                Column("accepts_per_conn", "accept calls / connection", digits=2),
            ),
            headline=Column("accepts_per_conn", "accept calls per connection", digits=2),
            headline_lower_is_better=True,
            note="Each server runs under `strace -f -c --seccomp-bpf -e trace=accept,accept4`, from its "
            "start to its end: -f follows every process and thread it starts (workers forked later "
            "too), and --seccomp-bpf stops them only at the accept calls counted, so the rest runs "
            "at full speed and the wake-ups strace counts are the ones that happen without it. "
            "Connections: ab's 1,000 plus the harness's readiness checks (usually 1). A failed "
            "accept is a process woken for a connection another process took (EAGAIN). Its req/s "
            "is under strace and only for reference: S3 measures the throughput.",
        ),
        Scenario(
            id="S4",
            title="keep-alive against busy workers: hello, 6 app slots, 1000 keep-alive clients",
            app="apps:hello",
            workers=6,
            load=Ab(concurrency=1000, requests=100000, keepalive=True, ignore_errors=True),
            lineup=KEEPALIVE_SLOTS,
            time_limit=15.0,
            targets=(
                NO_FAILURES,
                Target(
                    "every request on keep-alive (ab's Keep-Alive requests = completed)",
                    lambda summary, peers: summary["keepalive"] == summary["requests"],
                ),
                _max_latency_within(2.0),
                LEADS,
            ),
            note="Threaded servers run as many app slots as the others (processes x threads = 6): "
            "gunicorn's gthread and granian with 1 thread per worker, Apache httpd with 2 "
            "processes x 3 threads (ThreadsPerChild 3, MaxRequestWorkers 6). ab counts a response "
            'on a connection the server closed as failed ("Length"): that is how a dropped '
            "keep-alive connection shows. A run still going after 15 s is stopped, to keep the "
            "suite within its time: that cuts short a server serving under 6,700 req/s (its "
            "figures then cover what it served by then), and a server that pins a worker to each "
            "idle keep-alive connection, whose other clients wait. ab starts the clock of each "
            "connection's first request before it connects, and writes the first requests only "
            "once all 1,000 connects are made: those 1,000 latencies (1% of the requests, so p99 "
            'and max) include ab\'s own connect loop, which "connect max" shows.',
        ),
        Scenario(
            id="S5-c5",
            title="the proxy that hoards backend connections: nginx in front, 5 clients",
            app="apps:hello",
            workers=5,
            load=Ab(concurrency=5, requests=2000),
            lineup=BEHIND_PROXY,
            front=NginxFront(keepalive=32),
            time_limit=30.0,
            targets=S5_TARGETS,
            note=S5_NOTE,
        ),
        Scenario(
            id="S5-c50",
            title="the proxy that hoards backend connections: nginx in front, 50 clients",
            app="apps:hello",
            workers=5,
            load=Ab(concurrency=50, requests=5000),
            lineup=BEHIND_PROXY,
            front=NginxFront(keepalive=32),
            time_limit=30.0,
            targets=S5_TARGETS,
            note=S5_NOTE,
        ),
        Scenario(
            id="C1",
            title="slow clients: 2,000 request heads that never end, plus T1's load",
            app="apps:hello",
            workers=2,
            load=T1_LOAD,
            lineup=SLOW_CLIENTS,
            crowd=Crowd("slow", 2000, interval=5.0, open_seconds=10.0),
            alone_first=True,
            alone_from="T1",
            open_files=2200,
            targets=(_percent_at_least("pct_alone", 90, "req/s with the slow clients >= 90% of req/s without them"),),
            columns=(
                Column("alone_rps", "req/s without them"),
                Column("pct_alone", "with / without", suffix="%"),
                Column("crowd_opened", "slow clients connected"),
                Column("crowd_open_end", "still open at the end"),
                Column("crowd_closed_end", "closed by the server"),
            ),
            note="Each run runs T1's load after bench/connections.py has connected 2,000 slow clients, "
            "each of which sends a request line and a Host header, then one byte of a header every "
            '5 s and never the blank line that ends the head. "req/s without them" is T1\'s: '
            "when T1 ran in the same invocation, it is T1's run of the same number on the same "
            "server (same load, app and workers: the same measurement); otherwise the run "
            "measures it on its own server first, before the slow clients connect. The req/s "
            'column is the figure with them; "with / without" is their ratio, run by run. Slow clients the server '
            "closes (a header timeout, answered with 408 or not) are counted, not held against "
            "it: what matters is whether everyone else is still served.",
        ),
        Scenario(
            id="M1",
            title="memory: 10,000 idle keep-alive connections",
            app="apps:hello",
            workers=2,
            load=None,
            lineup=IDLE_CONNECTIONS,
            crowd=Crowd("idle", 10000, open_seconds=15.0, idle_seconds=3.0),
            time_limit=30.0,
            open_files=10100,
            targets=(
                ALL_HELD,
                Target(
                    "RSS growth <= 5 MB (0.5 KB per connection)", lambda summary, peers: summary["rss_growth_mb"] <= 5
                ),
            ),
            columns=IDLE_COLUMNS,
            headline=IDLE_HEADLINE,
            headline_lower_is_better=True,
            note="bench/connections.py opens 10,000 connections (at most 500 opening at once), sends one "
            "GET on each, reads the whole response, and then keeps them open without a word. The "
            "server's RSS (the sum of VmRSS over every process of its process group, from /proc) "
            "is read once it is ready and again 3 s after every connection was answered (or 15 s "
            "have passed), so that it is the memory of idle connections, not of ones answered a "
            'moment ago: the growth is what holding them costs. "Held" counts the answered '
            "connections still open at the end of the run; a server that closes idle connections (no "
            "keep-alive, or a short keep-alive timeout) or stops accepting holds fewer, and its "
            "KB per connection is left out when it held under 1% of them.",
        ),
        Scenario(
            id="R1",
            title="reload under load: a SIGHUP every 2 s, an app whose import takes 1 s",
            app="generation:app",
            workers=4,
            load=Wrk(threads=2, connections=50, seconds=30),
            lineup=RELOAD,
            lifecycle=Reload(every=2.0),
            targets=RELOAD_TARGETS,
            columns=RELOAD_COLUMNS,
            note=RELOAD_NOTE,
        ),
        Scenario(
            id="R1-broken",
            title="reload under load, one SIGHUP while the app's file has a syntax error",
            app="generation:app",
            workers=4,
            load=Wrk(threads=2, connections=50, seconds=30),
            lineup=RELOAD,
            lifecycle=Reload(every=2.0, broken=3),
            targets=(
                *RELOAD_TARGETS,
                Target(
                    "the broken SIGHUP: the old code answers every probe until the next SIGHUP, "
                    "and the server is alive at the end",
                    lambda summary, peers: (
                        summary.get("broken_probe_failed") == 0
                        and (summary.get("broken_old_answers") or 0) > 0
                        and summary["alive_at_end"] == 1
                    ),
                ),
            ),
            columns=(
                *RELOAD_COLUMNS,
                Column("broken_imported", "broken file imported (1 = yes)"),
                Column("broken_old_answers", "probe answers until the next SIGHUP"),
                Column("broken_probe_failed", "probe failures until the next SIGHUP"),
            ),
            note=RELOAD_NOTE + " The third SIGHUP (6 s into the load) is sent while the run's copy of the app has a "
            "syntax error and VERSION is left as it was; the file is put back 1.8 s later, 0.2 s "
            "before the next SIGHUP. The probe's answers and failures between the broken SIGHUP "
            'and the next are counted apart; "broken file imported" says whether any process '
            "tried to import it (the server's log names the SyntaxError): a server still busy with "
            "an earlier reload may never look at it.",
        ),
        Scenario(
            id="U1",
            title="binary upgrade under load: 200 idle keep-alive clients ask again after it",
            app="generation:app",
            workers=4,
            load=Wrk(threads=2, connections=50, seconds=20),
            lineup=UPGRADE,
            lifecycle=Upgrade(idle=200, after=5.0),
            targets=(
                NO_FAILURES,
                Target(
                    "all 200 idle clients answered on their connection, by the new master",
                    lambda summary, peers: summary["idle_answered"] == summary["idle_by_new"] == 200,
                ),
                Target(
                    "the old master exits 0 and the pid file names the new one",
                    lambda summary, peers: summary["old_exit"] == 0 and summary["pid_file_new"] == 1,
                ),
            ),
            columns=(
                Column("idle_before", "idle clients held after one answer"),
                Column("idle_answered", "answered again on their connection"),
                Column("idle_by_new", "by the new master"),
                Column("idle_closed", "closed by the server"),
                Column("idle_reset", "reset"),
                Column("idle_other", "other failures"),
                Column("old_exit", "old master's exit code"),
                Column("pid_file_new", "pid file names the new master (1 = yes)"),
                Column("upgrade_s", "upgrade took", digits=1, suffix=" s"),
                *WRK_ERROR_COLUMNS,
            ),
            note="bench/keepalive_clients.py opens 200 connections and makes one request on each, "
            "then leaves them idle; wrk starts, and 5 s into it the upgrade begins. maitred: "
            "SIGUSR2 to the lobby, which starts the new maitred, hands it the listen sockets and "
            "the idle connections, and exits by itself. gunicorn: SIGUSR2 to the master, which "
            "starts a new master and its workers beside the old ones; once the new workers have "
            "booted and had 2 s to import the app, SIGTERM to the old master (gunicorn's docs: "
            "SIGWINCH stops the old workers only when gunicorn runs as a daemon, and TERM stops the "
            "old master). Once the old master has exited, each idle client asks once more on its "
            "connection; the pid that answers is matched to the new master through /proc. "
            "\"upgrade took\" runs from SIGUSR2 to the old master's exit. gunicorn's keep-alive "
            "timeout is 2 s by default: gthread closes the idle connections before the upgrade, and "
            "the sync worker keeps none alive. The app's import takes 1 s, as in R1.",
        ),
        Scenario(
            id="O1-WSGI",
            title="overload goodput: a 3 ms CPU app at 1.5 x the best capacity, clients with a 1 s deadline",
            app="apps:cpu_3ms",
            workers=2,
            capacity=ClosedLoop(seconds=3, deadline=1.0, concurrency=16),
            load=OpenLoop(seconds=15, deadline=1.0, times_capacity=1.5),
            lineup=OVERLOAD,
            # The generator stops itself at 15 s plus the last deadline.
            time_limit=30.0,
            open_files=2000,
            targets=(_percent_at_least("pct_capacity", 90, "goodput >= 90% of its own capacity"),),
            columns=OVERLOAD_COLUMNS,
            headline=Column("pct_capacity", "goodput, % of own capacity"),
            note="Each round first measures every server's capacity, each on a fresh server: "
            "bench/deadline-clients closed, 16 clients each opening a new connection per "
            "request for 3 s, 200s answered per second. Then, again on a fresh server each, 15 s "
            "of requests arriving at 1.5 x the best capacity of the round (the same rate for every "
            "server), each on a new connection, started at its due time whatever the earlier ones "
            "are doing, and given up (its socket closed) 1 s after its start, as a user or a proxy "
            "with a 1 s deadline does. The req/s column is the goodput: answers 200 within the "
            "deadline per second of the 15 s; p50-max are their latencies. Shed: answered 503 within "
            "the deadline; late: no answer within it (a connect whose SYN was dropped is retried "
            "only after 1 s, so it is late too); errors: refused or reset before an answer. The app "
            "spins 3 ms on its thread's CPU clock. The generator runs on the same 2 cores as the "
            "server: its CPU and how late it started requests are shown, and its capacity runs pay "
            "the same client's cost per request.",
        ),
        Scenario(
            id="A1",
            title="ASGI hello world, keep-alive, wrk (throughput)",
            app="asgi_apps:hello",
            interface="asgi",
            workers=2,
            load=T1_LOAD,
            lineup=ASGI_HELLO,
            targets=(NO_FAILURES, _at_least("uvicorn")),
            note=ASGI_HELLO_NOTE,
        ),
        Scenario(
            id="A1-c1",
            title="ASGI hello world, keep-alive, one client (latency-bound)",
            app="asgi_apps:hello",
            interface="asgi",
            workers=2,
            load=Wrk(threads=1, connections=1, seconds=10),
            lineup=ASGI_HELLO,
            targets=(NO_FAILURES, _at_least("uvicorn")),
            note=ASGI_HELLO_NOTE,
        ),
        Scenario(
            id="O1-ASGI",
            title="overload goodput: an async endpoint (2 ms CPU, 50 ms await) at 1.5 x each server's "
            "own capacity, clients with a 1 s deadline",
            app="asgi_apps:overload",
            interface="asgi",
            workers=2,
            capacity=ClosedLoop(seconds=3, deadline=1.0, concurrency=ASGI_CAPACITY_CLIENTS),
            load=OpenLoop(seconds=20, deadline=1.0, times_capacity=1.5, own_capacity=True),
            lineup=ASGI_OVERLOAD,
            # The generator stops itself at 20 s plus the last deadline.
            time_limit=35.0,
            open_files=4000,
            targets=(_percent_at_least("pct_capacity", 90, "goodput >= 90% of its own capacity"),),
            columns=(
                *OVERLOAD_COLUMNS[:2],
                Column("pct_good", "good, % of arrivals", suffix="%"),
                Column("pct_answered", "answered (200 or 503) within 1 s, % of arrivals", suffix="%"),
                *OVERLOAD_COLUMNS[2:],
            ),
            headline=Column("pct_capacity", "goodput, % of own capacity"),
            note="As O1-WSGI, with an async endpoint (bench/asgi_apps.py overload): it spins 2 ms on "
            "its thread's CPU clock, blocking the event loop as real synchronous work does, then "
            "awaits asyncio.sleep(0.05) and answers the 13-byte body. In each round, each server in turn: "
            f"its capacity on a fresh server, bench/deadline-clients closed, {ASGI_CAPACITY_CLIENTS} "
            "clients each opening a new connection per request for 3 s, 200s answered per second (16 "
            "clients, O1-WSGI's, would measure the 50 ms await: 16 / 52 ms is about 300 req/s, below "
            "what 2 workers' CPU allows); then at once, on another fresh server, 20 s of requests "
            "arriving at 1.5 x that capacity (O1-WSGI gives every server 1.5 x the best one's, all "
            "capacities measured first; here the capacities differ up to twofold, the best one's "
            "would overload the slowest three times over, and on this shared machine a capacity "
            "measured two minutes earlier may no longer hold), each on a new connection, started at "
            "its due time whatever the earlier "
            "ones are doing, and given up (its socket closed) 1 s after its start. The req/s column is "
            "the goodput: answers 200 within the deadline per second of the 20 s; p50-max are their "
            "latencies. Good and answered are shares of the requests started; shed: answered 503 "
            "within the deadline; late: no answer within it; errors: refused or reset before an "
            f"answer. uvicorn --limit-concurrency {UVICORN_LIMIT}: uvicorn answers 503 to a request "
            "that arrives while its worker holds that many connections or requests (the bound is per "
            f"worker); {UVICORN_LIMIT} is the concurrency a worker's capacity needs, by Little's law: "
            "about 350 req/s a worker (half of what uvicorn and granian served in capacity runs on a "
            "quiet machine) x 52 ms each = 18, rounded up. The bound counts only connections uvicorn "
            "has accepted: the ones waiting in the kernel's accept queue (uvicorn's --backlog, 2048) "
            "are not refused, however long they wait.",
        ),
        Scenario(
            id="IO1",
            title="an app that waits 20 ms for I/O: 2 workers x 4 threads, 32 keep-alive clients",
            app="apps:io_20ms",
            workers=2,
            load=Wrk(threads=2, connections=32, seconds=10),
            lineup=THREADED_IO,
            targets=(
                Target(
                    "req/s >= 350 (2 workers x 4 threads, 20 ms each: 400 at most)",
                    lambda summary, peers: summary["rps"] >= 350,
                ),
                LEADS,
            ),
            note="The app sleeps 20 ms (time.sleep, which lets go of the GIL) and answers the 12-byte body: "
            "8 requests at once can each take 20 ms, so 400 req/s is the most and 32 clients wait about "
            "4 rounds (80 ms) each. Every server runs 2 processes of 4 threads: gunicorn's gthread "
            "worker `--threads 4`, granian `--blocking-threads 4`, uWSGI `--threads 4`, maitred "
            "`--threads 4` where its build takes it (its --help lists --threads; otherwise a warning "
            "below says it ran without). uWSGI's --http-socket closes every connection after its answer, "
            "which wrk counts as read errors.",
        ),
        Scenario(
            id="IO1-mem",
            title="memory for 8 requests at once: 2 workers x 4 threads against 8 processes",
            app="apps:io_20ms",
            workers=2,
            load=Wrk(threads=2, connections=8, seconds=5),
            lineup=THREADS_OR_PROCESSES,
            memory_after_load=True,
            columns=(
                Column("processes", "processes"),
                Column("threads", "threads"),
                Column("rss_mb", "RSS, summed", digits=1, suffix=" MB"),
                Column("pss_mb", "PSS, summed", digits=1, suffix=" MB"),
            ),
            headline=Column("pss_mb", "PSS of the whole server, MB", digits=1),
            headline_lower_is_better=True,
            note="Each server serves IO1's app to 8 keep-alive clients for 5 s (400 req/s at most), "
            "either as 2 processes of 4 threads (as in IO1) or as 8 single-threaded processes "
            "(maitred -w 8, gunicorn's sync worker -w 8, uWSGI --processes 8). Once the load is over, "
            "every thread the load needed has been started, and the server, still running, is read "
            "from /proc: every process of its process group (master, lobby, zygote, workers), their "
            "threads, their VmRSS summed (a page that forked processes share counts once per "
            "process) and their Pss summed (/proc/PID/smaps_rollup: a shared page is split among "
            "the processes sharing it, so the sum is what the whole server takes). The req/s and "
            "latencies are only for reference.",
        ),
        Scenario(
            id="HOL",
            title="head-of-line blocking: 3 clients' 2 s requests beside 400 quick ones a second, 2 workers x 2 threads",
            app="apps:slow_2s_or_quick",
            workers=2,
            load=MixedClients(
                slow_clients=3,
                quick_rate=400,
                quick_connections=8,
                seconds=10,
                slow_path=apps.SLOW_PATH,
                quick_path="/quick",
            ),
            lineup=THREADED_HOL,
            targets=(
                Target(
                    "the quick requests' p99 under 50 ms",
                    lambda summary, peers: summary["quick_p99_ms"] is not None and summary["quick_p99_ms"] < 50,
                ),
            ),
            columns=(
                Column("quick_over_1s", "quick requests over 1 s"),
                Column("quick_connections", "connections for the quick requests"),
                Column("slow_answered", "slow requests answered"),
                Column("slow_failed", "slow failed"),
                Column("slow_median_ms", "slow p50", suffix=" ms"),
                Column("slow_max_ms", "slow max", suffix=" ms"),
                Column("retried", "requests sent again on a new connection"),
            ),
            headline=Column("quick_p99_ms", "the quick requests' p99, ms", digits=1),
            headline_lower_is_better=True,
            note="bench/mixed_clients.py: 3 clients ask for /slow (the app sleeps 2 s) again as soon as "
            "each answer is in, so that 3 of the 4 threads are always busy with one; 0.2 s later "
            "requests for /quick (answered at once) start arriving, 400 a second for 10 s, each at "
            "its due time whatever the others are doing, on an idle keep-alive connection of a "
            "pool (8 opened beforehand) or a new one when none is idle. Every table figure but the "
            "slow columns is the quick requests'; each latency counts from the request's due time. "
            "A quick request stuck behind a slow one holds its connection, and the others go on "
            "without it, so the figures are the stuck requests' waits. Three slow requests on 2 workers leave one worker with "
            "both its threads busy however they are spread: a server that hands the quick requests "
            "to the free thread keeps them at a few ms, and one that binds a connection or a request "
            "to a worker before a thread of it is free makes them wait up to 2 s. With 2 slow "
            "clients the result would hang on how the connections happened to spread. A request that fails on a reused connection before any byte of its answer "
            "is sent again on a new one (uWSGI's --http-socket closes every connection after its answer).",
        ),
        _db_scenario(
            "DB-DJANGO",
            "Django on PostgreSQL (its ORM, psycopg, persistent connections)",
            "db_django:application",
            DB_WSGI,
            "bench/db_django.py: Django's ORM on psycopg 3, CONN_MAX_AGE None (each thread keeps its "
            "connection), the fortunes through Django's template engine.",
        ),
        _db_scenario(
            "DB-FLASK",
            "Flask on PostgreSQL (a psycopg_pool pool)",
            "db_flask:app",
            DB_WSGI,
            "bench/db_flask.py: psycopg 3 through psycopg_pool's ConnectionPool (4 connections per "
            "worker, autocommit), the fortunes through Flask's Jinja2 templates.",
        ),
        _db_scenario(
            "DB-FASTAPI",
            "FastAPI on PostgreSQL (an asyncpg pool made in the lifespan)",
            "db_fastapi:app",
            DB_ASGI,
            "bench/db_fastapi.py: asyncpg's pool (10 connections per worker) made in the lifespan's "
            "startup, async endpoints, the fortunes through Starlette's Jinja2Templates.",
            interface="asgi",
        ),
        Scenario(
            id="O1-HAPROXY",
            title="overload behind HAProxy (timeout server 1s): the 3 ms CPU app at 1.5 x each server's own capacity",
            app="apps:cpu_3ms_counted",
            workers=2,
            front=HAProxyFront(timeout_server=1.0),
            capacity=ClosedLoop(seconds=3, deadline=HAPROXY_CLIENT_DEADLINE, concurrency=16),
            load=OpenLoop(seconds=15, deadline=HAPROXY_CLIENT_DEADLINE, times_capacity=1.5, own_capacity=True),
            lineup=HAPROXY_OVERLOAD,
            count_runs=True,
            # The generator stops itself at 15 s plus the last deadline.
            time_limit=30.0,
            open_files=4000,
            targets=(
                _percent_at_least("pct_capacity", 90, "answered 200 in time >= 90% of its own capacity"),
                Target(
                    "requests run after HAProxy gave up on them <= 1% of the requests through it",
                    lambda summary, peers: (
                        summary["pct_ran_unanswered"] is not None and summary["pct_ran_unanswered"] <= 1
                    ),
                ),
            ),
            columns=HAPROXY_COLUMNS,
            headline=Column("pct_capacity", "answered 200 in time, % of own capacity"),
            note="O1's method with HAProxy (Debian's) in front of each server, `timeout server 1s`: "
            "HAProxy waits 1 s for the server's answer, then gives up, answers its client 504 and "
            "closes its connection to the server; it queues nothing itself (no maxconn on the server "
            "line), so every request reaches the server at once. The app is O1-WSGI's 3 ms of CPU, "
            "counting each request it runs (apps.cpu_3ms_counted). In each round, each server in "
            "turn: its capacity through HAProxy, bench/deadline-clients closed, 16 clients each "
            "opening a new connection per request for 3 s, 200s answered per second; then at once, "
            "on another fresh server, 15 s of requests arriving at HAProxy at 1.5 x that capacity, "
            "each on a new connection, with a 2 s deadline (past HAProxy's second, so that the "
            "clients see what HAProxy answers). The req/s column is the answers 200 per second of "
            "the 15 s, every one within HAProxy's second; the headline is their share of the "
            "server's capacity. From HAProxy's log (a line per request: status and termination "
            "state): the requests it gave up on (sH, sD: 504) and those it could not connect for "
            "(503, which the clients count as shed with the server's own 503s). The app's count, "
            "read once it has not grown for 1 s after the load (the server may go on running "
            "requests whose clients are gone), less the 200s HAProxy received, is the requests run "
            "after HAProxy gave up on them: work for nobody.",
        ),
        Scenario(
            id="H2-T1",
            title="hello world over HTTP/2, h2load, 100 connections x 10 streams (throughput)",
            app="apps:hello",
            workers=2,
            load=H2Load(threads=2, clients=100, streams=10, seconds=10),
            lineup=HTTP2,
            http1_from="T1",
            targets=(NO_FAILURES, _at_least("granian (default threads)"), AT_LEAST_ITS_OWN_HTTP1),
            columns=HTTP1_COLUMNS,
            note=f"{H2_NOTE} T1's app and workers; h2load reports no latency percentiles, only the "
            "mean and max. The HTTP/1.1 columns are each server's T1 run of the same number in the same "
            "invocation (- when T1 did not run).",
        ),
        Scenario(
            id="H2-L1",
            title="hello world over HTTP/2, h2load, one connection, one stream (latency-bound)",
            app="apps:hello",
            workers=2,
            load=H2Load(clients=1, streams=1, seconds=10),
            lineup=HTTP2,
            http1_from="L1",
            targets=(NO_FAILURES,),
            columns=HTTP1_COLUMNS,
            note=f"{H2_NOTE} L1's app and workers. The HTTP/1.1 columns are each server's L1 run of the "
            "same number in the same invocation (- when L1 did not run).",
        ),
        Scenario(
            id="M1-H2",
            title="memory: 10,000 idle HTTP/2 connections",
            app="apps:hello",
            workers=2,
            load=None,
            lineup=HTTP2,
            crowd=Crowd("idle-h2", 10000, open_seconds=15.0, idle_seconds=3.0),
            time_limit=30.0,
            open_files=10100,
            targets=(ALL_HELD,),
            columns=IDLE_COLUMNS,
            headline=IDLE_HEADLINE,
            headline_lower_is_better=True,
            note=f"{H2_NOTE} M1's method over HTTP/2: bench/connections.py idle-h2 opens 10,000 "
            "connections (at most 500 opening at once), each sending the preface, an empty SETTINGS, a "
            "WINDOW_UPDATE opening the connection's window to 32 MiB (as curl does) and one GET, reads "
            "until that stream ends, then keeps the connection open, acknowledging the server's SETTINGS "
            "and PINGs and saying nothing else. The server's RSS (the sum of VmRSS over its process group) "
            "is read once it is ready and again 3 s after every connection was answered: the growth per "
            "connection held is the figure. An idle HTTP/2 connection hibernates in maitred's lobby as an "
            'HTTP/1.1 one does (docs/HTTP2.md, "Idle connections"): compare with M1.',
        ),
        *(
            Scenario(
                id=scenario_id,
                title=f"{LL_CLIENTS:,} SSE clients, one event a second for {events} s, GET / beside them",
                app="ll_app:app",
                workers=2,
                load=StreamClients("sse", LL_CLIENTS, ramp=LL_RAMP, events=events),
                lineup=LONG_LIVED,
                interface="asgi",
                open_files=LL_CLIENTS + 200,
                skip_without_room=True,
                targets=LL_SSE_TARGETS,
                columns=(*LL_STREAM_COLUMNS, *LL_PROBE_COLUMNS, *LL_MEMORY_COLUMNS, *LL_CLIENT_COLUMNS),
                headline=Column("complete", "SSE streams complete, all their events in"),
                note=LL_SSE_NOTE.replace("N events", f"{events} events"),
            )
            for scenario_id, events in (("LL-SSE", 15), ("LL-SSE-60", 60))
        ),
        Scenario(
            id="LL-WS",
            title=f"{LL_CLIENTS:,} WebSocket clients, each sending a message every 3 s",
            app="ll_app:app",
            workers=2,
            load=StreamClients("ws", LL_CLIENTS, ramp=LL_RAMP, messages=5, interval=3.0),
            lineup=LONG_LIVED,
            interface="asgi",
            open_files=LL_CLIENTS + 200,
            skip_without_room=True,
            targets=(
                _figure_at_most("accept_p99_ms", 1000, "accepted within 1 s (p99)"),
                _figure_within_peer("echo_p99_ms", LL_UVICORN, 0, f"echo p99 at most {LL_UVICORN}'s"),
                LL_NO_ERRORS,
                LL_MEMORY,
            ),
            columns=(*LL_WS_COLUMNS, *LL_PROBE_COLUMNS, *LL_MEMORY_COLUMNS, *LL_CLIENT_COLUMNS),
            headline=Column("accepted_in_time", "WebSockets accepted within 1 s"),
            note="bench/ll_clients.py ws: 5,000 clients started over 2.5 s as in LL-SSE, each a "
            "WebSocket handshake to bench/ll_app.py's echo (the accept's latency is from the connect to "
            "the 101), then 5 masked 32-byte text messages 3 s apart, at a phase of its own within the "
            "first 3 s so that the 1,667 messages a second spread evenly, each echo checked and timed "
            "from its send, then a close (1000). The echo p99 counts a missing echo as slower than any. "
            "Errors: refused or reset connections, no answer, a handshake answered other than 101, an "
            "accept later than 1 s or never, a connection the server closed early, and each missing "
            "echo. GET / is probed beside them as in LL-SSE, and memory is read once every WebSocket is "
            "accepted (or failed, or 3 s after the ramp).",
        ),
        Scenario(
            id="LL-TOKENS",
            title="1,000 concurrent token streams of 40 chunks, 25 ms apart",
            app="ll_app:app",
            workers=2,
            load=StreamClients("tokens", 1000, tokens=40, gap=0.025, slack=30.0),
            lineup=LONG_LIVED,
            interface="asgi",
            open_files=1200,
            skip_without_room=True,
            targets=(
                _figure_within_peer("first_p99_ms", LL_UVICORN, 50, f"first chunk p99 at most {LL_UVICORN}'s + 50 ms"),
                _figure_within_peer("batch_s", LL_UVICORN, 0, f"the whole batch no slower than {LL_UVICORN}'s"),
            ),
            columns=(*LL_TOKEN_COLUMNS, *LL_PROBE_COLUMNS, *LL_CLIENT_COLUMNS),
            headline=Column("batch_s", "the whole batch, s", digits=2),
            headline_lower_is_better=True,
            note="bench/ll_clients.py tokens: 1,000 clients at once (2 client processes), each on a "
            "connection of its own, GET /tokens of bench/ll_app.py: 40 chunks, the first at once, then "
            "one every 25 ms from the stream's start (0.975 s a stream), as a language model's answer is "
            "streamed. First chunk latency from the client's connect (a client that never got one counts "
            "as slower than any); the whole batch from the first client's start to the last chunk of "
            "the last stream, - unless every stream ran to its end. A client gives up 30 s past its "
            "stream's end. GET / is probed beside them as in LL-SSE.",
        ),
        *_body_scenarios(),
    )
}
