"""--workers auto (docs/DEPLOY.md, "Containers"): one worker per CPU the container may use, its
cgroup's CPU quota rounded up (v2's cpu.max, v1's cpu.cfs_quota_us over cpu.cfs_period_us),
within the affinity mask, within the cores; the log line says what was read.

The cgroup files' parsing is checked on their contents; the counting on real processes, under
`taskset -c 0`, and under a CPU quota where this machine lets the tests make a cgroup.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import uuid
from fractions import Fraction
from pathlib import Path

import pytest
from client import get
from conftest import remove_cgroup, wait_until, workers_of
from maitred import cpus

HELLO = """\
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello"]
"""


def test_cpu_max_is_read_as_cgroup_v2_writes_it():
    assert cpus.quota_v2("150000 100000\n") == Fraction(3, 2)
    assert cpus.quota_v2("max 100000\n") is None
    assert cpus.quota_v2("50000 100000") == Fraction(1, 2)
    for bad in ("", "max", "lots 100000", "100000 0"):
        with pytest.raises(ValueError, match="cpu.max"):
            cpus.quota_v2(bad)


def test_cfs_quota_is_read_as_cgroup_v1_writes_it():
    assert cpus.quota_v1("200000\n", "100000\n") == 2
    assert cpus.quota_v1("-1\n", "100000\n") is None
    assert cpus.quota_v1("25000", "100000") == Fraction(1, 4)


V2_MOUNTINFO = """\
24 30 0:22 / /sys rw,nosuid - sysfs sysfs rw
29 24 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate
"""

V1_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 /kubepods /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
"""


def test_the_cgroups_directories_come_from_proc_self_cgroup_and_mountinfo():
    v2 = cpus.cgroup_directories("0::/system.slice/app.service\n", V2_MOUNTINFO)
    assert v2 == [cpus.CgroupDirectory(2, Path("/sys/fs/cgroup/system.slice/app.service"), Path("/sys/fs/cgroup"))]
    # A v1 mount whose root is a cgroup of its own (a container's view): the path is below it.
    v1 = cpus.cgroup_directories("4:memory:/kubepods/pod1\n3:cpu,cpuacct:/kubepods/pod1\n", V1_MOUNTINFO)
    assert v1 == [cpus.CgroupDirectory(1, Path("/sys/fs/cgroup/cpu,cpuacct/pod1"), Path("/sys/fs/cgroup/cpu,cpuacct"))]
    # A cgroup outside its mount's root cannot be read there.
    assert cpus.cgroup_directories("3:cpu,cpuacct:/elsewhere\n", V1_MOUNTINFO) == []
    # Hybrid: both, v2 first.
    both = cpus.cgroup_directories("0::/\n3:cpu,cpuacct:/kubepods\n", V2_MOUNTINFO + V1_MOUNTINFO)
    assert [d.version for d in both] == [2, 1]


def test_the_smallest_quota_from_the_cgroup_up_to_its_mount_counts(tmp_path):
    mount = tmp_path / "cgroup"
    leaf = mount / "pod" / "container"
    leaf.mkdir(parents=True)
    (mount / "pod" / "cpu.max").write_text("250000 100000\n")
    (leaf / "cpu.max").write_text("max 100000\n")
    quota = cpus.cgroup_quota([cpus.CgroupDirectory(2, leaf, mount)])
    assert quota is not None and quota.cpus == Fraction(5, 2)
    assert str(mount / "pod" / "cpu.max") in quota.read and "250000 100000" in quota.read
    (leaf / "cpu.max").write_text("120000 100000\n")
    assert cpus.cgroup_quota([cpus.CgroupDirectory(2, leaf, mount)]).cpus == Fraction(6, 5)
    # No limit anywhere (the root cgroup has no cpu.max at all).
    assert cpus.cgroup_quota([cpus.CgroupDirectory(2, mount, mount)]) is None
    v1 = tmp_path / "cpu"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cpus.cgroup_quota([cpus.CgroupDirectory(1, v1, v1)]).cpus == Fraction(1, 2)


def test_workers_auto_counts_the_affinity_mask_under_taskset(maitred_server, tmp_path):
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed")
    (tmp_path / "hello.py").write_text(HELLO)
    maitred_server.command = ["taskset", "-c", "0", *maitred_server.command]
    server = maitred_server("--workers", "auto", "hello:app", cwd=tmp_path)
    log = server.wait_for_log("--workers auto: 1, for 1 CPUs in the affinity mask", timeout=10)
    assert f"of {os.cpu_count()} cores" in log
    assert get(server.port, "/").status == 200
    assert len(workers_of(server.pid, 1)) == 1


def test_a_reload_counts_the_cpus_again(maitred_server, tmp_path):
    """SIGHUP reads --workers auto again (a pod's CPUs can change while it runs), and the log
    says what it read: here, the affinity mask of every thread of the lobby, widened by taskset
    from one CPU to two between the start and the reload."""
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("this process may use only one CPU: the mask cannot be widened")
    (tmp_path / "hello.py").write_text(HELLO)
    (tmp_path / "maitred.conf.py").write_text('workers = "auto"\n')
    maitred_server.command = ["taskset", "-c", "0", *maitred_server.command]
    server = maitred_server("-c", "maitred.conf.py", "hello:app", cwd=tmp_path)
    server.wait_for_log("--workers auto: 1, for 1 CPUs in the affinity mask", timeout=10)
    assert len(workers_of(server.pid, 1)) == 1
    subprocess.run(
        ["taskset", "--all-tasks", "--pid", "--cpu-list", "0,1", str(server.pid)], check=True, capture_output=True
    )
    os.kill(server.pid, signal.SIGHUP)
    server.wait_for_log("SIGHUP: --workers auto: 2, for 2 CPUs in the affinity mask", timeout=10)
    log = server.wait_for_log(re.compile(r"SIGHUP: reloaded: 2 new workers serve \(pids \d+, \d+\)"), timeout=20)
    new = {int(pid) for pid in re.findall(r"SIGHUP: reloaded: 2 new workers serve \(pids (\d+), (\d+)\)", log)[0]}
    # The old worker retires once the new ones serve: until it has gone, the zygote has three.
    wait_until(lambda: workers_of(server.pid) == new, 10, "the reload's two workers, and no other")
    assert get(server.port, "/").status == 200


def _cgroup_with_a_quota(quota_us: int, period_us: int) -> Path:
    """A new cgroup (v2 where the cpu controller is there, else v1's cpu controller) limited to
    quota_us over period_us; skips, saying why, where the tests cannot make one."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    name = f"maitred-test-{uuid.uuid4().hex[:8]}"
    v2 = Path("/sys/fs/cgroup")
    v1 = Path("/sys/fs/cgroup/cpu")
    try:
        if "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
            made = v2 / name
            made.mkdir()
            (made / "cpu.max").write_text(f"{quota_us} {period_us}\n")
            return made
    except OSError:
        pass
    if (v1 / "cpu.cfs_quota_us").exists():
        made = v1 / name
        try:
            made.mkdir()
            (made / "cpu.cfs_period_us").write_text(f"{period_us}\n")
            (made / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
        except OSError as error:
            if made.exists():
                made.rmdir()
            pytest.skip(f"cannot make a cgroup v1 cpu child with a quota: {error}")
        return made
    pytest.skip("no cgroup v2 with the cpu controller in the root's subtree_control, nor a v1 cpu controller")


def test_workers_auto_takes_the_cgroups_cpu_quota_rounded_up(maitred_server, tmp_path):
    (tmp_path / "hello.py").write_text(HELLO)
    cgroup = _cgroup_with_a_quota(50_000, 100_000)
    try:
        # The lobby joins the cgroup before it runs, so every process of maitred is in it.
        join = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
        maitred_server.command = ["sh", "-c", join, str(cgroup), *maitred_server.command]
        server = maitred_server("--workers", "auto", "hello:app", cwd=tmp_path)
        log = server.wait_for_log("--workers auto: 1, for the cgroup's CPU quota, 0.5, rounded up", timeout=10)
        assert str(cgroup) in log
        assert get(server.port, "/").status == 200
        assert len(workers_of(server.pid, 1)) == 1
        server.kill()
    finally:
        remove_cgroup(cgroup)


def test_workers_auto_in_a_config_file_and_a_bad_workers_is_one_line(run_maitred, tmp_path):
    (tmp_path / "hello.py").write_text(HELLO)
    (tmp_path / "maitred.conf.py").write_text('workers = "auto"\n')
    printed = run_maitred("--print-config", "hello:app", linger=0)
    assert printed.returncode == 0, printed.stderr
    line = next(line for line in printed.stdout.splitlines() if line.startswith("workers "))
    assert "(auto: " in line and "affinity mask" in line
    bad = run_maitred("--workers", "some", "hello:app", linger=0)
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [
        "maitred: error: argument -w/--workers: expected a whole number of at least 1, or auto, got 'some'"
    ]
