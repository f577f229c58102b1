"""--grad-compression: gradients all-reduced in 16 bits train the digits set as well as float32, under both launchers,
and every rank still ends with the same parameters."""

import pytest

from flows.config import DIGITS_TRAINING
from infra.engines.launchers import LaunchError
from infra.engines.pytorch import PyTorchTraining
from tests.fakes.training import digests, train_locally

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]  # trainings compared by accuracy
HALF_A_POINT = 0.005  # of val top-1, a fraction: 1.8 of the 359 val images


def two_workers(digits, out, launcher: str, compression: str) -> dict:
    """The digits set's own settings on 2 workers under `launcher`, gradients sent as `compression`: metrics.json,
    after checking that both ranks ended with the same parameters."""
    settings = {**DIGITS_TRAINING, "loader_workers": 0, "checkpoint_every": 0, "log_every": 100}
    metrics = train_locally(
        PyTorchTraining(launcher=launcher, workers=2, grad_compression=compression, **settings),
        str(digits),
        out,
        lambda line: None,
    )
    ranks = digests(out / "logs")
    assert metrics["parameters_in_sync"] is True and ranks[0] == ranks[1] == metrics["parameter_digest"][:16]
    return metrics


@pytest.fixture(scope="module")
def float32_top1(digits, tmp_path_factory) -> float:
    """DDP's accuracy with float32 gradients, trained once for every compression compared with it."""
    return two_workers(digits, tmp_path_factory.mktemp("none") / "out", "torchrun", "none")["final_val_top1"]


@pytest.mark.timeout(
    3600
)  # float32 and a compressed 2-worker training of the digits set: minutes each on 2 shared cores
@pytest.mark.parametrize("launcher, compression", [("torchrun", "bf16")])  # each digits training costs minutes
def test_compressed_gradients_train_as_well_and_stay_in_sync(digits, tmp_path, float32_top1, launcher, compression):
    assert float32_top1 > 0.95  # trained, not guessing
    metrics = two_workers(digits, tmp_path / "out", launcher, compression)
    assert metrics["final_val_top1"] >= float32_top1 - HALF_A_POINT


def test_horovod_refuses_bf16_in_one_line(digits, tmp_path):
    settings = dict(model="resnet18", image_size=32, epochs=1, steps_per_epoch=1, batch_size=8, loader_workers=0)
    with pytest.raises(LaunchError, match="--grad-compression bf16 needs DDP"):
        train_locally(
            PyTorchTraining(launcher="horovodrun", workers=2, grad_compression="bf16", **settings),
            str(digits),
            tmp_path / "out",
            lambda line: None,
        )
