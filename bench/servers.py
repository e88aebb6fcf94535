"""The servers under test: how to install each, start it with N workers (and M threads where it
has threads) on a given port, and know that it is ready.

Adding a peer is adding one Server here. Processes are stopped by process group (procs.stop), so
a server only has to run in the foreground and not leave its session. Servers configured by a
file (nginx, Apache httpd) start through peers/from_template.py, which writes the file into the
run's work directory and then execs the server.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PEERS = BENCH / "peers"
# The project's build (`make`); MAITRED=/path/to/maitred measures another build instead.
MAITRED = Path(os.environ.get("MAITRED", REPO / ".venv" / "bin" / "maitred"))
PEERS_VENV = BENCH / ".peers"
# The database applications' packages (peers/db-apps.txt), installed apart from both venvs and put
# first on every server's PYTHONPATH in the database scenarios.
DB_APPS = PEERS_VENV / "db-apps"


@dataclass(frozen=True)
class Launch:
    """What one run asks of a server."""

    app: str  # "module:callable" in bench/apps.py (WSGI) or bench/asgi_apps.py (ASGI)
    port: int
    workers: int
    threads: int | None  # None: the server's own production default (default_threads)
    backlog: int | None  # None: the server's default
    # A pid file, relative to the run's directory (U1 reads the new master's pid from it); None: none.
    # Only the servers whose binary upgrade is measured (maitred, gunicorn) are given one.
    pid_file: str | None = None
    # The server's own settings under test (maitred's queue policies in O1-WSGI, uvicorn's
    # --limit-concurrency in O1-ASGI), before the app on its command line.
    options: tuple[str, ...] = ()
    # The app's interface: the scenario's. Servers that serve both (granian) are told which; maitred
    # tells them apart by the app's signature, and the others serve one only.
    interface: Literal["wsgi", "asgi"] = "wsgi"


# Server.default_threads for a server that picks its own thread count from other settings.
AUTO: Literal["auto"] = "auto"
# Server.default_threads for a server that runs one thread per worker unless told otherwise
# (uWSGI): its command then passes no thread flag, and its label names threads only where a
# scenario sets them, so that it reads as it always has in the line-ups that leave them alone.
ONE_THREAD: Literal["one"] = "one"


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
    # Pinned PyPI requirements installed after those without their declared dependencies: only for
    # a package whose own pins cannot install on this Python (its entry says why).
    pip_no_deps: tuple[str, ...] = ()
    # Debian packages the server needs, to run or to build its PyPI package: installed with apt-get
    # when missing, and their versions recorded in the results.
    debian: tuple[str, ...] = ()
    # How many threads each worker runs when the scenario does not fix it: a number; AUTO where the
    # server derives it from other settings (the command then leaves its thread flag out);
    # ONE_THREAD where it runs one unless told otherwise; None where the server has no threads.
    default_threads: int | Literal["auto", "one"] | None = None
    # Where the version comes from: a PyPI distribution in bench/.peers, or a command.
    version_command: tuple[str, ...] = ()
    # A ceiling, not a peer: it runs no app (nginx's fixed body). Shown, never led against.
    ceiling: bool = False
    # Whether its command passes a scenario entry's options (Launch.options) on.
    takes_options: bool = False
    # The interfaces it serves (a scenario of another is refused when its line-up is built).
    interfaces: tuple[str, ...] = ("wsgi",)

    def threads_for(self, launch: Launch) -> int | None:
        """The thread count to pass, or None to pass none (no threads, or the server's own default)."""
        if self.default_threads is None:
            return None
        if launch.threads is not None:
            return launch.threads
        return None if self.default_threads in (AUTO, ONE_THREAD) else self.default_threads

    def label(self, threads: int | None, processes: int | None = None) -> str:
        """The server's name, with its thread count where it has threads, and its process count
        where a line-up sets it apart from the scenario's workers."""
        count = threads if threads is not None else self.default_threads
        if self.default_threads is None or count == ONE_THREAD:
            return self.name if processes is None else f"{self.name} ({processes} processes)"
        if count == AUTO:
            return f"{self.name} (default threads)"
        per_process = "" if processes is None else f"{processes} x "
        return f"{self.name} ({per_process}{count} thread{'s' if count > 1 else ''})"

    def argv(self, launch: Launch) -> list[str]:
        return self.command(launch, self.threads_for(launch))


def _backlog(launch: Launch) -> list[str]:
    return [] if launch.backlog is None else ["--backlog", str(launch.backlog)]


def _pid_file(launch: Launch) -> list[str]:
    return [] if launch.pid_file is None else ["--pid", launch.pid_file]


def _peer(executable: str) -> str:
    return str(PEERS_VENV / "bin" / executable)


def _address(launch: Launch) -> str:
    return f"127.0.0.1:{launch.port}"


@functools.cache
def maitred_takes_threads() -> bool:
    """Whether the maitred measured takes --threads (issue 19 adds it): its --help lists the flag.
    Builds before it refuse the flag, so a scenario's threads are not passed to them and each of
    their workers serves one request at a time. Asked once per invocation of the harness."""
    try:
        help_text = subprocess.run(
            [str(MAITRED), "--help"], check=False, capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return re.search(r"^\s*(-\w+( \w+)?, )?--threads\b", help_text, re.MULTILINE) is not None


def _maitred_threads(launch: Launch) -> list[str]:
    if launch.threads is None or not maitred_takes_threads():
        return []
    return ["--threads", str(launch.threads)]


def _from_template(template: str, output: str, values: dict[str, object], server: list[str]) -> list[str]:
    """The argv that writes output from bench/peers/template with values, then execs server."""
    return [
        _peer("python"),
        str(PEERS / "from_template.py"),
        template,
        output,
        *(f"{name}={value}" for name, value in values.items()),
        "--",
        *server,
    ]


# nginx's keepalive_requests and Apache's MaxKeepAliveRequests: high enough that no benchmark
# connection is closed for having carried too many requests (see peers/nginx.conf.template).
KEEPALIVE_REQUESTS = 1_000_000
# What nginx and Apache httpd use when not told (both document 511 on Linux): their templates
# always name a backlog, so that every command line says what the server was given.
NGINX_DEFAULT_BACKLOG = 511
APACHE_DEFAULT_BACKLOG = 511
# granian refuses a backlog below 128 (its --backlog is range-checked), so S1-b10 gets 128 there.
GRANIAN_MIN_BACKLOG = 128


def _gunicorn(worker_class: str) -> Callable[[Launch, int | None], list[str]]:
    def command(launch: Launch, threads: int | None) -> list[str]:
        thread_flags = [] if threads is None else ["--threads", str(threads)]
        return [
            _peer("gunicorn"),
            "-k",
            worker_class,
            "-w",
            str(launch.workers),
            *thread_flags,
            "-b",
            f"127.0.0.1:{launch.port}",
            *_backlog(launch),
            *_pid_file(launch),
            *launch.options,
            launch.app,
        ]

    return command


def _uwsgi(launch: Launch, threads: int | None) -> list[str]:
    # The workers speak HTTP themselves (--http-socket, no router process in front), one
    # single-threaded process each unless a scenario sets threads (--threads, which enables
    # Python threads in uWSGI by itself), under a master; what uWSGI's "things to know" advise for
    # production: --die-on-term (uWSGI 2.0 reloads on SIGTERM otherwise), --need-app (fail if the
    # app does not load), --strict (reject unknown options). --disable-logging turns off the
    # per-request log line, as no other server here writes an access log.
    # --thunder-lock: uWSGI's workers wait for the shared listen socket in epoll, which wakes every
    # process for each connection; uWSGI's article "Serializing accept()" gives the lock as the
    # fix (one process at a time waits to accept) and robust pthread mutexes, which Linux has, as
    # the safe way to hold it. That herd is S3's subject, so uWSGI runs with its documented fix.
    # Keep-alive: an --http-socket worker answers HTTP/1.1 and then closes the connection without
    # a "Connection: close" header, so a keep-alive client (wrk, ab -k, a proxy) only learns of
    # the close when its next request on it fails; wrk counts those as read errors.
    backlog = [] if launch.backlog is None else ["--listen", str(launch.backlog)]
    thread_flags = [] if threads is None else ["--threads", str(threads)]
    return [
        _peer("uwsgi"),
        "--master",
        "--processes",
        str(launch.workers),
        *thread_flags,
        "--http-socket",
        _address(launch),
        "--module",
        launch.app,
        "--need-app",
        "--strict",
        "--die-on-term",
        "--thunder-lock",
        "--disable-logging",
        *backlog,
    ]


def _granian(launch: Launch, threads: int | None) -> list[str]:
    # On Linux each granian worker listens on a socket of its own (SO_REUSEPORT), so --backlog is
    # per worker: the kernel queues up to backlog x workers connections in all.
    thread_flags = [] if threads is None else ["--blocking-threads", str(threads)]
    backlog = [] if launch.backlog is None else ["--backlog", str(max(GRANIAN_MIN_BACKLOG, launch.backlog))]
    return [
        _peer("granian"),
        "--interface",
        launch.interface,
        "--host",
        "127.0.0.1",
        "--port",
        str(launch.port),
        "--workers",
        str(launch.workers),
        *thread_flags,
        *backlog,
        *launch.options,
        launch.app,
    ]


# uvicorn's ASGI stack, as its docs advise for production (`pip install uvicorn[standard]`, which
# brings httptools and uvloop; its --http and --loop "auto" then pick them): the versions pinned.
UVICORN_PIP = ("uvicorn==0.54.0", "httptools==0.9.0", "uvloop==0.23.0")
# The WebSocket implementation of uvicorn[standard], pinned as tests/requirements.txt pins it.
UVICORN_WEBSOCKETS = "websockets==17.4"


def _uvicorn(launch: Launch, threads: int | None) -> list[str]:
    # --workers N: uvicorn's own supervisor, N processes on one shared listen socket. --http and
    # --loop name what "auto" picks with uvicorn[standard], so that the command line says it.
    # --no-access-log: uvicorn writes a line per request by default, and no other server here
    # writes an access log (maitred's, gunicorn's and granian's are off unless asked for).
    # launch.options: --limit-concurrency in O1-ASGI (scenarios.py says which value and why).
    return [
        _peer("uvicorn"),
        "--host",
        "127.0.0.1",
        "--port",
        str(launch.port),
        "--workers",
        str(launch.workers),
        "--http",
        "httptools",
        "--loop",
        "uvloop",
        "--no-access-log",
        *_backlog(launch),
        *launch.options,
        launch.app,
    ]


def _waitress(launch: Launch, threads: int | None) -> list[str]:
    assert threads is not None, "waitress has a numeric default_threads"
    return [
        _peer("waitress-serve"),
        f"--listen={_address(launch)}",
        f"--threads={launch.workers * threads}",
        *([] if launch.backlog is None else [f"--backlog={launch.backlog}"]),
        launch.app,
    ]


# libpython3.11 is the Python mod_wsgi runs the app on (Debian's, not bench/.peers'): named so
# that its version is in the results.
APACHE_DEBIAN = ("apache2", "libapache2-mod-wsgi-py3", "libpython3.11")


def _apache(mpm: str, launch: Launch, threads: int | None) -> list[str]:
    # launch.workers processes of `threads` threads each, in httpd's MPM and in mod_wsgi's daemon
    # processes alike: S4's MaxRequestWorkers 6 with ThreadsPerChild 3 is workers=2, threads=3.
    assert threads is not None, "apache has a numeric default_threads"
    module, _, callable_name = launch.app.partition(":")
    return _from_template(
        "apache.conf.template",
        "apache.conf",
        {
            "mpm": mpm,
            "address": _address(launch),
            "backlog": APACHE_DEFAULT_BACKLOG if launch.backlog is None else launch.backlog,
            "processes": launch.workers,
            "threads": threads,
            "max_workers": launch.workers * threads,
            "keepalive_requests": KEEPALIVE_REQUESTS,
            # The app's module is a file in bench/, which mod_wsgi loads as a script.
            "bench": BENCH,
            "module": module,
            "callable": callable_name,
        },
        ["/usr/sbin/apache2", "-d", ".", "-f", "apache.conf", "-DFOREGROUND"],
    )


SERVERS: dict[str, Server] = {
    server.name: server
    for server in (
        Server(
            name="maitred",
            command=lambda launch, _threads: [
                str(MAITRED),
                "-w",
                str(launch.workers),
                *_maitred_threads(launch),
                "-b",
                f"127.0.0.1:{launch.port}",
                *_backlog(launch),
                *_pid_file(launch),
                *launch.options,
                launch.app,
            ],
            ready_line=lambda launch: re.compile(rf"listening at http://127\.0\.0\.1:{launch.port}\b"),
            version_command=(str(MAITRED), "--version"),
            takes_options=True,
            interfaces=("wsgi", "asgi"),
            # No default_threads: maitred is the reference every scenario's results compare against
            # by its plain name, so its label never names threads; its command line does, where a
            # scenario sets them and the build takes them (maitred_takes_threads).
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
            # h2 (gunicorn's [http2] extra): its HTTP/2, which the gthread worker serves (H2-T1,
            # H2-L1, M1-H2 turn it on with launch.options; scenarios.py says how).
            pip=("gunicorn==27.0.1", "h2==4.4.1"),
            # gunicorn's docs advise 2-4 threads per core for gthread; the suite takes 4.
            default_threads=4,
            takes_options=True,
        ),
        Server(
            name="uwsgi",
            command=lambda launch, threads: _uwsgi(launch, threads),
            # uWSGI calls a worker's threads its cores.
            ready_line=lambda launch: re.compile(
                rf"spawned uWSGI worker \d+ \(pid: \d+, cores: {launch.threads or 1}\)"
            ),
            ready_count=lambda launch: launch.workers,
            pip=("uWSGI==2.0.31",),
            default_threads=ONE_THREAD,
        ),
        Server(
            name="granian",
            command=lambda launch, threads: _granian(launch, threads),
            ready_line=lambda launch: re.compile(r"Started worker-\d+"),
            ready_count=lambda launch: launch.workers,
            pip=("granian==2.8.7",),
            # granian's docs advise leaving --blocking-threads alone for WSGI; it then runs
            # backlog / workers / 2 threads per worker (256 with 2 workers and its backlog of 1024).
            # For ASGI the app runs on each worker's event loop (uvloop when installed, --loop
            # auto) and --blocking-threads is not given either.
            default_threads=AUTO,
            # launch.options: --backpressure in the database scenarios (scenarios.py says why).
            takes_options=True,
            interfaces=("wsgi", "asgi"),
        ),
        Server(
            name="uvicorn",
            command=_uvicorn,
            # Each worker logs it once the app's lifespan startup is done (bench/asgi_apps.py
            # answers the lifespan protocol).
            ready_line=lambda launch: re.compile(r"Application startup complete"),
            ready_count=lambda launch: launch.workers,
            # websockets: the WebSocket library uvicorn[standard] brings, without which uvicorn
            # refuses every upgrade (LL-WS names it on the command line, --ws websockets).
            pip=(*UVICORN_PIP, UVICORN_WEBSOCKETS),
            takes_options=True,
            interfaces=("asgi",),
        ),
        Server(
            name="gunicorn-uvicorn",
            # uvicorn's docs for running under gunicorn: the worker class of uvicorn-worker, the
            # maintained package (uvicorn.workers is deprecated); it picks httptools and uvloop
            # as uvicorn's "auto" does.
            command=_gunicorn("uvicorn_worker.UvicornWorker"),
            ready_line=lambda launch: re.compile(r"Application startup complete"),
            ready_count=lambda launch: launch.workers,
            pip=("gunicorn==27.0.1", "uvicorn-worker==0.4.0", *UVICORN_PIP),
            interfaces=("asgi",),
        ),
        Server(
            name="waitress",
            command=lambda launch, threads: _waitress(launch, threads),
            ready_line=lambda launch: re.compile(rf"Serving on http://127\.0\.0\.1:{launch.port}\b"),
            pip=("waitress==3.0.2",),
            # waitress is one process of threads, so a worker here is a share of its threads:
            # --threads is workers x threads. Its default, 4 threads, is one worker's share, as for
            # gunicorn's gthread; with threads=1 it runs as many apps at once as a prefork server.
            default_threads=4,
        ),
        Server(
            name="bjoern",
            command=lambda launch, _threads: [
                _peer("python"),
                str(PEERS / "bjoern_serve.py"),
                "-w",
                str(launch.workers),
                "-b",
                _address(launch),
                *_backlog(launch),
                launch.app,
            ],
            ready_line=lambda launch: re.compile(r"bjoern_serve: process \d+ serving"),
            ready_count=lambda launch: launch.workers,
            pip=("bjoern==3.2.2",),
            debian=("libev-dev",),  # bjoern builds against libev
        ),
        Server(
            name="meinheld",
            # meinheld's docs run it under gunicorn for more than one process, with its own worker.
            command=_gunicorn("egg:meinheld#gunicorn_worker"),
            ready_line=lambda launch: re.compile(r"Booting worker with pid"),
            ready_count=lambda launch: launch.workers,
            pip=("gunicorn==27.0.1", "greenlet==3.2.4"),
            # meinheld 1.0.2 (its last release) pins greenlet<0.5, which does not build on Python
            # 3.11; it works with greenlet 3.
            pip_no_deps=("meinheld==1.0.2",),
        ),
        Server(
            name="nginx",
            # Not an app server: it runs no app and serves hello's 12-byte body itself, whatever
            # launch.app says: the most this machine can answer over HTTP, as a ceiling for the rest.
            command=lambda launch, _threads: _from_template(
                "nginx.conf.template",
                "nginx.conf",
                {
                    "address": _address(launch),
                    "workers": launch.workers,
                    "backlog": NGINX_DEFAULT_BACKLOG if launch.backlog is None else launch.backlog,
                },
                ["/usr/sbin/nginx", "-p", ".", "-c", "nginx.conf", "-e", "stderr"],
            ),
            ready_line=lambda launch: re.compile(r"start worker process \d+"),
            ready_count=lambda launch: launch.workers,
            debian=("nginx",),
            ceiling=True,
        ),
        Server(
            name="apache-event",
            command=lambda launch, threads: _apache("event", launch, threads),
            ready_line=lambda launch: re.compile(r"Loading Python script file"),
            ready_count=lambda launch: launch.workers,
            debian=APACHE_DEBIAN,
            default_threads=3,  # ThreadsPerChild in S4 (docs/SCENARIOS.md)
        ),
        Server(
            name="apache-worker",
            command=lambda launch, threads: _apache("worker", launch, threads),
            ready_line=lambda launch: re.compile(r"Loading Python script file"),
            ready_count=lambda launch: launch.workers,
            debian=APACHE_DEBIAN,
            default_threads=3,  # ThreadsPerChild in S4 (docs/SCENARIOS.md)
        ),
    )
}
