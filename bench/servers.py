"""The servers under test: how to install each, start it with N workers (and M threads where it
has threads) on a given port, and know that it is ready.

Adding a peer is adding one Server here. Processes are stopped by process group (procs.stop), so
a server only has to run in the foreground and not leave its session.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# The project's build (`make`); MAITRED=/path/to/maitred measures another build instead.
MAITRED = Path(os.environ.get("MAITRED", REPO / ".venv" / "bin" / "maitred"))
PEERS_VENV = BENCH / ".peers"


@dataclass(frozen=True)
class Launch:
    """What one run asks of a server."""

    app: str              # "module:callable" in bench/apps.py
    port: int
    workers: int
    threads: int | None   # None: the server's own production default (default_threads)
    backlog: int | None   # None: the server's default


@dataclass(frozen=True)
class Server:
    name: str
    # The argv that serves launch.app in the foreground, given the launch and its thread count
    # (launch.threads, or default_threads when that is None).
    command: Callable[[Launch, int | None], list[str]]
    # A log line printed once per ready worker, or once when the whole server is ready: the run
    # starts when it has appeared ready_count(launch) times and GET / answers 200.
    ready_line: Callable[[Launch], re.Pattern[str]] | None = None
    ready_count: Callable[[Launch], int] = lambda launch: 1
    # Pinned PyPI requirements, installed into bench/.peers; empty for maitred (the project's .venv).
    pip: tuple[str, ...] = ()
    # How many threads each worker runs when the scenario does not fix it; None: no threads.
    default_threads: int | None = None
    # Where the version comes from: a PyPI distribution in bench/.peers, or a command.
    version_command: tuple[str, ...] = ()

    def threads_for(self, launch: Launch) -> int | None:
        if self.default_threads is None:
            return None
        return launch.threads if launch.threads is not None else self.default_threads

    def label(self, threads: int | None) -> str:
        """The server's name, with its thread count where it has threads."""
        if self.default_threads is None:
            return self.name
        count = threads if threads is not None else self.default_threads
        return f"{self.name} ({count} thread{'s' if count > 1 else ''})"

    def argv(self, launch: Launch) -> list[str]:
        return self.command(launch, self.threads_for(launch))


def _backlog(launch: Launch) -> list[str]:
    return [] if launch.backlog is None else ["--backlog", str(launch.backlog)]


def _peer(executable: str) -> str:
    return str(PEERS_VENV / "bin" / executable)


def _gunicorn(worker_class: str) -> Callable[[Launch, int | None], list[str]]:
    def command(launch: Launch, threads: int | None) -> list[str]:
        thread_flags = [] if threads is None else ["--threads", str(threads)]
        return [_peer("gunicorn"), "-k", worker_class, "-w", str(launch.workers), *thread_flags,
                "-b", f"127.0.0.1:{launch.port}", *_backlog(launch), launch.app]
    return command


SERVERS: dict[str, Server] = {server.name: server for server in (
    Server(
        name="maitred",
        command=lambda launch, _threads: [
            str(MAITRED), "-w", str(launch.workers), "-b", f"127.0.0.1:{launch.port}",
            *_backlog(launch), launch.app],
        ready_line=lambda launch: re.compile(rf"listening at http://127\.0\.0\.1:{launch.port}\b"),
        version_command=(str(MAITRED), "--version"),
    ),
    Server(
        name="gunicorn-sync",
        command=_gunicorn("sync"),
        ready_line=lambda launch: re.compile(r"Booting worker with pid"),
        ready_count=lambda launch: launch.workers,
        pip=("gunicorn==27.0.1",),
    ),
    Server(
        name="gunicorn-gthread",
        command=_gunicorn("gthread"),
        ready_line=lambda launch: re.compile(r"Booting worker with pid"),
        ready_count=lambda launch: launch.workers,
        pip=("gunicorn==27.0.1",),
        # gunicorn's docs advise 2-4 threads per core for gthread; issue 3 fixes 4.
        default_threads=4,
    ),
)}
