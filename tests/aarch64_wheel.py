"""`make check-aarch64`: the aarch64 wheel of `make wheel-aarch64` checked on an x86_64 machine
(README, "Installing").

1. `auditwheel show` reads the library's versioned symbols: the wheel must be consistent with
   manylinux_2_17 (manylinux2014) or older, as the x86_64 wheel is.
2. Debian bookworm's arm64 python3.11 is unpacked into .cache/arm64-sysroot/, once: apt runs
   with a state of its own in .cache/arm64-apt/ that knows arm64 only, so that the machine's
   dpkg architectures and apt lists stay as they are, and `dpkg -x` unpacks each package
   python3.11 depends on, recursively, without installing it.
3. The host's pip installs the wheel into .cache/aarch64-check/site/ (--platform
   manylinux2014_aarch64), where arm64 python finds it on PYTHONPATH.
4. qemu-user runs that python (`qemu-aarch64 -L <sysroot>`, no binfmt_misc handler, which would
   be the whole machine's) as `python3.11 -m maitred`, serving a WSGI application on 127.0.0.1;
   one GET must answer, and a SIGTERM to its process group must stop every process in it.
   maitred forks its zygote and workers and execs nothing on this path; a reload with --preload
   and a binary upgrade (SIGUSR2) exec sys.executable, which without binfmt_misc an x86_64
   kernel refuses, so they are not checked here.

Prints one line: "check-aarch64: ok: ...", "check-aarch64: FAILED: ..." (exit status 1) or
"check-aarch64: skipped: ..." (exit status 0) when qemu-user or apt is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
CACHE = ROOT / ".cache"
SYSROOT = CACHE / "arm64-sysroot"
APT_STATE = CACHE / "arm64-apt"
WORK = CACHE / "aarch64-check"
# Written once every package is unpacked: a sysroot without it is an interrupted one.
COMPLETE = SYSROOT / ".complete"
PYTHON = "python3.11"
MANYLINUX2014 = (2, 17)
HOST = "127.0.0.1"
# Emulated, python and the workers take seconds to start where they take a tenth natively.
READY_TIMEOUT = 120.0
STOP_TIMEOUT = 60.0
HELLO = """\
def app(environ, start_response):
    body = b"Hello from aarch64\\n"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
"""


class Skip(Exception):
    """This machine cannot run the check: the message says what is missing."""


class Failure(Exception):
    """The check ran and the wheel did not pass it."""


def run(command: list[str | Path], **options) -> subprocess.CompletedProcess[str]:
    """`command`, with its output kept for the one line a failure prints."""
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, check=False, **options)


def last_line(completed: subprocess.CompletedProcess[str]) -> str:
    lines = (completed.stderr or completed.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {completed.returncode}"


def the_wheel() -> Path:
    wheels = sorted(DIST.glob("maitred-*_aarch64.whl"), key=lambda path: path.stat().st_mtime)
    if not wheels:
        raise Failure(f"no aarch64 wheel in {DIST}: `make wheel-aarch64` builds it")
    return wheels[-1]


def check_symbols(wheel: Path) -> str:
    shown = run([sys.executable, "-m", "auditwheel", "show", wheel])
    if shown.returncode != 0:
        raise Failure(f"auditwheel show {wheel.name}: {last_line(shown)}")
    text = " ".join(shown.stdout.split())
    consistent = re.search(r'consistent with the following platform tag: "manylinux_(\d+)_(\d+)_aarch64"', text)
    if consistent is None:
        raise Failure(f"auditwheel show names no manylinux aarch64 tag for {wheel.name}: {text}")
    glibc = (int(consistent[1]), int(consistent[2]))
    if glibc > MANYLINUX2014:
        raise Failure(f"{wheel.name} needs glibc {glibc[0]}.{glibc[1]}, newer than manylinux2014's 2.17")
    return f"manylinux_{glibc[0]}_{glibc[1]}_aarch64"


def apt_options() -> list[str]:
    """apt's settings for a state of its own that knows arm64 only; the sources stay the
    machine's (Debian's mirror serves every architecture)."""
    return [
        f"-oDir::State::Lists={APT_STATE / 'lists'}",
        f"-oDir::State::status={APT_STATE / 'status'}",
        f"-oDir::Cache::archives={APT_STATE / 'archives'}",
        "-oDir::Cache::pkgcache=",
        "-oDir::Cache::srcpkgcache=",
        "-oAPT::Architecture=arm64",
        "-oAPT::Architectures::=arm64",
    ]


def build_sysroot() -> None:
    if COMPLETE.exists():
        return
    for tool in ("apt-get", "apt-cache", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise Skip(f"no {tool}: Debian's arm64 {PYTHON} is unpacked with apt and dpkg")
    shutil.rmtree(SYSROOT, ignore_errors=True)
    downloads = APT_STATE / "downloads"
    for directory in (APT_STATE / "lists" / "partial", downloads, SYSROOT):
        directory.mkdir(parents=True, exist_ok=True)
    (APT_STATE / "status").touch()
    updated = run(["apt-get", *apt_options(), "-qq", "update"])
    if updated.returncode != 0:
        raise Skip(f"apt-get update for arm64 failed: {last_line(updated)}")
    depends = run(
        ["apt-cache", *apt_options(), "depends", "--recurse", "--no-recommends", "--no-suggests"]
        + ["--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", PYTHON]
    )
    if depends.returncode != 0:
        raise Failure(f"apt-cache depends {PYTHON}: {last_line(depends)}")
    # Packages are the unindented lines; virtual ones, which some real package provides, are in <>.
    packages = sorted({line for line in depends.stdout.splitlines() if line[:1] not in ("", " ", "<")})
    for stale in downloads.glob("*.deb"):
        stale.unlink()
    downloaded = run(["apt-get", *apt_options(), "-qq", "download", *packages], cwd=downloads)
    if downloaded.returncode != 0:
        raise Failure(f"apt-get download of {len(packages)} arm64 packages: {last_line(downloaded)}")
    for package in sorted(downloads.glob("*.deb")):
        unpacked = run(["dpkg-deb", "-x", package, SYSROOT])
        if unpacked.returncode != 0:
            raise Failure(f"dpkg-deb -x {package.name}: {last_line(unpacked)}")
    if not (SYSROOT / "usr" / "bin" / PYTHON).exists():
        raise Failure(f"the arm64 packages unpacked into {SYSROOT} hold no usr/bin/{PYTHON}")
    COMPLETE.write_text("\n".join(packages) + "\n")


def install(wheel: Path) -> Path:
    site = WORK / "site"
    shutil.rmtree(site, ignore_errors=True)
    installed = run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
        + ["--platform", "manylinux2014_aarch64", "--only-binary", ":all:", "--target", site, wheel]
    )
    if installed.returncode != 0:
        raise Failure(f"pip install --platform manylinux2014_aarch64 {wheel.name}: {last_line(installed)}")
    return site


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def serve_once(qemu: str, site: Path) -> str:
    """maitred under qemu-user answers one GET and stops on SIGTERM with its whole group."""
    app_dir = WORK / "app"
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "hello.py").write_text(HELLO)
    port = free_port()
    log_path = WORK / "maitred.log"
    command = [qemu, "-L", SYSROOT, SYSROOT / "usr" / "bin" / PYTHON, "-m", "maitred"]
    command += ["--bind", f"{HOST}:{port}", "-w", "2", "--chdir", app_dir, "hello:app"]
    environment = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "PYTHONPATH": str(site)}
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [str(part) for part in command],
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not accepts_connections(port):
            if server.poll() is not None:
                raise Failure(f"maitred under qemu exited with {server.returncode} before listening: see {log_path}")
            if time.monotonic() >= deadline:
                raise Failure(f"maitred under qemu did not listen within {READY_TIMEOUT:.0f} s: see {log_path}")
            time.sleep(0.1)
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/", timeout=READY_TIMEOUT) as reply:
                status, body = reply.status, reply.read()
        except TimeoutError:
            raise Failure(
                f"GET / on {HOST}:{port} got no answer within {READY_TIMEOUT:.0f} s: see {log_path}"
            ) from None
        if (status, body) != (200, b"Hello from aarch64\n"):
            raise Failure(f"GET / answered {status} {body!r}, not the application's greeting")
        os.killpg(server.pid, signal.SIGTERM)
        exit_status = server.wait(timeout=STOP_TIMEOUT)
        if exit_status != 0:
            raise Failure(f"maitred under qemu exited with {exit_status} on SIGTERM: see {log_path}")
        # The lobby waits for its zygote and workers before it exits; none may outlive it.
        if group_alive(server.pid):
            raise Failure(f"processes of maitred's group {server.pid} outlived the lobby's exit")
    finally:
        if group_alive(server.pid):
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    return f"GET / on {HOST}:{port} answered 200, and SIGTERM stopped its process group"


def check() -> str:
    qemu = shutil.which("qemu-aarch64")
    if qemu is None:
        raise Skip("no qemu-aarch64: apt-get install qemu-user")
    wheel = the_wheel()
    tag = check_symbols(wheel)
    build_sysroot()
    site = install(wheel)
    served = serve_once(qemu, site)
    return f"{wheel.name}: auditwheel: {tag}; under qemu-aarch64 with Debian's arm64 {PYTHON}, {served}"


def main() -> int:
    try:
        print(f"check-aarch64: ok: {check()}")
    except Skip as reason:
        print(f"check-aarch64: skipped: {reason}")
    except (Failure, subprocess.TimeoutExpired, OSError) as failure:
        print(f"check-aarch64: FAILED: {failure}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
