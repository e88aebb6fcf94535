"""How a killed worker is named (docs/SIGNALS.md, "How a killed worker is named"): an OOM kill
its memory cgroup counted is a certain one, with the limit and the worker's last RSS, counted as
`oom_kill`; another SIGKILL maitred did not send is a probable one; maitred's own SIGKILL is
neither.

The OOM test makes a memory cgroup of its own (v1 under the test's memory cgroup, v2 under the
root), starts maitred in it and removes it at the end; where it cannot, it is skipped with why.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from client import get, status_of
from conftest import HOST, _Launcher, eventually, free_port, remove_cgroup, workers_of

APPS = Path(__file__).resolve().parent / "apps"
APP = "crashy:app"  # tests/apps/crashy.py
CGROUPS = Path("/sys/fs/cgroup")
LIMIT = 256 << 20


def _own_v1_memory_cgroup() -> Path | None:
    """The v1 memory cgroup this test runs in, if the machine has a v1 memory hierarchy."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUPS / "memory" / path.lstrip("/")
    return None


def _make_memory_cgroup(name: str) -> tuple[Path, str]:
    """A new memory cgroup limited to `LIMIT` without swap; its directory and its counter file.
    Skips the test, saying why, where none can be made."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    v1 = _own_v1_memory_cgroup()
    if v1 is not None and (v1 / "memory.oom_control").exists():
        made = v1 / name
        limits = {"memory.limit_in_bytes": LIMIT, "memory.swappiness": 0}
        counter = "memory.oom_control"
    elif (CGROUPS / "cgroup.subtree_control").exists():
        if "memory" not in (CGROUPS / "cgroup.subtree_control").read_text().split():
            pytest.skip("the cgroup v2 root does not give its children the memory controller")
        made = CGROUPS / name
        limits = {"memory.max": LIMIT, "memory.swap.max": 0}
        counter = "memory.events"
    else:
        pytest.skip("this machine has no memory cgroup hierarchy (neither v1's memory nor v2's)")
    try:
        made.mkdir()
    except OSError as error:
        pytest.skip(f"cannot make a memory cgroup at {made}: {error}")
    limit_file = next(iter(limits))
    if not (made / limit_file).exists():
        made.rmdir()
        pytest.skip(f"a new cgroup at {made} has no {limit_file}: no memory controller is given to it")
    # Without swap, so that the limit ends in an OOM kill; a machine without swap has no such file.
    for file, value in limits.items():
        if (made / file).exists():
            (made / file).write_text(f"{value}\n")
    return made, counter


@pytest.fixture
def in_memory_cgroup(tmp_path, maitred_command) -> Iterator[tuple[_Launcher, Path, str]]:
    """Starts servers inside a memory cgroup the test makes: a shell joins it, then becomes
    maitred, whose zygote and workers are born in it."""
    cgroup, counter = _make_memory_cgroup(f"maitred-test-{os.getpid()}")
    joining = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *maitred_command]
    launcher = _Launcher(joining, tmp_path)
    try:
        yield launcher, cgroup, counter
    finally:
        launcher.kill_all()
        remove_cgroup(cgroup)


def _exit_counts(stats: int) -> dict[str, int]:
    return status_of(stats)["worker_exits"]


def test_an_oom_kill_the_memory_cgroup_counted_is_named_with_the_limit_and_the_last_rss(in_memory_cgroup):
    launcher, cgroup, counter = in_memory_cgroup
    stats = free_port()
    server = launcher("-w", "2", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    before = workers_of(server.pid, 2)

    reply = get(server.port, "/hog", timeout=60)
    assert reply.status == 502, reply
    log = server.wait_for_log("exited (signal 9)", 30)
    named = re.search(
        rf"worker (\d+) exited \(signal 9\): an OOM kill: the kernel's OOM killer ended it, as the memory cgroup "
        rf"{re.escape(str(cgroup))} \({counter} oom_kill 1\) counted; its limit 256\.0 MiB, the worker's last RSS "
        r"([\d.]+) MiB",
        log,
    )
    assert named, log
    assert int(named[1]) in before
    # Sampled every 500 ms while it took memory: at least what a worker holds loaded.
    assert 10 < float(named[2]) <= 256, named[0]
    assert f"worker {named[1]} lost: " in log
    assert "killed by the kernel's OOM killer" in log
    assert "probable OOM kill" not in log

    assert eventually(lambda: _exit_counts(stats)["oom_kill"] == 1, timeout=10)
    assert _exit_counts(stats)["crash"] == 0
    assert 'maitred_worker_exits_total{reason="oom_kill"} 1' in get(stats, "/metrics").body.decode()


def test_a_sigkill_maitred_did_not_send_is_named_a_probable_oom_kill(maitred_server):
    stats = free_port()
    server = maitred_server("-w", "2", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    victim = get(server.port, "/pid").pid
    os.kill(victim, 9)
    log = server.wait_for_log(f"worker {victim} exited (signal 9)", 10)
    assert (
        f"worker {victim} exited (signal 9): a probable OOM kill: a SIGKILL maitred did not send, as the kernel's "
        "OOM killer sends (or a kill -9 from outside); "
    ) in log
    # The cgroup's count has not moved (or there is none to read): not a certain one.
    assert "an OOM kill:" not in log
    assert eventually(lambda: _exit_counts(stats)["crash"] == 1, timeout=10)
    assert _exit_counts(stats)["oom_kill"] == 0


def test_maitreds_own_sigkill_is_not_called_an_oom_kill(maitred_server):
    """--timeout kills the worker with SIGKILL: its exit says so, and no OOM kill is named."""
    stats = free_port()
    server = maitred_server("-w", "2", "--timeout", "1", "--stats", f"{HOST}:{stats}", APP, cwd=APPS)
    reply = get(server.port, "/sleep?seconds=10")
    assert reply.status == 504, reply
    killed = re.search(r"worker (\d+) timed out after 1 s", server.wait_for_log("timed out after 1 s", 10))
    assert killed
    log = server.wait_for_log(f"worker {killed[1]} exited (signal 9, sent by maitred)", 10)
    assert "OOM kill" not in log
    assert eventually(lambda: _exit_counts(stats)["timeout"] == 1, timeout=10)
    assert _exit_counts(stats)["oom_kill"] == 0
