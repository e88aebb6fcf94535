"""The lobby's own ceiling (issue 18): how many requests per second one lobby thread drives on one
core, when its workers cost nothing.

bench/stub builds `maitred-stub`: the real lobby (maitred_lobby::run, the CLI's default settings,
no access log) whose workers are native stubs that answer every request at once with one frame
(200, "Hello, world!\\n") through the shared region. The lobby is pinned to CPU 0 (`taskset -c 0`),
its zygote and workers to CPU 1 (the stub's `--worker-cpu 1`), and wrk, one thread, to CPU 1 as
well. For each number of keep-alive connections, one load of wrk; around it the lobby's CPU time
(user and system, every thread of it) is read from /proc/PID/stat, the workers' likewise, and
each CPU's busy time from /proc/stat. The figures: req/s; the lobby's CPU per request; its
utilisation (CPU seconds per second of the load); and req/s per lobby core, req/s divided by
that utilisation: what the lobby would drive with its core to itself, when the other side (wrk and
the workers sharing CPU 1) is what holds it back.

Every load takes /work/bench.lock (flock) for its whole measurement, so that it never overlaps
another benchmark on this machine; the server, wrk and everything they start run in their own
process groups and are stopped, and checked gone, at the end (procs.py).

    python3 bench/ceiling.py                          # build, then 1, 16, 64, 256 connections, 10 s each
    python3 bench/ceiling.py -c 64 -s 3 --no-build    # one short load, nothing written to results/
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import procs
from measure import Wrk

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
STUB = REPO / "target" / "release" / "maitred-stub"
WORK = BENCH / ".work" / "ceiling"
RESULTS = BENCH / "results" / "ceiling"
# Taken by every load on this machine, so that two never overlap.
LOCK = Path("/work/bench.lock")
LOBBY_CPU = 0
OTHER_CPU = 1
# How long the server has to exit on SIGTERM: its graceful timeout is 10 s, and nothing is open.
STOP_GRACE_SECONDS = 15.0
# A load longer than its duration by this much is stopped (procs.run_tool).
LOAD_TIME_MARGIN = 30.0


class CeilingError(Exception):
    """Nothing was measured; str(error) says why."""


def main(argv: list[str]) -> int:
    args = _parse_args(argv)
    for tool in ("wrk", "taskset", "cargo"):
        if shutil.which(tool) is None and not (tool == "cargo" and args.no_build):
            print(f"ceiling: {tool} is missing (wrk: apt-get install wrk; taskset: util-linux)", file=sys.stderr)
            return 1
    if (os.cpu_count() or 1) < 2:
        print("ceiling: needs 2 CPUs (the lobby on one, the rest on the other)", file=sys.stderr)
        return 1
    if not args.no_build:
        print("building maitred-stub: cargo build --release -p maitred-stub", flush=True)
        subprocess.run(["cargo", "build", "--release", "-p", "maitred-stub"], cwd=REPO, check=True)
    if not STUB.exists():
        print(f"ceiling: {STUB} is missing; build it with cargo build --release -p maitred-stub", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _interrupt)
    WORK.mkdir(parents=True, exist_ok=True)
    try:
        rows, server = _measure(args.connections, args.seconds, args.workers, args.rounds)
    except (CeilingError, procs.StartError) as error:
        print(f"ceiling: {error}", file=sys.stderr)
        return 1
    finally:
        procs.stop_all()
    report = _markdown(rows, server)
    print(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "latest.md").write_text(report)
        (args.out / "latest.json").write_text(json.dumps({"environment": server, "rows": rows}, indent=1) + "\n")
        print(f"written to {args.out / 'latest.md'} and latest.json")
    return 0


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/ceiling.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "-c", "--connections", default="1,16,64,256", help="keep-alive connections per load, comma-separated"
    )
    parser.add_argument("-s", "--seconds", type=int, default=10, help="each load's duration (1 to 60)")
    parser.add_argument("-n", "--rounds", type=int, default=3, help="loads per level, the levels taking turns")
    parser.add_argument("-w", "--workers", type=int, default=2, help="stub workers")
    parser.add_argument("--no-build", action="store_true", help="use target/release/maitred-stub as it is")
    parser.add_argument("--out", type=Path, help=f"where to write latest.md (default {RESULTS.relative_to(REPO)})")
    args = parser.parse_args(argv)
    args.connections = [int(c) for c in args.connections.split(",") if c.strip()]
    if not args.connections or min(args.connections) < 1 or max(args.connections) > 10000:
        parser.error("connections: whole numbers from 1 to 10000")
    if not 1 <= args.seconds <= 60 or not 1 <= args.workers <= 64 or not 1 <= args.rounds <= 10:
        parser.error("seconds: 1 to 60; workers: 1 to 64; rounds: 1 to 10")
    # Only the full default run goes to results/ unless told otherwise.
    default_run = (args.seconds, args.connections, args.workers, args.rounds) == (10, [1, 16, 64, 256], 2, 3)
    if args.out is None and default_run:
        args.out = RESULTS
    return args


def _interrupt(number: int, frame: object) -> None:
    raise KeyboardInterrupt


def _measure(levels: list[int], seconds: int, workers: int, rounds: int) -> tuple[list[dict], dict]:
    """Starts one server, runs `rounds` loads per level (1, 16, 64, 1, 16, 64 ...: other work on
    the machine then slows each level alike), stops the server. Returns a row per load and what the
    report says of the server and the machine."""
    port = procs.free_port()
    log_path = WORK / "server.log"
    argv = ["taskset", "-c", str(LOBBY_CPU), str(STUB), "--port", str(port), "--workers", str(workers)]
    argv += ["--worker-cpu", str(OTHER_CPU), "--log-level", "warning"]
    with log_path.open("wb") as log:
        server = procs.start(argv, log=log, cwd=WORK, env=dict(os.environ))
    procs.wait_ready(server, port=port, log_path=log_path, log_pattern=None, log_count=0, timeout=30.0)
    lobby = server.pid
    zygote, worker_pids = _sides(lobby, workers)
    affinity = {
        "lobby": _cpus_allowed(lobby),
        "zygote": _cpus_allowed(zygote),
        "workers": sorted({_cpus_allowed(pid) for pid in worker_pids}),
    }
    if affinity["lobby"] != str(LOBBY_CPU) or affinity["workers"] != [str(OTHER_CPU)]:
        raise CeilingError(f"the processes are not where they were put: {affinity}")
    rows = []
    for round_ in range(1, rounds + 1):
        for connections in levels:
            load = Wrk(threads=1, connections=connections, seconds=seconds)
            workdir = WORK / f"c{connections}-{round_}"
            workdir.mkdir(exist_ok=True)
            rows.append({"round": round_, **_one_load(load, port, workdir, lobby, worker_pids)})
            print(_row(rows[-1]), flush=True)
            if _sides(lobby, workers) != (zygote, worker_pids):
                raise CeilingError("the workers changed during the load; see bench/.work/ceiling/server.log")
    procs.stop(server, grace=STOP_GRACE_SECONDS)
    left = procs.group_members(lobby)
    if server.returncode != 0 or left:
        raise CeilingError(f"the server exited with {server.returncode}, leaving {left}; see server.log")
    facts = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git_commit(),
        "cpu": _cpu_model(),
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "wrk": _first_line(["wrk", "-v"]).split(" Copyright")[0],
        "workers": workers,
        "rounds": rounds,
        "affinity": affinity,
        "server": " ".join(["taskset", "-c", str(LOBBY_CPU), "target/release/maitred-stub", "--port", "PORT"])
        + f" --workers {workers} --worker-cpu {OTHER_CPU} --log-level warning",
        "loads": [f"taskset -c {OTHER_CPU} {Wrk(1, c, seconds).describe()}" for c in levels],
    }
    return rows, facts


def _one_load(load: Wrk, port: int, workdir: Path, lobby: int, workers: tuple[int, ...]) -> dict:
    output = workdir / "wrk.txt"
    argv = ["taskset", "-c", str(OTHER_CPU), *load.argv(f"http://127.0.0.1:{port}/", workdir)]
    with _bench_lock():
        cpus_before = _cpu_busy()
        lobby_before, workers_before = _cpu_seconds((lobby,)), _cpu_seconds(workers)
        started = time.monotonic()
        status, cut_short = procs.run_tool(
            argv, output=output, cwd=workdir, env=dict(os.environ), time_limit=load.seconds + LOAD_TIME_MARGIN
        )
        wall = time.monotonic() - started
        lobby_after, workers_after = _cpu_seconds((lobby,)), _cpu_seconds(workers)
        cpus_after = _cpu_busy()
    text = output.read_text(errors="replace")
    if status != 0 or cut_short:
        raise CeilingError(f"wrk exited with {status}{' at the time limit' if cut_short else ''}: {text[-500:]}")
    measured = load.parse(text, workdir, wall)
    requests = measured["requests"]
    lobby_cpu = lobby_after - lobby_before
    # The lobby is idle outside the load, so its CPU time is spread over the load's own duration.
    utilisation = lobby_cpu / measured["duration_s"]
    busy, steal = {}, {}
    for cpu, (after, before) in ((cpu, (cpus_after[cpu], cpus_before[cpu])) for cpu in cpus_after):
        total = after["total"] - before["total"]
        busy[cpu] = (after["busy"] - before["busy"]) / total
        steal[cpu] = (after["steal"] - before["steal"]) / total
    return {
        "connections": load.connections,
        "requests": requests,
        "rps": measured["rps"],
        "failed": measured["failed"],
        "non2xx": measured["non2xx"],
        "p50_ms": measured["latency_ms"].get("50"),
        "p99_ms": measured["latency_ms"].get("99"),
        "wall_s": wall,
        "lobby_cpu_s": lobby_cpu,
        "lobby_us_per_request": lobby_cpu * 1e6 / requests if requests else None,
        "lobby_utilisation": utilisation,
        "rps_per_lobby_core": measured["rps"] / utilisation if utilisation > 0 else None,
        "workers_utilisation": (workers_after - workers_before) / measured["duration_s"],
        "cpu_busy": busy,
        "cpu_steal": steal,
    }


@contextmanager
def _bench_lock() -> Iterator[None]:
    """Holds /work/bench.lock, waiting for whoever holds it now; closing the file lets it go."""
    with LOCK.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {LOCK}: another benchmark holds it", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _sides(lobby: int, workers: int) -> tuple[int, tuple[int, ...]]:
    """The zygote (the lobby's one child) and the workers (its children), from /proc."""
    children = procs.children(lobby)
    if len(children) != 1:
        raise CeilingError(f"the lobby ({lobby}) has children {children}, where the zygote should be its only one")
    found = tuple(sorted(procs.children(children[0])))
    if len(found) != workers:
        raise CeilingError(f"the zygote has {len(found)} children, where {workers} workers were asked for")
    return children[0], found


def _cpus_allowed(pid: int) -> str:
    """The CPUs every thread of the process may run on, as /proc says (e.g. "0", "0-1")."""
    allowed = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        allowed |= {
            line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list")
        }
    return ",".join(sorted(allowed))


def _cpu_seconds(pids: tuple[int, ...]) -> float:
    try:
        return procs.cpu_seconds(pids)
    except ProcessLookupError as gone:
        raise CeilingError(f"process {gone} of the server ended during the load; see server.log") from None


def _cpu_busy() -> dict[str, dict[str, int]]:
    """Per CPU, from /proc/stat, in ticks: busy (whoever ran), steal (the hypervisor ran another
    machine's work: the cores are shared), and total."""
    found = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name != "cpu":
            # user nice system idle iowait irq softirq steal
            ticks = [int(v) for v in values[:8]]
            found[name] = {"busy": sum(ticks[:3]) + ticks[5] + ticks[6], "steal": ticks[7], "total": sum(ticks)}
    return found


def _git_commit() -> str:
    commit = _first_line(["git", "rev-parse", "--short=12", "HEAD"])
    dirty = _first_line(["git", "status", "--porcelain", "--untracked-files=no"])
    return commit + (" with uncommitted changes" if dirty else "")


def _first_line(argv: list[str]) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=REPO, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unavailable ({error})"
    lines = (result.stdout + result.stderr).strip().splitlines()
    return lines[0] if lines else ""


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


HEADER = (
    "| connections | req/s | lobby CPU µs/request | lobby utilisation | req/s per lobby core | "
    "workers' utilisation | CPU 0 / CPU 1 busy | CPU 0 / CPU 1 steal | p50 / p99 ms | errors |"
)
RULE = "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"


def _row(row: dict) -> str:
    def number(value: float | None, digits: int = 0) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    busy, steal = row["cpu_busy"], row["cpu_steal"]
    return (
        f"| {row['connections']} | {number(row['rps'])} | {number(row['lobby_us_per_request'], 1)} | "
        f"{row['lobby_utilisation']:.0%} | {number(row['rps_per_lobby_core'])} | {row['workers_utilisation']:.0%} | "
        f"{busy.get('cpu0', 0):.0%} / {busy.get('cpu1', 0):.0%} | {steal.get('cpu0', 0):.0%} / {steal.get('cpu1', 0):.0%} | "
        f"{number(row['p50_ms'], 2)} / {number(row['p99_ms'], 2)} | {row['failed'] + (row['non2xx'] or 0)} |"
    )


def _median(rows: list[dict], connections: int) -> dict:
    """A row whose every figure is the median of the loads at `connections`; errors, their sum."""
    loads = [row for row in rows if row["connections"] == connections]

    def median(values: list) -> float | None:
        known = [value for value in values if value is not None]
        return statistics.median(known) if known else None

    merged = {}
    for key, value in loads[0].items():
        if key in ("connections", "failed", "non2xx"):
            merged[key] = sum(row[key] or 0 for row in loads) if key != "connections" else value
        elif isinstance(value, dict):
            merged[key] = {inner: median([row[key][inner] for row in loads]) for inner in value}
        else:
            merged[key] = median([row[key] for row in loads])
    return merged


def _markdown(rows: list[dict], facts: dict) -> str:
    lines = [
        "# The lobby's own ceiling (bench/ceiling.py)",
        "",
        (
            f"{facts['date']}, commit {facts['commit']}. Machine: {facts['nproc']} CPUs ({facts['cpu']}), "
            f"kernel {facts['kernel']}, {facts['wrk']}."
        ),
        "",
        (
            "**This machine has only 2 cores, and they are shared** (other sessions build and measure on it; every "
            "load here held /work/bench.lock, which only the benchmarks take). The lobby has CPU 0; its "
            f"{facts['workers']} stub workers, its zygote and wrk (one thread) share CPU 1. So the load generator and "
            "the workers compete for one core, and req/s is whatever the slower side allows; req/s per lobby core "
            "(req/s divided by the lobby's utilisation) is the ceiling of the lobby alone, assuming its cost per "
            "request stays the same at full use of its core."
        ),
        "",
        "Commands (PORT is a free port):",
        "",
        "```",
        facts["server"],
        *facts["loads"],
        "```",
        "",
        HEADER,
        RULE,
        *(_row(_median(rows, connections)) for connections in dict.fromkeys(row["connections"] for row in rows)),
        "",
        f"Each row: the median of each column over {facts['rounds']} loads, the levels taking turns on one server.",
        "",
        (
            "- lobby CPU: user and system time of every thread of the lobby's process (/proc/PID/stat, 10 ms ticks) "
            "over the load, divided by wrk's completed requests; utilisation: the same time divided by wrk's "
            "duration (the lobby idles before and after it)."
        ),
        "- workers' utilisation: the same for the stub workers together (on CPU 1, beside wrk).",
        (
            "- CPU busy: each core's user, system and interrupt time over the load (/proc/stat), whoever ran there "
            "(the lobby's share of CPU 0 is its utilisation; the rest is other work on the machine); steal: time the "
            "hypervisor gave the core to another machine."
        ),
        f"- affinity as /proc showed it: {facts['affinity']}.",
        "",
        "<details><summary>Every load</summary>",
        "",
        "| round " + HEADER,
        "|---:" + RULE,
        *(f"| {row['round']} {_row(row)}" for row in rows),
        "",
        "</details>",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        procs.stop_all()
        sys.exit(130)
