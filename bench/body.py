"""The BODY scenarios (issue 49): big bodies up and down, with curl as the client.

One run, on one server started by runner.py:

1. The timed pass: the load's fast clients (curl processes, each in a process group of its own)
   started together, and for the slow-reader cases one more curl at --limit-rate beside them,
   whose body the harness reads from a pipe and counts (stopped once the fast ones are done, or
   after its seconds). MB/s is the fast clients' bytes (10^6 a MB) over the wall seconds from the
   first start to the last exit, on the client's side; CPU per GiB the server tree's utime + stime
   (every process below the one the harness started, those reaped meanwhile included:
   procs.tree_cpu_seconds) around the pass, over the fast clients' GiB (2^30 bytes). Every 50 ms
   the server tree's RSS (VmRSS summed) and its temporary files (deleted regular files any of its
   processes holds open, from /proc/PID/fd: their disk blocks, each file once) are read; the peaks
   over the pass, the RSS as growth over the reading before it, are figures.
2. BODY-SLOW-GENERATED only, before that pass: one fast reader alone (the worker CPU of one fast
   answer) and the slow reader alone for its seconds (the worker CPU its answer costs, counted
   until the server tree's CPU has been still for a second after the reader left, at most 30 s).
   The workers are every process of the tree but the one the harness started.
3. The strace pass, apart from the timing: `strace -f -c` attached to every process of the tree
   (hop.py's way), one fast transfer, then strace detached; its system calls over that
   transfer's GiB.

Every curl has --max-time, every pass a bound in seconds (measure.body_pass_limit), and the
harness stops each curl's process group when its pass ends.
"""

from __future__ import annotations

import hashlib
import os
import re
import resource
import stat
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import hop
import procs
from measure import BodyLoad, body_pass_limit, strace_counts
from servers import BENCH

WORK = BENCH / ".work"
SAMPLE_SECONDS = 0.05
GIB = 1024**3
# The slow reader's worker CPU is counted until the tree's CPU has been still this long.
SETTLED_SECONDS = 1.0
SETTLE_WAIT_SECONDS = 30.0
STRACE_LIMIT_SECONDS = 120.0


def body_file(mib: int) -> tuple[Path, str]:
    """The upload and download body: `mib` MiB of random bytes in bench/.work, made once (not
    committed), and its sha256 (kept beside it)."""
    path = WORK / f"body-{mib}MiB.bin"
    digest_path = path.with_suffix(".sha256")
    if path.exists() and path.stat().st_size == mib * 1024 * 1024 and digest_path.exists():
        # Read through once, so that the page cache holds it: the first server's first pass
        # otherwise waits for the disk (BODY-UP-WSGI-CL-1 of 2026-12-03 07:04: maitred, first in
        # line, 279 MB/s with curl at 1.42 s of CPU; 793 MB/s in a run before with the file cached).
        with path.open("rb") as cached:
            while cached.read(8 * 1024 * 1024):
                pass
        return path, digest_path.read_text().strip()
    WORK.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    partial = path.with_suffix(".partial")
    with partial.open("wb") as out:
        for _ in range(mib):
            piece = os.urandom(1024 * 1024)
            digest.update(piece)
            out.write(piece)
    partial.rename(path)
    digest_path.write_text(digest.hexdigest() + "\n")
    return path, digest.hexdigest()


class BodyError(Exception):
    """The run measured nothing; str(error) says why."""


def run(load: BodyLoad, process: subprocess.Popen, port: int, workdir: Path, env: dict[str, str]) -> tuple:
    """The passes of one run. Returns (measurement, cut short, figures, raw): measure.py's common
    dict (requests: fast transfers right; failed: those wrong or failed; no latencies), whether a
    pass hit its bound, the scenario's figures, and the raw per-transfer results and call counts."""
    path, digest = body_file(load.mib)
    url = f"http://127.0.0.1:{port}"
    top = process.pid
    figures: dict = {"bound_mib": load.bound_mib}
    raw: dict = {}
    cut = False
    errors: dict[str, int] = {}

    if load.kind == "generated":
        fast_alone = _pass(replace(load, clients=1), url, path, top, workdir / "fast-alone", with_slow=False)
        slow_alone = _pass(replace(load, clients=0), url, path, top, workdir / "slow-alone", with_slow=True)
        slow_alone["worker_cpu_s"] += _settle(top)
        raw["fast_alone"], raw["slow_alone"] = fast_alone, slow_alone
        cut = cut or fast_alone["cut"] or slow_alone["cut"]
        figures["fast_worker_cpu_s"] = fast_alone["worker_cpu_s"]
        figures["slow_worker_cpu_s"] = slow_alone["worker_cpu_s"]
        figures["slow_alone_mb"] = slow_alone["slow_bytes"] / 1e6
        _count_errors(errors, fast_alone, load, digest)
        _count_errors(errors, slow_alone, load, digest)
        time.sleep(0.5)

    timed = _pass(load, url, path, top, workdir / "timed", with_slow=load.slow)
    raw["timed"] = timed
    cut = cut or timed["cut"]
    right = _count_errors(errors, timed, load, digest)
    fast_bytes = sum(t["bytes"] for t in timed["transfers"])
    gib = fast_bytes / GIB
    figures.update(
        transfers=len(timed["transfers"]),
        mb_s=fast_bytes / 1e6 / timed["wall_s"] if timed["wall_s"] else None,
        cpu_s_per_gib=timed["cpu_s"] / gib if gib else None,
        worker_cpu_s_per_gib=timed["worker_cpu_s"] / gib if gib else None,
        pass_s=timed["wall_s"],
        client_cpu_s=timed["client_cpu_s"],
    )
    passes = [timed, *(raw[name] for name in ("fast_alone", "slow_alone") if name in raw)]
    figures["rss_before_mb"] = timed["rss_before_kb"] / 1024
    figures["rss_growth_mb"] = max(p["rss_peak_kb"] - p["rss_before_kb"] for p in passes) / 1024
    figures["disk_mb"] = max(p["disk_peak"] for p in passes) / 2**20
    figures["held_mb"] = max(p["held_peak"] for p in passes) / 2**20
    if load.slow:
        figures["slow_mb"] = timed["slow_bytes"] / 1e6
        figures["slow_mb_s"] = timed["slow_bytes"] / 1e6 / timed["slow_s"] if timed["slow_s"] else None

    time.sleep(0.5)
    traced, calls = _strace_pass(load, url, path, top, workdir / "strace", env)
    raw["strace"] = {"pass": traced, "calls": calls}
    traced_bytes = sum(t["bytes"] for t in traced["transfers"])
    cut = cut or traced["cut"]
    figures["strace_mb"] = traced_bytes / 1e6
    figures["calls_per_gib"] = sum(calls.values()) / (traced_bytes / GIB) if traced_bytes else None
    raw["calls_per_gib"] = (
        {name: count / (traced_bytes / GIB) for name, count in sorted(calls.items(), key=lambda item: -item[1])}
        if traced_bytes
        else {}
    )

    failed = sum(errors.values())
    figures["errors"] = failed
    measurement = {
        "requests": right,
        "rps": None,
        "duration_s": timed["wall_s"],
        "failed": failed,
        "failed_detail": errors,
        "non2xx": sum(count for error, count in errors.items() if error.startswith("status ")),
        "keepalive": None,
        "latency_ms": {},
        "max_ms": None,
        "mean_ms": None,
        "connect_max_ms": None,
        "gave_up": None,
    }
    return measurement, cut, figures, raw


def _count_errors(errors: dict[str, int], result: dict, load: BodyLoad, digest: str) -> int:
    """Adds the pass's failed or wrong fast transfers to errors (by kind); returns the right ones."""
    right = 0
    for transfer in result["transfers"]:
        why = transfer["error"]
        if why is None and transfer["status"] != 200:
            why = f"status {transfer['status']}"
        if why is None and load.kind == "upload" and transfer["answer"] != digest:
            why = "wrong sha256"
        if why is None and load.kind != "upload" and transfer["bytes"] != load.size:
            why = "wrong length"
        if why is None:
            right += 1
        else:
            errors[why] = errors.get(why, 0) + 1
    if result.get("slow_error"):
        errors[f"slow reader: {result['slow_error']}"] = errors.get(f"slow reader: {result['slow_error']}", 0) + 1
    return right


class _Sampler(threading.Thread):
    """Reads the server tree's RSS and temporary-file disk every SAMPLE_SECONDS; keeps the peaks."""

    def __init__(self, top: int) -> None:
        super().__init__(daemon=True)
        self.top = top
        self.stopped = threading.Event()
        self.rss_peak_kb = 0
        self.disk_peak = 0
        self.held_peak = 0
        self.rss_before_kb = tree_rss_kb(top)

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(SAMPLE_SECONDS)

    def sample(self) -> None:
        rss, disk = tree_rss_kb(self.top), tree_temp_disk(self.top)
        self.rss_peak_kb = max(self.rss_peak_kb, rss)
        self.disk_peak = max(self.disk_peak, disk)
        self.held_peak = max(self.held_peak, (rss - self.rss_before_kb) * 1024 + disk)

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        self.sample()


def _tree(top: int) -> list[int]:
    return [top, *procs.descendants(top)]


def tree_rss_kb(top: int) -> int:
    total = 0
    for pid in _tree(top):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total


def tree_temp_disk(top: int) -> int:
    """Bytes of disk taken by deleted regular files the tree's processes hold open (a temporary
    file, as maitred's lobby spills bodies and answers to): each file once, by its blocks."""
    seen, total = set(), 0
    for pid in _tree(top):
        try:
            fds = os.scandir(f"/proc/{pid}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    if not os.readlink(fd.path).endswith(" (deleted)"):
                        continue
                    info = os.stat(fd.path)
                except OSError:
                    continue
                if (info.st_dev, info.st_ino) in seen or not stat.S_ISREG(info.st_mode):
                    continue
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


def _own_cpu_seconds(pid: int) -> float:
    """The process's own CPU time (not its children's): the lobby's, or the peer's master's."""
    try:
        return procs.cpu_seconds([pid])
    except ProcessLookupError:
        raise BodyError(f"the server's process {pid} ended during the run; see server.log") from None


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class _SlowReader:
    """curl at --limit-rate with its body on a pipe, which a thread reads and counts."""

    def __init__(self, load: BodyLoad, url: str, path: Path, workdir: Path, seconds: float) -> None:
        argv = load.curl_argv(url, str(path), "-", rate=load.slow_rate)
        argv[1:1] = ["--max-time", f"{seconds:g}"]
        argv[argv.index("-w") : argv.index("-w") + 2] = []
        self.log = (workdir / "slow.err").open("wb")
        self.began = time.monotonic()
        self.process = procs.start_piped(argv, log=self.log, cwd=workdir, env=dict(os.environ))
        self.bytes = 0
        self.ended = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while piece := self.process.stdout.read1(1 << 20):
            self.bytes += len(piece)
        self.ended = time.monotonic()

    def stop(self) -> tuple[int, float, str | None]:
        """Stops it if it still reads; (bytes, seconds read, error or None)."""
        procs.stop(self.process, grace=0.5)
        self.reader.join(timeout=5)
        self.log.close()
        ended = self.ended or time.monotonic()
        # curl's 28 is --max-time's; a stop by signal is this pass's own doing.
        code = self.process.returncode
        error = None if code in (0, 28) or code < 0 else f"curl exit {code}"
        return self.bytes, ended - self.began, error


def _pass(
    load: BodyLoad, url: str, path: Path, top: int, workdir: Path, *, with_slow: bool, limit: float | None = None
) -> dict:
    """One pass: load.clients fast transfers at once (and the slow reader), timed and measured."""
    workdir.mkdir(parents=True, exist_ok=True)
    limit = limit or body_pass_limit(load)
    sampler = _Sampler(top)
    sampler.start()
    client_before = _children_cpu()
    cpu_before, own_before = procs.tree_cpu_seconds(top), _own_cpu_seconds(top)
    began = time.monotonic()
    slow_seconds = load.slow_seconds if load.kind == "generated" or not load.clients else limit
    slow = _SlowReader(load, url, path, workdir, slow_seconds) if with_slow else None
    clients = []
    for index in range(load.clients):
        # An upload's answer is its sha256; a download's body goes nowhere.
        out = str(workdir / f"answer-{index}") if load.kind == "upload" else os.devnull
        argv = load.curl_argv(url, str(path), out)
        argv[1:1] = ["--max-time", f"{limit:g}"]
        log = (workdir / f"curl-{index}.out").open("wb")
        clients.append((procs.start(argv, log=log, cwd=workdir, env=dict(os.environ)), log))
    cut = False
    for client, log in clients:
        if not procs.wait_exit(client, limit + 5 - (time.monotonic() - began)):
            cut = True
        procs.stop(client, grace=0.5)
        log.close()
    # The fast clients' wall seconds and the server's CPU over them (a slow reader alone: over it).
    wall = time.monotonic() - began
    cpu = procs.tree_cpu_seconds(top) - cpu_before
    own = _own_cpu_seconds(top) - own_before
    if slow and (load.kind == "generated" or not clients):
        # Its --max-time bounds it: it reads for its seconds whatever the fast ones do.
        try:
            slow.process.wait(timeout=max(0.1, slow_seconds + 5 - (time.monotonic() - began)))
        except subprocess.TimeoutExpired:
            cut = True
    slow_bytes, slow_s, slow_error = slow.stop() if slow else (0, 0.0, None)
    if not clients:
        wall = time.monotonic() - began
        cpu = procs.tree_cpu_seconds(top) - cpu_before
        own = _own_cpu_seconds(top) - own_before
    sampler.stop()
    transfers = [
        _transfer(workdir, index, client.returncode, load.kind) for index, (client, _log) in enumerate(clients)
    ]
    return {
        "transfers": transfers,
        "wall_s": wall,
        "cut": cut or any((t["error"] or "").startswith("curl exit 28") for t in transfers),
        "cpu_s": cpu,
        "worker_cpu_s": cpu - own,
        "client_cpu_s": _children_cpu() - client_before,
        "rss_before_kb": sampler.rss_before_kb,
        "rss_peak_kb": sampler.rss_peak_kb,
        "disk_peak": sampler.disk_peak,
        "held_peak": sampler.held_peak,
        "slow_bytes": slow_bytes,
        "slow_s": slow_s,
        "slow_error": slow_error,
    }


def _transfer(workdir: Path, index: int, code: int | None, kind: str) -> dict:
    """One curl's outcome: its -w line (`status uploaded downloaded seconds`), its exit status and
    what it printed besides (-sS: its error), and the answer (an upload's sha256)."""
    lines = (workdir / f"curl-{index}.out").read_text(errors="replace").strip().splitlines()
    answer_path = workdir / f"answer-{index}"
    answer = answer_path.read_text(errors="replace").strip()[:80] if answer_path.exists() else ""
    written = next((line.split() for line in reversed(lines) if _WRITE_OUT.match(line)), None)
    said = " ".join(line for line in lines if not _WRITE_OUT.match(line))[-200:]
    error = None if code == 0 else f"curl exit {code}" + (f": {said}" if said else "")
    if written is None:
        return {
            "status": None,
            "bytes": 0,
            "seconds": None,
            "answer": answer,
            "error": error or "curl wrote no -w line",
        }
    status, uploaded, downloaded, seconds = int(written[0]), int(written[1]), int(written[2]), float(written[3])
    if error is None and status == 0:
        error = "no answer"
    return {
        "status": status,
        "bytes": uploaded if kind == "upload" else downloaded,
        "seconds": seconds,
        "answer": answer,
        "error": error,
    }


_WRITE_OUT = re.compile(r"^\d{3} \d+ \d+ [\d.]+$")


def _settle(top: int) -> float:
    """The workers' CPU from now until the tree's has been still for SETTLED_SECONDS (at most
    SETTLE_WAIT_SECONDS): what an answer costs after its client has gone."""
    began = time.monotonic()
    start = last = procs.tree_cpu_seconds(top) - _own_cpu_seconds(top)
    still_since = time.monotonic()
    while time.monotonic() - still_since < SETTLED_SECONDS and time.monotonic() - began < SETTLE_WAIT_SECONDS:
        time.sleep(0.1)
        now = procs.tree_cpu_seconds(top) - _own_cpu_seconds(top)
        if now > last + 0.02:
            last, still_since = now, time.monotonic()
    return last - start


def _strace_pass(
    load: BodyLoad, url: str, path: Path, top: int, workdir: Path, env: dict[str, str]
) -> tuple[dict, dict[str, int]]:
    """One fast transfer with strace attached to every process of the server: its calls by name."""
    workdir.mkdir(parents=True, exist_ok=True)
    summary = workdir / "strace.txt"
    try:
        tracer = hop.attach_strace(tuple(_tree(top)), summary, workdir / "strace.log", env)
    except hop.HopError as error:
        raise BodyError(str(error)) from None
    try:
        traced = _pass(replace(load, clients=1), url, path, top, workdir, with_slow=False, limit=STRACE_LIMIT_SECONDS)
    finally:
        hop.detach_strace(tracer)
    text = summary.read_text() if summary.exists() else ""
    if not text.strip():
        raise BodyError("strace wrote no counts (strace.txt)")
    return traced, {name: calls for name, (calls, _failed) in strace_counts(text).items()}
