"""maitred's benchmark: every scenario against maitred and its peers, side by side.

    python3 bench/run.py                 # every scenario, 3 runs each, into bench/results/
    python3 bench/run.py -s S1,T1        # some scenarios
    python3 bench/run.py --quick         # short loads, 1 run, into bench/.work/quick/ (for trying out)
    python3 bench/run.py --list          # the scenarios and servers

The harness installs the peers itself into bench/.peers (a venv, pinned versions) and runs from
there, since it needs matplotlib too. maitred comes from the project's .venv, built by `make`.
See bench/README.md for what is measured and how to read the results.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import postgres
import procs
import soak
from measure import DEADLINE_CLIENTS_MANIFEST, BodyLoad, DeadlineClients, Load, strace_argv
from runner import SETTLE_SECONDS, WORK, brief, run_once
from scenarios import SCENARIOS, Entry, Scenario
from servers import BENCH, DB_APPS, MAITRED, PEERS, PEERS_VENV, REPO, SERVERS, Server, maitred_takes_threads

HARNESS_REQUIREMENTS = ("matplotlib==3.11.2",)
# strace counts accept calls (S3-accept) and the BODY scenarios' system calls; nginx is the proxy in
# front of the servers in S5; h2load is the HTTP/2 load (H2-T1, H2-L1); curl the BODY scenarios'
# clients.
DEBIAN_TOOLS = {
    "ab": "apache2-utils",
    "wrk": "wrk",
    "strace": "strace",
    "nginx": "nginx",
    "h2load": "nghttp2-client",
    "curl": "curl",
}
# The database scenarios' PostgreSQL (bench/postgres.py makes a cluster of its own with it).
DATABASE_PACKAGE = "postgresql"
# The database applications' packages, pinned, installed into DB_APPS.
DB_APPS_REQUIREMENTS = PEERS / "db-apps.txt"


def main(argv: list[str]) -> int:
    args = _parse_args(argv)
    if not _inside_peers_venv():
        try:
            _install_debian_tools(_selected(args))
            _create_peers_venv()
        except subprocess.CalledProcessError as error:
            return _fail(
                f"setting up the load tools and bench/.peers failed: {' '.join(error.cmd)} "
                f"exited with status {error.returncode}"
            )
        venv_python = str(PEERS_VENV / "bin" / "python")
        os.execv(venv_python, [venv_python, str(Path(__file__).resolve()), *argv])

    if args.list:
        _print_registry()
        return 0
    if args.scenarios:
        args.scenarios = _families(args.scenarios)
    if args.scenarios and soak.ID in args.scenarios:
        return _run_soak(args)
    if args.report_only:
        import report  # needs matplotlib, which only the peers' venv has

        out = Path(args.out) if args.out else BENCH / "results"
        data = json.loads((out / "latest.json").read_text())
        paths = report.write(out, data["environment"], [], SCENARIOS)
        print("\n".join(f"wrote {path}" for path in paths))
        return 0
    if unknown := set(args.scenarios or ()) - set(SCENARIOS):
        return _fail(f"unknown scenario(s) {', '.join(sorted(unknown))}; known: {', '.join(SCENARIOS)}")
    scenarios = _selected(args)
    wanted = set(args.servers) if args.servers else {e.server for s in scenarios for e in s.lineup}
    if unknown := wanted - set(SERVERS):
        return _fail(f"unknown server(s) {', '.join(sorted(unknown))}; known: {', '.join(SERVERS)}")
    if "maitred" in wanted and not MAITRED.exists():
        return _fail(f"{MAITRED} is missing: run `make` first to build it (or leave maitred out with --servers)")
    if any(_uses_deadline_clients(scenario) for scenario in scenarios) and (error := _build_deadline_clients()):
        return _fail(error)

    installs = _install_peers([SERVERS[name] for name in sorted(wanted)])
    with_database = any(scenario.db_tests for scenario in scenarios)
    # The BODY scenarios' ASGI app serves files with Starlette's FileResponse, from the same packages.
    with_db_apps = with_database or any(isinstance(scenario.load, BodyLoad) for scenario in scenarios)
    if with_db_apps and (error := _install_db_apps()):
        return _fail(error)
    available = {name for name in wanted if installs.get(name, "ok") == "ok"}
    out = Path(args.out) if args.out else (WORK / "quick" if args.quick else BENCH / "results")
    runs = args.runs if args.runs is not None else (1 if args.quick else 3)

    _raise_open_files_limit()
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, _interrupt)
    records: list[dict] = []
    tool_versions = {s.front.name: s.front.version() for s in scenarios if s.front and s.front.available()}
    try:
        with contextlib.ExitStack() as stack:
            database = stack.enter_context(postgres.running()) if with_database else None
            if database:
                tool_versions["postgresql"] = database.version()
                tool_versions["database applications"] = ", ".join(_db_apps_requirements(direct_only=True))
            for scenario in scenarios:
                records.append(
                    _run_scenario(
                        scenario, runs, args.quick, available, records, database, args.db_seconds, _body_sizes(args)
                    )
                )
    except KeyboardInterrupt:
        print("\ninterrupted: nothing written", file=sys.stderr)
        return 130
    except postgres.ClusterError as error:
        return _fail(f"the database scenarios' PostgreSQL: {error}")
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(number, signal.SIG_IGN)
        procs.stop_all()

    import report  # needs matplotlib, which only the peers' venv has

    environment = _environment(available, installs, tool_versions)
    paths = report.write(out, environment, records, SCENARIOS)
    print("\n".join(f"wrote {path}" for path in paths))
    return 0


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/run.py", description="maitred's benchmark harness.")
    parser.add_argument("-s", "--scenarios", type=_names, help="comma-separated scenario ids (default: all)")
    parser.add_argument(
        "--servers", type=_names, help="comma-separated server names (default: every one in the line-ups)"
    )
    parser.add_argument("-n", "--runs", type=int, help="runs per server and scenario (default: 3; --quick: 1)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="short loads for trying the harness out; writes to bench/.work/quick unless --out says otherwise",
    )
    parser.add_argument(
        "--db-seconds",
        type=int,
        help="seconds of wrk per load in the database scenarios (default: 10; --quick: 3)",
    )
    parser.add_argument("--out", help="directory for latest.md, latest.json and charts/ (default: bench/results)")
    parser.add_argument(
        "--body-mib",
        type=int,
        help=f"BODY-*: the body's size in MiB (default: {BODY_MIB}; --quick: {BODY_QUICK_MIB})",
    )
    parser.add_argument(
        "--body-bound-mib",
        type=float,
        default=BodyLoad.bound_mib,
        help="BODY-SLOW-GENERATED: the bound on the server's memory growth and temp-file disk, MiB "
        f"(default: {BodyLoad.bound_mib:g})",
    )
    parser.add_argument(
        "--soak-minutes",
        type=float,
        help=f"SOAK's length (default: {soak.MINUTES:g} minutes; --quick: {soak.QUICK_MINUTES:g})",
    )
    parser.add_argument(
        "--contend",
        action="store_true",
        help="SOAK: a busy loop per core beside the servers for the whole soak, as shared machines have",
    )
    parser.add_argument(
        "--soak-max-requests",
        type=int,
        default=soak.MAX_REQUESTS,
        help=f"SOAK: the workers' --max-requests (default: {soak.MAX_REQUESTS}; a few hundred recycles a worker every second)",
    )
    parser.add_argument(
        "--soak-fault-every", type=float, help="SOAK: seconds between faults (default: 20; --quick: 12)"
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and servers, run nothing")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write latest.md again from latest.json (after a change to the report)",
    )
    return parser.parse_args(argv)


def _run_soak(args: argparse.Namespace) -> int:
    """SOAK runs apart from the registry: several servers at once under one schedule of faults
    (bench/soak.py), with a report of its own."""
    if args.scenarios != [soak.ID]:
        return _fail(f"{soak.ID} runs alone (-s {soak.ID})")
    if not MAITRED.exists():
        return _fail(f"{MAITRED} is missing: run `make` first to build it")
    gunicorn = _install_peers([SERVERS["gunicorn-gthread"]]).get("gunicorn-gthread", "ok") == "ok"
    _raise_open_files_limit()
    minutes = args.soak_minutes or (soak.QUICK_MINUTES if args.quick else soak.MINUTES)
    default = BENCH / "results" / ("soak-contend" if args.contend else "soak")
    out = Path(args.out) if args.out else (WORK / "quick" if args.quick else default)
    try:
        return soak.run(minutes, args.quick, out, gunicorn, args.contend, args.soak_max_requests, args.soak_fault_every)
    finally:
        procs.stop_all()


# BODY-*: the body's size, and with --quick.
BODY_MIB = 512
BODY_QUICK_MIB = 64


def _body_sizes(args: argparse.Namespace) -> dict:
    """What the BODY loads take from the command line: the body's size and the generated answer's bound."""
    return {"mib": args.body_mib or (BODY_QUICK_MIB if args.quick else BODY_MIB), "bound_mib": args.body_bound_mib}


def _families(names: list[str]) -> list[str]:
    """-s BODY: every scenario whose id starts with BODY- (a family of ids); other names as given."""
    expanded = []
    for name in names:
        family = [scenario_id for scenario_id in SCENARIOS if scenario_id.startswith(name + "-")]
        expanded += family if name == "BODY" else [name]
    return expanded


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _selected(args: argparse.Namespace) -> list[Scenario]:
    """The scenarios asked for, in the registry's order whatever the command line's, so that T1 runs
    before C1, which takes its figure without the slow clients from T1's runs."""
    return [s for s in SCENARIOS.values() if not args.scenarios or s.id in args.scenarios]


def _fail(message: str) -> int:
    print(f"bench: error: {message}", file=sys.stderr)
    return 2


def _interrupt(number: int, frame: object) -> None:
    raise KeyboardInterrupt


def _inside_peers_venv() -> bool:
    return Path(sys.prefix).resolve() == PEERS_VENV.resolve()


def _install_debian_tools(scenarios: list[Scenario]) -> None:
    """The load tools, and what the scenarios asked for need: PostgreSQL, a front proxy."""
    missing = {package for tool, package in DEBIAN_TOOLS.items() if shutil.which(tool) is None}
    if any(scenario.db_tests for scenario in scenarios) and postgres.bin_directory() is None:
        missing.add(DATABASE_PACKAGE)
    missing |= {scenario.front.debian for scenario in scenarios if scenario.front and not scenario.front.available()}
    if missing:
        print(f"bench: installing {' '.join(sorted(missing))} from Debian", file=sys.stderr)
        for argv in _apt_get_install(sorted(missing)):
            subprocess.run(argv, check=True, env=_INSTALL_ENV)


# For installing: apt-get must not stop to ask a question, nobody is there to answer it.
_INSTALL_ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")


def _apt_get_install(packages: list[str]) -> list[list[str]]:
    return [["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]]


def _debian_installed(package: str) -> str | None:
    """The installed version of a Debian package, or None when it is not installed."""
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}\t${Version}", package], check=False, capture_output=True, text=True
    )
    status, _, version = result.stdout.partition("\t")
    return version if result.returncode == 0 and status == "install ok installed" else None


def _uses_deadline_clients(scenario: Scenario) -> bool:
    return isinstance(scenario.load, DeadlineClients) or isinstance(scenario.capacity, DeadlineClients)


def _build_deadline_clients() -> str | None:
    """Builds O1's load generator, bench/deadline-clients (Rust, its own Cargo.lock), once per
    invocation: a no-op when it is up to date. None, or why it could not be built."""
    package = DEADLINE_CLIENTS_MANIFEST.parent.relative_to(REPO)
    cargo = shutil.which("cargo")
    if cargo is None:
        return f"cargo is missing: it builds {package}, O1-WSGI's load generator (install Rust, or leave O1-WSGI out with -s)"
    print(f"bench: building {package}", file=sys.stderr)
    argv = [cargo, "build", "--release", "--quiet", "--locked", "--manifest-path", str(DEADLINE_CLIENTS_MANIFEST)]
    result = subprocess.run(argv, check=False)
    if result.returncode != 0:
        return f"building {package} failed: cargo {' '.join(argv[1:])} exited with status {result.returncode}"
    return None


def _create_peers_venv() -> None:
    if _made_elsewhere(PEERS_VENV):
        # A venv's scripts name its path in their first line: one moved here from a worktree
        # since removed runs no peer ("No such file or directory" for bin/gunicorn).
        print(f"bench: {PEERS_VENV.relative_to(REPO)} was made in another folder; making it again", file=sys.stderr)
        shutil.rmtree(PEERS_VENV)
    if not (PEERS_VENV / "bin" / "python").exists():
        print(f"bench: creating {PEERS_VENV.relative_to(REPO)}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    # pip as a module: a venv whose bin/pip script went missing still installs.
    subprocess.run(
        [str(PEERS_VENV / "bin" / "python"), "-m", "pip", "install", "-q", *HARNESS_REQUIREMENTS], check=True
    )


def _made_elsewhere(venv: Path) -> bool:
    """Whether the venv at `venv` says (pyvenv.cfg's `command`) it was made at another path."""
    try:
        lines = (venv / "pyvenv.cfg").read_text().splitlines()
    except FileNotFoundError:
        return False
    commands = [line.partition("=")[2].strip() for line in lines if line.partition("=")[0].strip() == "command"]
    return bool(commands) and Path(commands[0].split()[-1]).resolve() != venv.resolve()


def _install_peers(servers: list[Server]) -> dict[str, str]:
    """Installs what each server needs, its Debian packages (when missing) and then its pinned
    PyPI requirements; returns {server name: "ok" or why not}. A peer that does not install is
    reported, not fatal."""
    outcome = {}
    for server in servers:
        if server.debian or server.pip or server.pip_no_deps:
            outcome[server.name] = _install_peer(server)
            if outcome[server.name] != "ok":
                print(f"bench: {server.name} left out: {outcome[server.name]}", file=sys.stderr)
    return outcome


def _install_peer(server: Server) -> str:
    """ "ok", or what failed and the last line it printed."""
    steps = []
    if missing := [package for package in server.debian if _debian_installed(package) is None]:
        print(f"bench: installing {' '.join(missing)} from Debian for {server.name}", file=sys.stderr)
        steps += _apt_get_install(missing)
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    if server.pip and not _pinned_installed(server.pip):
        steps.append([*pip, *server.pip])
    if server.pip_no_deps and not _pinned_installed(server.pip_no_deps):
        steps.append([*pip, "--no-deps", *server.pip_no_deps])
    for argv in steps:
        result = subprocess.run(argv, check=False, capture_output=True, text=True, env=_INSTALL_ENV)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
            command = " ".join(argv[2:] if argv[0] == sys.executable else argv)
            return f"{command} failed: {last}"
    return "ok"


def _install_db_apps() -> str | None:
    """Installs the database applications' pinned packages into DB_APPS, unless every one is there
    at its version already. None, or why it failed."""
    pins = {_normalized(name): version for name, _, version in (r.partition("==") for r in _db_apps_requirements())}
    installed = {
        _normalized(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions(path=[str(DB_APPS)])
    }
    if installed == pins:
        return None
    print(f"bench: installing the database applications' packages into {DB_APPS.relative_to(REPO)}", file=sys.stderr)
    argv = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(DB_APPS)]
    result = subprocess.run([*argv, "-r", str(DB_APPS_REQUIREMENTS)], check=False, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"installing {DB_APPS_REQUIREMENTS.relative_to(REPO)} failed: {last}"
    return None


def _db_apps_requirements(direct_only: bool = False) -> list[str]:
    """The "name==version" lines of DB_APPS_REQUIREMENTS, or only those marked direct."""
    lines = DB_APPS_REQUIREMENTS.read_text().splitlines()
    return [
        line.partition("#")[0].strip()
        for line in lines
        if line.partition("#")[0].strip() and (line.endswith("# direct") or not direct_only)
    ]


def _normalized(name: str) -> str:
    """A distribution's name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pinned_installed(requirements: tuple[str, ...]) -> bool:
    """Whether every "name==version" is installed at that version here (pip takes a second per
    call to find that out for itself)."""
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        try:
            if importlib.metadata.version(name) != version:
                return False
        except importlib.metadata.PackageNotFoundError:
            return False
    return True


def _ephemeral_ports() -> int | None:
    """How many local ports the kernel picks client connections' ports from (each of a load's
    connections to one server's port takes one); None where it cannot be read."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except (OSError, ValueError):
        return None
    return int(high) - int(low) + 1


def _raise_open_files_limit() -> None:
    # ab -c 1000 needs over 1000 descriptors, and so does a server holding 1000 connections.
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _run_scenario(
    scenario: Scenario,
    runs: int,
    quick: bool,
    available: set[str],
    earlier: list[dict],
    database: postgres.Cluster | None,
    db_seconds: int | None,
    body_sizes: dict | None = None,
) -> dict:
    """Runs scenario `runs` times for every available server of its line-up, interleaved
    (A B C A B C ...) so that drift in the machine's speed hits every server alike. earlier: the
    records of the scenarios this invocation has run so far. database: the cluster of the
    database scenarios, db_seconds the duration of their loads (None: the scenario's)."""
    load = scenario.load and (scenario.load.shortened() if quick else scenario.load)
    if isinstance(load, BodyLoad) and body_sizes:
        load = replace(load, **body_sizes)
    if scenario.db_tests and db_seconds:
        load = replace(load, seconds=db_seconds)
    if scenario.db_tests and quick:
        scenario = replace(scenario, db_tests=scenario.db_tests.shortened())
    crowd = scenario.crowd and (scenario.crowd.shortened() if quick else scenario.crowd)
    capacity = scenario.capacity and (scenario.capacity.shortened() if quick else scenario.capacity)
    entries = [entry for entry in scenario.lineup if entry.server in available]
    labels = {entry: _label(entry) for entry in scenario.lineup}
    alone = _alone_figures(scenario, earlier)
    http1 = _http1_figures(scenario, earlier)
    commands = {}
    for entry in entries:
        argv = SERVERS[entry.server].argv(scenario.launch(entry, 0))
        # The port, 0 here, as the README writes it: "-b 127.0.0.1:PORT" or "--port PORT".
        command = " ".join([Path(argv[0]).name, *argv[1:]]).replace("127.0.0.1:0", "127.0.0.1:PORT")
        command = re.sub(r"--port 0\b", "--port PORT", command)
        if scenario.trace_accepts:
            prefix = strace_argv(Path("strace.txt"))
            command = " ".join(prefix) + " " + command
        commands[labels[entry]] = command
    soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    warnings = []
    if soft_limit < scenario.open_files:
        warnings.append(
            f"The open-files limit here is {soft_limit}, below the {scenario.open_files} "
            "this scenario needs: failures may be the load tool's or the server's "
            "'Too many open files' rather than the server's doing."
        )
    if scenario.front and not scenario.front.available():
        warnings.append(f"{scenario.front.name} is not installed: every run fails.")
    warnings += [
        f"{labels[entry]} without --threads ({MAITRED}'s --help does not list it): "
        f"{scenario.launch(entry, 0).workers} workers, one request at a time each."
        for entry in entries
        if entry.server == "maitred" and entry.threads is not None and not maitred_takes_threads()
    ]
    skip = []
    if scenario.skip_without_room:
        ports = _ephemeral_ports()
        if soft_limit < scenario.open_files:
            skip.append(f"the open-files limit here is {soft_limit}, below the {scenario.open_files} it needs")
        if ports is not None and ports < scenario.open_files:
            skip.append(f"the ephemeral port range here holds {ports} ports, below the {scenario.open_files} it needs")
    record = {
        "id": scenario.id,
        "started": _now(),
        "commit": _git_commit(),
        "load": scenario.describe_load(load, entries) if load else None,
        "crowd": crowd.describe() if crowd else None,
        "capacity": capacity.describe() if capacity else None,
        "front": scenario.front.describe() if scenario.front else None,
        "front_command": scenario.front.command if scenario.front else None,
        "time_limit_s": scenario.limit(),
        "alone_from": scenario.alone_from if alone else None,
        "commands": commands,
        "left_out": [labels[entry] for entry in scenario.lineup if entry not in entries],
        "warnings": warnings,
        "runs": [],
    }
    print(f"\n{scenario.id}: {scenario.title}\n  load: {record['load'] or record['crowd']}", file=sys.stderr)
    for warning in warnings:
        print(f"  warning: {warning}", file=sys.stderr)
    if skip:
        why = "skipped: " + "; ".join(skip)
        print(f"  {why}", file=sys.stderr)
        # The skip says it all: the warning that failures may be the limit's is not needed.
        record["warnings"] = [w for w in warnings if not w.startswith("The open-files limit here")]
        record["warnings"].append(why[0].upper() + why[1:] + ".")
        record["runs"] = [
            {
                "server": labels[entry],
                "run": 1,
                "measurement": None,
                "error": why,
                "cut_short": False,
                "kernel": None,
                "extra": {},
                "wall_s": 0.0,
                "phases_s": {},
            }
            for entry in entries
        ]
        record["wall_s"] = 0
        return record
    began = time.monotonic()
    for repetition in range(1, runs + 1):
        round_load = load
        # O1-WSGI: every server's capacity first, then one rate for all. O1-ASGI (own_capacity):
        # each server's capacity just before its own overload run, on the machine as busy as it
        # is then (_capacity_run, per entry below).
        if capacity and not load.own_capacity:
            capacity_runs = _capacity_round(scenario, capacity, entries, labels, repetition, runs)
            capacities = {
                label: run["measurement"]["rps"]
                for label, run in capacity_runs.items()
                if run["measurement"] and not run["error"]
            }
            if not capacities:
                record["runs"] += [
                    dict(run, measurement=None, error=f"no capacity measured in this round ({run['error']})")
                    for run in capacity_runs.values()
                ]
                continue
            round_load = load.at_rate(load.times_capacity * max(capacities.values()))
            print(f"  run {repetition}/{runs} load: {round_load.describe()}", file=sys.stderr)
        for entry in entries:
            if capacity and load.own_capacity:
                capacity_run = _capacity_run(scenario, capacity, entry, labels[entry], repetition, runs)
                capacity_runs = {labels[entry]: capacity_run}
                own = capacity_run["measurement"]["rps"] if capacity_run["measurement"] else 0
                if capacity_run["error"] or not own:
                    why = capacity_run["error"] or "no answer"
                    record["runs"].append(dict(capacity_run, measurement=None, error=f"no capacity measured ({why})"))
                    continue
                capacities = {labels[entry]: own}
                round_load = load.at_rate(load.times_capacity * own)
            result = run_once(
                scenario,
                scenario.load_for(entry, round_load),
                crowd,
                entry,
                labels[entry],
                repetition,
                alone=alone.get((labels[entry], repetition)),
                database=database,
            )
            if capacity:
                _add_capacity(result, capacity_runs[labels[entry]], capacities.get(labels[entry]))
            if scenario.http1_from:
                _add_http1(result, http1.get((_label(replace(entry, options=())), repetition)))
            record["runs"].append(result)
            print(f"  run {repetition}/{runs} {labels[entry]:<28} {brief(result)}", file=sys.stderr)
            time.sleep(SETTLE_SECONDS)
    record["wall_s"] = round(time.monotonic() - began)
    print(f"  {scenario.id} took {record['wall_s']} s", file=sys.stderr)
    return record


def _capacity_round(
    scenario: Scenario, capacity: Load, entries: list[Entry], labels: dict[Entry, str], repetition: int, runs: int
) -> dict[str, dict]:
    """O1-WSGI: every server's capacity run of one round, each on a fresh server, by label."""
    return {
        labels[entry]: _capacity_run(scenario, capacity, entry, labels[entry], repetition, runs) for entry in entries
    }


def _capacity_run(scenario: Scenario, capacity: Load, entry: Entry, label: str, repetition: int, runs: int) -> dict:
    """O1: one server's capacity run, on a fresh server."""
    result = run_once(scenario, capacity, None, entry, label, repetition, stage="capacity")
    print(f"  run {repetition}/{runs} {label:<28} capacity: {brief(result)}", file=sys.stderr)
    time.sleep(SETTLE_SECONDS)
    return result


def _add_capacity(result: dict, capacity_run: dict, capacity: float | None) -> None:
    """O1: the server's capacity (None: its capacity run of the round measured none) and its
    goodput as a share of it; the capacity run itself is kept in the result, raw."""
    goodput = result["measurement"]["rps"] if result["measurement"] else None
    result["extra"]["capacity_rps"] = capacity
    result["extra"]["pct_capacity"] = 100 * goodput / capacity if capacity and goodput is not None else None
    result["capacity"] = {key: capacity_run[key] for key in ("measurement", "error", "extra", "wall_s")}
    if capacity is None:
        result["detail"] = f"capacity run: {capacity_run['error']}"


def _label(entry: Entry) -> str:
    clients = [] if entry.clients is None else [f"c={entry.clients}"]
    return " ".join([SERVERS[entry.server].label(entry.threads, entry.workers), *entry.options, *clients])


def _alone_figures(scenario: Scenario, earlier: list[dict]) -> dict[tuple[str, int], dict]:
    """C1: {(server label, run number): {"measurement", "source"}} from the runs of
    scenario.alone_from in this invocation, where it ran the same app, workers, backlog and load,
    and the run measured its whole load; empty otherwise (each run then measures it itself)."""
    donor = SCENARIOS.get(scenario.alone_from) if scenario.alone_from else None
    record = next((r for r in earlier if donor and r["id"] == donor.id), None)
    if record is None or (donor.app, donor.workers, donor.backlog, donor.load) != (
        scenario.app,
        scenario.workers,
        scenario.backlog,
        scenario.load,
    ):
        return {}
    return {
        (run["server"], run["run"]): {"measurement": run["measurement"], "source": f"{donor.id} run {run['run']}"}
        for run in record["runs"]
        if run["measurement"] is not None and not run["cut_short"] and not run["error"]
    }


def _http1_figures(scenario: Scenario, earlier: list[dict]) -> dict[tuple[str, int], float]:
    """H2-T1, H2-L1: {(server label, run number): req/s} of the runs of scenario.http1_from (T1,
    L1) in this invocation that measured their whole load; empty when it did not run."""
    record = next((r for r in earlier if r["id"] == scenario.http1_from), None) if scenario.http1_from else None
    if record is None:
        return {}
    return {
        (run["server"], run["run"]): run["measurement"]["rps"]
        for run in record["runs"]
        if run["measurement"] is not None and not run["cut_short"] and not run["error"]
    }


def _add_http1(result: dict, http1_rps: float | None) -> None:
    """H2-T1, H2-L1: the same server's HTTP/1.1 req/s (None: not measured in this invocation) and
    the HTTP/2 figure's ratio to it."""
    http2_rps = result["measurement"]["rps"] if result["measurement"] else None
    result["extra"]["http1_rps"] = http1_rps
    result["extra"]["h2_over_http1"] = http2_rps / http1_rps if http2_rps is not None and http1_rps else None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _run(argv: list[str]) -> str:
    try:
        result = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unavailable ({error})"
    return (result.stdout + result.stderr).strip()


def _git_commit() -> str:
    commit = _run(["git", "rev-parse", "--short=12", "HEAD"])
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return commit + (" with uncommitted changes" if dirty else "")


def _environment(available: set[str], installs: dict[str, str], tool_versions: dict[str, str]) -> dict:
    """What a reader needs to reproduce the figures: machine, kernel settings, versions (the
    servers', the load tools', and tool_versions: those of what some scenarios add)."""

    def first_line(text: str) -> str:
        return text.splitlines()[0] if text else ""

    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return "unavailable"

    cpu = next(
        (line.split(":", 1)[1].strip() for line in read("/proc/cpuinfo").splitlines() if line.startswith("model name")),
        "unknown",
    )
    memory = next(
        (line.split(":", 1)[1].strip() for line in read("/proc/meminfo").splitlines() if line.startswith("MemTotal")),
        "unknown",
    )
    versions = {
        "ab": first_line(_run(["ab", "-V"])).replace("This is ApacheBench, Version", "ApacheBench").split(" <")[0],
        "wrk": first_line(_run(["wrk", "-v"])).split(" Copyright")[0],
        "h2load": f"nghttp2-client {_debian_installed('nghttp2-client') or 'not installed'} (Debian)",
        "python (peers)": platform.python_version(),
        **tool_versions,
    }
    maitred_python = REPO / ".venv" / "bin" / "python"
    if maitred_python.exists():
        versions["python (maitred)"] = _run(
            [str(maitred_python), "-c", "import platform; print(platform.python_version())"]
        )
    for name in sorted(available):
        server = SERVERS[name]
        if server.version_command:
            versions[name] = f"{first_line(_run(list(server.version_command)))} ({server.version_command[0]})"
        else:
            debian = [
                f"{package} {_debian_installed(package) or 'not installed'} (Debian)" for package in server.debian
            ]
            versions[name] = ", ".join([*server.pip, *server.pip_no_deps, *debian])
    return {
        "date": _now(),
        "commit": _git_commit(),
        "machine": {
            "nproc": os.cpu_count(),
            "cpu": cpu,
            "memory": memory,
            "kernel": platform.release(),
            "net.core.somaxconn": read("/proc/sys/net/core/somaxconn"),
            "net.ipv4.tcp_max_syn_backlog": read("/proc/sys/net/ipv4/tcp_max_syn_backlog"),
            "net.ipv4.tcp_syncookies": read("/proc/sys/net/ipv4/tcp_syncookies"),
            "net.ipv4.ip_local_port_range": " ".join(read("/proc/sys/net/ipv4/ip_local_port_range").split()),
            "open files limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            # How an idle CPU waits: in a KVM guest, cpuidle-haltpoll polls up to guest_halt_poll_ns
            # before it halts (the kernel's default is 200000). At 0 each wake of an idle vCPU costs
            # 35-40 us here, which decides every one-client scenario (docs/PERFORMANCE.md).
            "cpuidle driver": read("/sys/devices/system/cpu/cpuidle/current_driver"),
            "haltpoll.guest_halt_poll_ns": read("/sys/module/haltpoll/parameters/guest_halt_poll_ns"),
        },
        "versions": versions,
        "peers not installed": {name: why for name, why in installs.items() if why != "ok"},
        "peers venv": _run([sys.executable, "-m", "pip", "freeze"]).splitlines(),
    }


def _print_registry() -> None:
    print("scenarios:")
    for scenario in SCENARIOS.values():
        loads = [scenario.crowd.describe()] if scenario.crowd else []
        loads += [scenario.describe_load(scenario.load, scenario.lineup)] if scenario.load else []
        first = f"capacity first: {scenario.capacity.describe()}; then " if scenario.capacity else ""
        print(
            f"  {scenario.id:<8} {scenario.title}\n           {first}{' + '.join(loads)}; "
            f"{scenario.workers} workers; {', '.join(_label(e) for e in scenario.lineup)}"
        )
    print(f"  {soak.ID:<8} {soak.TITLE} (runs alone: bench/soak.py)")
    print("servers:")
    for server in SERVERS.values():
        packages = [
            *server.pip,
            *(f"{requirement} (pip --no-deps)" for requirement in server.pip_no_deps),
            *(f"{package} (Debian)" for package in server.debian),
        ]
        # Only maitred installs nothing: it is the project's own build.
        print(f"  {server.name:<18} {', '.join(packages) or f'{MAITRED} (make install)'}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
