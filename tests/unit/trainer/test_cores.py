"""How the cores a process may use are read: the kernel's files, laid out as cgroup v1 and v2 mount them (the real
groups are made in tests/integration/trainer/test_cpu_quota.py)."""

from pathlib import Path

import pytest

from nodelib.cores import capped, cpu_folders, cpu_quota, read_quota, unescape

V1 = "4:memory:/a\n3:cpu,cpuacct:/docker/abc\n0::/\n"
V1_MOUNTS = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
"""
V2 = "0::/user.slice/job\n"


def test_v1_inside_a_container_whose_mount_is_its_own_group():
    assert cpu_folders(V1, V1_MOUNTS) == [
        (Path("/sys/fs/cgroup/cpu,cpuacct"), Path("/sys/fs/cgroup/cpu,cpuacct"), "v1")
    ]


def test_v2_on_the_host_the_group_folder_is_below_the_mount():
    mounts = "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cpu_folders(V2, mounts) == [(Path("/sys/fs/cgroup/user.slice/job"), Path("/sys/fs/cgroup"), "v2")]


def test_no_cpu_controller_mounted_means_no_folder():
    assert cpu_folders("4:memory:/a\n", "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") == []


def test_a_mount_point_with_a_space_is_unescaped():
    assert unescape(r"/mnt/cpu\040groups") == "/mnt/cpu groups"


@pytest.mark.parametrize(
    ("files", "version", "expected"),
    [
        ({"cpu.max": "150000 100000\n"}, "v2", 1.5),
        ({"cpu.max": "max 100000\n"}, "v2", None),
        ({"cpu.cfs_quota_us": "400000\n", "cpu.cfs_period_us": "100000\n"}, "v1", 4.0),
        ({"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"}, "v1", None),
        ({"cpu.cfs_quota_us": "junk\n", "cpu.cfs_period_us": "100000\n"}, "v1", None),
        ({"cpu.max": "100000 0\n"}, "v2", None),
        ({}, "v2", None),  # a hierarchy's root has no cpu.max
    ],
)
def test_one_groups_quota_in_cores(tmp_path, files, version, expected):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert read_quota(tmp_path, version) == expected


def proc_with(tmp_path: Path, groups: str, mounts: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(groups)
    (proc / "mountinfo").write_text(mounts)
    return proc


def test_the_smallest_quota_from_the_group_up_to_the_mount_binds(tmp_path):
    mount = tmp_path / "cg"
    (mount / "user.slice" / "job").mkdir(parents=True)
    (mount / "cpu.max").write_text("100000 100000\n")  # the mounted top: the last level read
    (mount / "user.slice" / "cpu.max").write_text("250000 100000\n")
    (mount / "user.slice" / "job" / "cpu.max").write_text("max 100000\n")
    proc = proc_with(tmp_path, V2, f"41 31 0:38 / {mount} rw - cgroup2 cgroup2 rw\n")
    assert cpu_quota(proc) == 1.0
    (mount / "cpu.max").unlink()
    assert cpu_quota(proc) == 2.5


def test_without_proc_there_is_no_quota(tmp_path):
    assert cpu_quota(tmp_path / "nothing") is None


@pytest.mark.parametrize(("quota", "expected"), [(None, 16), (0.5, 1), (1.5, 2), (4.0, 4), (64.0, 16)])
def test_the_affinity_capped_by_the_quota_a_fraction_counting_as_a_core(quota, expected):
    assert capped(16, quota) == expected
