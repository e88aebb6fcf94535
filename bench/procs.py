"""Starting and stopping the processes a benchmark run needs, leaving nothing behind.

Every child is started in a session of its own, so its process id is also its process group id
and everything it forks (workers, zygotes, threads' helpers) can be signalled at once. A group
is only forgotten once /proc shows no live member of it, and `stop_all` stops whatever is still
known, whatever interrupted the harness.
"""

from __future__ import annotations

import http.client
import os
import re
import select
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

_live_groups: dict[int, subprocess.Popen] = {}
# How often readiness is checked: a server is usually up within 0.1-0.3 s, and every poll the
# check sleeps past its readiness is time added to every run of the suite.
READY_POLL_SECONDS = 0.02


class StartError(Exception):
    """A server did not become ready; str(error) says why, with the last line of its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(
    argv: Sequence[str], *, log: IO[bytes], cwd: Path, env: dict[str, str], user: str | None = None
) -> subprocess.Popen:
    """Starts argv as the leader of a new process group, with stdout and stderr going to log; as
    user where one is named (PostgreSQL refuses to run as root)."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        env=env,
        start_new_session=True,
        user=user,
    )
    _live_groups[process.pid] = process
    return process


def start_piped(argv: Sequence[str], *, log: IO[bytes], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """As start, with stdout a pipe for the caller to read (stderr still to log)."""
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, cwd=cwd, env=env, start_new_session=True
    )
    _live_groups[process.pid] = process
    return process


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in group pgid, read from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        # Fields after the command name, which is in parentheses and may itself contain spaces.
        state, _ppid, group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(group) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def group_rss_kb(pgid: int) -> int:
    """The resident memory of every live process in group pgid, summed, in KB (VmRSS from /proc).
    Pages that forked processes share are counted once per process; differences between two
    readings of the same processes are what the sum is good for."""
    total = 0
    for pid in group_members(pgid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:  # ended meanwhile
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total


def group_memory(pgid: int) -> dict[str, int]:
    """The memory of every live process in group pgid: how many processes and threads, and their
    resident memory summed two ways, in KB: VmRSS, which counts a page that forked processes share
    once per process, and Pss (/proc/PID/smaps_rollup), which splits each shared page among the
    processes sharing it, so that its sum is what the whole server takes."""
    memory = {"processes": 0, "threads": 0, "rss_kb": 0, "pss_kb": 0}
    for pid in group_members(pgid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except (FileNotFoundError, ProcessLookupError):  # ended meanwhile
            continue
        memory["processes"] += 1
        memory["threads"] += _proc_field(status, "Threads")
        memory["rss_kb"] += _proc_field(status, "VmRSS")
        memory["pss_kb"] += _proc_field(rollup, "Pss")
    return memory


def _proc_field(text: str, name: str) -> int:
    """The number after "name:" in a /proc file of such lines (status, smaps_rollup)."""
    return int(re.search(rf"^{name}:\s+(\d+)", text, re.MULTILINE).group(1))


def cpu_seconds(pids: Sequence[int]) -> float:
    """User and system CPU time of the processes, every thread's, in seconds (in clock ticks of
    10 ms here). Raises ProcessLookupError, naming the pid, for a process that has ended."""
    ticks = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is None:
            raise ProcessLookupError(pid)
        # utime and stime are fields 14 and 15.
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's closing parenthesis (the command may itself
    hold spaces), from the state (field 3) on, so field N is at index N - 3; None when the process
    has ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def tree_cpu_seconds(pid: int) -> float:
    """The CPU time, user and system, that process pid and its descendants have spent: every live
    one's own, and what each has collected from the children it reaped (a database backend that
    ended, a worker that was replaced), so that the difference between two readings misses nothing
    that ran in between. By the tree, not the process group: PostgreSQL's backends each start a
    session of their own."""
    ticks = 0
    for each in [pid, *descendants(pid)]:
        # utime, stime, cutime and cstime are fields 14 to 17; a process that has ended meanwhile
        # is left out: its time goes to its parent's once reaped.
        if (fields := _stat_fields(each)) is not None:
            ticks += sum(int(field) for field in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def per_thread(pids: Sequence[int], field: str) -> dict[int, int]:
    """{thread id: the number a field of its /proc status holds} for every thread of the processes
    (a thread that ends meanwhile is left out). Raises ProcessLookupError, naming the pid, for a
    process that has ended."""
    found = {}
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except FileNotFoundError:
            raise ProcessLookupError(pid) from None
        for task in tasks:
            try:
                found[int(task.name)] = _proc_field((task / "status").read_text(), field)
            except OSError:
                continue
    return found


def tree_sleeps(pid: int) -> int:
    """How many times the threads of process pid and its descendants have gone to sleep of their
    own accord (voluntary context switches: a wait in epoll_wait, poll, a lock), each of which a
    wake-up ends. Threads that end between two readings take their count with them."""
    sleeps = 0
    for each in [pid, *descendants(pid)]:
        try:
            sleeps += sum(per_thread([each], "voluntary_ctxt_switches").values())
        except ProcessLookupError:
            continue
    return sleeps


def start_time(pid: int) -> int | None:
    """When process pid started, in clock ticks since boot (field 22 of /proc/PID/stat): with the
    pid, it names one process, where a pid alone may be reused; None when no such process lives."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


def descendants(pid: int) -> list[int]:
    """The processes below pid in the process tree, children first; those that end while it is
    read are left out."""
    found = []
    try:
        below = children(pid)
    except OSError:  # pid, or one of its threads, ended meanwhile
        return found
    for child in below:
        found += [child, *descendants(child)]
    return found


def children(pid: int) -> list[int]:
    """The processes whose parent is pid."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def wait_exit(process: subprocess.Popen, timeout: float) -> bool:
    """Waits up to `timeout` seconds for `process` to exit, and returns whether it did, noticed
    the moment it does: through a pidfd, where Popen.wait(timeout) looks every 50 ms at most,
    which put a timed half-second transfer a tenth off (BODY-UP-WSGI-CL-1, 2026-12-08: granian's
    MB/s came as 940 or 1,143 and nothing between)."""
    pidfd = os.pidfd_open(process.pid)
    try:
        exited = bool(select.select([pidfd], [], [], max(0.0, timeout))[0])
    finally:
        os.close(pidfd)
    if exited:
        process.wait()
    return exited


def stop(process: subprocess.Popen, *, grace: float = 5.0) -> None:
    """Stops process and its whole group: SIGTERM to the leader, then once the leader has exited
    or grace seconds have passed, SIGKILL to whatever is left of the group; returns only when no
    member of it is alive."""
    pgid = process.pid
    if process.poll() is None:
        _signal_leader(process, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + 10.0
    while members := group_members(pgid):
        if time.monotonic() > deadline:
            raise RuntimeError(f"process group {pgid} survives SIGKILL: {members}")
        _signal_group(pgid, signal.SIGKILL)
        time.sleep(0.05)
    process.wait()
    _live_groups.pop(pgid, None)


def stop_wrapped(process: subprocess.Popen, *, grace: float = 15.0) -> None:
    """Stops a process started through a wrapper that exits when its child does and ignores
    SIGTERM meanwhile (strace running a server): SIGTERM to the wrapper's children first, so
    that they shut down as they would on their own and the wrapper then writes what it collected;
    after up to grace seconds, as stop()."""
    try:
        for child in children(process.pid):
            _signal_pid(child, signal.SIGTERM)
    except OSError:  # the wrapper ended meanwhile
        pass
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    stop(process)


def interrupt(process: subprocess.Popen) -> None:
    """Sends SIGINT to the whole group: what a person pressing Ctrl-C on the tool would do."""
    _signal_group(process.pid, signal.SIGINT)


def stop_all() -> None:
    """Stops every group this module started and has not stopped yet."""
    for process in list(_live_groups.values()):
        stop(process, grace=2.0)


def _signal_leader(process: subprocess.Popen, number: signal.Signals) -> None:
    try:
        process.send_signal(number)
    except ProcessLookupError:
        pass


def _signal_pid(pid: int, number: signal.Signals) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, number: signal.Signals) -> None:
    try:
        os.killpg(pgid, number)
    except ProcessLookupError:
        pass


def wait_ready(
    process: subprocess.Popen,
    *,
    port: int,
    log_path: Path,
    log_pattern: re.Pattern[str] | None,
    log_count: int,
    timeout: float = 30.0,
) -> int:
    """Waits until the log shows log_pattern log_count times (e.g. one line per booted worker) and
    GET / answers 200. Returns how many TCP connections the checks opened to the server (S3 counts
    the server's accept calls per connection). Raises StartError if the server exits or the time
    runs out."""
    deadline = time.monotonic() + timeout
    connections = 0
    while True:
        if process.poll() is not None:
            raise StartError(f"exited with status {process.returncode}; its log ends: {_last_line(log_path)}")
        if time.monotonic() > deadline:
            raise StartError(f"not ready after {timeout:.0f} s; its log ends: {_last_line(log_path)}")
        log_ready = log_pattern is None or len(log_pattern.findall(_read(log_path))) >= log_count
        if log_ready:
            connected, ok = _get(port)
            connections += connected
            if ok:
                return connections
        time.sleep(READY_POLL_SECONDS)


def _get(port: int) -> tuple[bool, bool]:
    """GET / once: (whether a connection was made, whether it answered 200)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        connection.connect()
    except OSError:
        return False, False
    try:
        connection.request("GET", "/")
        return True, connection.getresponse().status == 200
    except OSError:
        return True, False
    finally:
        connection.close()


def wait_for_line(process: subprocess.Popen, path: Path, marker: str, timeout: float) -> str | None:
    """Waits until the file path has a whole line starting with marker and returns it; None if
    the process exits first or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = _read(path)
        whole = text[: text.rfind("\n") + 1]  # a line still being written is not read yet
        found = next((line for line in whole.splitlines() if line.startswith(marker)), None)
        if found is not None:
            return found
        if process.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def _read(path: Path) -> str:
    return path.read_text(errors="replace")


def _last_line(path: Path) -> str:
    lines = _read(path).strip().splitlines()
    return lines[-1] if lines else "(nothing)"


def run_tool(
    argv: Sequence[str],
    *,
    output: Path,
    cwd: Path,
    env: dict[str, str],
    time_limit: float,
) -> tuple[int, bool]:
    """Runs a load tool with stdout and stderr in output. After time_limit seconds the tool gets
    SIGINT (ab then prints what it has measured so far), and SIGKILL 10 s later.
    Returns (exit status, whether the time limit cut the run short)."""
    with output.open("wb") as log:
        process = start(argv, log=log, cwd=cwd, env=env)
        try:
            process.wait(timeout=time_limit)
            return process.returncode, False
        except subprocess.TimeoutExpired:
            interrupt(process)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            return process.returncode if process.returncode is not None else -9, True
        finally:
            stop(process, grace=1.0)
