"""The wheel `make wheel` puts in dist/ (README, "Installing"): tagged manylinux, it installs
with pip and no package index into a fresh venv of the system's Python, with a PATH cut down to
the system's directories (no cargo, no rustc), and the `maitred` it installs serves an
application. Only the wheel for this machine's architecture is tested (dist/ may also hold the
aarch64 wheel of `make wheel-aarch64`, which tests/aarch64_wheel.py checks under qemu-user).
Skipped when dist/ holds no such wheel; .ci/run runs `make wheel` before the tests."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from client import get

DIST = Path(__file__).resolve().parents[1] / "dist"

# Debian's and Ubuntu's directories of programs: where `python3` is the distribution's own.
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CUT_DOWN = {"PATH": SYSTEM_PATH}

# The glibc versions of the manylinux tags that predate PEP 600's manylinux_X_Y.
LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
MANYLINUX2014 = LEGACY_MANYLINUX["manylinux2014"]

HELLO = """\
def app(environ, start_response):
    body = b"Hello from the wheel\\n"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
"""


@pytest.fixture(scope="module")
def wheel() -> Path:
    # A wheel's name ends with its platform tags, each ending with the machine it is for.
    machine = platform.machine()
    wheels = sorted(DIST.glob(f"maitred-*_{machine}.whl"), key=lambda path: path.stat().st_mtime)
    if not wheels:
        pytest.skip(f"no {machine} wheel in {DIST}: `make wheel` builds it (.ci/run does, before the tests)")
    return wheels[-1]


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv of the system's python3 with the wheel installed, and nothing else."""
    for tool in ("cargo", "rustc"):
        found = shutil.which(tool, path=SYSTEM_PATH)
        if found is not None:
            pytest.skip(f"{found} is installed: this machine cannot show that the wheel needs no Rust")
    if shutil.which("python3", path=SYSTEM_PATH) is None:
        pytest.skip(f"no python3 in {SYSTEM_PATH}: the wheel is tested with the system's Python")
    directory = tmp_path_factory.mktemp("wheel") / "venv"
    made = run(["python3", "-m", "venv", str(directory)])
    if made.returncode != 0 and "ensurepip" in made.stdout + made.stderr:
        pytest.skip(f"the system's python3 cannot make a venv (apt-get install python3-venv): {made.stdout}")
    assert made.returncode == 0, made.stdout + made.stderr
    pip = [str(directory / "bin" / "python"), "-m", "pip"]
    installed = run([*pip, "install", "--no-index", "--no-cache-dir", "--disable-pip-version-check", str(wheel)])
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return directory


@pytest.fixture(scope="module")
def maitred_command(venv: Path) -> list[str]:
    """The venv's `maitred`, for conftest's maitred_server and run_maitred."""
    return [str(venv / "bin" / "maitred")]


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        env={"PATH": SYSTEM_PATH, "HOME": os.environ.get("HOME", "/root")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_wheel_is_a_manylinux2014_abi3_wheel(wheel):
    """README, "Installing": linked against glibc 2.17's symbols, tagged manylinux2014, so that it
    installs on Debian 9, Ubuntu 18.04, RHEL 7 and Amazon Linux 2 as on this machine."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/WHEEL"))
        tags = re.findall(r"^Tag: (\S+)$", archive.read(metadata).decode(), re.MULTILINE)
        assert "maitred/_native.abi3.so" in archive.namelist()
    assert tags, f"{metadata} names no tag"
    # The file's name holds the tags compressed: one platform after another, joined by dots.
    assert wheel.name.endswith(f"-cp310-abi3-{'.'.join(tag.split('-')[2] for tag in tags)}.whl"), (wheel.name, tags)
    for tag in tags:
        python, abi, platform_tag = tag.split("-")
        assert (python, abi) == ("cp310", "abi3"), tag
        policy = re.fullmatch(r"(manylinux_(\d+)_(\d+)|manylinux1|manylinux2010|manylinux2014)_(\w+)", platform_tag)
        assert policy is not None, f"{tag} is not a manylinux tag"
        needs = LEGACY_MANYLINUX.get(policy[1]) or (int(policy[2]), int(policy[3]))
        assert policy[4] == platform.machine()
        assert needs <= MANYLINUX2014, f"{tag} needs glibc {needs}, newer than manylinux2014's"


def test_auditwheel_finds_no_symbol_newer_than_manylinux2014(wheel):
    """The tag is maturin's word; auditwheel reads the library's versioned symbols itself."""
    shown = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    consistent = re.search(r'consistent with the following platform tag:\s+"manylinux_(\d+)_(\d+)_', shown.stdout)
    assert consistent is not None, shown.stdout
    assert (int(consistent[1]), int(consistent[2])) <= MANYLINUX2014, shown.stdout


def test_installed_without_rust_it_serves_an_application(venv, maitred_server, app_dir):
    native = run([str(venv / "bin" / "python"), "-c", "import maitred._native as n; print(n.__file__)"])
    assert native.stdout.strip().startswith(str(venv)), native.stdout + native.stderr
    (app_dir / "hello.py").write_text(HELLO)
    server = maitred_server("-w", "2", "hello:app", cwd=app_dir, env=CUT_DOWN)
    reply = get(server.port)
    assert (reply.status, reply.body) == (200, b"Hello from the wheel\n")
    assert server.stop() == 0


def test_reload_without_watchfiles_is_one_line(venv, run_maitred, app_dir):
    (app_dir / "hello.py").write_text(HELLO)
    finished = run_maitred("--reload", "hello:app", cwd=app_dir, env=CUT_DOWN)
    assert finished.returncode == 2
    assert finished.stderr == (
        "maitred: error: --reload needs the watchfiles package (No module named 'watchfiles'): "
        "install it with pip install 'maitred[reload]'\n"
    )
