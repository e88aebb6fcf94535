"""One run: one server, one scenario. Start the server (under strace for S3's accept count), wait
until it is ready, start the proxy in front of it (S5), run the load alone first where the scenario
compares against that and no earlier scenario of the invocation measured it (C1), open the crowd of held connections (C1, M1) and read the server's
memory while they are held (M1), run the load (beside it, reloads or a binary upgrade: R1, U1,
bench/lifecycle.py; or twice, plain and then under strace: H1-hop, bench/hop.py; or curl's
big bodies and an strace pass: BODY-*, bench/body.py), read the
kernel's counters around it, read the server's memory after it (IO1-mem), and stop everything
that was started, in reverse order.

A run's result is a dict: server, run, measurement (measure.py's dict, None when the run failed),
error, cut_short, kernel (counter changes) and extra (the scenario's own figures, named by the
keys of its Columns).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import apps
import body
import body_app
import db_levels
import hop
import lifecycle
import postgres
import procs
from front import HAProxyFront
from measure import (
    ACCEPT_SYSCALLS,
    BodyLoad,
    Load,
    ParseError,
    StreamClients,
    crowd_measurement,
    crowd_reports,
    kernel_counters,
    strace_argv,
    strace_counts,
)
from scenarios import Crowd, Entry, Scenario
from servers import BENCH, DB_APPS, SERVERS

WORK = BENCH / ".work"
# A pause after a server is ready (so its start-up does not share the CPU with the load) and
# between runs (so that one run's closing connections do not overlap the next). Servers here
# finish starting within a few ms of their ready line, and a run's connections are closed by
# the time its server has stopped, so a short pause does; it is paid ~2 x 300 times per suite.
SETTLE_SECONDS = 0.2
# How long a server (or the front proxy) gets to exit on SIGTERM before what is left
# of its process group gets SIGKILL. The measurement is over by then and a clean shutdown is not
# measured; most servers exit within 0.3 s, uWSGI takes 1 s.
STOP_GRACE_SECONDS = 0.5
CROWD_MARKER = "CONNECTIONS-JSON "
# bench/ll_clients.py's line once every stream is open (the LL scenarios read memory then).
OPEN_MARKER = "LL-OPEN "
# O1-HAPROXY: the app's count of the requests it ran is read once it has not grown for this long
# (the server may still be running requests whose clients the proxy has answered already), or
# after RAN_WAIT_SECONDS at most.
RAN_SETTLED_SECONDS = 1.0
RAN_WAIT_SECONDS = 15.0


class RunError(Exception):
    """The run measured nothing; str(error) says why."""


def run_once(
    scenario: Scenario,
    load: Load | None,
    crowd: Crowd | None,
    entry: Entry,
    label: str,
    repetition: int,
    alone: dict | None = None,
    stage: str = "",
    database: postgres.Cluster | None = None,
) -> dict:
    """alone (C1): the figure without the crowd, from a run of the same server under the same load
    in another scenario of this invocation ({"measurement", "source"}); None: measure it here,
    on this server instance, before the crowd arrives. stage: names a run that measures what the
    scenario's runs need first (O1's "capacity"); its logs go beside theirs, into <run>-<stage>.
    database: the cluster the database scenarios' applications use (bench/postgres.py)."""
    server = SERVERS[entry.server]
    slug = "".join(c for c in label.replace(" ", "-") if c.isalnum() or c == "-")
    workdir = WORK / "runs" / scenario.id / slug / (f"{repetition}-{stage}" if stage else str(repetition))
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    port = procs.free_port()
    launch = scenario.launch(entry, port)
    env = dict(os.environ, PYTHONPATH=str(BENCH))
    if scenario.db_tests:
        # The applications' packages (bench/peers/db-apps.txt) before whatever the server's own
        # Python has, so that every server runs the same versions.
        env.update(database.environment(), PYTHONPATH=os.pathsep.join([str(DB_APPS), str(BENCH)]))
    if isinstance(load, BodyLoad):
        # The body file (made once in bench/.work) for the app's GET /file, and Starlette (the ASGI
        # app's FileResponse) from the database applications' packages, for every server alike.
        env[body_app.FILE_VARIABLE] = str(body.body_file(load.mib)[0])
        env["PYTHONPATH"] = os.pathsep.join([str(DB_APPS), str(BENCH)])
    ran_file = workdir / "ran"
    if scenario.count_runs:
        env[apps.RAN_FILE_VARIABLE] = str(ran_file)
    result = {
        "server": label,
        "run": repetition,
        "measurement": None,
        "error": None,
        "cut_short": False,
        "kernel": None,
        "extra": {},
        "wall_s": None,
        "phases_s": {},
    }
    run_began = time.monotonic()
    phases = _Phases(result["phases_s"])
    if scenario.lifecycle:
        if reason := lifecycle.unsupported(scenario.lifecycle, entry.server):
            result["error"] = f"not supported: {reason}"
            result["wall_s"] = 0.0
            return result
        env = lifecycle.prepare(workdir, env)
    argv = server.argv(launch)
    if scenario.trace_accepts:
        argv = strace_argv(workdir / "strace.txt") + argv
    started: list[subprocess.Popen] = []  # stopped in reverse order
    ready_connections = 0
    try:
        process = _start(argv, workdir / "server.log", workdir, env)
        started.append(process)
        ready_connections = procs.wait_ready(
            process,
            port=port,
            log_path=workdir / "server.log",
            log_pattern=server.ready_line(launch) if server.ready_line else None,
            log_count=server.ready_count(launch),
        )
        phases.end("ready")
        target = port
        if scenario.front:
            target = procs.free_port()
            front = _start(
                scenario.front.prepare(port=target, backend=port, workdir=workdir), workdir / "front.log", workdir, env
            )
            started.append(front)
            try:
                procs.wait_ready(front, port=target, log_path=workdir / "front.log", log_pattern=None, log_count=1)
            except procs.StartError as error:
                raise RunError(f"{scenario.front.name} did not start: {error}") from None
        time.sleep(SETTLE_SECONDS)
        phases.end("settle")
        url = f"http://127.0.0.1:{target}/"

        if scenario.alone_first and alone is not None:
            result["alone"] = {"measurement": alone["measurement"], "cut_short": False, "source": alone["source"]}
            result["extra"]["alone_rps"] = alone["measurement"]["rps"]
        elif scenario.alone_first:
            alone_measured, alone_cut = _load(load, url, workdir / "alone", env, scenario.limit())
            result["alone"] = {
                "measurement": alone_measured,
                "cut_short": alone_cut,
                "source": "this run, before the crowd",
            }
            result["extra"]["alone_rps"] = alone_measured["rps"]
            time.sleep(SETTLE_SECONDS)

        if scenario.count_runs:
            # The readiness checks' requests are not the load's.
            ran_before = _ran(ran_file)
            proxy_log_from = (workdir / "front.log").stat().st_size
        before = kernel_counters()
        began = time.monotonic()
        if crowd:
            rss_before = procs.group_rss_kb(process.pid)
            crowd_process = _start(
                crowd.argv(sys.executable, target, crowd.open_seconds + scenario.limit() + 10),
                workdir / "crowd.out",
                workdir,
                env,
            )
            started.append(crowd_process)
            line = procs.wait_for_line(crowd_process, workdir / "crowd.out", CROWD_MARKER, crowd.open_seconds + 10)
            if line is None:
                raise RunError(f"connections.py held nothing; its output ends: {_last_line(workdir / 'crowd.out')}")
            holding = json.loads(line[len(CROWD_MARKER) :])
            time.sleep(crowd.idle_seconds)
            rss_holding = procs.group_rss_kb(process.pid)

        if scenario.lifecycle:
            measurement, result["cut_short"], figures, result["detail"] = lifecycle.run(
                scenario.lifecycle,
                entry.server,
                process,
                port,
                workdir,
                env,
                launch.workers,
                load.seconds,
                lambda: _load(load, url, workdir, env, scenario.limit()),
            )
            result["extra"].update(figures)
        elif scenario.count_hop:
            measurement, result["cut_short"], figures, result["hop"] = hop.run(
                process, launch.workers, workdir, env, lambda where: _load(load, url, where, env, scenario.limit())
            )
            result["extra"].update(figures)
        elif scenario.db_tests:
            measurement, result["cut_short"], result["levels"] = db_levels.run(
                scenario.db_tests,
                load,
                process.pid,
                port,
                database.cpu_seconds,
                lambda shaped, path, where: _load(shaped, url.rstrip("/") + path, where, env, scenario.limit()),
                workdir,
            )
            result["extra"].update(measurement.pop("figures"))
        elif isinstance(load, BodyLoad):
            measurement, result["cut_short"], figures, result["body"] = body.run(load, process, port, workdir, env)
            result["extra"].update(figures)
        elif isinstance(load, StreamClients):
            measurement, result["cut_short"] = _stream_load(load, url, process.pid, workdir, env, scenario.limit())
            result["extra"].update(measurement.pop("figures"))
        elif load:
            measurement, result["cut_short"] = _load(load, url, workdir, env, scenario.limit())
            result["extra"].update(measurement.pop("figures", {}))
        else:
            measurement = crowd_measurement(holding, time.monotonic() - began)
        phases.end("load")
        after = kernel_counters()
        result["kernel"] = {name: after[name] - before[name] for name in after}
        if scenario.count_runs:
            proxy_log = (workdir / "front.log").read_bytes()[proxy_log_from:].decode(errors="replace")
            result["extra"].update(_runs_and_outcomes(_ran_settled(ran_file) - ran_before, scenario.front, proxy_log))
        if scenario.memory_after_load:
            result["extra"].update(_memory_figures(procs.group_memory(process.pid)))

        if crowd:
            procs.stop(crowd_process)
            started.remove(crowd_process)
            end = crowd_reports((workdir / "crowd.out").read_text(errors="replace")).get("end")
            if end is None:
                raise RunError("connections.py did not report its end; see crowd.out")
            result["extra"].update(_crowd_figures(crowd, holding, end, rss_before, rss_holding))
        if scenario.alone_first:
            alone_rps = result["extra"]["alone_rps"]
            result["extra"]["pct_alone"] = 100 * measurement["rps"] / alone_rps if alone_rps else None
        # In an upgrade the old master's exit is the point (its exit code is among the figures).
        if process.poll() is not None and not isinstance(scenario.lifecycle, lifecycle.Upgrade):
            result["error"] = f"the server exited during the run with status {process.returncode}"
        result["measurement"] = measurement
    except procs.StartError as error:
        result["error"] = f"did not start: {error}"
    except (RunError, lifecycle.LifecycleError, hop.HopError, body.BodyError) as error:
        result["error"] = str(error)
    finally:
        phases.end("measured")
        for each in reversed(started):
            if each is started[0] and scenario.trace_accepts:
                procs.stop_wrapped(each)
            else:
                procs.stop(each, grace=STOP_GRACE_SECONDS)
        phases.end("stop")

    result["wall_s"] = round(time.monotonic() - run_began, 1)
    if scenario.trace_accepts and result["measurement"]:
        # ab without -k opens one connection per request; the readiness checks opened the rest.
        connections = result["measurement"]["requests"] + ready_connections
        figures = _accept_figures(workdir / "strace.txt", connections)
        if figures is None:
            result["error"] = "strace wrote no summary (strace.txt); no accept count"
        else:
            result["extra"].update(figures)
    return result


class _Phases:
    """Where a run's time goes, for keeping the suite's own cost in view: seconds from the end of
    the previous phase to the end of each named one, written into the dict given."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into = into
        self.last = time.monotonic()

    def end(self, name: str) -> None:
        now = time.monotonic()
        self.into[name] = round(now - self.last, 3)
        self.last = now


def _start(argv: list[str], log_path: Path, workdir: Path, env: dict[str, str]) -> subprocess.Popen:
    with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
        return procs.start(argv, log=log, cwd=workdir, env=env)


def _load(load: Load, url: str, workdir: Path, env: dict[str, str], limit: float) -> tuple[dict, bool]:
    """Runs the load tool once against url; returns its measurement and whether the time limit
    cut it short."""
    workdir.mkdir(exist_ok=True)
    began = time.monotonic()
    status, cut_short = procs.run_tool(
        load.argv(url, workdir), output=workdir / "tool.out", cwd=workdir, env=env, time_limit=limit
    )
    seconds = time.monotonic() - began
    output = (workdir / "tool.out").read_text(errors="replace")
    try:
        return load.parse(output, workdir, seconds), cut_short
    except ParseError as error:
        raise RunError(f"{load.tool} exited with status {status}; {error}") from None


def _stream_load(
    load: StreamClients, url: str, pgid: int, workdir: Path, env: dict[str, str], limit: float
) -> tuple[dict, bool]:
    """The LL scenarios (bench/ll_clients.py): the server's memory (every process of its group:
    procs.group_memory) read just before the clients start and again when they say every stream
    is open (or has failed, or the time to open them is over), the growth divided by the streams
    open then; the rest as _load."""
    workdir.mkdir(exist_ok=True)
    before = procs.group_memory(pgid)
    began = time.monotonic()
    output = workdir / "tool.out"
    with output.open("wb") as log:
        client = procs.start(load.argv(url, workdir), log=log, cwd=workdir, env=env)
    cut_short = False
    try:
        line = procs.wait_for_line(client, output, OPEN_MARKER, limit)
        holding = procs.group_memory(pgid) if line else None
        try:
            client.wait(timeout=max(1.0, limit - (time.monotonic() - began)))
        except subprocess.TimeoutExpired:
            cut_short = True
            procs.interrupt(client)
            try:
                client.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
    finally:
        procs.stop(client, grace=1.0)
    text = output.read_text(errors="replace")
    try:
        measurement = load.parse(text, workdir, time.monotonic() - began)
    except ParseError as error:
        raise RunError(f"{load.tool} exited with status {client.returncode}; {error}") from None
    opened = json.loads(line[len(OPEN_MARKER) :]) if line else {"open": 0, "failed": load.clients}
    figures = measurement["figures"]
    figures["rss_before_mb"] = before["rss_kb"] / 1024
    figures["pss_before_mb"] = before["pss_kb"] / 1024
    figures["open_at_memory"] = opened["open"]
    # Every client connection not failed by then: open streams, and those still waiting for theirs
    # (a server that holds more connections than it serves streams holds their memory too).
    figures["held_at_memory"] = load.clients - opened["failed"]
    figures["open_at_s"] = opened.get("at_s")
    if holding is not None:
        figures["rss_growth_mb"] = (holding["rss_kb"] - before["rss_kb"]) / 1024
        figures["pss_growth_mb"] = (holding["pss_kb"] - before["pss_kb"]) / 1024
        # Per stream only where enough were open for the figure to mean something (M1's rule).
        enough = opened["open"] >= load.clients / 100
        figures["rss_kb_per_stream"] = (holding["rss_kb"] - before["rss_kb"]) / opened["open"] if enough else None
        figures["pss_kb_per_stream"] = (holding["pss_kb"] - before["pss_kb"]) / opened["open"] if enough else None
        held = figures["held_at_memory"]
        figures["rss_kb_per_held"] = (
            (holding["rss_kb"] - before["rss_kb"]) / held if held >= load.clients / 100 else None
        )
    return measurement, cut_short


def _ran(path: Path) -> int:
    """How many requests apps.cpu_3ms_counted has run: one byte each."""
    return path.stat().st_size if path.exists() else 0


def _ran_settled(path: Path) -> int:
    """_ran once the count has stopped growing for RAN_SETTLED_SECONDS (at most RAN_WAIT_SECONDS):
    requests the server runs after the load has ended are the ones the proxy gave up on."""
    count, changed = _ran(path), time.monotonic()
    deadline = changed + RAN_WAIT_SECONDS
    while time.monotonic() - changed < RAN_SETTLED_SECONDS and time.monotonic() < deadline:
        time.sleep(0.1)
        if (now := _ran(path)) != count:
            count, changed = now, time.monotonic()
    return count


def _runs_and_outcomes(ran: int, front: HAProxyFront, proxy_log: str) -> dict:
    """O1-HAPROXY: what became of the requests at the proxy (front.outcomes), how many the app ran,
    and how many of those the proxy did not get a 200 from in time: run after it had given up."""
    outcomes = front.outcomes(proxy_log)
    unanswered = ran - outcomes["proxy_200"]
    return {
        **outcomes,
        "ran": ran,
        "ran_unanswered": unanswered,
        "pct_ran_unanswered": 100 * unanswered / outcomes["proxy_requests"] if outcomes["proxy_requests"] else None,
    }


def _crowd_figures(crowd: Crowd, holding: dict, end: dict, rss_before: int, rss_holding: int) -> dict:
    """The crowd's figures: how many connections it opened and held, what the server closed, and
    (read while they were held) how much the server's memory grew."""
    growth = rss_holding - rss_before
    # After an idle period, what the server still holds at the end (it may have closed some).
    held = min(holding["held"], end["held"]) if crowd.idle_seconds else holding["held"]
    return {
        "crowd_count": holding["count"],
        "crowd_opened": holding["opened"],
        "crowd_held": held,
        "crowd_closed": holding["closed"],
        "crowd_open_end": end["open"],
        "crowd_closed_end": end["closed"],
        "crowd_answered_end": end["answered"],
        "rss_before_mb": rss_before / 1024,
        "rss_growth_mb": growth / 1024,
        # Per connection only where the server held enough of them for the figure to mean
        # something (a server that closed them all grew by nothing per connection it held).
        "kb_per_held": growth / held if held >= crowd.count / 100 else None,
    }


def _memory_figures(memory: dict[str, int]) -> dict:
    return {
        "processes": memory["processes"],
        "threads": memory["threads"],
        "rss_mb": memory["rss_kb"] / 1024,
        "pss_mb": memory["pss_kb"] / 1024,
    }


def _accept_figures(summary: Path, connections: int) -> dict | None:
    if not summary.exists() or not summary.read_text().strip():
        return None
    counts = strace_counts(summary.read_text())
    calls = sum(counts.get(name, (0, 0))[0] for name in ACCEPT_SYSCALLS)
    failed = sum(counts.get(name, (0, 0))[1] for name in ACCEPT_SYSCALLS)
    return {
        "accept_calls": calls,
        "accept_failed": failed,
        "connections": connections,
        "accepts_per_conn": calls / connections if connections else None,
    }


def _last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return lines[-1] if lines else "(nothing)"


def brief(result: dict) -> str:
    """One line for the console."""
    m = result["measurement"]
    if m is None:
        return f"ERROR {result['error'].splitlines()[0]}  [{result['wall_s']} s]"

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} ms"

    text = ("" if m["rps"] is None else f"{m['rps']:9.0f} req/s  ") + (
        f"failed {m['failed']}  non-2xx {m['non2xx']}  "
        f"p99 {ms(m['latency_ms'].get('99'))}  max {ms(m['max_ms'])}  "
        f"overflows {result['kernel']['ListenOverflows']}"
    )
    if m["keepalive"] is not None:
        text += f"  keep-alive {m['keepalive']}"
    for key, value in result["extra"].items():
        shown = "-" if value is None else f"{value:.0f}" if value == int(value) else f"{value:.2f}"
        text += f"  {key} {shown}"
    if result["cut_short"]:
        text += f"  (stopped at the time limit after {m['requests']} requests)"
    if m.get("gave_up"):
        text += f"  ({m['gave_up']})"
    text += f"  [{result['wall_s']} s]"
    return text + (f"  [{result['error']}]" if result["error"] else "")
