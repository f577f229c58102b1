"""`auto` worker counts and the one-rank-a-GPU rule (infra/engines/gpus.py), on a stand-in of the NVIDIA driver's
per-GPU folders (this machine has no GPU), and through the config as `trainflow run --workers auto` reads it."""

import pytest

import infra.engines.gpus as gpus
from flows.config import ConfigError, load_config
from nodelib.cores import usable_cores
from tests.fakes.paths import REPO


def driver(tmp_path, count: int):
    folder = tmp_path / "gpus"
    folder.mkdir()
    for i in range(count):
        (folder / f"0000:0{i}:00.0").mkdir()
    return folder


@pytest.mark.parametrize(
    ("installed", "listed", "seen"),
    [(4, None, 4), (4, "0,1", 2), (4, "", 0), (4, "-1", 0), (4, "1,-1,2", 1), (0, "0,1", 0), (2, "0,1,2,3", 2)],
)
def test_the_visible_gpus_are_the_drivers_as_cuda_visible_devices_lists_them(tmp_path, installed, listed, seen):
    environ = {} if listed is None else {"CUDA_VISIBLE_DEVICES": listed}
    assert gpus.visible_gpus(environ, driver(tmp_path, installed)) == seen


def test_auto_is_one_worker_a_gpu_else_one_a_core(tmp_path):
    assert gpus.auto_count("auto", {}, driver(tmp_path, 4)) == 4
    assert gpus.auto_count("auto", {"CUDA_VISIBLE_DEVICES": ""}, tmp_path / "gpus") == usable_cores()
    assert gpus.auto_count(3) == 3 and gpus.auto_count("3") == "3"  # the field's own parsing does the rest
    with pytest.raises(ValueError, match=r"'many' is not a count: give a whole number of at least 1, or auto"):
        gpus.auto_count("many")


def test_more_workers_than_gpus_is_refused_naming_the_count_and_the_fix(tmp_path):
    four = driver(tmp_path, 4)
    assert gpus.shared_gpu(4, "auto", {}, four) == "" and gpus.shared_gpu(8, "cpu", {}, four) == ""
    assert gpus.shared_gpu(8, "cuda", {}, tmp_path / "none") == ""  # no GPU: the device's own check says so
    assert gpus.shared_gpu(8, "auto", {}, four) == (
        "training.workers is 8 but this machine has 4 visible GPU(s): two ranks would share one GPU, which NCCL "
        "refuses; set training.workers to 4 (or auto: one per GPU), or training.device: cpu"
    )


def test_workers_auto_on_a_gpu_workstation_and_the_refusal_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "DRIVER_GPUS", driver(tmp_path, 3))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = load_config(None, {"training": {"workers": "auto"}, "pool": {"slots_per_node": "auto"}}, environ={})
    assert cfg.training.workers == cfg.pool.slots_per_node == 3
    with pytest.raises(ConfigError, match=r"training.workers is 4 but this machine has 3 visible GPU\(s\)"):
        load_config(None, {"training": {"workers": 4}, "pool": {"slots_per_node": 4}}, environ={})
    cpu = load_config(None, {"training": {"workers": 4, "device": "cpu"}, "pool": {"slots_per_node": 4}}, environ={})
    assert cpu.training.workers == 4


def test_the_azureml_pool_takes_no_auto_slots():
    with pytest.raises(ConfigError, match=r"pool.slots_per_node auto counts this machine's GPUs, not the cluster's"):
        load_config(REPO / "flows" / "configs" / "azure.yaml", {"pool": {"slots_per_node": "auto"}}, environ={})
