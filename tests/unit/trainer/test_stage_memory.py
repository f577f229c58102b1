"""A pipeline stage holds only its own part of the model: the meta build, materialising a part with the values of a
one-device build, the per-stage checkpoint files merged into the single-device model's, the bench's summaries."""

import pytest
import torch

from benchmarks.common import spread
from benchmarks.parallel import compared, deeper_runs, row
from infra.engines.contract import Metrics
from infra.engines.pytorch import PyTorchTraining
from trainer import checkpoint, metrics
from trainer.models import build_model, build_on_meta, forget, materialise
from trainer.pipeline import blocks_of, parameter_costs, split_model, state_names


@pytest.mark.parametrize("name", ["resnet18", "vgg11", "mobilenet_v3_small", "efficientnet_b0"])
def test_a_model_built_on_meta_materialises_to_the_values_of_a_real_build(name):
    torch.manual_seed(7)
    real = build_model(name, 5)
    after_real = torch.get_rng_state()
    torch.manual_seed(7)
    model, recipe = build_on_meta(name, 5)
    assert torch.equal(torch.get_rng_state(), after_real)  # what is drawn next (data, dropout) is drawn as before
    assert metrics.held(model) == (0, 0)
    materialise(model, list(real.state_dict()), recipe, torch.device("cpu"))
    expected = real.state_dict()
    assert all(torch.equal(value, expected[key]) for key, value in model.state_dict().items())


def test_materialising_one_stage_holds_that_stage_and_nothing_else():
    torch.manual_seed(0)
    real = build_model("resnet18", 4)
    torch.manual_seed(0)
    model, recipe = build_on_meta("resnet18", 4)
    split, modules = split_model(model, 2, parameter_costs(blocks_of(model)))
    names = state_names(model, modules[1])
    materialise(model, names, recipe, torch.device("cpu"))
    held = {k for k, v in model.state_dict().items() if not v.is_meta}
    assert held == names and metrics.held(model)[0] == split.params[1] == sum(
        p.numel() for p in modules[1].parameters()
    )
    assert all(torch.equal(model.state_dict()[k], real.state_dict()[k]) for k in names)
    forget(model, names)
    assert metrics.held(model) == (0, 0)


def test_held_counts_parameters_and_the_bytes_of_parameters_and_buffers():
    model = torch.nn.BatchNorm1d(3)  # 6 parameters, 2 x 3 float buffers and one int64 counter
    assert metrics.held(model) == (6, 6 * 4 + 6 * 4 + 8)


def stage_files(folder, step: int) -> list:
    """A 2-stage checkpoint as the trainer writes it: stage 1's part, then step-N.pt with stage 0's part."""
    torch.manual_seed(0)
    whole = build_model("resnet18", 4)
    optimizer = torch.optim.SGD(whole.parameters(), lr=0.1, momentum=0.9)
    whole(torch.zeros(2, 3, 32, 32)).sum().backward()
    optimizer.step()
    keys, state = list(whole.state_dict()), optimizer.state_dict()
    cut, params = keys.index("layer3.0.conv1.weight"), len(state["param_groups"][0]["params"])
    first = sum(1 for k, _ in whole.named_parameters() if keys.index(k) < cut)

    def part(key_range, index_range):
        return {
            "model": {k: whole.state_dict()[k] for k in keys[key_range]},
            "optimizer": {
                "state": {i: state["state"][i] for i in range(params)[index_range]},
                "param_groups": [{**state["param_groups"][0], "params": list(range(params)[index_range])}],
            },
        }

    path = checkpoint.checkpoint_path(folder, step)
    checkpoint.save_torch(checkpoint.stage_path(path, 1), part(slice(cut, None), slice(first, None)))
    checkpoint.save_checkpoint(
        folder, {**part(slice(0, cut), slice(0, first)), "stages": 2, "step": step}, step, keep=2
    )
    return [whole, optimizer]


def test_the_stage_files_of_a_checkpoint_merge_into_the_single_device_model(tmp_path):
    whole, optimizer = stage_files(tmp_path, 5)
    state = checkpoint.load_checkpoint(checkpoint.latest_checkpoint(tmp_path))
    model = build_model("resnet18", 4)
    model.load_state_dict(state["model"])  # strict
    fresh = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    fresh.load_state_dict(state["optimizer"])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), whole.state_dict().values()))
    assert state["optimizer"]["param_groups"] == optimizer.state_dict()["param_groups"]


def test_old_checkpoints_go_with_their_stage_files(tmp_path):
    for step in (1, 2, 3):
        stage_files(tmp_path, step)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-000000002.pt",
        "step-000000002.stage-1.pt",
        "step-000000003.pt",
        "step-000000003.stage-1.pt",
    ]


def metrics_of(images_per_sec: float, peaks: list[float], params: list[int]) -> Metrics:
    """A run's metrics whose training added all but 200 MB (the runtime) of each rank's peak."""
    return Metrics(
        status="complete",
        model="m",
        world_size=len(peaks),
        backend="ddp",
        wall_seconds=1.0,
        images_per_sec=images_per_sec,
        steady_images_per_sec=images_per_sec,
        peak_memory_mb=peaks,
        parameters_per_rank=params,
        training_memory_mb=[p - 200 for p in peaks],
    )


def test_the_parallel_bench_gives_medians_with_their_spread_per_rank():
    assert spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "all": [3.0, 1.0, 2.0]}
    data = PyTorchTraining(workers=2, batch_size=8, launcher="torchrun")
    four = deeper_runs(PyTorchTraining(batch_size=16, launcher="torchrun"))
    assert [(c.workers, c.stages, c.microbatches, c.batch_size) for _, c in four] == [(4, 4, 4, 16)]
    rows = compared(
        [
            row(
                "data-parallel",
                data,
                [
                    metrics_of(10, [1000, 900], [8, 8]),
                    metrics_of(12, [1100, 950], [8, 8]),
                    metrics_of(11, [1050, 960], [8, 8]),
                ],
            ),
            row("4 stages M=4", four[0][1], [metrics_of(5, [300, 310, 320, 330], [2, 2, 2, 2])] * 3),
        ]
    )
    assert rows[0]["peak_memory_mb_per_rank"][1] == {"median": 950, "min": 900, "max": 960, "all": [900, 950, 960]}
    assert rows[1]["vs_data_parallel"] == 5 / 11 and rows[1]["memory_vs_data_parallel"] == 330 / 1050
    assert rows[1]["training_memory_mb_per_rank"][3]["median"] == 130
    assert rows[1]["training_memory_vs_data_parallel"] == 130 / 850
    assert rows[1]["parameters_per_rank"] == [2, 2, 2, 2]


def test_a_resnet_divides_finely_and_vgg_does_not():
    """docs/benchmarks/earlier-training.md's figures: wide_resnet101_2's largest of 4 stages holds at most 28% of its
    parameters; VGG-16's head (its first fully connected layer alone 76%) is one block, so its largest stage holds
    more at any S."""
    with torch.device("meta"):
        wide, vgg = build_model("wide_resnet101_2", 10), build_model("vgg16", 10)
    split, _ = split_model(wide, 4, parameter_costs(blocks_of(wide)))
    assert max(split.params) <= 0.28 * sum(split.params)
    assert vgg.classifier[0].weight.numel() >= 0.76 * sum(p.numel() for p in vgg.parameters())
    assert max(parameter_costs(blocks_of(vgg))) >= 0.76 * sum(p.numel() for p in vgg.parameters())
