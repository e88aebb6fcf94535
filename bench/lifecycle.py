"""The lifecycle scenarios' steps, run while the load runs: a reload every few seconds (R1,
R1-broken), or a binary upgrade with idle keep-alive clients waiting across it (U1).

Both serve bench/generation.py, copied into the run's directory with a file VERSION beside it
(prepare). A reload writes the next generation into VERSION and sends SIGHUP to the server's
master; a probe (a thread here) asks GET / on a new connection every 20 ms and notes which
generation answered, and when, so that the delay from each SIGHUP to the first answer of the new
code can be read off. For one SIGHUP of R1-broken the copy has a syntax error instead (VERSION
unchanged), put back just before the next SIGHUP: the old code should go on answering.

An upgrade (U1): bench/keepalive_clients.py makes one request on each of its connections and holds
them idle; the load starts; the server's own upgrade is run (maitred: SIGUSR2, after which the old
lobby exits by itself; gunicorn: SIGUSR2, then SIGTERM to the old master once the new one's workers
are up, as gunicorn's docs say for a master not run as a daemon, where SIGWINCH is ignored); then
each idle client asks once more on its connection, and the answering pids are matched to the new
master through /proc.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import procs

HERE = Path(__file__).resolve().parent
APP_FILE = "generation.py"
# Appended to the run's copy of the app for R1-broken's broken SIGHUP: a syntax error.
BROKEN_LINE = "def broken(:\n"
PID_FILE = "server.pid"
KEEPALIVE_MARKER = "KEEPALIVE-JSON "


class LifecycleError(Exception):
    """The run measured nothing; str(error) says why."""


@dataclass(frozen=True)
class Reload:
    """SIGHUP every `every` seconds while the load runs, the first `every` seconds in, the last at
    least `every` seconds before its end. broken: the number of the SIGHUP (from 1) sent while the
    app's file has a syntax error (VERSION unchanged), put back 90% of `every` later, just before
    the next SIGHUP; None: every one is clean."""

    every: float = 2.0
    broken: int | None = None
    probe_interval: float = 0.02
    probe_timeout: float = 2.0

    def describe(self) -> str:
        text = f"SIGHUP every {self.every:g} s, a new generation in VERSION before each"
        if self.broken:
            text += f"; SIGHUP number {self.broken} while {APP_FILE} has a syntax error"
        return text + f"; probe: GET / on a new connection every {self.probe_interval * 1000:g} ms"


@dataclass(frozen=True)
class Upgrade:
    """idle keep-alive clients, each answered once before the upgrade, which starts `after`
    seconds into the load; each asks once more once the old master has exited."""

    idle: int = 200
    after: float = 5.0
    # gunicorn: how long the new master's workers get to import the app (1 s) before the old
    # master is told to stop, since gunicorn logs a worker's boot before its import.
    import_margin: float = 2.0
    # How long the old master may take to hand over and exit (gunicorn: its graceful timeout is 30 s).
    exit_within: float = 40.0

    def describe(self) -> str:
        return (
            f"{self.idle} idle keep-alive clients (bench/keepalive_clients.py), one request each before; "
            f"binary upgrade {self.after:g} s into the load; then one more request on each connection"
        )


Lifecycle = Reload | Upgrade

# Servers whose binary upgrade is not measured, and why.
NO_UPGRADE = {
    "granian": "granian 2.8.7 has no binary upgrade: its main process handles SIGINT and SIGTERM (stop) "
    "and SIGHUP (respawn the workers) only, and cannot pass its listen sockets to a new process",
}


def unsupported(lifecycle: Lifecycle, server: str) -> str | None:
    if isinstance(lifecycle, Upgrade):
        return NO_UPGRADE.get(server)
    return None


def prepare(workdir: Path, env: dict[str, str]) -> dict[str, str]:
    """Copies the app into the run's directory with VERSION 0; returns the server's environment,
    which imports the app from there only."""
    shutil.copyfile(HERE / APP_FILE, workdir / APP_FILE)
    (workdir / "VERSION").write_text("0\n")
    return dict(env, PYTHONPATH=str(workdir), PYTHONDONTWRITEBYTECODE="1")


def run(
    lifecycle: Lifecycle,
    server: str,
    process: subprocess.Popen,
    port: int,
    workdir: Path,
    env: dict[str, str],
    workers: int,
    load_seconds: float,
    run_load: Callable[[], tuple[dict, bool]],
) -> tuple[dict, bool, dict, str]:
    """Runs the load (run_load, load_seconds long) with the lifecycle's steps beside it. Returns
    the load's measurement, whether the time limit cut it short, the scenario's figures and a line
    of detail for the per-run table."""
    loaded = _Background(run_load)
    if isinstance(lifecycle, Reload):
        return _reload(lifecycle, process, port, workdir, loaded, load_seconds)
    return _upgrade(lifecycle, server, process, port, workdir, env, workers, loaded)


# ---------------------------------------------------------------------------------------------
# Reload


def _reload(
    spec: Reload, process: subprocess.Popen, port: int, workdir: Path, loaded: _Background, seconds: float
) -> tuple[dict, bool, dict, str]:
    probe = _Probe(port, spec.probe_interval, spec.probe_timeout)
    probe.start()
    began = time.monotonic()
    loaded.start()
    app_file = workdir / APP_FILE
    original = app_file.read_text()
    hups: list[tuple[int, float, bool]] = []
    number = 1
    try:
        while number * spec.every <= seconds - spec.every:
            if not _sleep_until(began + number * spec.every, loaded):
                break
            broken = number == spec.broken
            if broken:
                app_file.write_text(original + BROKEN_LINE)
            else:
                (workdir / "VERSION").write_text(f"{number}\n")
            hups.append((number, time.monotonic(), broken))
            if process.poll() is None:
                process.send_signal(signal.SIGHUP)
            if broken:
                _sleep_until(began + (number + 0.9) * spec.every, loaded)
                app_file.write_text(original)
            number += 1
        measurement, cut_short = loaded.result()
    finally:
        probe.stop()
        app_file.write_text(original)
    return (measurement, cut_short, *_reload_figures(hups, probe.answers, process, measurement, workdir))


def _sleep_until(moment: float, loaded: _Background) -> bool:
    """Sleeps until moment; False if the load ended first."""
    while time.monotonic() < moment:
        if not loaded.running():
            return False
        time.sleep(min(0.01, max(0.0, moment - time.monotonic())))
    return True


def _reload_figures(
    hups: list[tuple[int, float, bool]],
    answers: list[tuple[float, int | None]],
    process: subprocess.Popen,
    measurement: dict,
    workdir: Path,
) -> tuple[dict, str]:
    delays = []
    unseen = mixed = 0
    broken_figures = {}
    shown = []
    for index, (number, sent, broken) in enumerate(hups):
        until = hups[index + 1][1] if index + 1 < len(hups) else float("inf")
        window = [(t, g) for t, g in answers if sent <= t < until]
        if broken:
            # Whether some process imported the broken file (the server's log names the error),
            # and what the probe got until the next SIGHUP.
            log = (workdir / "server.log").read_text(errors="replace")
            broken_figures = {
                "broken_imported": int("SyntaxError" in log),
                "broken_old_answers": sum(g is not None for _, g in window),
                "broken_probe_failed": sum(g is None for _, g in window),
            }
            shown.append("broken")
            continue
        first = next((t for t, g in window if g == number), None)
        if first is None:
            unseen += 1
            shown.append("never")
            continue
        delays.append((first - sent) * 1000)
        shown.append(f"{delays[-1]:.0f}")
        if any(g is not None and g < number for t, g in window if t > first):
            mixed += 1
    failed = measurement["failed_detail"]
    figures = {
        "hups": len(hups),
        "new_code_median_ms": statistics.median(delays) if delays else None,
        "new_code_max_ms": max(delays) if delays else None,
        "hups_unseen": unseen,
        "hups_mixed": mixed,
        "probe_answers": sum(g is not None for _, g in answers),
        "probe_failed": sum(g is None for _, g in answers),
        **{f"wrk_{kind}": failed.get(kind, 0) for kind in ("connect", "read", "write", "timeout")},
        **broken_figures,
        "alive_at_end": int(process.poll() is None),
    }
    detail = "ms from each SIGHUP to the first answer of its code: " + ", ".join(shown)
    return figures, detail


class _Probe(threading.Thread):
    """GET / on a new connection every `interval` seconds until stopped; answers: (time the answer
    came, generation or None when the request failed or was not 200)."""

    def __init__(self, port: int, interval: float, timeout: float) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.interval = interval
        self.timeout = timeout
        self.answers: list[tuple[float, int | None]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            generation = _generation(self.port, self.timeout)
            self.answers.append((time.monotonic(), generation))
            self.stopping.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=self.timeout + 1)


def _generation(port: int, timeout: float) -> int | None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", "/", headers={"Connection": "close"})
        response = connection.getresponse()
        body = response.read().decode("latin-1")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    found = re.match(r"generation (\d+) ", body)
    return int(found.group(1)) if response.status == 200 and found else None


class _Background(threading.Thread):
    """The load, run in a thread so that the lifecycle's steps go on beside it."""

    def __init__(self, run_load: Callable[[], tuple[dict, bool]]) -> None:
        super().__init__(daemon=True)
        self.run_load = run_load
        self.outcome: tuple[dict, bool] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.outcome = self.run_load()
        except BaseException as error:  # noqa: BLE001 - raised again in result()
            self.error = error

    def running(self) -> bool:
        return self.is_alive()

    def result(self) -> tuple[dict, bool]:
        self.join()  # run_load is bounded by the scenario's time limit
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome


# ---------------------------------------------------------------------------------------------
# Upgrade


def _upgrade(
    spec: Upgrade,
    server: str,
    process: subprocess.Popen,
    port: int,
    workdir: Path,
    env: dict[str, str],
    workers: int,
    loaded: _Background,
) -> tuple[dict, bool, dict, str]:
    output = workdir / "keepalive.out"
    with output.open("wb") as log:
        clients = procs.start(
            [
                sys.executable,
                str(HERE / "keepalive_clients.py"),
                "--port",
                str(port),
                "--count",
                str(spec.idle),
                "--seconds",
                f"{spec.after + spec.exit_within + 60:g}",
            ],
            log=log,
            cwd=workdir,
            env=env,
        )
    try:
        line = procs.wait_for_line(clients, output, KEEPALIVE_MARKER, 30.0)
        if line is None:
            raise LifecycleError(f"keepalive_clients.py did not report holding its connections; see {output}")
        holding = json.loads(line[len(KEEPALIVE_MARKER) :])
        loaded.start()
        time.sleep(spec.after)
        old = process.pid
        began = time.monotonic()
        if server == "maitred":
            _upgrade_maitred(process, spec)
        else:
            _upgrade_gunicorn(process, workdir, workers, spec)
        upgrade_s = time.monotonic() - began
        new = _new_master(workdir, old)
        clients.send_signal(signal.SIGUSR1)
        again_line = _wait_for_event(clients, output, "again", 60.0)
        again = json.loads(again_line[len(KEEPALIVE_MARKER) :]) if again_line else None
        by_new = (
            sum(count for pid, count in again["pids"].items() if pid.isdigit() and _descends(int(pid), new))
            if again and new
            else 0
        )
        measurement, cut_short = loaded.result()
    finally:
        procs.stop(clients, grace=2.0)
    exit_code = process.returncode
    figures = {
        "idle_before": holding["held"],
        "idle_answered": again["answered"] if again else None,
        "idle_by_new": by_new,
        "idle_closed": again["closed"] if again else None,
        "idle_reset": again["reset"] if again else None,
        "idle_other": again["timeout"] + again["error"] + again["non2xx"] if again else None,
        "old_exit": exit_code,
        "pid_file_new": int(new is not None and _read_pid(workdir / PID_FILE) == new),
        "upgrade_s": upgrade_s,
        **{
            f"wrk_{kind}": measurement["failed_detail"].get(kind, 0) for kind in ("connect", "read", "write", "timeout")
        },
    }
    status = "still running" if exit_code is None else f"exited with {exit_code}"
    detail = (
        f"old master {old} {status} {upgrade_s:.1f} s after SIGUSR2; new master {new} (from {PID_FILE}); "
        f"idle answers by pid: {again['pids'] if again else 'none'}"
    )
    return measurement, cut_short, figures, detail


def _upgrade_maitred(process: subprocess.Popen, spec: Upgrade) -> None:
    """SIGUSR2: the new maitred takes over and the old one exits by itself."""
    process.send_signal(signal.SIGUSR2)
    try:
        process.wait(timeout=spec.exit_within)
    except subprocess.TimeoutExpired:
        pass


def _upgrade_gunicorn(process: subprocess.Popen, workdir: Path, workers: int, spec: Upgrade) -> None:
    """SIGUSR2 starts a new master beside the old one (its pid file gets the suffix .2); once its
    workers have booted and had time to import the app, SIGTERM stops the old master gracefully."""
    log = workdir / "server.log"
    booted = len(re.findall(r"Booting worker with pid", log.read_text(errors="replace")))
    process.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + spec.exit_within
    while time.monotonic() < deadline:
        now_booted = len(re.findall(r"Booting worker with pid", log.read_text(errors="replace")))
        if now_booted >= booted + workers and (workdir / f"{PID_FILE}.2").exists():
            break
        time.sleep(0.02)
    else:
        return
    time.sleep(spec.import_margin)
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=spec.exit_within)
    except subprocess.TimeoutExpired:
        pass


def _new_master(workdir: Path, old: int, within: float = 5.0) -> int | None:
    """The pid the pid file holds once it names a process other than the old master (gunicorn's
    new master renames its own file, with the suffix .2, to that name after the old one exits,
    within a second); failing that, the pid in gunicorn's file with the suffix .2."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pid = _read_pid(workdir / PID_FILE)
        if pid is not None and pid != old:
            return pid
        time.sleep(0.05)
    pid = _read_pid(workdir / f"{PID_FILE}.2")
    return pid if pid != old else None


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _descends(pid: int, ancestor: int) -> bool:
    """Whether ancestor is pid's parent, grandparent... (read from /proc now)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return False


def _wait_for_event(process: subprocess.Popen, path: Path, event: str, timeout: float) -> str | None:
    """The keepalive_clients.py report of that event, once written; None if the program exits
    without it or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited = process.poll() is not None
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(KEEPALIVE_MARKER) and json.loads(line[len(KEEPALIVE_MARKER) :])["event"] == event:
                return line
        if exited:
            return None
        time.sleep(0.05)
    return None
