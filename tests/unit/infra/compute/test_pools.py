"""Pool slots and leftovers, the nodes' merged output, and the one interface of every backend."""

import json
import socket
import subprocess
from pathlib import Path

import pytest

from flows.config import ConfigError, load_config
from infra.compute import BACKENDS, DockerPoolConfig, PoolError, ProcessPoolConfig, RunPaths
from infra.compute.base import merged_lines
from infra.compute.process import ProcessPool, leftover_runs
from infra.engines import default_training
from tests.fakes.paths import REPO


def test_more_workers_than_slots_is_refused_with_the_fix_when_the_config_is_read(tmp_path):
    three = default_training().model_copy(update={"workers": 3})
    BACKENDS["process"].check_world(ProcessPoolConfig(slots_per_node=3), three)
    BACKENDS["docker"].check_world(DockerPoolConfig(nodes=3, slots_per_node=1), three)
    with pytest.raises(ConfigError, match="training.workers is 3 but the process pool has 2 slots") as failure:
        load_config(None, {"workdir": tmp_path, "training": {"workers": 3}}, environ={})
    assert failure.value.exit_code == 2 and "pool.slots_per_node" in str(failure.value)


def run_paths(run_id: str) -> RunPaths:
    return RunPaths(run_id, Path("synthetic"), Path("scripts/v"), Path("out"))


def test_process_pool_lifecycle_and_leftovers(tmp_path):
    crashed = ProcessPool(2, run_paths("crashed-run"), tmp_path)
    crashed.create()
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    crashed.record_process(sleeper.pid)
    gone = subprocess.Popen(["true"])
    gone.wait()  # the crashed run's flow process: no longer running
    marker = json.loads((crashed.folder / "pool.json").read_text())
    (crashed.folder / "pool.json").write_text(json.dumps({**marker, "owner": f"{socket.gethostname()}:{gone.pid}"}))
    pool = ProcessPool(2, run_paths("this-run"), tmp_path)
    pool.create()
    pool.wait_until_ready()
    assert pool.describe()["state"] == "ready" and pool.describe()["slots"] == 2
    assert leftover_runs(tmp_path) == {"crashed-run"}  # a live owner's pool (this run) is kept
    assert pool.delete_leftovers(set()) == ["crashed-run"]
    assert sleeper.wait(timeout=10) != 0 and not crashed.folder.exists()
    pool.delete()
    assert pool.describe()["state"] == "deleted"
    with pytest.raises(PoolError, match="was not created"):
        pool.wait_until_ready()


@pytest.mark.parametrize("sources", [1, 3])
def test_merged_lines_passes_every_line_in_order_per_source_and_reports_each_end(sources):
    streams = [iter([f"node{n} line{i}\n" for i in range(50)]) for n in range(sources)]
    ended: list[int] = []
    lines = list(merged_lines(streams, ended.append))
    assert sorted(ended) == list(range(sources)) and len(lines) == 50 * sources
    for n in range(sources):
        assert [line for line in lines if line.startswith(f"node{n} ")] == [f"node{n} line{i}\n" for i in range(50)]


def test_every_backend_has_the_interface_and_nothing_else_names_one():
    """Adding a backend is one module and one registry line: every registered backend has the whole interface,
    and no code outside infra/compute compares pool.backend with a backend's name."""
    for name, backend in BACKENDS.items():
        assert backend.name == name == backend.settings().backend  # its pool section is the one pool.backend picks
        interface = "needs_image settings check nodes billing scripts_root sync_where pool specs"  # as Backend has
        for attribute in interface.split():
            assert hasattr(backend, attribute), (name, attribute)
    repo = REPO
    outside = [p for p in repo.glob("infra/**/*.py") if "compute" not in p.relative_to(repo).parts]
    for path in [*repo.glob("flows/**/*.py"), *repo.glob("tasks/*.py"), *outside]:
        text = path.read_text()
        for name in BACKENDS:
            for needle in (f'== "{name}"', f'!= "{name}"', "isinstance(pool,"):
                assert needle not in text, (path, needle)
