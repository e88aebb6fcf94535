"""SOAK (issue 31): minutes of mixed, checked load with a fault every 20 s, against maitred (its
WSGI application and an ASGI twin, each on an instance of its own) and gunicorn's gthread worker
under the same schedule, at the same moments.

    flock /work/bench.lock python3 bench/run.py -s SOAK                    # 8 minutes
    flock /work/bench.lock python3 bench/run.py -s SOAK --quick            # 2 minutes, a fault every 12 s
    flock /work/bench.lock python3 bench/run.py -s SOAK --soak-minutes 4
    flock /work/bench.lock python3 bench/run.py -s SOAK --contend          # beside a CPU hog per core

Each server runs `-w 3 --threads 2 --max-requests 5000 --max-requests-jitter 500` with a pid file
and a log file; maitred also TLS on one listener beside a plain one (a certificate made for the
run), --stats, --max-worker-memory. The load, every answer checked (bench/soak_clients.py): wrk,
paced, one connection per thread, checking each body (bench/soak_wrk.lua); clients of the soak's
own for the fast, 20 ms, 2 s, 256 KiB streamed and 1 MiB upload routes, some over TLS; a slow
reader and a slow uploader; 200 idle keep-alive connections asking every 20 s; WebSocket
sessions echoing messages (the ASGI twin). The faults, in turn: SIGHUP, SIGUSR2 (the new lobby
followed through the pid file), SIGTTIN then SIGTTOU, SIGKILL of a worker, SIGSTOP of a worker for
3 s then SIGCONT, SIGUSR1 (the log renamed first), a worker made to pass --max-worker-memory, a
client that resets mid-upload. At the end SIGTERM, with the load still on.

Each server is probed once a second with a fresh connection (`GET /`); the longest it went
without answering one is its silence, and a silence past HANG_SECONDS is a hang (issue 46: a
lobby that had stopped answering, logging and taking signals). `--contend` runs a busy loop per
core beside the servers for the whole soak, at the servers' priority, as a CI machine or a
shared host has them: issue 46's hang needed the lobby's thread preempted at one moment.

What it reports, per server and per fault: bench/README.md ("SOAK") and soak.md beside soak.json
in the output directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import http.client
import json
import os
import random
import shutil
import signal
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import procs
from servers import BENCH, MAITRED, PEERS_VENV, REPO
from soak_app import held_requests, payload
from soak_clients import (
    HOST,
    REQUEST_TIMEOUT,
    UPLOAD_BYTES,
    Connection,
    Record,
    RequestFailed,
    WebSocket,
    close_code,
    correct,
    expected,
)
from tls import make_certificate

ID = "SOAK"
TITLE = "faults under mixed, checked load: maitred (WSGI and ASGI) and gunicorn gthread, a fault every 20 s"
MINUTES = 8.0
QUICK_MINUTES = 2.0
FAULT_EVERY = 20.0
# --quick: every fault within 2 minutes.
QUICK_FAULT_EVERY = 12.0
# Load before the first fault: the idle connections opened, every client going.
WARMUP_SECONDS = 10.0
WORKERS = 3
MAX_REQUESTS = 5000


def _server_settings(max_requests: int) -> list[str]:
    """Each server's workers, threads and recycling (a jitter of a tenth)."""
    recycling = ["--max-requests", str(max_requests), "--max-requests-jitter", str(max_requests // 10)]
    return ["-w", str(WORKERS), "--threads", "2", *recycling]


GRACEFUL_TIMEOUT = 10
# The worker's baseline is about 25 MB: the hog's 200 MB takes it past the limit at once.
MAX_WORKER_MEMORY_MB = 150
HOG_MB = 200
IDLE_CONNECTIONS = 200
IDLE_EVERY = 20.0
STOP_SECONDS = 3.0
WEBSOCKET_SESSIONS = 4
SAMPLE_EVERY = 5.0
PROBE_EVERY = 1.0
PROBE_TIMEOUT = 5.0
# No probe answered for this long is a hang: longer than any fault holds every worker (a stopped
# one's 3 s, a reload), far shorter than issue 46's hang, which lasted until the lobby was killed.
HANG_SECONDS = 10.0
# A fault is recovered when the workers are back (3 serving, the victim gone) within this.
RESTORE_WITHIN = 15.0
WRK_THREADS = 2
WRK_PAUSE_MS = 20
FAULTS = (
    "SIGHUP",
    "SIGUSR2",
    "SIGTTIN, SIGTTOU",
    "SIGKILL a worker",
    "SIGSTOP a worker 3 s",
    "SIGUSR1",
    "--max-worker-memory",
    "reset mid-upload",
)
# What a client sees, per fault: docs/SIGNALS.md's table, checked in each fault's window.
STATEMENTS = {
    "SIGHUP": "no request fails; WebSockets stay with the old workers until 1001 at --graceful-timeout",
    "SIGUSR2": "no request fails; idle plain connections are handed over; TLS ones answered by the old lobby, then close",
    "SIGTTIN, SIGTTOU": "no request fails; 4 workers, then 3",
    "SIGKILL a worker": "502 (or a cut answer) only for the requests it held; its WebSockets 1011",
    "SIGSTOP a worker 3 s": "no request fails: those on the stopped worker are answered after SIGCONT",
    "SIGUSR1": "no request fails; the log file is opened again at its path",
    "--max-worker-memory": "no request fails; the worker retires once it has answered",
    "reset mid-upload": "no other request fails",
}


@dataclass
class Target:
    """One server under the soak."""

    name: str
    prefix: str  # of its request ids
    kind: str  # "maitred" or "gunicorn"
    workdir: Path
    argv: list[str]
    plain_port: int
    tls_port: int | None = None
    stats_port: int | None = None
    websockets: bool = False
    not_applicable: dict[str, str] = field(default_factory=dict)
    record: Record = field(default_factory=Record)
    process: subprocess.Popen | None = None
    faults: list[dict] = field(default_factory=list)
    killed: list[tuple[float, int, set[str]]] = field(default_factory=list)
    stopped: list[tuple[float, int, set[str]]] = field(default_factory=list)
    samples: list[tuple[float, int, int, int]] = field(default_factory=list)  # time, lobby pid, RSS KB, fds
    # The longest without a probe answered, and each silence past HANG_SECONDS: (from, seconds).
    longest_silence: float = 0.0
    hangs: list[tuple[float, float]] = field(default_factory=list)
    last_answer: float = 0.0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    wrk: subprocess.Popen | None = None
    wrk_report: dict | None = None
    logs_renamed: int = 0
    start: float = 0.0  # time.monotonic() when the load began; every time reported counts from it

    @property
    def pid_file(self) -> Path:
        return self.workdir / "server.pid"

    @property
    def held_dir(self) -> Path:
        return self.workdir / "held"

    def lobby(self) -> int:
        """The lobby (gunicorn: the master) serving now, as the pid file names it."""
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return self.process.pid

    def workers(self) -> list[int] | None:
        """The workers serving now (maitred: idle or busy on its scoreboard, the spare and retiring
        ones left out; gunicorn: the master's children); None when it cannot be read right now."""
        self.process.poll()  # reaps the first lobby once it has exited
        if self.kind == "gunicorn":
            try:
                return procs.children(self.lobby())
            except OSError:
                return None
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.stats_port}/status.json", timeout=2) as answer:
                status = json.load(answer)
        except (OSError, ValueError):
            return None
        return [row["pid"] for row in status["scoreboard"] if row["state"] in ("idle", "busy")]

    def held(self, pid: int) -> set[str]:
        log = self.held_dir / f"{pid}.log"
        return held_requests(log) if log.exists() else set()

    def log_text(self) -> str:
        return "".join(path.read_text(errors="replace") for path in sorted(self.workdir.glob("server.log*")))


def run(
    minutes: float,
    quick: bool,
    out: Path,
    with_gunicorn: bool,
    contend: bool = False,
    max_requests: int = MAX_REQUESTS,
    fault_every: float | None = None,
) -> int:
    """Runs the soak and writes soak.json and soak.md into out; 0 when maitred met its targets.
    contend: a CPU hog per core beside the servers for the whole soak; max_requests: the
    workers' --max-requests (a worker recycled every few hundred requests reaches the moments
    of a spare's first requests far more often); fault_every: seconds between faults."""
    fault_every = fault_every or (QUICK_FAULT_EVERY if quick else FAULT_EVERY)
    workdir = BENCH / ".work" / "runs" / ID
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    cert, key = make_certificate(workdir)
    targets = _targets(workdir, cert, key, with_gunicorn, _server_settings(max_requests))
    began = datetime.datetime.now(datetime.timezone.utc)
    hogs = [_start_hog(workdir, number) for number in range(os.cpu_count() or 1)] if contend else []
    try:
        asyncio.run(_soak(targets, minutes * 60, fault_every, cert))
    finally:
        for target in targets:
            for process in (target.wrk, target.process):
                if process is not None:
                    procs.stop(process, grace=1.0)
        for hog in hogs:
            procs.stop(hog, grace=0.1)
    results = [_results(target) for target in targets]
    report = {
        "started": began.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git(["rev-parse", "--short=12", "HEAD"]),
        "maitred": str(MAITRED),
        "minutes": minutes,
        "fault_every_s": fault_every,
        "cpu_hogs": len(hogs),
        "max_requests": max_requests,
        "targets": results,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "soak.md").write_text(_markdown(report))
    print(f"wrote {out / 'soak.md'} and {out / 'soak.json'}")
    print(_summary_lines(results))
    return 0 if all(all(met for _, met in r["targets_met"]) for r in results if r["kind"] == "maitred") else 1


def _start_hog(workdir: Path, number: int) -> subprocess.Popen:
    """A busy loop, at the servers' priority, for --contend."""
    with (workdir / f"hog-{number}.out").open("wb") as log:
        return procs.start([sys.executable, "-c", "while True: pass"], log=log, cwd=workdir, env=dict(os.environ))


def _git(argv: list[str]) -> str:
    return subprocess.run(["git", *argv], check=False, capture_output=True, text=True, cwd=REPO).stdout.strip()


def _targets(workdir: Path, cert: Path, key: Path, with_gunicorn: bool, settings: list[str]) -> list[Target]:
    targets = []
    for name, prefix, app, websockets in (
        ("maitred", "m", "soak_app:app", False),
        ("maitred ASGI", "a", "soak_asgi_app:app", True),
    ):
        directory = workdir / name.replace(" ", "-")
        plain, tls, stats = procs.free_port(), procs.free_port(), procs.free_port()
        argv = [
            str(MAITRED),
            *settings,
            "--max-worker-memory",
            str(MAX_WORKER_MEMORY_MB),
            "--graceful-timeout",
            str(GRACEFUL_TIMEOUT),
            "-b",
            f"{HOST}:{tls}",
            "-b",
            f"http://{HOST}:{plain}",
            "--certfile",
            str(cert),
            "--keyfile",
            str(key),
            "--stats",
            f"{HOST}:{stats}",
            "--pid",
            "server.pid",
            "--error-logfile",
            "server.log",
            app,
        ]
        targets.append(Target(name, prefix, "maitred", directory, argv, plain, tls, stats, websockets))
    if with_gunicorn:
        plain = procs.free_port()
        argv = [
            str(PEERS_VENV / "bin" / "gunicorn"),
            "-k",
            "gthread",
            *settings,
            "--graceful-timeout",
            str(GRACEFUL_TIMEOUT),
            "-b",
            f"{HOST}:{plain}",
            "--pid",
            "server.pid",
            "--error-logfile",
            "server.log",
            "soak_app:app",
        ]
        targets.append(
            Target(
                "gunicorn gthread",
                "g",
                "gunicorn",
                workdir / "gunicorn-gthread",
                argv,
                plain,
                not_applicable={
                    "--max-worker-memory": "gunicorn has no memory limit for its workers",
                    "TLS": "gunicorn's --certfile applies to every listener: it runs plain only",
                    "WebSockets": "the gthread worker serves no WebSocket",
                },
            )
        )
    return targets


async def _soak(targets: list[Target], seconds: float, fault_every: float, cert: Path) -> None:
    context = ssl.create_default_context(cafile=str(cert))
    for target in targets:
        target.workdir.mkdir(parents=True)
        target.held_dir.mkdir()
        env = dict(os.environ, PYTHONPATH=str(BENCH), SOAK_HELD_DIR=str(target.held_dir))
        with (target.workdir / "stdout.log").open("wb") as log:
            target.process = procs.start(target.argv, log=log, cwd=target.workdir, env=env)
    for target in targets:
        await asyncio.to_thread(_wait_ready, target)
    start = time.monotonic()
    tasks = []
    for target in targets:
        target.start = start
        target.wrk = _start_wrk(target, seconds + 60)
        tasks += [asyncio.create_task(client) for client in _clients(target, context, start)]
    sampler = asyncio.create_task(_sample(targets, start))
    probes = [asyncio.create_task(_probe(target)) for target in targets]
    await _faults(targets, start, seconds, fault_every)
    await asyncio.sleep(max(0.0, start + seconds - time.monotonic()))
    # The samples end before the stop, which closes every connection.
    sampler.cancel()
    for probe in probes:
        probe.cancel()
    # A silence until the stop is one too: the load's last minutes unanswered.
    stopping = time.monotonic()
    for target in targets:
        if stopping - target.last_answer > PROBE_EVERY + PROBE_TIMEOUT:
            _silence_ends(target, stopping)
    await asyncio.gather(*(_stop(target, tasks, start) for target in targets))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _wait_ready(target: Target) -> None:
    deadline = time.monotonic() + 60
    while (workers := target.workers()) is None or len(workers) < WORKERS:
        if target.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{target.name} did not start; see {target.workdir}/server.log")
        time.sleep(0.1)
    procs.wait_ready(
        target.process, port=target.plain_port, log_path=target.workdir / "stdout.log", log_pattern=None, log_count=1
    )


def _start_wrk(target: Target, seconds: float) -> subprocess.Popen:
    argv = [
        "wrk",
        f"-t{WRK_THREADS}",
        f"-c{WRK_THREADS}",
        f"-d{seconds:.0f}s",
        "--timeout",
        f"{REQUEST_TIMEOUT:.0f}s",
        "-s",
        str(BENCH / "soak_wrk.lua"),
        f"http://{HOST}:{target.plain_port}/",
        "--",
        f"{target.prefix}-wrk",
        str(WRK_PAUSE_MS),
        str(target.workdir / "wrk-failures"),
    ]
    with (target.workdir / "wrk.out").open("wb") as log:
        return procs.start(argv, log=log, cwd=target.workdir, env=dict(os.environ))


# ---------------------------------------------------------------------------------------------
# The clients


def _clients(target: Target, context: ssl.SSLContext, start: float) -> list:
    """The coroutines of every client of the target: (kind, route, TLS, pause between requests,
    pause between 16 KiB pieces written, read)."""
    plans = [
        ("fast", "fast", False, 0.05, 0, 0),
        ("io", "io", False, 0.05, 0, 0),
        ("slow", "slow", False, 0, 0, 0),
        ("stream", "stream", False, 0.5, 0, 0),
        ("upload", "upload", False, 1.0, 0, 0),
        ("slow-reader", "stream", False, 0, 0, 0.2),
        ("slow-uploader", "upload", False, 0, 0.1, 0),
    ]
    if target.tls_port:
        plans += [
            ("fast-tls", "fast", True, 0.1, 0, 0),
            ("stream-tls", "stream", True, 0.5, 0, 0),
            ("upload-tls", "upload", True, 1.0, 0, 0),
        ]
    clients = [_client_loop(target, context, *plan) for plan in plans]
    clients += [_idle_client(target, index, start) for index in range(IDLE_CONNECTIONS)]
    if target.websockets:
        clients += [_websocket_client(target, index) for index in range(WEBSOCKET_SESSIONS)]
    return clients


async def _pause(target: Target, seconds: float) -> None:
    """Sleeps, or less once the stop has begun."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(target.stop.wait(), seconds)


async def _client_loop(
    target: Target,
    context: ssl.SSLContext,
    kind: str,
    route: str,
    tls: bool,
    pause: float,
    write_pace: float,
    read_pace: float,
) -> None:
    connection = Connection(target.tls_port if tls else target.plain_port, context if tls else None)
    number = 0
    while not target.stop.is_set():
        number += 1
        await _request(target, connection, kind, route, f"{target.prefix}-{kind}-{number}", write_pace, read_pace)
        await _pause(target, pause)
    connection.close()


async def _request(
    target: Target,
    connection: Connection,
    kind: str,
    route: str,
    request_id: str,
    write_pace: float = 0,
    read_pace: float = 0,
) -> bool | str:
    """One checked request: True when answered correctly, else the kind of failure (recorded)."""
    record = target.record
    tls = connection.tls is not None
    if connection.idle_closed():
        record.closed_while_idle.append((time.monotonic(), kind, tls))
        connection.close()
    method, body = ("POST", payload(request_id, UPLOAD_BYTES)) if route == "upload" else ("GET", b"")
    sent = time.monotonic()
    record.in_flight[request_id] = sent
    try:
        answer = await connection.exchange(method, f"/{route}?id={request_id}", body, write_pace, read_pace)
    except RequestFailed as failure:
        outcome = str(failure)
    else:
        good = correct(answer, expected(route, request_id))
        outcome = True if good else f"status {answer.status}" if answer.status != 200 else "wrong body"
    finally:
        del record.in_flight[request_id]
    if outcome is True:
        record.good[kind] += 1
        record.good_ids.add(request_id)
    else:
        record.failures.append((time.monotonic(), request_id, kind, outcome, sent, tls))
    return outcome


async def _idle_client(target: Target, index: int, start: float) -> None:
    """A keep-alive connection asked once at the start, then every IDLE_EVERY seconds, each at its
    own phase; a close by the server, or a failed request, loses it (it is opened again)."""
    record = target.record
    connection = Connection(target.plain_port, None)
    await _pause(target, index * 0.02)
    number = 1
    await _request(target, connection, "idle", "fast", f"{target.prefix}-idle{index}-{number}")
    due = start + IDLE_EVERY * (1 + index / IDLE_CONNECTIONS)
    while not target.stop.is_set():
        await _pause(target, due - time.monotonic())
        if target.stop.is_set():
            break
        due += IDLE_EVERY
        number += 1
        if connection.idle_closed():
            record.idle_lost.append((time.monotonic(), "closed while idle"))
        elif connection.writer is None:
            record.idle_lost.append((time.monotonic(), "closed by its last answer"))
        outcome = await _request(target, connection, "idle", "fast", f"{target.prefix}-idle{index}-{number}")
        if outcome is not True:
            record.idle_lost.append((time.monotonic(), f"request {outcome}"))
    connection.close()


async def _websocket_client(target: Target, index: int) -> None:
    """A WebSocket session sending a message of 1 to 4 KiB every 0.5 s and checking its echo;
    when the server ends it, how, and a new one."""
    record = target.record
    number = 0
    while not target.stop.is_set():
        number += 1
        session = f"{target.prefix}-ws{index}-{number}"
        try:
            socket_ = await asyncio.wait_for(WebSocket.connect(target.plain_port, f"/ws?id={session}"), REQUEST_TIMEOUT)
            _opcode, hello = await asyncio.wait_for(socket_.receive(), REQUEST_TIMEOUT)
            pid = int(hello.split()[1])
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, IndexError) as error:
            record.failures.append(
                (time.monotonic(), session, "websocket", f"handshake: {error!r}", time.monotonic(), False)
            )
            await _pause(target, 1.0)
            continue
        while not target.stop.is_set():
            message = random.randbytes(random.randint(1024, 4096))
            socket_.send(2, message)
            try:
                opcode, data = await asyncio.wait_for(socket_.receive(), REQUEST_TIMEOUT)
            except (OSError, asyncio.IncompleteReadError):
                record.ws_ends.append((time.monotonic(), session, pid, 1006, "ended without a Close"))
                break
            except asyncio.TimeoutError:
                record.failures.append((time.monotonic(), session, "websocket", "timeout", time.monotonic(), False))
                break
            if opcode == 8:
                record.ws_ends.append(
                    (time.monotonic(), session, pid, close_code(data), data[2:].decode(errors="replace"))
                )
                break
            if data != message:
                record.failures.append((time.monotonic(), session, "websocket", "wrong echo", time.monotonic(), False))
            else:
                record.ws_messages += 1
            await _pause(target, 0.5)
        else:
            with contextlib.suppress(OSError):
                await socket_.close()
            return
        socket_.writer.close()


async def _probe(target: Target) -> None:
    """GET / on a fresh connection every PROBE_EVERY s, for the server's silences (HANG_SECONDS).
    A silence still going on when the probing stops is closed there (`_soak`)."""
    target.last_answer = time.monotonic()
    while True:
        await asyncio.sleep(PROBE_EVERY)
        connection = Connection(target.plain_port, None)
        try:
            answered = (await asyncio.wait_for(connection.exchange("GET", "/"), PROBE_TIMEOUT)).status == 200
        except (RequestFailed, asyncio.TimeoutError):
            answered = False
        finally:
            connection.close()
        if answered:
            _silence_ends(target, time.monotonic())


def _silence_ends(target: Target, now: float) -> None:
    """The probes' silence since the last answer ends at `now`: counted, and a hang if long."""
    silence = now - target.last_answer
    target.longest_silence = max(target.longest_silence, silence)
    if silence > HANG_SECONDS:
        target.hangs.append((round(target.last_answer - target.start, 1), round(silence, 1)))
    target.last_answer = now


async def _sample(targets: list[Target], start: float) -> None:
    while True:
        for target in targets:
            pid = target.lobby()
            with contextlib.suppress(OSError, StopIteration):
                status = Path(f"/proc/{pid}/status").read_text()
                rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
                target.samples.append((time.monotonic() - start, pid, rss, len(os.listdir(f"/proc/{pid}/fd"))))
        await asyncio.sleep(SAMPLE_EVERY)


# ---------------------------------------------------------------------------------------------
# The faults


async def _faults(targets: list[Target], start: float, seconds: float, every: float) -> None:
    number = 0
    while (due := start + WARMUP_SECONDS + number * every) < start + seconds:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        fault = FAULTS[number % len(FAULTS)]
        number += 1
        await asyncio.gather(*(asyncio.to_thread(_fault, target, fault, number, start) for target in targets))
        print(
            f"  fault {number} {fault}: " + "; ".join(f"{t.name} {_brief(t.faults[-1])}" for t in targets), flush=True
        )


def _brief(outcome: dict) -> str:
    if outcome.get("not_applicable"):
        return "not applicable"
    restored = outcome["restored_s"]
    return ("restored in " + f"{restored:.1f} s" if restored is not None else "NOT restored") + (
        f" ({outcome['detail']})" if outcome["detail"] else ""
    )


def _fault(target: Target, fault: str, number: int, start: float) -> None:
    outcome = {"number": number, "fault": fault, "at": time.monotonic() - start, "victim": None, "detail": ""}
    target.faults.append(outcome)
    if fault in target.not_applicable:
        outcome.update(not_applicable=target.not_applicable[fault], restored_s=None)
        return
    action = {
        "SIGHUP": _reload,
        "SIGUSR2": _upgrade,
        "SIGTTIN, SIGTTOU": _one_more_one_fewer,
        "SIGKILL a worker": _kill,
        "SIGSTOP a worker 3 s": _stop_worker,
        "SIGUSR1": _reopen,
        "--max-worker-memory": _hog,
        "reset mid-upload": _reset_upload,
    }[fault]
    began = time.monotonic()
    try:
        restored = action(target, outcome)
    except OSError as error:
        outcome["detail"] = f"the fault could not be made: {error}"
        restored = None
    outcome["restored_s"] = None if restored is None else restored - began


def _until(check: Callable[[], bool], within: float = RESTORE_WITHIN) -> float | None:
    """The time check() first held, polled every 0.1 s; None if it did not within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return time.monotonic()
        time.sleep(0.1)
    return None


def _serving(target: Target, count: int = WORKERS, without: set[int] = frozenset()) -> Callable[[], bool]:
    def check() -> bool:
        workers = target.workers()
        return workers is not None and len(workers) == count and not set(workers) & without

    return check


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def _reload(target: Target, outcome: dict) -> float | None:
    before = set(target.workers() or ())
    os.kill(target.lobby(), signal.SIGHUP)
    return _until(_serving(target, without=before))


def _upgrade(target: Target, outcome: dict) -> float | None:
    old = target.lobby()
    if target.kind == "maitred":
        os.kill(old, signal.SIGUSR2)
    else:
        # gunicorn: SIGUSR2 starts a new master beside the old (its pid file has the suffix .2);
        # once its workers are up, SIGTERM to the old master, as its docs say without --daemon.
        os.kill(old, signal.SIGUSR2)
        second = Path(f"{target.pid_file}.2")

        def new_master_serving() -> bool:
            try:
                return len(procs.children(int(second.read_text()))) == WORKERS
            except (OSError, ValueError):
                return False

        if _until(new_master_serving, 30.0) is None:
            outcome["detail"] = "the new master did not start its workers"
            return None
        time.sleep(1.0)  # the app's import, which gunicorn logs no line for
        os.kill(old, signal.SIGTERM)
    exited = _until(lambda: not _alive(old) and _alive(target.lobby()), GRACEFUL_TIMEOUT + 20.0)
    outcome["victim"] = old
    outcome["detail"] = f"lobby {old} -> {target.lobby()}" + ("" if exited else f", {old} still there")
    return _until(_serving(target)) if exited else None


def _one_more_one_fewer(target: Target, outcome: dict) -> float | None:
    os.kill(target.lobby(), signal.SIGTTIN)
    more = _until(_serving(target, WORKERS + 1))
    os.kill(target.lobby(), signal.SIGTTOU)
    outcome["detail"] = "4 workers " + ("reached" if more else "never seen")
    return _until(_serving(target)) if more else None


def _busiest(target: Target, route: str = "") -> int | None:
    """The serving worker holding the most requests, those of the route counting first."""
    workers = target.workers() or []
    held = {pid: target.held(pid) for pid in workers}
    return max(workers, key=lambda pid: (sum(f"-{route}-" in i for i in held[pid]), len(held[pid])), default=None)


def _kill(target: Target, outcome: dict) -> float | None:
    victim = _busiest(target, "slow")
    if victim is None:
        return None
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    _until(lambda: not _alive(victim))
    held = target.held(victim)
    target.killed.append((killed_at, victim, held))
    outcome.update(victim=victim, detail=f"it held {len(held)} requests")
    return _until(_serving(target, without={victim}))


def _stop_worker(target: Target, outcome: dict) -> float | None:
    victim = _busiest(target, "slow")
    if victim is None:
        return None
    os.kill(victim, signal.SIGSTOP)
    stopped_at = time.monotonic()
    time.sleep(0.1)  # until it is stopped: its log no longer moves
    held = target.held(victim)
    time.sleep(STOP_SECONDS)
    os.kill(victim, signal.SIGCONT)
    target.stopped.append((stopped_at, victim, held))
    replaced = _until(_serving(target, without={victim}))
    outcome.update(victim=victim, detail=f"it held {len(held)} requests; " + ("replaced" if replaced else "kept"))
    return replaced or _until(_serving(target))


def _reopen(target: Target, outcome: dict) -> float | None:
    log = target.workdir / "server.log"
    target.logs_renamed += 1
    log.rename(target.workdir / f"server.log.{target.logs_renamed}")
    os.kill(target.lobby(), signal.SIGUSR1)
    reopened = _until(log.exists)
    outcome["detail"] = "log reopened" if reopened else "no new log file"
    return reopened and _until(_serving(target))


def _hog(target: Target, outcome: dict) -> float | None:
    request_id = f"{target.prefix}-hog-{outcome['number']}"
    connection = http.client.HTTPConnection(HOST, target.plain_port, timeout=REQUEST_TIMEOUT)
    try:
        connection.request("GET", f"/hog?mb={HOG_MB}&id={request_id}")
        answer = connection.getresponse()
        body = answer.read()
    finally:
        connection.close()
    victim = int(answer.getheader("X-Soak-Pid", "0"))
    good = answer.status == 200 and body == f"hog {request_id}\n".encode()
    if good:
        target.record.good["hog"] += 1
    else:
        target.record.failures.append(
            (time.monotonic(), request_id, "hog", f"status {answer.status}", time.monotonic(), False)
        )
    retired = _until(lambda: not _alive(victim))
    outcome.update(
        victim=victim, detail=("answered" if good else "NOT answered") + (", retired" if retired else ", still there")
    )
    return retired and _until(_serving(target, without={victim}))


def _reset_upload(target: Target, outcome: dict) -> float | None:
    """A client sends 384 KiB of a 1 MiB upload (past the 256 KiB maitred keeps in memory), then
    resets its connection."""
    request_id = f"{target.prefix}-reset-{outcome['number']}"
    with socket.create_connection((HOST, target.plain_port), timeout=REQUEST_TIMEOUT) as sock:
        sock.sendall(
            f"POST /upload?id={request_id} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {UPLOAD_BYTES}\r\n\r\n".encode()
        )
        sock.sendall(payload(request_id, UPLOAD_BYTES)[: 384 * 1024])
        time.sleep(0.3)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    time.sleep(1.0)
    return _until(_serving(target))


# ---------------------------------------------------------------------------------------------
# The stop


async def _stop(target: Target, tasks: list[asyncio.Task], start: float) -> None:
    """SIGTERM with the load on: the clients stop asking (WebSocket sessions close), every request
    in flight then must be answered, and every process must be gone within --graceful-timeout."""
    procs.interrupt(target.wrk)
    target.stop.set()
    await asyncio.sleep(1.0)  # the WebSocket sessions close, the idle clients let go
    in_flight = dict(target.record.in_flight)
    term_at = time.monotonic()
    os.kill(target.lobby(), signal.SIGTERM)
    mine = [task for task in tasks if not task.done()]
    await asyncio.wait(mine, timeout=GRACEFUL_TIMEOUT + REQUEST_TIMEOUT)
    gone = await asyncio.to_thread(_until, lambda: not procs.group_members(target.process.pid), GRACEFUL_TIMEOUT + 10.0)
    target.process.poll()
    failed = {request_id for _, request_id, *_ in target.record.failures}
    target.faults.append(
        {
            "number": len(target.faults) + 1,
            "fault": "SIGTERM",
            "at": term_at - start,
            "victim": None,
            "restored_s": None,
            "stop_s": None if gone is None else gone - term_at,
            "in_flight": len(in_flight),
            "in_flight_answered": sum(request_id in target.record.good_ids for request_id in in_flight),
            "in_flight_failed": sorted(failed & set(in_flight)),
            "detail": "",
        }
    )
    await asyncio.to_thread(target.wrk.wait, 30)
    text = (target.workdir / "wrk.out").read_text(errors="replace")
    line = next((line for line in text.splitlines() if line.startswith("SOAK-WRK-JSON ")), None)
    target.wrk_report = json.loads(line.split(" ", 1)[1]) if line else None


# ---------------------------------------------------------------------------------------------
# The figures


def _results(target: Target) -> dict:
    record = target.record
    failures = [(t - target.start, request_id, kind, how) for t, request_id, kind, how, _sent, _tls in record.failures]
    # wrk's lines have wall-clock seconds (Lua's os.time()).
    wall_start = time.time() - (time.monotonic() - target.start)
    for path in sorted(target.workdir.glob("wrk-failures.*")):
        for line in path.read_text().splitlines():
            wall, request_id, how = line.split(" ", 2)
            failures.append((int(wall) - wall_start, request_id, "wrk", how))
    log = target.log_text()
    classified = []
    for t, request_id, kind, how in failures:
        killed = next((pid for _at, pid, held in target.killed if request_id in held), None)
        classified.append(
            {
                "at": round(t, 2),
                "id": request_id,
                "client": kind,
                "how": how,
                "expected": killed is not None,
                "why": f"held by worker {killed}, killed" if killed else "",
            }
        )
    ws_outside = []
    for t, session, pid, code, reason in record.ws_ends:
        if _websocket_end_documented(target, t, pid, code, log):
            continue
        ws_outside.append({"at": t - target.start, "session": session, "pid": pid, "code": code, "reason": reason})
    stopped_checks = []
    wrk_failed = {c["id"] for c in classified if c["client"] == "wrk"}
    for _at, pid, held in target.stopped:
        # Its WebSocket sessions are checked as sessions (ws_outside), not as answers.
        requests = {i for i in held if "-ws" not in i}
        answered = sum(i in record.good_ids or ("-wrk" in i and i not in wrk_failed) for i in requests)
        stopped_checks.append({"pid": pid, "held": len(requests), "answered": answered})
    per_fault = _per_fault(target, classified, ws_outside, stopped_checks)
    samples = target.samples
    rss_slope, fd_slope = _slopes(samples)
    unexpected = [c for c in classified if not c["expected"]]
    stop = target.faults[-1] if target.faults and target.faults[-1]["fault"] == "SIGTERM" else {}
    recovered = [f for f in target.faults if f["fault"] not in ("SIGTERM",) and not f.get("not_applicable")]
    result = {
        "name": target.name,
        "kind": target.kind,
        "command": " ".join([Path(target.argv[0]).name, *target.argv[1:]]),
        "answered_correctly": sum(record.good.values()) + (target.wrk_report or {}).get("good", 0),
        "answered_by_client": dict(record.good, wrk=(target.wrk_report or {}).get("good", 0)),
        "wrk": target.wrk_report,
        "websocket_messages": record.ws_messages,
        "expected_errors": len(classified) - len(unexpected),
        "unexpected_errors": len(unexpected),
        "unexpected_by_kind": dict(Counter(f"{c['client']}: {c['how']}" for c in unexpected)),
        "unexpected_first": unexpected[:20],
        "idle_lost": len(record.idle_lost),
        "idle_lost_by_how": dict(Counter(how for _, how in record.idle_lost)),
        "closed_while_idle": dict(
            Counter(f"{kind}{' (TLS)' if tls else ''}" for _, kind, tls in record.closed_while_idle)
        ),
        "websocket_ends": dict(Counter(code for *_, code, _reason in record.ws_ends)),
        "websocket_lost_outside_rule": ws_outside,
        "samples": samples,
        "rss_slope_mb_per_min": rss_slope,
        "fd_slope_per_min": fd_slope,
        "faults": per_fault,
        "longest_silence_s": round(target.longest_silence, 1),
        "hangs": target.hangs,
        "faults_recovered": sum(f["restored_s"] is not None for f in recovered),
        "faults_applied": len(recovered),
        "stop": stop,
        "not_applicable": target.not_applicable,
    }
    result["targets_met"] = _targets_met(result)
    return result


def _websocket_end_documented(target: Target, at: float, pid: int, code: int, log: str) -> bool:
    """docs/SIGNALS.md's rules for a WebSocket the server ends: 1011 when its worker is lost (here:
    killed); 1001 once --graceful-timeout has passed after its worker retired (the lobby's line
    names it) or after a binary upgrade (the old lobby drains it as any request)."""
    if code == 1011:
        return any(victim == pid and killed_at <= at for killed_at, victim, _ in target.killed)
    if code != 1001:
        return False
    if f"worker {pid} retired with" in log:
        return True
    return any(
        fault["fault"] == "SIGUSR2" and GRACEFUL_TIMEOUT - 1 <= at - target.start - fault["at"] <= GRACEFUL_TIMEOUT + 30
        for fault in target.faults
    )


def _per_fault(target: Target, classified: list[dict], ws_outside: list[dict], stopped: list[dict]) -> list[dict]:
    """Each fault's outcome, and what the clients saw from it until the next fault."""
    rows = []
    faults = target.faults
    stopped_iter = iter(stopped)
    for index, fault in enumerate(faults):
        until = faults[index + 1]["at"] if index + 1 < len(faults) else float("inf")
        window = [c for c in classified if fault["at"] <= c["at"] < until]
        row = dict(fault)
        row["statement"] = STATEMENTS.get(fault["fault"], "")
        row["unexpected"] = sum(not c["expected"] for c in window)
        row["expected"] = sum(c["expected"] for c in window)
        row["idle_lost"] = sum(fault["at"] <= t - target.start < until for t, _ in target.record.idle_lost)
        row["ws_outside_rule"] = sum(fault["at"] <= w["at"] < until for w in ws_outside)
        if fault["fault"] == "SIGSTOP a worker 3 s" and not fault.get("not_applicable"):
            check = next(stopped_iter, None)
            row["stopped_held_answered"] = check
        row["holds"] = _holds(row, target.kind)
        rows.append(row)
    return rows


def _holds(row: dict, kind: str) -> bool | None:
    """Whether the fault's statement held in its window (None: not applied)."""
    if row.get("not_applicable"):
        return None
    if row["fault"] == "SIGTERM":
        return (
            row["stop_s"] is not None
            and row["stop_s"] <= GRACEFUL_TIMEOUT
            and row["in_flight_answered"] == row["in_flight"]
        )
    holds = row["unexpected"] == 0 and row["ws_outside_rule"] == 0 and row["restored_s"] is not None
    if kind == "maitred":
        holds = holds and row["idle_lost"] == 0
    stopped = row.get("stopped_held_answered")
    if stopped:
        holds = holds and stopped["answered"] == stopped["held"]
    return holds


def _slopes(samples: list[tuple]) -> tuple[float | None, float | None]:
    """Theil-Sen slopes (the median of the slopes between every two samples) of the lobby's RSS
    (MB per minute) and descriptors (per minute) over the last half of the samples. A fault moves
    the descriptors for a few samples (a stopped ASGI worker's 10 s took 118 of 719 away, then gave
    them back), and a least-squares line leans on such a dip near the window's end: 3.3 a minute
    for a count that was 719 at both ends. A leak moves every pair, and the median with them."""
    half = samples[len(samples) // 2 :]
    if len(half) < 3:
        return None, None

    def slope(values: list[float]) -> float:
        times = [s[0] / 60 for s in half]
        pairs = [
            (values[j] - values[i]) / (times[j] - times[i])
            for i in range(len(half))
            for j in range(i + 1, len(half))
            if times[j] > times[i]
        ]
        return statistics.median(pairs)

    return slope([s[2] / 1024 for s in half]), slope([s[3] for s in half])


# maitred's targets (bench/README.md, SOAK).
RSS_SLOPE_TARGET_MB_PER_MIN = 1.0
FD_SLOPE_TARGET_PER_MIN = 1.0


def _targets_met(result: dict) -> list[tuple[str, bool]]:
    stop = result["stop"]
    return [
        (f"0 hangs (no probe answered for {HANG_SECONDS:g} s)", not result["hangs"]),
        ("0 unexpected errors", result["unexpected_errors"] == 0),
        ("0 idle connections lost", result["idle_lost"] == 0),
        ("0 WebSocket sessions lost outside the documented rule", not result["websocket_lost_outside_rule"]),
        (
            f"RSS slope under {RSS_SLOPE_TARGET_MB_PER_MIN:g} MB/min",
            result["rss_slope_mb_per_min"] is not None and result["rss_slope_mb_per_min"] < RSS_SLOPE_TARGET_MB_PER_MIN,
        ),
        (
            f"descriptors flat (slope under {FD_SLOPE_TARGET_PER_MIN:g} a minute)",
            result["fd_slope_per_min"] is not None and abs(result["fd_slope_per_min"]) < FD_SLOPE_TARGET_PER_MIN,
        ),
        ("every fault recovered", result["faults_recovered"] == result["faults_applied"]),
        ("every fault's statement held", all(f["holds"] is not False for f in result["faults"])),
        (
            f"a clean stop (gone within {GRACEFUL_TIMEOUT} s, every request in flight answered)",
            bool(stop) and _holds(stop, result["kind"]) is True,
        ),
    ]


def _summary_lines(results: list[dict]) -> str:
    lines = []
    for r in results:
        rss = "-" if r["rss_slope_mb_per_min"] is None else f"{r['rss_slope_mb_per_min']:.2f}"
        fds = "-" if r["fd_slope_per_min"] is None else f"{r['fd_slope_per_min']:.1f}"
        lines.append(
            f"{r['name']}: {len(r['hangs'])} hangs (longest silence {r['longest_silence_s']:.1f} s), "
            f"{r['answered_correctly']} answered correctly, {r['unexpected_errors']} unexpected errors "
            f"({r['expected_errors']} expected), {r['idle_lost']} idle lost, "
            f"{len(r['websocket_lost_outside_rule'])} WebSockets lost outside the rule, RSS slope {rss} MB/min, "
            f"fds slope {fds}/min, faults recovered {r['faults_recovered']}/{r['faults_applied']}"
        )
    return "\n".join(lines)


def _markdown(report: dict) -> str:
    lines = [
        "# SOAK: faults under mixed load",
        "",
        (
            f"{report['started']}, commit {report['commit']}, maitred {report['maitred']}; "
            f"{report['minutes']:g} minutes, a fault every {report['fault_every_s']:g} s"
            + (f", beside {report['cpu_hogs']} CPU hogs (--contend). " if report.get("cpu_hogs") else ". ")
            + "bench/README.md (SOAK) says what is measured and how."
        ),
        "",
        (
            "| server | hangs | longest silence, s | answered correctly | unexpected errors | expected errors | idle connections lost "
            "| WebSockets lost outside the rule | lobby RSS slope, MB/min | descriptors slope, /min "
            "| faults recovered | stop |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in report["targets"]:
        stop = r["stop"]
        stop_text = (
            f"{stop['stop_s']:.1f} s, {stop['in_flight_answered']}/{stop['in_flight']} in flight answered"
            if stop and stop.get("stop_s") is not None
            else "not gone"
        )
        rss = "-" if r["rss_slope_mb_per_min"] is None else f"{r['rss_slope_mb_per_min']:.2f}"
        fds = "-" if r["fd_slope_per_min"] is None else f"{r['fd_slope_per_min']:.2f}"
        ws = len(r["websocket_lost_outside_rule"]) if r["name"] == "maitred ASGI" else "-"
        lines.append(
            f"| {r['name']} | {len(r['hangs'])} | {r['longest_silence_s']:.1f} | {r['answered_correctly']:,} | {r['unexpected_errors']} | {r['expected_errors']} "
            f"| {r['idle_lost']} | {ws} | {rss} | {fds} | {r['faults_recovered']}/{r['faults_applied']} | {stop_text} |"
        )
    for r in report["targets"]:
        lines += ["", f"## {r['name']}", "", f"`{r['command']}`", ""]
        if r["kind"] == "maitred":
            lines += ["Targets:", ""] + [
                f"- {'met' if met else '**not met**'}: {text}" for text, met in r["targets_met"]
            ]
            lines.append("")
        for what, why in r["not_applicable"].items():
            lines.append(f"- not applicable, {what}: {why}")
        lines += [
            (
                f"Answers by client: {json.dumps(r['answered_by_client'])}; WebSocket messages echoed: {r['websocket_messages']}; "
                f"wrk: {json.dumps(r['wrk'])}."
            ),
            "",
            (
                f"Unexpected errors by kind: {json.dumps(r['unexpected_by_kind'])}. Idle connections lost, how: "
                f"{json.dumps(r['idle_lost_by_how'])}. Connections of the other clients found closed while idle "
                f"(opened again, not failed): {json.dumps(r['closed_while_idle'])}. WebSocket ends by code: "
                f"{json.dumps(r['websocket_ends'])}."
            ),
            "",
            "| # | fault | at, s | victim | restored in | detail | unexpected | expected | idle lost | WS outside rule | statement | holds |",
            "|---:|---|---:|---|---:|---|---:|---:|---:|---:|---|---|",
        ]
        for f in r["faults"]:
            restored = f"{f['restored_s']:.1f} s" if f.get("restored_s") is not None else "-"
            detail = f.get("not_applicable") or f["detail"]
            if f["fault"] == "SIGTERM":
                stop_s = "-" if f["stop_s"] is None else f"{f['stop_s']:.1f} s"
                detail = f"gone in {stop_s}; in flight {f['in_flight']}, answered {f['in_flight_answered']}"
                statement = "every request in flight answered; every process gone within --graceful-timeout"
            else:
                statement = f["statement"]
            if f.get("stopped_held_answered"):
                s = f["stopped_held_answered"]
                detail += f"; {s['answered']}/{s['held']} of its requests answered"
            holds = {True: "yes", False: "**no**", None: "n/a"}[f["holds"]]
            lines.append(
                f"| {f['number']} | {f['fault']} | {f['at']:.0f} | {f['victim'] or '-'} | {restored} | {detail} "
                f"| {f['unexpected']} | {f['expected']} | {f['idle_lost']} | {f['ws_outside_rule']} | {statement} | {holds} |"
            )
        if r["unexpected_first"]:
            lines += ["", "First unexpected errors:", ""]
            lines += [f"- {u['at']:.1f} s {u['client']} {u['id']}: {u['how']}" for u in r["unexpected_first"]]
        if r["websocket_lost_outside_rule"]:
            lines += ["", "WebSocket sessions lost outside the rule:", ""]
            lines += [
                f"- {w['at']:.1f} s {w['session']} (worker {w['pid']}): {w['code']} {w['reason']}"
                for w in r["websocket_lost_outside_rule"]
            ]
    return "\n".join(lines) + "\n"
