import pytest

from flows.bench.training import scaling_efficiency, summarise
from infra.trainer import TrainingConfig


def test_scaling_efficiency_is_two_worker_over_twice_one_worker():
    rates = {("ddp", 1): 50.0, ("ddp", 2): 90.0, ("horovod", 1): 40.0}
    assert scaling_efficiency(rates) == {"ddp": pytest.approx(0.9)}


def test_the_training_bench_computes_each_ratio_within_its_round():
    """The ceiling is two independent processes against one process alone in the same round (not against the
    slower launcher's 1-worker run), and every figure is the median of the rounds with its range."""
    rounds = [{"rates": {("ddp", 1): 50.0, ("ddp", 2): 90.0}, "alone": 52.0, "together": 98.8},
              {"rates": {("ddp", 1): 40.0, ("ddp", 2): 76.0}, "alone": 41.0, "together": 73.8},
              {"rates": {("ddp", 1): 45.0, ("ddp", 2): 72.0}, "alone": 46.0, "together": 87.4}]
    result = summarise(rounds, TrainingConfig(threads=1), "synthetic")
    assert result["scaling_efficiency"]["ddp"]["all"] == pytest.approx([0.9, 0.95, 0.8])
    assert result["scaling_efficiency"]["ddp"]["median"] == pytest.approx(0.9)
    assert result["machine_ceiling_efficiency"]["all"] == pytest.approx([0.95, 0.9, 0.95])
    assert result["runs"][1] == {"backend": "ddp", "workers": 2, "threads_per_worker": 1, "images_per_sec": {
        "median": 76.0, "min": 72.0, "max": 90.0, "all": [90.0, 76.0, 72.0]}}
    assert result["settings"]["repeats"] == 3
