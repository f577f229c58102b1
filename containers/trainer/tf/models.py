"""The ResNets of torchvision's names, built in Keras (tf_keras): the same architectures, layer for layer.

Each is torchvision's model of that name (ResNet v1.5, as torchvision's): a 7x7/2 stem convolution without bias, batch
norm, ReLU, a 3x3/2 max pool; BasicBlocks (resnet18, resnet34) or Bottlenecks with the stride on their 3x3
convolution (resnet50 and up); a 1x1 convolution and batch norm where a block changes the shape of its input; global
average pooling and a dense layer with bias. Explicit ZeroPadding2D layers pad as torch's `padding=` does, so every
feature map has torchvision's size at any image size, odd or even, and the trainable parameters are torchvision's
exactly. Input: NHWC float images, (image_size, image_size, 3); output: float32 logits, also under a mixed-precision
policy (the last dense layer computes in float32).

Initialised as torchvision initialises them: convolutions He-normal on fan_out, batch norm gamma 1 and beta 0 (its
momentum 0.9 is torch's 0.1: Keras weighs the old average, torch the new batch), the dense layer uniform within
+-1/sqrt(fan_in) (weights and bias, torch's nn.Linear default). Each layer's initialiser has its own seed, drawn from
`seed`: one seed, one model, whatever the global random state. Layers are named as torchvision's modules
(layer1.0.conv1, layer2.0.downsample.0, fc), so a weight's name says which of torchvision's tensors it is.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tf_keras as keras

from nodelib.errors import UsageError
from trainer.model_files import (
    IMAGENET,
    KERAS,
    PYTORCH,
    arch_named_by,
    check_model_file,
    framework_of,
    imagenet_file,
    read_about,
    weights_in,
)
from trainer.tf.options import MODEL_NAMES, check_model_name
from trainer.torch_files import read_torch_file

layers = keras.layers

BN_MOMENTUM, BN_EPSILON = 0.9, 1e-5  # torch's BatchNorm2d defaults (momentum 0.1 in torch's sense)


@dataclass(frozen=True)
class ResNet:
    """One of torchvision's ResNets: its block, the blocks of each of its 4 stages, and the 3x3 convolutions' width
    per 64 channels (2x in the wide ones)."""

    block: str  # "basic" (2 convolutions 3x3) or "bottleneck" (1x1, 3x3, 1x1 x4 channels)
    stages: tuple[int, int, int, int]
    width: int = 64


MODELS = {
    "resnet18": ResNet("basic", (2, 2, 2, 2)),
    "resnet34": ResNet("basic", (3, 4, 6, 3)),
    "resnet50": ResNet("bottleneck", (3, 4, 6, 3)),
    "resnet101": ResNet("bottleneck", (3, 4, 23, 3)),
    "resnet152": ResNet("bottleneck", (3, 8, 36, 3)),
    "wide_resnet50_2": ResNet("bottleneck", (3, 4, 6, 3), width=128),
    "wide_resnet101_2": ResNet("bottleneck", (3, 4, 23, 3), width=128),
}
EXPANSION = {"basic": 1, "bottleneck": 4}  # output channels of a block per `planes`


def build_model(name: str, num_classes: int, image_size: int, seed: int) -> keras.Model:
    """A freshly initialised ResNet `name` with `num_classes` outputs for (image_size, image_size, 3) images."""
    check_model_name(name)
    if num_classes < 1 or image_size < 1:
        raise UsageError(
            f"a model needs 1 class and 1 pixel at least (got {num_classes} classes, --image-size {image_size})"
        )
    spec, seeds = MODELS[name], Seeds(seed)
    inputs = keras.Input((image_size, image_size, 3), name="images")
    x = layers.ZeroPadding2D(3, name="conv1.pad")(inputs)
    x = conv(64, 7, 2, "conv1", seeds)(x)
    x = layers.ReLU(name="relu")(norm("bn1")(x))
    x = layers.ZeroPadding2D(1, name="maxpool.pad")(x)  # zeros pad as torch's -inf would: after a ReLU none is below
    x = layers.MaxPool2D(3, 2, name="maxpool")(x)
    channels = 64
    for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), spec.stages), start=1):
        for i in range(blocks):
            stride = 2 if stage > 1 and i == 0 else 1
            x = block(spec, x, channels, planes, stride, f"layer{stage}.{i}", seeds)
            channels = planes * EXPANSION[spec.block]
    x = layers.GlobalAveragePooling2D(name="avgpool")(x)
    return keras.Model(inputs, dense(num_classes, channels, seeds)(x), name=name)


def block(spec: ResNet, x, channels: int, planes: int, stride: int, name: str, seeds: "Seeds"):
    """One residual block (`channels` in, planes x expansion out), its shortcut a 1x1 convolution where it changes
    the shape."""
    out = (basic if spec.block == "basic" else bottleneck)(x, planes, stride, spec.width, name, seeds)
    shortcut = x
    if stride != 1 or channels != planes * EXPANSION[spec.block]:
        shortcut = conv(planes * EXPANSION[spec.block], 1, stride, f"{name}.downsample.0", seeds)(x)
        shortcut = norm(f"{name}.downsample.1")(shortcut)
    return layers.ReLU(name=f"{name}.relu")(layers.Add(name=f"{name}.add")([out, shortcut]))


def basic(x, planes: int, stride: int, width: int, name: str, seeds: "Seeds"):
    """torchvision's BasicBlock without its shortcut: 3x3 (with the stride), batch norm, ReLU, 3x3, batch norm."""
    x = conv(planes, 3, stride, f"{name}.conv1", seeds)(layers.ZeroPadding2D(1, name=f"{name}.conv1.pad")(x))
    x = layers.ReLU(name=f"{name}.relu1")(norm(f"{name}.bn1")(x))
    x = conv(planes, 3, 1, f"{name}.conv2", seeds)(layers.ZeroPadding2D(1, name=f"{name}.conv2.pad")(x))
    return norm(f"{name}.bn2")(x)


def bottleneck(x, planes: int, stride: int, width: int, name: str, seeds: "Seeds"):
    """torchvision's Bottleneck (v1.5: the stride on the 3x3) without its shortcut: 1x1, 3x3, 1x1 to planes x 4."""
    inner = planes * width // 64
    x = layers.ReLU(name=f"{name}.relu1")(norm(f"{name}.bn1")(conv(inner, 1, 1, f"{name}.conv1", seeds)(x)))
    x = conv(inner, 3, stride, f"{name}.conv2", seeds)(layers.ZeroPadding2D(1, name=f"{name}.conv2.pad")(x))
    x = layers.ReLU(name=f"{name}.relu2")(norm(f"{name}.bn2")(x))
    return norm(f"{name}.bn3")(conv(planes * 4, 1, 1, f"{name}.conv3", seeds)(x))


def conv(filters: int, kernel: int, stride: int, name: str, seeds: "Seeds") -> Any:
    """A convolution without bias or padding of its own (a ZeroPadding2D before it pads as torch does), He-normal
    on fan_out as torchvision's kaiming_normal_(mode="fan_out", nonlinearity="relu")."""
    init = keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal", seed=seeds.next())
    return layers.Conv2D(filters, kernel, strides=stride, use_bias=False, kernel_initializer=init, name=name)


def norm(name: str) -> Any:
    """Batch norm over the channels (NHWC), with torch's momentum and epsilon; gamma 1, beta 0."""
    return layers.BatchNormalization(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, name=name)


def dense(num_classes: int, fan_in: int, seeds: "Seeds") -> Any:
    """The classifier, in float32 whatever the policy (logits, and the loss after them, keep their precision);
    weights and bias uniform within +-1/sqrt(fan_in), as torch's nn.Linear initialises them."""
    bound = 1 / math.sqrt(fan_in)
    return layers.Dense(
        num_classes,
        kernel_initializer=keras.initializers.VarianceScaling(1 / 3, "fan_in", "uniform", seed=seeds.next()),
        bias_initializer=keras.initializers.RandomUniform(-bound, bound, seed=seeds.next()),
        dtype="float32",
        name="fc",
    )


class Seeds:
    """The initialisers' seeds of one model: the n-th drawn from (seed, n), a different one for each layer."""

    def __init__(self, seed: int):
        self.seed, self.drawn = seed % 2**64, 0

    def next(self) -> int:
        self.drawn += 1
        return int(np.random.SeedSequence([self.seed, self.drawn]).generate_state(1)[0] >> 1)  # below 2**31


def start_from(model: keras.Model, source: str, arch: str, classes: list[str]) -> dict:
    """Load the weights --init-from names into `model` (a fresh `arch` for `classes`), layer by layer by name: a
    model.keras's layers, or PyTorch's tensors converted (a PyTorch run's model.pt, torchvision's weights file or
    imagenet: the layers are named as torchvision's modules). Every layer whose weights fit is loaded; the classifier
    (fc) is new unless trained on these very classes. What was loaded, for the log and metrics.json; another
    architecture: one line naming both."""
    path = imagenet_file(arch) if source == IMAGENET else Path(source)
    check_model_file(path, "--init-from")
    if framework_of(path) == PYTORCH:
        their_arch, their_classes, weights_of = torch_layers(path)
    else:
        theirs, about = read_keras_model(source)
        their_arch, their_classes = about.get("arch") or theirs.name, about.get("classes")
        by_name = {layer.name: layer for layer in theirs.layers}
        weights_of = lambda layer: by_name[layer.name].get_weights() if layer.name in by_name else None  # noqa: E731
    shown = f"imagenet ({path.name})" if source == IMAGENET else source
    if their_arch and their_arch != arch:
        raise UsageError(
            f"--init-from {shown} holds a {their_arch} model, and this run trains {arch}: pass --model {their_arch}, "
            f"or weights of a {arch}"
        )
    loaded, new = load_layers(model, weights_of, their_classes == classes)
    if set(new) - {"fc/kernel:0", "fc/bias:0"}:
        raise UsageError(
            f"--init-from {shown} holds weights of another architecture than {arch} (its {new[0]} does not fit); "
            f"pass weights of a {arch}, or the --model they were trained as"
        )
    return {"source": shown, "loaded": loaded, "tensors": loaded + len(new), "new": new}


def load_layers(model: keras.Model, weights_of: Callable, same_classes: bool) -> tuple[int, list[str]]:
    """Set each layer's weights to `weights_of(layer)` where they fit (the classifier only for the same classes):
    (how many weights were loaded, the names of those left new)."""
    loaded, new = 0, []
    for layer in (layer for layer in model.layers if layer.weights):
        values = weights_of(layer)
        fits = values is not None and [np.shape(v) for v in values] == [tuple(w.shape) for w in layer.weights]
        if fits and (layer.name != "fc" or same_classes):
            layer.set_weights(values)
            loaded += len(layer.weights)
        else:
            new += [w.name for w in layer.weights]
    return loaded, new


def torch_layers(path: Path) -> tuple[str | None, list[str] | None, Callable]:
    """A PyTorch weights file's architecture (what a run's model.pt says, or a torchvision file's name), its classes
    and the function that gives a layer its weights, converted from torchvision's tensors of the same name."""
    content = read_torch_file(path, "--init-from")
    instead = "pass a model.pt of an earlier run or a torchvision weights file"
    weights = weights_in(content, path, lambda v: isinstance(v, np.ndarray), "--init-from", instead)
    arch = weights.arch or arch_named_by(path, MODEL_NAMES)
    return arch, weights.classes, lambda layer: torch_weights_of(layer, weights.tensors)


def torch_weights_of(layer, tensors: dict) -> list | None:
    """`layer`'s weights in Keras's layout from torchvision's tensors of its name: a convolution's (out, in, h, w)
    as (h, w, in, out); batch norm's weight, bias, running mean and variance as gamma, beta and the moving ones; the
    dense layer's (out, in) transposed. None where a tensor is missing."""
    names = {
        layers.Conv2D: ["weight"],
        layers.BatchNormalization: ["weight", "bias", "running_mean", "running_var"],
        layers.Dense: ["weight", "bias"],
    }.get(type(layer), [])
    values = [v for v in (tensors.get(f"{layer.name}.{n}") for n in names) if v is not None]
    if not names or len(values) < len(names):
        return None
    if isinstance(layer, layers.Conv2D):
        return [values[0].transpose(2, 3, 1, 0)]
    return [values[0].T, values[1]] if isinstance(layer, layers.Dense) else values


def read_keras_model(source: str, option: str = "--init-from") -> tuple[keras.Model, dict]:
    """The Keras model in the file `source` (not compiled: its weights are what is wanted) and what its run
    recorded of it; anything else: one line naming what it is and what to pass (`option`: the option that named it,
    --init-from or `trainflow predict`'s --model)."""
    path = Path(source)
    check_model_file(path, option)
    if (kind := framework_of(path)) != KERAS:
        what = "a PyTorch model" if kind == PYTORCH else "not a Keras model"
        raise UsageError(
            f"{option} {path} is {what}: the TensorFlow and Keras trainers start from a model.keras of an earlier "
            "run; pass one, or train with --framework pytorch"
        )
    try:
        return keras.models.load_model(path, compile=False), read_about(path)
    except (ValueError, OSError, KeyError, TypeError) as exc:
        lines = str(exc).strip().splitlines()
        raise UsageError(
            f"{option} {path} cannot be read as a Keras model ({lines[0] if lines else type(exc).__name__}); "
            "pass a model.keras of an earlier run"
        ) from None
