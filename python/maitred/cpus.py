"""How many CPUs this process may use, for `--workers auto` (docs/DEPLOY.md, "Containers"): the
cgroup's CPU quota, within the CPUs of the affinity mask, which are within the machine's cores.
`os.cpu_count()` alone is the host's cores: a container limited to 2 CPUs on a 64-core node
would start 64 workers, or 128 at gunicorn's twice the cores, to share 2 CPUs.

This is how Go 1.25 sizes GOMAXPROCS: the quota is cgroup v2's cpu.max, or v1's cpu.cfs_quota_us
over cpu.cfs_period_us, the smallest of those along the process's cgroup up to the root of its
mount (a parent's limit binds its children); it is rounded up, since one worker under a quota of
1.5 CPUs would leave half a CPU idle where two share all of it; and it never counts more than
the affinity mask allows (taskset, a cpuset). Go's further minimum of 2 is for its garbage
collector's threads beside the program's; a worker has none, so the least here is 1.

May import: nothing of maitred (a leaf).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path


@dataclass(frozen=True)
class CgroupDirectory:
    """Where one of the process's cgroups is mounted: `leaf` is its directory, `mount` the
    mount's, at or above it."""

    version: int
    leaf: Path
    mount: Path


@dataclass(frozen=True)
class Quota:
    cpus: Fraction
    read: str
    """The file and what it said, for the log line."""


@dataclass(frozen=True)
class Available:
    count: int
    reading: str
    """What was read, in words, for the log line."""


def quota_v2(cpu_max: str) -> Fraction | None:
    """The CPUs a cgroup v2 cpu.max allows: "150000 100000" is 1.5, "max 100000" no limit."""
    fields = cpu_max.split()
    if len(fields) != 2 or not fields[1].isdigit() or int(fields[1]) == 0:
        raise ValueError(f"cpu.max: expected QUOTA PERIOD, got {cpu_max.strip()!r}")
    if fields[0] == "max":
        return None
    if not fields[0].isdigit():
        raise ValueError(f"cpu.max: expected QUOTA PERIOD, got {cpu_max.strip()!r}")
    return Fraction(int(fields[0]), int(fields[1]))


def quota_v1(cfs_quota_us: str, cfs_period_us: str) -> Fraction | None:
    """The CPUs cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us allow: a quota of -1 is none."""
    quota, period = int(cfs_quota_us), int(cfs_period_us)
    if quota < 0:
        return None
    if quota == 0 or period <= 0:
        raise ValueError(f"cpu.cfs_quota_us {quota} over cpu.cfs_period_us {period} is not a quota")
    return Fraction(quota, period)


def cgroup_directories(proc_self_cgroup: str, mountinfo: str) -> list[CgroupDirectory]:
    """The directories of the process's CPU cgroups, from /proc/self/cgroup and
    /proc/self/mountinfo: v2's (the "0::" line, on a cgroup2 mount) and v1's cpu controller's
    (on a cgroup mount with the cpu option). A cgroup outside its mount's root (another
    namespace's) cannot be read, and is left out."""
    paths: dict[int, str] = {}
    for line in proc_self_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            paths[2] = path
        elif "cpu" in controllers.split(","):
            paths[1] = path
    found = []
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, described = before.split(), after.split()
        if len(fields) < 5 or len(described) < 3:
            continue
        root, mount_point = fields[3], fields[4]
        fstype, options = described[0], described[2].split(",")
        version = 2 if fstype == "cgroup2" else 1 if fstype == "cgroup" and "cpu" in options else None
        if version is None or version not in paths:
            continue
        path = paths.pop(version)
        if root != "/" and path != root and not path.startswith(root + "/"):
            continue
        relative = path[len(root) :] if root != "/" else path
        found.append(CgroupDirectory(version, Path(mount_point + relative.rstrip("/")), Path(mount_point)))
    return sorted(found, key=lambda directory: -directory.version)


def cgroup_quota(directories: list[CgroupDirectory]) -> Quota | None:
    """The smallest CPU quota from each directory's leaf up to its mount; None when no level of
    any sets one."""
    smallest: Quota | None = None
    for directory in directories:
        level = directory.leaf
        while True:
            quota = _quota_at(directory.version, level)
            if quota is not None and (smallest is None or quota.cpus < smallest.cpus):
                smallest = quota
            if level == directory.mount or directory.mount not in level.parents:
                break
            level = level.parent
    return smallest


def _quota_at(version: int, level: Path) -> Quota | None:
    try:
        if version == 2:
            text = (level / "cpu.max").read_text()
            cpus = quota_v2(text)
            read = f"{level / 'cpu.max'} {text.strip()!r}"
        else:
            quota, period = (level / "cpu.cfs_quota_us").read_text(), (level / "cpu.cfs_period_us").read_text()
            cpus = quota_v1(quota, period)
            read = f"{level}/cpu.cfs_quota_us {quota.strip()}, cpu.cfs_period_us {period.strip()}"
    except FileNotFoundError:
        return None  # the root cgroup has no limit files, nor does a controller not enabled here
    return Quota(cpus, read) if cpus is not None else None


def available() -> Available:
    """The CPUs this process may use, and what was read to say so. A cgroup file that cannot be
    read or parsed raises OSError or ValueError, for the caller to report."""
    cores = os.cpu_count() or 1
    mask = len(os.sched_getaffinity(0))
    with open("/proc/self/cgroup") as cgroup, open("/proc/self/mountinfo") as mountinfo:
        quota = cgroup_quota(cgroup_directories(cgroup.read(), mountinfo.read()))
    within = f"{mask} CPUs in the affinity mask, of {cores} cores"
    if quota is None or math.ceil(quota.cpus) >= mask:
        limit = f"the cgroup's CPU quota, {float(quota.cpus):g} ({quota.read})" if quota else "no cgroup CPU quota"
        return Available(mask, f"{within}; {limit}")
    count = max(1, math.ceil(quota.cpus))
    return Available(count, f"the cgroup's CPU quota, {float(quota.cpus):g}, rounded up ({quota.read}); {within}")
