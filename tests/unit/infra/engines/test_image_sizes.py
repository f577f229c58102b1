"""The image sizes the PyTorch engine refuses with the config are exactly those its models cannot take: each rule's
edges, tried on the model itself (a forward pass in training mode on the meta device: shapes only, no memory)."""

import warnings

import pytest
import torch
import torchvision

from flows.config import ConfigError, load_config
from infra.engines.pytorch import IMAGE_SIZES


def takes(model: str, size: int) -> bool:
    """Whether torchvision's `model` runs a batch of 2 images of `size` px in training mode."""
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GoogLeNet's and Inception's notes on their initialisation
        built = torchvision.models.get_model(model, weights=None, num_classes=10).train()
        try:
            built(torch.zeros(2, 3, size, size))
        except (RuntimeError, ValueError, AssertionError, IndexError):
            return False
    return True


@pytest.mark.parametrize("model", sorted(IMAGE_SIZES))
def test_each_rule_is_the_model_s_own_edge(model):
    low, high = IMAGE_SIZES[model]
    assert takes(model, low) and not takes(model, low - 1)
    if high is not None:
        assert takes(model, high) and not takes(model, high + 1)


def test_a_size_the_model_cannot_take_is_refused_with_the_config():
    with pytest.raises(ConfigError) as refused:
        load_config(None, {"training": {"model": "vit_b_16", "image_size": 32}}, environ={})
    assert str(refused.value) == (
        "invalid config: vit_b_16 takes images of 224 px, not training.image_size 32; set training.image_size 224 "
        "or pick another training.model"
    )
    load_config(None, {"training": {"model": "resnet18", "image_size": 32}}, environ={})  # no rule: the preflight's
