"""Splitting a model into pipeline stages: the partition, the blocks, the layout checks, the bench plan."""

import pytest
import torchvision

from benchmarks.parallel import planned_runs
from infra.engines.pytorch import PyTorchTraining
from nodelib.errors import UsageError
from trainer.pipeline import Split, blocks_of, check_layout, parameter_costs, partition, theoretical_bubble


def largest(costs: list[float], starts: list[int]) -> float:
    bounds = starts + [len(costs)]
    return max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize(
    "costs, stages, best",
    [
        ([1, 1, 1, 1], 2, 2),
        ([5, 1, 1, 1, 1, 1], 2, 5),
        ([1, 1, 1, 1, 1, 5], 3, 5),
        ([3, 3, 3], 3, 3),
        ([2], 1, 2),
        ([4, 3, 2, 2, 1, 4], 3, 7),
    ],
)
def test_partition_makes_the_largest_stage_as_small_as_it_can_be(costs, stages, best):
    starts = partition(costs, stages)
    assert len(starts) == stages and starts[0] == 0 and starts == sorted(set(starts))
    assert largest(costs, starts) == best


def test_more_stages_than_blocks_is_refused_with_the_count():
    with pytest.raises(UsageError, match="--stages 4 is more than the 3 blocks"):
        partition([1, 2, 3], 4)


def test_a_resnet_splits_into_stem_residual_blocks_and_head_holding_every_parameter():
    model = torchvision.models.resnet50(num_classes=10)
    blocks = blocks_of(model)
    assert [n for n, _ in blocks][:2] == ["stem", "layer1.0"] and blocks[-1][0] == "head" and len(blocks) == 18
    assert sum(parameter_costs(blocks)) == sum(p.numel() for p in model.parameters())


def test_models_that_are_not_a_sequence_of_blocks_are_refused():
    with pytest.raises(UsageError, match="not DenseNet"):
        blocks_of(torchvision.models.densenet121(num_classes=10))


@pytest.mark.parametrize(
    "world, stages, batch, microbatches, message",
    [
        (3, 2, 16, 2, "world size 3 is not a multiple of --stages 2"),
        (4, 2, 10, 4, "--batch-size 10 is not divisible by --microbatches 4"),
    ],
)
def test_bad_layouts_are_refused(world, stages, batch, microbatches, message):
    with pytest.raises(UsageError, match=message):
        check_layout(world, stages, batch, microbatches)


def test_the_theoretical_bubble_of_gpipe():
    assert theoretical_bubble(2, 1) == 0.5 and theoretical_bubble(2, 8) == pytest.approx(1 / 9)
    assert theoretical_bubble(1, 4) == 0


def test_the_parallel_benchmark_keeps_the_global_batch():
    runs = planned_runs(PyTorchTraining(batch_size=32, launcher="torchrun"))
    data, *pipes = runs
    assert data[1].batch_size * data[1].workers == 32 and data[1].parallel == "data"
    assert [(c.microbatches, c.batch_size, c.stages) for _, c in pipes] == [(m, 32, 2) for m in (1, 2, 4, 8)]


def test_the_split_line_names_each_stage_s_parameters_once_and_its_seconds_when_balanced_by_time():
    split = Split(names=[["stem", "layer1.0"], ["layer1.1", "fc"]], costs=[1200.0, 0.25], params=[1200, 34])
    assert split.describe("params") == (
        "stage 0: stem..layer1.0 (2 blocks, 1,200 params); stage 1: layer1.1..fc (2 blocks, 34 params)"
    )
    assert split.describe("time").endswith("(2 blocks, 34 params, 0.25 s)")
