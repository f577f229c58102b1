"""The CPU cores this process may use: its CPU affinity (taskset, cpusets), capped by the CPU quota of its control
group (`docker run --cpus 4`, a Kubernetes pod's CPU limit, a systemd slice's CPUQuota), which
os.sched_getaffinity does not see: in a container limited to 4 of a host's 64 cores, the affinity still counts 64.

The quota is read as the kernel documents it (Documentation/admin-guide/cgroup-v2.rst, "cpu.max": "$MAX $PERIOD",
MAX "max" for none; Documentation/scheduler/sched-bwc.rst for cgroup v1: cpu.cfs_quota_us, -1 for none, over
cpu.cfs_period_us). A quota holds for the group and all below it, so the smallest one from the process's own group up
to the hierarchy's mount is the one that binds. Where the mount is a part of the hierarchy (a container's view of
its own group), /proc/self/mountinfo's root field names that part (proc(5)). A fraction of a core counts as a core,
as `docker run --cpus 1.5` lets a process run on two at once.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cores() -> int:
    """The cores this process may use: its affinity, capped by its control group's CPU quota (at least 1)."""
    return capped(len(os.sched_getaffinity(0)), cpu_quota())


def capped(affinity: int, quota: float | None) -> int:
    """The cores of the affinity that a quota of `quota` cores leaves, a fraction counting as a core."""
    return affinity if quota is None else max(1, min(affinity, math.ceil(quota)))


def cpu_quota(proc: Path = Path("/proc/self")) -> float | None:
    """The CPU quota, in cores, binding this process (cgroup v1 or v2), or None where none is set or none can be
    read (no /proc, no cgroup mounted)."""
    try:
        groups, mounts = (proc / "cgroup").read_text(), (proc / "mountinfo").read_text()
    except OSError:
        return None
    limits = [
        read_quota(level, version) for folder, top, version in cpu_folders(groups, mounts) for level in up(folder, top)
    ]
    return min((limit for limit in limits if limit is not None), default=None)


def cpu_folders(groups: str, mounts: str) -> list[tuple[Path, Path, str]]:
    """(the process's group folder, its mount point, "v1" or "v2") for each mounted hierarchy holding the cpu
    controller: from /proc/self/cgroup ("ID:CONTROLLERS:PATH", cgroup(7); v2's ID is 0 and CONTROLLERS empty) and
    /proc/self/mountinfo ("... ROOT MOUNT_POINT ... - FSTYPE SOURCE SUPER_OPTIONS", proc(5))."""
    paths: dict[str, Path] = {}
    for number, controllers, group in (line.split(":", 2) for line in groups.splitlines() if line.count(":") >= 2):
        if number == "0" and not controllers:
            paths["v2"] = Path(group)
        elif "cpu" in controllers.split(","):
            paths["v1"] = Path(group)
    found = []
    for line in mounts.splitlines():
        fields, _, tail = line.partition(" - ")
        parts, (fstype, _, options) = fields.split(), (tail.split() + ["", "", ""])[:3]
        version = "v2" if fstype == "cgroup2" else "v1" if fstype == "cgroup" and "cpu" in options.split(",") else ""
        if version not in paths or len(parts) < 5:
            continue
        root, point, path = Path(unescape(parts[3])), Path(unescape(parts[4])), paths[version]
        inside = path.relative_to(root) if path.is_relative_to(root) else Path()  # a view below the group: its top
        found.append((point / inside, point, version))
    return found


def up(folder: Path, top: Path) -> list[Path]:
    """The group's folder and those above it, up to the hierarchy's mount point: a quota binds all below it."""
    return [folder, *(level for level in folder.parents if level.is_relative_to(top))]


def read_quota(folder: Path, version: str) -> float | None:
    """One group's quota in cores: v2's cpu.max, v1's cpu.cfs_quota_us over cpu.cfs_period_us (None: unlimited or
    not there, as at a hierarchy's root)."""
    try:
        if version == "v2":
            quota, period = (folder / "cpu.max").read_text().split()
        else:
            quota, period = ((folder / name).read_text().strip() for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
    except (OSError, ValueError):
        return None
    if quota in ("max", "-1") or not quota.lstrip("-").isdigit() or not period.isdigit() or int(period) <= 0:
        return None
    return int(quota) / int(period) if int(quota) > 0 else None


def unescape(field: str) -> str:
    """A mountinfo path as it is: the kernel writes space, tab, newline and backslash as octal escapes (proc(5))."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field
