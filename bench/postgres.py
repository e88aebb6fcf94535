"""A throw-away PostgreSQL cluster for the database scenarios (DB-DJANGO, DB-FLASK, DB-FASTAPI).

Debian's PostgreSQL (the `postgresql` package, installed by bench/run.py when missing), never the
machine's own cluster: `initdb` makes a new one in a temporary directory, owned by the `postgres`
user (PostgreSQL refuses to run as root), and the postmaster runs in the foreground from there, in
a process group of its own (bench/procs.py), listening only on a Unix socket in that directory
under a free port number. It loads TechEmpower's schema: `world` (10,000 rows of id and
randomnumber, 1 to 10,000) and `fortune` (12 messages). Once the scenarios are over, or whatever
interrupted them, the postmaster is stopped and the directory removed.

The applications reach it through libpq's own environment variables (PGHOST, PGPORT, PGUSER,
PGDATABASE), which psycopg, Django and asyncpg all read: `Cluster.environment()`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import procs
from db_rules import WORLD_ROWS

OWNER = "postgres"
DATABASE = "bench"
# TechEmpower's fortunes, the table's 12 rows by id; the application adds a 13th at request time.
# They test the template's escaping (the script tag, the quotes and ampersand-free apostrophes)
# and its UTF-8 (the em dashes and the Japanese line).
FORTUNES = (
    "fortune: No such file or directory",
    "A computer scientist is someone who fixes things that aren't broken.",
    "After enough decimal places, nobody gives a damn.",
    "A bad random number generator: 1, 1, 1, 1, 1, 4.33e+67, 1, 1, 1",
    "A computer program does what you tell it to do, not what you want it to do.",
    "Emacs is a nice operating system, but I prefer UNIX. — Tom Christaensen",
    "Any program that runs right is obsolete.",
    "A list is only as strong as its weakest link. — Donald Knuth",
    "Feature: A bug with seniority.",
    "Computers make very fast, very accurate mistakes.",
    '<script>alert("This should not be displayed in a browser alert box.");</script>',
    "フレームワークのベンチマーク",
)
# The cluster is thrown away at the end, so nothing it writes needs to survive a crash: without
# fsync, and with commits not waiting for their WAL, the updates test measures the servers and the
# queries rather than the shared machine's disk.
SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
READY_SECONDS = 30.0


class ClusterError(Exception):
    """The cluster did not start or load its schema; str(error) says why."""


def bin_directory() -> Path | None:
    """The newest PostgreSQL's programs (initdb, postgres, pg_isready, psql) Debian installed, or
    None when none is."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda path: int(path.parent.parent.name))
    return found[-1].parent if found else None


class Cluster:
    """A running throw-away cluster: its directory, socket and postmaster."""

    def __init__(self, directory: Path, port: int, postmaster: subprocess.Popen, programs: Path) -> None:
        self.directory = directory
        self.port = port
        self.postmaster = postmaster
        self.programs = programs

    def environment(self) -> dict[str, str]:
        """libpq's variables that lead a client to this cluster's database."""
        return {"PGHOST": str(self.directory), "PGPORT": str(self.port), "PGUSER": OWNER, "PGDATABASE": DATABASE}

    def cpu_seconds(self) -> float:
        """The CPU time the postmaster and its backends have spent (those that ended included)."""
        return procs.tree_cpu_seconds(self.postmaster.pid)

    def version(self) -> str:
        return _run_as_owner([str(self.programs / "postgres"), "--version"], self.directory).strip()


@contextlib.contextmanager
def running() -> Iterator[Cluster]:
    """A new cluster, started and loaded; stopped and removed when the block ends, however."""
    programs = bin_directory()
    if programs is None:
        raise ClusterError("PostgreSQL is not installed (/usr/lib/postgresql/*/bin/initdb)")
    directory = Path(tempfile.mkdtemp(prefix="maitred-bench-postgres-"))
    postmaster = None
    try:
        shutil.chown(directory, OWNER, OWNER)
        data = directory / "data"
        _run_as_owner(
            [str(programs / "initdb"), "-D", str(data), "-U", OWNER, "--auth=trust", "-E", "UTF8", "--no-locale"],
            directory,
        )
        port = procs.free_port()
        settings = [flag for name, value in SETTINGS.items() for flag in ("-c", f"{name}={value}")]
        argv = [
            str(programs / "postgres"),
            "-D",
            str(data),
            "-k",
            str(directory),
            "-p",
            str(port),
            # No TCP listener: the socket in the directory is the only way in.
            "-c",
            "listen_addresses=",
            *settings,
        ]
        with (directory / "postgres.log").open("wb") as log:
            postmaster = procs.start(argv, log=log, cwd=directory, env={}, user=OWNER)
        cluster = Cluster(directory, port, postmaster, programs)
        _wait_ready(cluster)
        _load_schema(cluster)
        yield cluster
    finally:
        if postmaster is not None:
            _stop(postmaster)
        shutil.rmtree(directory, ignore_errors=True)


def _stop(postmaster: subprocess.Popen) -> None:
    """Stops the postmaster and every process it started. SIGINT is PostgreSQL's fast shutdown: the
    postmaster ends its backends and exits once they have, where procs.stop's SIGTERM would wait
    for every client to leave. Each backend runs in a session of its own, out of the postmaster's
    process group that procs.stop watches: one still alive after the postmaster (had it been
    killed, a backend ends only when it next notices) gets SIGKILL, found by its pid and its start
    time, so that a pid reused meanwhile by another process is left alone."""
    backends = {pid: procs.start_time(pid) for pid in procs.descendants(postmaster.pid)}
    procs.interrupt(postmaster)
    procs.stop(postmaster, grace=10.0)
    for pid, started in backends.items():
        if started is not None and procs.start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _run_as_owner(argv: list[str], cwd: Path, stdin: str | None = None) -> str:
    result = subprocess.run(
        argv, input=stdin, cwd=cwd, user=OWNER, check=False, capture_output=True, text=True, timeout=120
    )
    if result.returncode != 0:
        raise ClusterError(f"{Path(argv[0]).name} exited with status {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def _wait_ready(cluster: Cluster) -> None:
    deadline = time.monotonic() + READY_SECONDS
    probe = [str(cluster.programs / "pg_isready"), "-q", "-h", str(cluster.directory), "-p", str(cluster.port)]
    while subprocess.run(probe, check=False).returncode != 0:
        log = cluster.directory / "postgres.log"
        if cluster.postmaster.poll() is not None or time.monotonic() > deadline:
            raise ClusterError(f"the postmaster did not start; its log: {log.read_text(errors='replace').strip()}")
        time.sleep(0.1)


def _load_schema(cluster: Cluster) -> None:
    psql = [
        str(cluster.programs / "psql"),
        "-q",
        "-X",
        "-v",
        "ON_ERROR_STOP=1",
        "-h",
        str(cluster.directory),
        "-p",
        str(cluster.port),
        "-U",
        OWNER,
    ]
    _run_as_owner([*psql, "-d", "postgres", "-c", f"CREATE DATABASE {DATABASE}"], cluster.directory)
    fortunes = ",\n".join(
        f"({number}, '{message.replace(chr(39), chr(39) * 2)}')" for number, message in enumerate(FORTUNES, 1)
    )
    schema = f"""
CREATE TABLE world (id integer PRIMARY KEY, randomnumber integer NOT NULL);
INSERT INTO world (id, randomnumber)
    SELECT id, 1 + floor(random() * {WORLD_ROWS})::integer FROM generate_series(1, {WORLD_ROWS}) AS id;
CREATE TABLE fortune (id integer PRIMARY KEY, message varchar(2048) NOT NULL);
INSERT INTO fortune (id, message) VALUES
{fortunes};
VACUUM ANALYZE;
"""
    _run_as_owner([*psql, "-d", DATABASE], cluster.directory, stdin=schema)
