import pytest

from benchmarks.frameworks import summarise_frameworks
from benchmarks.training import against_pytorch, scaling_efficiency, summarise
from infra.engines.pytorch import PyTorchTraining

CPU = {
    ("ddp", 1): {"training_thread": 190.0, "other_threads": 5.0},
    ("ddp", 2): {"training_thread": 200.0, "other_threads": 30.0},
}


def test_scaling_efficiency_is_two_worker_over_twice_one_worker():
    rates = {("ddp", 1): 50.0, ("ddp", 2): 90.0, ("horovod", 1): 40.0}
    assert scaling_efficiency(rates) == {"ddp": pytest.approx(0.9)}


def test_the_training_bench_computes_each_ratio_within_its_round():
    """The ceiling is two independent processes against one process alone in the same round (not against the
    slower launcher's 1-worker run), and every figure is the median of the rounds with its range."""
    rounds = [
        {"rates": {("ddp", 1): 50.0, ("ddp", 2): 90.0}, "cpu": CPU, "alone": 52.0, "together": 98.8},
        {"rates": {("ddp", 1): 40.0, ("ddp", 2): 76.0}, "cpu": CPU, "alone": 41.0, "together": 73.8},
        {"rates": {("ddp", 1): 45.0, ("ddp", 2): 72.0}, "cpu": CPU, "alone": 46.0, "together": 87.4},
    ]
    result = summarise(rounds, PyTorchTraining(threads=1), "synthetic")
    assert result["scaling_efficiency"]["ddp"]["all"] == pytest.approx([0.9, 0.95, 0.8])
    assert result["scaling_efficiency"]["ddp"]["median"] == pytest.approx(0.9)
    assert result["machine_ceiling_efficiency"]["all"] == pytest.approx([0.95, 0.9, 0.95])
    assert result["of_the_ceiling"]["ddp"]["all"] == pytest.approx([0.9 / 0.95, 0.95 / 0.9, 0.8 / 0.95])
    assert result["runs"][1] == {
        "backend": "ddp",
        "workers": 2,
        "threads_per_worker": 1,
        "images_per_sec": {"median": 76.0, "min": 72.0, "max": 90.0, "all": [90.0, 76.0, 72.0]},
    }
    assert result["settings"]["repeats"] == 3


def test_the_loader_bench_computes_per_core_figures_and_speed_ups_within_each_round():
    from benchmarks.loader import summarise as summarise_loader

    parts = {loader: {"decode": 0.002, "augment": 0.001, "collate": 0.0001} for loader in ("fast", "pil")}
    rounds = [
        {"rates": {"fast/1": 600.0, "fast/2": 1000.0, "pil/1": 300.0, "pil/2": 400.0}, "parts": parts},
        {"rates": {"fast/1": 400.0, "fast/2": 900.0, "pil/1": 250.0, "pil/2": 450.0}, "parts": parts},
        {"rates": {"fast/1": 500.0, "fast/2": 800.0, "pil/1": 200.0, "pil/2": 500.0}, "parts": parts},
    ]
    result = summarise_loader(rounds, 2, 512, PyTorchTraining())
    assert result["speedup_per_core"]["fast"]["1"]["all"] == pytest.approx([2.0, 1.6, 2.5])
    assert result["speedup_per_core"]["fast"]["1"]["median"] == pytest.approx(2.0)  # not 500 / 250
    assert result["speedup_per_core"]["fast"]["2"]["all"] == pytest.approx([2.5, 2.0, 1.6])
    assert result["runs"]["fast/2"]["per_core"]["all"] == pytest.approx([500.0, 450.0, 400.0])
    assert result["ms_per_image"]["pil"]["decode"]["median"] == pytest.approx(2.0)


def test_the_two_worker_step_s_extra_time_splits_into_the_machine_s_share_and_communication():
    """Batch 10 per worker. One worker: 50 images/s, 200 ms a step. Two: 80 images/s, 20 images a step, 250 ms.
    Alone 50 images/s (200 ms), two independent 90 images/s (each 222 ms): the machine's share 22 ms, the rest
    of the 50 ms, 28 ms, communication."""
    rounds = [{"rates": {("ddp", 1): 50.0, ("ddp", 2): 80.0}, "cpu": CPU, "alone": 50.0, "together": 90.0}]
    ms = summarise(rounds, PyTorchTraining(threads=1, batch_size=10), "synthetic")["per_step_ms"]["ddp"]
    assert ms["step_ms_1_worker"]["median"] == pytest.approx(200) and ms["step_ms_2_workers"][
        "median"
    ] == pytest.approx(250)
    assert ms["machine_ms"]["median"] == pytest.approx(2000 / 9 - 200)
    assert ms["communication_ms"]["median"] == pytest.approx(50 - (2000 / 9 - 200))
    # per worker, the 250 ms step: 200 ms of the training thread's CPU, 30 of the all-reduce's threads, 20 off the CPU
    assert ms["training_thread_cpu_ms"]["median"] == 200 and ms["other_threads_cpu_ms"]["median"] == 30
    assert ms["off_cpu_ms"]["median"] == pytest.approx(20)


def test_another_framework_s_efficiency_is_compared_with_pytorch_s_within_each_round():
    rounds = [{"horovod": 0.9, "ddp": 0.95, "tensorflow/horovod": 0.8}, {"horovod": 0.7, "tensorflow/horovod": 0.75}]
    assert against_pytorch(rounds)["tensorflow/horovod"]["all"] == pytest.approx([-0.1, 0.05])
    assert set(against_pytorch(rounds)) == {"tensorflow/horovod"}


def test_the_frameworks_bench_gives_each_ratio_to_pytorch_within_its_round():
    rounds = [{"pytorch": 100.0, "keras": 80.0}, {"pytorch": 50.0, "keras": 45.0}, {"pytorch": 90.0, "keras": 72.0}]
    runs = {r["framework"]: r for r in summarise_frameworks(rounds, {"model": "resnet50"})["runs"]}
    assert runs["keras"]["vs_pytorch"]["all"] == pytest.approx([0.8, 0.9, 0.8])
    assert runs["keras"]["images_per_sec"]["median"] == 72.0 and runs["pytorch"]["vs_pytorch"]["median"] == 1.0
