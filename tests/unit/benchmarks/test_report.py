"""The benchmarks' report: each bench's figures, made by the bench's own summarising code from measured-shaped rounds,
become a section with a plot (a valid SVG beside the report) and a table of median (min-max)."""

import xml.etree.ElementTree as ET

import pytest

from benchmarks import images, loader, overhead, staging, training
from benchmarks.report import CHARTS, write_report
from benchmarks.suite import ORDER, SIZES, bench_all, with_training
from flows.config import ConfigError, FlowConfig
from infra.engines.pytorch import PyTorchTraining
from infra.storage.config import StorageConfig

STAGING_ROUNDS = [
    {
        "seconds": {path: seconds * (i + 1) for i, path in enumerate(staging.PATHS)},
        "phases": {"upload": seconds * 0.6, "sync": seconds * 0.4, "shrink": seconds * 0.2},
        "shrunk": {"shrunk": 30, "bytes_source": 4_400_000, "bytes_mirror": 1_100_000},
    }
    for seconds in (2.0, 2.5, 3.0)
]
CPU = {
    ("ddp", 1): {"training_thread": 500.0, "other_threads": 20.0},
    ("ddp", 2): {"training_thread": 520.0, "other_threads": 40.0},
}
TRAINING_ROUNDS = [
    {"rates": {("ddp", 1): 50.0, ("ddp", 2): 90.0}, "cpu": CPU, "alone": 52.0, "together": 98.8},
    {"rates": {("ddp", 1): 40.0, ("ddp", 2): 76.0}, "cpu": CPU, "alone": 41.0, "together": 73.8},
]
FLOW_ROUNDS = [
    {
        "torchrun": 20.0 + i,
        "trainflow run": 50.0 + 2 * i,
        "import the flow": 4.0,
        "start Prefect's server": 20.0,
        "start Azurite": 2.5,
    }
    for i in range(3)
]
MACHINE = {"cores": 2, "memory_gb": 23.4, "platform": "Linux", "python": "3.11.2", "versions": {"torch": "2.14.1"}}


def results() -> dict:
    """One result per chart, each made by its bench's own code where the bench has a pure summary."""
    parallel_run = {
        "run": "data-parallel",
        "images_per_sec": {"median": 30.0, "min": 28.0, "max": 33.0, "all": [28.0, 30.0, 33.0]},
        "vs_data_parallel": 1.0,
        "training_memory_vs_data_parallel": 1.0,
    }
    first = {"image": "localhost:5000/trainflow-cpu@sha256:ab", "seconds": 600.0, "built": True, "pushed": True}
    ours = [{"seconds": s, "built": False, "pushed": False} for s in (0.2, 0.3, 0.25)]
    per_core = {"pil": 40.0, "fast": 100.0, "dali": 80.0}
    loader_rounds = [
        {
            "rates": {f"{name}/{n}": per_core[name] * n * 0.95 ** (n - 1) * k for name in per_core for n in (1, 2)},
            "parts": {name: dict.fromkeys(loader.PARTS, 0.002) for name in per_core},
        }
        for k in (1.0, 0.9, 1.1)
    ]
    return {
        "loader": loader.summarise(loader_rounds, 2, 512, PyTorchTraining()),
        "staging": staging.summarise(STAGING_ROUNDS, 40, 4_400_000, StorageConfig(), 500),
        "train": training.summarise(TRAINING_ROUNDS, PyTorchTraining(threads=1), "synthetic"),
        "parallel": {
            "settings": {"model": "resnet18", "image_size": 64, "global_batch": 32},
            "runs": [
                parallel_run,
                {
                    **parallel_run,
                    "run": "pipeline M=2",
                    "vs_data_parallel": 1.1,
                    "training_memory_vs_data_parallel": 0.7,
                },
            ],
        },
        "flow": overhead.summarise(FLOW_ROUNDS, FlowConfig()),
        "images": images.image_result(first, ours, [9.0, 8.0, 10.0], cold=False),
        "scale": {
            "points": [
                {"files": n, "stages": {"first": {"seconds": n * 5e-4}, "unchanged": {"seconds": n * 2e-5}}}
                for n in (300, 3000)
            ]
        },
    }


def test_bench_all_runs_exactly_the_benchmarks_the_report_draws():
    assert set(ORDER) == set(CHARTS) and all(set(size) <= set(ORDER) for size in SIZES.values())


def test_every_benchmark_gets_a_plot_and_a_table_of_its_spread(tmp_path):
    report = write_report(results(), tmp_path / "bench.md", "trainflow bench all --json bench.json", MACHINE)
    text = report.read_text()
    for name in ORDER:
        plot = tmp_path / f"bench-{name}.svg"
        assert ET.parse(plot).getroot().tag.endswith("svg") and f"![{name}]({plot.name})" in text
        assert f"## {name}: " in text
    assert "| per file, one at a time | 5 (4–6) |" in text  # seconds of the 2nd path: 2x each round's
    assert "scaling efficiency at 2 workers, ddp: 0.93 (0.90–0.95)" in text
    assert "unchanged context: trainflow 40.0 (26.7–45.0)x faster" in text
    assert "| first build and push, once (the engine's layer cache) | 600 |" in text
    assert "overhead of `trainflow run`: 31.0 (30.0–32.0) s" in text
    assert "| --loader fast, 2 core(s) | 95 (85.5–105) |" in text  # per core: half the 2-core rate
    assert "fast against pil, per core, 1 core(s): 2.50 (2.50–2.50)x" in text
    assert "dali against pil, per core, 2 core(s): 2.00 (2.00–2.00)x" in text
    assert "| first, 3,000 files | 500 |" in text  # µs per file, one run
    assert "Machine: 2 cores, 23.4 GB, Linux, Python 3.11.2; versions: torch 2.14.1" in text


def test_a_report_of_an_unknown_benchmark_names_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match="no chart for benchmark gpu: report one of loader, staging"):
        write_report({"gpu": {}}, tmp_path / "r.md", "x", MACHINE)


def test_bench_all_refuses_an_unknown_benchmark_before_running_any(tmp_path):
    with pytest.raises(ConfigError, match="--only loaderz is not a benchmark: pass one of loader, staging, train"):
        bench_all(FlowConfig(workdir=tmp_path), tmp_path / "all.json", ("train", "loaderz"))
    assert not (tmp_path / "all.json").exists()


def test_bench_all_sizes_give_way_to_the_settings_the_config_names():
    cfg = FlowConfig(training=PyTorchTraining(epochs=5))
    training = with_training(cfg, {"epochs": 1, "steps_per_epoch": 2}).training
    assert (training.epochs, training.steps_per_epoch) == (5, 2)
    assert training.model_fields_set == {"epochs", "steps_per_epoch"}  # the rest stay the bench's own defaults


@pytest.mark.parametrize("command", ["train", "parallel", "flow"])
def test_a_bench_refuses_fewer_than_two_repeats_before_running_anything(command, tmp_path):
    from typer.testing import CliRunner

    from cli import app

    result = CliRunner().invoke(app, ["bench", command, "--repeats", "1", "--workdir", str(tmp_path)])
    said = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "--repeats" in said and "greater than or equal to 2" in said
    assert not any(tmp_path.iterdir())
