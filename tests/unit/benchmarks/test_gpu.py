"""`trainflow bench gpu`'s runs, its arithmetic and its answer on a machine without a GPU (this one, and CI's)."""

import pytest
import torch
from typer.testing import CliRunner

from benchmarks.gpu import gpu_row, measured, runs
from benchmarks.gpu_plan import MODEL_STEP_RUNS, SYNTHETIC_RUNS, installed_loaders, mfu, peak_tflops, trainer_lacks
from cli import app
from trainer.metrics import installed_versions


def test_mfu_is_resnet50_training_flops_over_the_gpu_s_bf16_peak():
    # 4,000 images/s on an H100 SXM: 4000 x 24.3e9 / 989.4e12
    assert mfu(4000, peak_tflops("NVIDIA H100 80GB HBM3", None)) == pytest.approx(0.0982, abs=1e-4)
    assert mfu(4000, None) is None


def test_the_peak_comes_from_the_device_name_or_the_option():
    assert peak_tflops("NVIDIA H100 PCIe", None) == 756.5 and peak_tflops("NVIDIA A100-SXM4-80GB", None) == 312.0
    assert peak_tflops("Some Future GPU", None) is None and peak_tflops("Some Future GPU", 500.0) == 500.0


def labels(plan) -> list[str]:
    return [run.label for run in plan]


def test_every_loader_runs_on_the_jpegs_and_gpu_and_fast_on_the_shrunk_copy_then_the_model_step_variants():
    synthetic = ["synthetic, --compile off", "synthetic, --compile on"]
    variants = [
        "synthetic, --compile-mode reduce-overhead",
        "synthetic, --fused-optimizer off",
        "synthetic, --compile-mode max-autotune-no-cudagraphs",
    ]
    shrunk = ["JPEGs shrunk to 500 px, --loader gpu", "JPEGs shrunk to 500 px, --loader fast"]
    assert labels(runs(("gpu", "fast", "pil"), restarts=False)) == synthetic + [
        "JPEGs, --loader gpu",
        "JPEGs, --loader fast",
        "JPEGs, --loader pil",
        *shrunk,
        *variants,
    ]
    # where jpeg_crop can rewrite them, the fast loader reads the JPEGs once more with restart markers, after its run
    assert labels(runs(("fast", "pil"), restarts=True))[2:5] == [
        "JPEGs, --loader fast",
        "JPEGs, --loader fast+restarts",
        "JPEGs, --loader pil",
    ]
    assert "fast+restarts" not in {run.data for run in runs(("pil",), restarts=True)}
    # the JPEG runs are compiled, as a GPU's default is; the settings are the trainer's options by name
    assert {run.settings["compile"] for run in runs(("gpu", "fast"), restarts=True)} == {"on", "off"}
    assert runs(("gpu",), restarts=False)[2].settings == {"loader": "gpu", "compile": "on"}


def test_every_run_of_the_bench_is_one_this_trainer_takes():
    plan = runs(("gpu", "fast", "pil", "dali"), restarts=True)
    assert [run.label for run in plan if trainer_lacks(run.settings)] == []
    assert set(labels(SYNTHETIC_RUNS + MODEL_STEP_RUNS)) <= set(labels(plan))


def test_the_json_written_after_each_run_holds_the_runs_measured_so_far():
    # bench gpu writes its JSON after every run, so a bench stopped by a time limit keeps what it measured
    plan = runs(("fast",), restarts=False)
    facts = {run.label: [] for run in plan} | {"synthetic, --compile off": [(3843.0, 0.0)]}
    part = measured(plan, facts, 989.4, complete=False)
    assert part["complete"] is False and [row["run"] for row in part["runs"]] == ["synthetic, --compile off"]
    assert part["runs"][0]["images_per_sec"]["all"] == [3843.0] and part["runs"][0]["mfu"]["median"] == mfu(
        3843.0, 989.4
    )


def test_a_row_has_the_spread_of_each_figure():
    row = gpu_row("synthetic", [(4000.0, 0.01), (4200.0, 0.02), (3900.0, 0.0)], 989.4)
    assert row["images_per_sec"]["median"] == 4000.0 and row["data_wait_share"]["max"] == 0.02
    assert row["mfu"]["min"] == pytest.approx(mfu(3900.0, 989.4))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the bench runs instead")
def test_without_a_gpu_bench_gpu_says_so_and_writes_nothing(tmp_path):
    result = CliRunner().invoke(app, ["bench", "gpu", "--workdir", str(tmp_path), "--json", str(tmp_path / "g.json")])
    assert (
        result.exit_code == 2
        and "no CUDA GPU here" in result.output
        and "bench" not in {p.name for p in tmp_path.iterdir()}
    )
    assert not (tmp_path / "g.json").exists()


def test_bench_gpu_refuses_dali_where_it_is_not_installed_before_any_run(tmp_path, monkeypatch):
    # a machine without NVIDIA DALI (the GPU machine measured on had none): asked for, refused before anything runs;
    # by default the bench runs the loaders installed here
    monkeypatch.setattr("benchmarks.gpu_plan.importlib.util.find_spec", lambda name: None)
    result = CliRunner().invoke(
        app, ["bench", "gpu", "--workdir", str(tmp_path), "--loader", "fast", "--loader", "dali"]
    )
    assert (
        result.exit_code == 2
        and "--loader dali needs NVIDIA DALI" in result.output
        and "trainflow[dali]" in result.output
    )
    assert not list(tmp_path.iterdir())
    assert installed_loaders() == ("fast", "pil", "gpu")


def test_bench_gpu_takes_its_rounds_from_repeats_at_least_two(tmp_path):
    one = CliRunner().invoke(app, ["bench", "gpu", "--workdir", str(tmp_path), "--repeats", "1"])
    assert one.exit_code == 2 and "--repeats" in one.output
    two = CliRunner().invoke(app, ["bench", "gpu", "--workdir", str(tmp_path), "--repeats", "2"])
    assert two.exit_code == 2 and "no CUDA GPU here" in two.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check runs instead")
def test_bench_gpu_quick_is_the_device_check_and_refuses_loaders_of_its_own(tmp_path):
    # --quick runs the device check, which needs a GPU as the full bench does; it picks its own loaders
    quick = CliRunner().invoke(app, ["bench", "gpu", "--quick", "--workdir", str(tmp_path)])
    assert quick.exit_code == 2 and "no CUDA GPU here" in quick.output
    both = CliRunner().invoke(app, ["bench", "gpu", "--quick", "--loader", "fast", "--workdir", str(tmp_path)])
    assert both.exit_code == 2 and "--quick runs the device check, which picks its own loaders" in both.output
    assert "bench" not in {p.name for p in tmp_path.iterdir()}


def test_the_machine_record_leaves_out_a_package_that_is_not_installed():
    # a GPU host may run the bench from a checkout without the orchestrator's packages: the figures still get written
    versions = installed_versions("torch", "trainflow-no-such-package")
    assert list(versions) == ["torch"] and versions["torch"].startswith(torch.__version__.split("+")[0])
