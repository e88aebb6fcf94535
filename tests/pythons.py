"""`make test-pythons`: the worker-side tests on every other CPython this machine has, 3.10 on.

CI's `make test` runs every test on one Python, the one .venv was made from. The wheel claims
every CPython from 3.10 on (README, "Installing"), and what differs between CPythons runs in the
workers: the channel's buffers, the threads, the signals, the collector. So, for each other
CPython minor version found (the newest patch of each; on PATH as python3.N, and in pyenv's
versions), this makes a venv in .venv-pythons/, installs into it the pip and the test packages
of tests/requirements.txt and the wheel `make wheel` put in dist/, and runs there the tests of
WORKER_SIDE. A free-threaded build is left out, saying why: the abi3 wheel does not install there
(README). A machine with no other CPython runs nothing, and says so.

The output is pytest's for each Python, after a line naming it; .ci/summary.py reads it. The exit
status is 1 when any run failed, 2 when dist/ holds no wheel for this machine.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / ".venv-pythons"
FLOOR = (3, 10)
WORKER_SIDE = [
    "tests/test_interpreter.py",
    "tests/test_worker_protocol.py",
    "tests/test_asgi.py",
    "tests/test_threads.py",
    "tests/test_signals.py",
    "tests/test_startup_heap.py",
]
# The Makefile's pin of pip, as .venv has it (PIP_PIN).
PIP_PIN = os.environ.get("PIP_PIN", "pip")

DESCRIBE = """
import json, os, sys, sysconfig
print(json.dumps({
    "implementation": sys.implementation.name,
    "version": list(sys.version_info[:3]),
    "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    "executable": os.path.realpath(sys.executable),
}))
"""


@dataclass(frozen=True)
class Interpreter:
    executable: str
    version: tuple[int, int, int]

    @property
    def minor(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    @property
    def name(self) -> str:
        return "CPython " + ".".join(map(str, self.version))


def candidates() -> list[str]:
    """Every python3.N on PATH, and every pyenv version's python3."""
    found = []
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        for minor in range(FLOOR[1], 40):
            path = Path(directory) / f"python3.{minor}"
            if path.is_file() and os.access(path, os.X_OK):
                found.append(str(path))
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv.is_dir():
        found.extend(str(path) for path in sorted(pyenv.glob("*/bin/python3")))
    return found


def describe(executable: str) -> dict | None:
    """What the interpreter says of itself, or None when it does not start (a pyenv shim for a
    version that is not selected, say)."""
    try:
        said = subprocess.run([executable, "-c", DESCRIBE], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    if said.returncode != 0:
        return None
    return json.loads(said.stdout)


def interpreters() -> list[Interpreter]:
    """The newest patch of each CPython minor version from FLOOR on, but the one running this."""
    newest: dict[tuple[int, int], Interpreter] = {}
    for executable in candidates():
        seen = describe(executable)
        if seen is None:
            continue
        version = tuple(seen["version"])
        if seen["implementation"] != "cpython" or version[:2] < FLOOR:
            continue
        if seen["free_threaded"]:
            print(f"pythons: {seen['executable']} is free-threaded, which takes no abi3 wheel (README): left out")
            continue
        if version[:2] == sys.version_info[:2]:
            continue  # make test's own
        found = Interpreter(seen["executable"], version)
        if version[:2] not in newest or version > newest[version[:2]].version:
            newest[version[:2]] = found
    return [newest[minor] for minor in sorted(newest)]


def the_wheel() -> Path | None:
    """The newest of dist/'s wheels for this machine's architecture."""
    machine = re.escape(platform.machine())
    wheels = [path for path in (ROOT / "dist").glob("maitred-*.whl") if re.search(rf"_{machine}\.whl$", path.name)]
    return max(wheels, key=lambda path: path.stat().st_mtime, default=None)


def prepare(interpreter: Interpreter, wheel: Path) -> Path:
    """A venv of this interpreter with the test packages and the wheel; kept between runs, so
    that pip finds them installed, and the wheel reinstalled, as `make wheel` rebuilds it under
    the same version."""
    venv = VENVS / interpreter.minor
    python = venv / "bin" / "python"
    if not python.exists() or os.path.realpath(venv / "bin" / "python3") != interpreter.executable:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([interpreter.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, PIP_PIN], check=True)
    subprocess.run([*pip, "--requirement", str(ROOT / "tests" / "requirements.txt")], check=True)
    subprocess.run([*pip, "--no-deps", "--force-reinstall", str(wheel)], check=True)
    return python


def main() -> int:
    wheel = the_wheel()
    if wheel is None:
        print(f"pythons: no wheel for {platform.machine()} in {ROOT / 'dist'}: `make wheel` builds it", file=sys.stderr)
        return 2
    found = interpreters()
    if not found:
        print(
            f"pythons: no CPython from {FLOOR[0]}.{FLOOR[1]} on but this one ({sys.version.split()[0]}): nothing to run"
        )
        return 0
    print("pythons: " + ", ".join(f"{interpreter.name} ({interpreter.executable})" for interpreter in found))
    failed = []
    for interpreter in found:
        print(f"=== pythons: {interpreter.name}: {' '.join(WORKER_SIDE)}", flush=True)
        try:
            python = prepare(interpreter, wheel)
        except subprocess.CalledProcessError as error:
            failed.append(
                f"{interpreter.name} (its venv was not made: installing {error.cmd[-1]} exited with {error.returncode})"
            )
            continue
        ran = subprocess.run(
            [str(python), "-m", "pytest", *WORKER_SIDE, "-q", "-rs", "-p", "no:cacheprovider"], cwd=ROOT, check=False
        )
        if ran.returncode != 0:
            failed.append(f"{interpreter.name} (pytest's exit status {ran.returncode})")
    if failed:
        print("pythons: failed on " + ", ".join(failed))
        return 1
    print("pythons: passed on " + ", ".join(interpreter.name for interpreter in found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
