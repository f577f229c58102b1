"""The TensorFlow trainers' ResNets are torchvision's: the same parameters, the same feature-map sizes and, given
torchvision's weights, the same logits; initialised as torchvision initialises them, from one seed."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras
import torch
import torchvision

from nodelib.errors import UsageError
from trainer.tf import models


def trainable(model: keras.Model) -> int:
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def test_the_logits_are_float32_and_shaped_by_the_classes_also_under_mixed_precision():
    for size in (224, 32):
        model = models.build_model("resnet18", 7, size, seed=0)
        assert model.input_shape == (None, size, size, 3) and model.output_shape == (None, 7)
    assert model(tf.zeros((2, 32, 32, 3))).shape == (2, 7)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = models.build_model("resnet18", 7, 32, seed=0)
        assert model.get_layer("layer1.0.conv1").compute_dtype == "bfloat16"
        assert model(tf.zeros((1, 32, 32, 3))).dtype == tf.float32
    finally:
        keras.mixed_precision.set_global_policy("float32")


def copy_torch_weights(torch_model: torch.nn.Module, model: keras.Model) -> None:
    """torchvision's tensors into the Keras model, by name: kernels HWIO, batch norm's four, the dense layer's."""
    state = {name: tensor.detach().numpy() for name, tensor in torch_model.state_dict().items()}
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            layer.set_weights([state[f"{layer.name}.weight"].transpose(2, 3, 1, 0)])
        elif isinstance(layer, keras.layers.BatchNormalization):
            layer.set_weights(
                [state[f"{layer.name}.{part}"] for part in ("weight", "bias", "running_mean", "running_var")]
            )
        elif isinstance(layer, keras.layers.Dense):
            layer.set_weights([state["fc.weight"].T, state["fc.bias"]])


@pytest.mark.parametrize("name, size, parameters", [("resnet18", 33, 11_689_512), ("resnet50", 38, 25_557_032)])
def test_the_parameters_are_torchvisions_and_with_its_weights_so_are_the_logits(name, size, parameters):
    """The same layers, padded the same way: the same trainable parameters (1000 classes) and, at odd and even
    sizes, the same feature maps and so the same logits."""
    torch.manual_seed(0)
    torch_model = torchvision.models.get_model(name, weights=None, num_classes=1000).eval()
    with torch.no_grad():  # batch-norm statistics other than 0 and 1, so that a wrong epsilon or order shows
        for module in torch_model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1), module.running_var.uniform_(0.5, 1.5)
    model = models.build_model(name, 1000, size, seed=0)
    assert trainable(model) == sum(p.numel() for p in torch_model.parameters() if p.requires_grad) == parameters
    copy_torch_weights(torch_model, model)
    images = np.random.default_rng(0).normal(size=(2, size, size, 3)).astype(np.float32)
    with torch.no_grad():
        expected = torch_model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
    np.testing.assert_allclose(model(images, training=False).numpy(), expected, rtol=1e-3, atol=1e-4)


def test_one_seed_gives_one_model_initialised_as_torchvisions():
    first, again, other = (models.build_model("resnet18", 10, 16, seed) for seed in (3, 3, 4))
    for a, b in zip(first.weights, again.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    kernel = first.get_layer("layer4.1.conv2").kernel.numpy()  # He-normal on fan_out: 3 x 3 x 512
    assert kernel.std() == pytest.approx(np.sqrt(2 / (9 * 512)), rel=0.02)
    assert not np.array_equal(kernel, other.get_layer("layer4.1.conv2").kernel.numpy())
    fc = first.get_layer("fc")
    assert np.abs(fc.kernel.numpy()).max() <= 1 / np.sqrt(512) and np.abs(fc.bias.numpy()).max() <= 1 / np.sqrt(512)
    assert np.abs(fc.bias.numpy()).max() > 0  # torch's nn.Linear draws its bias too
    bn = first.get_layer("bn1")
    assert (bn.momentum, bn.epsilon) == (0.9, 1e-5) and np.all(bn.gamma.numpy() == 1) and np.all(bn.beta.numpy() == 0)


def test_an_unknown_model_is_refused_with_the_known_names():
    with pytest.raises(UsageError, match="unknown model 'vit_b_16' .*pick one of resnet18, resnet34, resnet50"):
        models.build_model("vit_b_16", 10, 32, seed=0)
    models.check_model_name("resnet152")
