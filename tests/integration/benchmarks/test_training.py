"""`trainflow bench train` and `trainflow bench parallel` at their smallest: every configuration repeated under the
real launchers, the table and the JSON with the machine it ran on."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]  # minutes each: every configuration twice
TRAINFLOW = str(Path(sys.executable).with_name("trainflow"))
FIGURE = {"median", "min", "max", "all"}
REPEATS = 2  # the commands' default is 3; two rounds check the same arithmetic in less time
TINY = {
    "TRAINFLOW_TRAINING__IMAGE_SIZE": "32",
    "TRAINFLOW_TRAINING__EPOCHS": "1",
    "TRAINFLOW_TRAINING__LOG_EVERY": "1",
    "TRAINFLOW_TRAINING__NUM_CLASSES": "4",
}


def bench(tmp_path: Path, command: list[str], **settings: str) -> dict:
    """Run `trainflow bench COMMAND` with tiny training settings; its JSON."""
    env = {**os.environ, **TINY, **settings}
    out = subprocess.run(
        [
            TRAINFLOW,
            "bench",
            *command,
            "--repeats",
            str(REPEATS),
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(tmp_path / "bench.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"median (min-max) of {REPEATS}" in " ".join(out.stdout.split())
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["machine"]["cores"] >= 1 and result["machine"]["versions"]["horovod"]
    return result


def repeated(figure: dict) -> bool:
    return (
        set(figure) == FIGURE and len(figure["all"]) == REPEATS and figure["min"] <= figure["median"] <= figure["max"]
    )


def test_bench_train_repeats_every_run_and_computes_the_ceiling(tmp_path):
    """At its smallest: one launcher (`--launcher horovodrun`, the slower to start; torchrun's runs are the
    parallel bench's and the flow bench's) and one framework (TensorFlow's runs are the frameworks bench's; the
    ratio of its efficiency to PyTorch's is computed from the same rows, tests/unit/benchmarks/test_summaries.py)."""
    result = bench(
        tmp_path,
        ["train", "--launcher", "horovodrun", "--framework", "pytorch"],
        TRAINFLOW_TRAINING__BATCH_SIZE="8",
        TRAINFLOW_TRAINING__STEPS_PER_EPOCH="3",
    )
    assert [(r["backend"], r["workers"]) for r in result["runs"]] == [("horovod", 1), ("horovod", 2)]
    assert all(repeated(r["images_per_sec"]) and r["images_per_sec"]["min"] > 0 for r in result["runs"])
    assert set(result["scaling_efficiency"]) == {"horovod"} == set(result["per_step_ms"])
    steps = result["per_step_ms"]["horovod"]
    assert all(repeated(f) for f in steps.values())
    # the step's CPU split: Horovod's background thread (the all-reduce) spends CPU beside the thread that trains
    assert steps["training_thread_cpu_ms"]["min"] > 0 and steps["other_threads_cpu_ms"]["min"] > 0
    assert steps["off_cpu_ms"]["all"] == pytest.approx(
        [
            s - t - o
            for s, t, o in zip(
                steps["step_ms_2_workers"]["all"],
                steps["training_thread_cpu_ms"]["all"],
                steps["other_threads_cpu_ms"]["all"],
            )
        ]
    )
    assert all(repeated(f) for f in result["scaling_efficiency"].values())
    ceiling = result["machine_ceiling_efficiency"]
    assert repeated(ceiling) and ceiling["all"] == pytest.approx(
        [
            t / (2 * a)
            for t, a in zip(result["independent_2x1_images_per_sec"]["all"], result["alone_images_per_sec"]["all"])
        ]
    )
    assert result["of_the_ceiling"]["horovod"]["all"] == pytest.approx(
        [e / c for e, c in zip(result["scaling_efficiency"]["horovod"]["all"], ceiling["all"])]
    )


def test_bench_frameworks_trains_each_framework_side_by_side(tmp_path):
    """At its smallest (ResNet-18 at 32 px instead of ResNet-50 at 224; two of the frameworks, Keras's trainer being
    the tf-training tests'): each framework in every round, the ratios to PyTorch's computed within the round."""
    result = bench(
        tmp_path,
        ["frameworks", "--framework", "pytorch", "--framework", "tensorflow"],
        TRAINFLOW_TRAINING__MODEL="resnet18",
        TRAINFLOW_TRAINING__STEPS_PER_EPOCH="3",
        TRAINFLOW_TRAINING__EPOCHS="2",
    )
    runs = {r["framework"]: r for r in result["runs"]}
    assert list(runs) == ["pytorch", "tensorflow"] and result["settings"]["model"] == "resnet18"
    assert all(repeated(r["images_per_sec"]) and r["images_per_sec"]["min"] > 0 for r in runs.values())
    assert runs["pytorch"]["vs_pytorch"]["all"] == [1.0, 1.0]
    assert repeated(runs["tensorflow"]["vs_pytorch"])


def test_bench_parallel_repeats_every_layout_with_memory_per_rank(tmp_path):
    """At its smallest: one micro-batch count for the 2-stage pipeline (`--microbatches 2`), the 4-stage one."""
    result = bench(
        tmp_path,
        ["parallel", "--microbatches", "2"],
        TRAINFLOW_TRAINING__BATCH_SIZE="16",
        TRAINFLOW_TRAINING__STEPS_PER_EPOCH="2",
        TRAINFLOW_TRAINING__BALANCE="params",
    )
    assert [r["run"] for r in result["runs"]] == ["data-parallel", "pipeline M=2", "4 stages M=4"]
    for r in result["runs"]:
        ranks = r["workers"]
        assert repeated(r["images_per_sec"]) and len(r["peak_memory_mb_per_rank"]) == ranks
        assert all(repeated(m) for m in r["peak_memory_mb_per_rank"] + r["training_memory_mb_per_rank"])
    assert result["runs"][0]["memory_vs_data_parallel"] == 1.0 and result["settings"]["repeats"] == REPEATS


def test_bench_flow_times_trainflow_run_against_torchrun_with_the_fixed_cost_in_parts(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(
        "training: {model: resnet18, image_size: 32, epochs: 1, steps_per_epoch: 2, batch_size: 16, "
        "workers: 2, warmup_epochs: 0, loader_workers: 0}\n"
    )
    result = bench(tmp_path, ["flow", "--config", str(config)])
    assert list(result["seconds"]) == [
        "torchrun",
        "trainflow run",
        "import the flow",
        "start Prefect's server",
        "start Azurite",
    ]
    assert all(repeated(f) and f["min"] > 0 for f in result["seconds"].values())
    seconds = result["seconds"]
    assert result["overhead_seconds"]["all"] == pytest.approx(
        [f - d for f, d in zip(seconds["trainflow run"]["all"], seconds["torchrun"]["all"])]
    )
    assert result["settings"]["workers"] == 2 and result["settings"]["repeats"] == REPEATS
    runs = [p for p in (tmp_path / "w" / "bench" / "flow" / "work" / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1 + REPEATS  # the unmeasured first run and one per round, each trained in full
