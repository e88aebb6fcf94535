"""H1-hop: what maitred's hop between the lobby and its workers costs each side, per request, in
system calls, in voluntary context switches (sleeps) and in CPU time.

Each run serves one load twice on the same server. First plain: the voluntary context switches
of every thread of each side are read from /proc/<pid>/task/*/status, and the CPU time (user and
system) of each process from /proc/<pid>/stat, just before and just after it, since ptrace
changes when processes sleep and wake and what they cost. Then with strace attached to each side
apart (one strace on the lobby, one on the workers), counting every system call. Each figure is
divided by the requests the load tool reports as completed in its own load.

The sides come from the process tree: the lobby is the process the harness started, the zygote
its only child, the workers the zygote's children.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import procs
from measure import strace_attach_argv, strace_counts

# How long strace may take to attach to every thread, and to write its counts once interrupted.
STRACE_WAIT_SECONDS = 10.0


class HopError(Exception):
    """The run measured nothing; str(error) says why."""


@dataclass(frozen=True)
class Sides:
    lobby: int
    zygote: int
    workers: tuple[int, ...]


def _sides(lobby: int, workers: int) -> Sides:
    """The server's processes by role, from /proc; HopError when the tree has another shape."""
    lobby_children = procs.children(lobby)
    if len(lobby_children) != 1:
        raise HopError(
            f"the lobby ({lobby}) has {len(lobby_children)} children, where the zygote should be its only one"
        )
    zygote = lobby_children[0]
    found = tuple(sorted(procs.children(zygote)))
    if len(found) != workers:
        raise HopError(f"the zygote ({zygote}) has {len(found)} children, where {workers} workers were asked for")
    return Sides(lobby, zygote, found)


def run(
    process: subprocess.Popen,
    workers: int,
    workdir: Path,
    env: dict[str, str],
    run_load: Callable[[Path], tuple[dict, bool]],
) -> tuple[dict, bool, dict, dict]:
    """Runs the load plain, then under strace (run_load: the load tool's measurement into the
    directory given, and whether the time limit cut it short). Returns the plain load's
    measurement, whether either load was cut short, the figures per request, and the raw counts
    ({"traced": the traced load's measurement, "calls": {side: {call: count}}})."""
    roles = _sides(process.pid, workers)
    by_side = {"lobby": (roles.lobby,), "workers": roles.workers, "zygote": (roles.zygote,)}
    before = {side: _per_thread(pids, "voluntary_ctxt_switches") for side, pids in by_side.items()}
    cpu_before = {side: _cpu_seconds(pids) for side, pids in by_side.items()}
    plain, plain_cut = run_load(workdir / "plain")
    cpu_after = {side: _cpu_seconds(pids) for side, pids in by_side.items()}
    after = {side: _per_thread(pids, "voluntary_ctxt_switches") for side, pids in by_side.items()}
    if _sides(process.pid, workers) != roles:
        raise HopError("the server's processes changed during the load (a worker replaced?); see server.log")
    switches = {side: _switched(before[side], after[side]) for side in before}

    # The zygote takes no part in a request (its switches say whether it woke at all): its calls
    # are not counted.
    tracers = {}
    try:
        for side in ("lobby", "workers"):
            tracers[side] = attach_strace(
                by_side[side], workdir / f"strace-{side}.txt", workdir / f"strace-{side}.log", env
            )
        traced, traced_cut = run_load(workdir / "traced")
    finally:
        for tracer in tracers.values():
            detach_strace(tracer)
    calls = {side: _counts(workdir / f"strace-{side}.txt") for side in tracers}
    totals = {side: sum(counts.values()) for side, counts in calls.items()}

    figures = {
        "traced_rps": traced["rps"],
        "hop_calls": _per_request(totals["lobby"] + totals["workers"], traced),
        "lobby_calls": _per_request(totals["lobby"], traced),
        "worker_calls": _per_request(totals["workers"], traced),
        "lobby_switches": _per_request(switches["lobby"], plain),
        "worker_switches": _per_request(switches["workers"], plain),
        "zygote_switches": switches["zygote"],
        **{
            f"{side}_cpu_us": _per_request((cpu_after[side] - cpu_before[side]) * 1e6, plain)
            for side in ("lobby", "workers")
        },
    }
    figures["server_cpu_us"] = _per_request(sum(cpu_after[side] - cpu_before[side] for side in by_side) * 1e6, plain)
    return plain, plain_cut or traced_cut, figures, {"traced": traced, "calls": calls}


def _per_thread(pids: tuple[int, ...], field: str) -> dict[int, int]:
    """procs.per_thread, and HopError when a process has ended."""
    try:
        return procs.per_thread(pids, field)
    except ProcessLookupError as gone:
        raise HopError(f"process {gone} of the server ended during the run; see server.log") from None


def _cpu_seconds(pids: tuple[int, ...]) -> float:
    """procs.cpu_seconds (a load of 20,000 requests at some 40 us each spends about 80 of its 10 ms
    ticks), and HopError when a process has ended."""
    try:
        return procs.cpu_seconds(pids)
    except ProcessLookupError as gone:
        raise HopError(f"process {gone} of the server ended during the run; see server.log") from None


def _switched(before: dict[int, int], after: dict[int, int]) -> int:
    """The switches between two readings: a thread born in between counts from 0; one that ended
    in between takes its last switches with it, which no reading can recover (the processes of
    both sides keep their threads for their whole life under this load)."""
    return sum(count - before.get(tid, 0) for tid, count in after.items())


def _per_request(count: int, measurement: dict) -> float | None:
    return count / measurement["requests"] if measurement["requests"] else None


def attach_strace(pids: tuple[int, ...], summary: Path, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """Starts strace on pids (every thread of each) and returns once it traces all of them, as
    /proc shows (TracerPid), so that the load starts with every call counted."""
    with log.open("wb") as output:
        tracer = procs.start(strace_attach_argv(summary, pids), log=output, cwd=summary.parent, env=env)
    deadline = time.monotonic() + STRACE_WAIT_SECONDS
    while not all(tracing == tracer.pid for tracing in _per_thread(pids, "TracerPid").values()):
        if tracer.poll() is not None or time.monotonic() > deadline:
            detach_strace(tracer)
            raise HopError(f"strace did not attach to {pids}: {log.read_text(errors='replace').strip() or 'no output'}")
        time.sleep(0.01)
    return tracer


def detach_strace(tracer: subprocess.Popen) -> None:
    """SIGINT makes strace detach from its tracees, which run on, and write its counts."""
    procs.interrupt(tracer)
    try:
        tracer.wait(timeout=STRACE_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    procs.stop(tracer)


def _counts(summary: Path) -> dict[str, int]:
    text = summary.read_text() if summary.exists() else ""
    if not text.strip():
        raise HopError(f"strace wrote no counts ({summary.name})")
    return {name: calls for name, (calls, _failed) in strace_counts(text).items()}
