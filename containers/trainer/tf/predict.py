"""`trainflow predict` with a TensorFlow or Keras run's model.keras: the model its run trained, evaluated as its
validation was.

Each image goes through the validation pipeline's own steps (data.val_image: TensorFlow's decoder for JPEG, PNG and
GIF, PIL's for the rest, the shorter side resized to image_size/0.875, the centre crop, normalised), at the size of
the model's input; a batch at a time through the model, on the GPU where TensorFlow finds one. The class names are
those its run recorded in the file (model_files.read_about); a model.keras made elsewhere has none, and its classes
are named by their labels (0, 1, ...). predictions.py does the rest. Imports no torch.
"""

from pathlib import Path

import numpy as np
import tensorflow as tf

from nodelib.errors import UsageError
from trainer.tf.data import bad_image, val_image
from trainer.tf.models import read_keras_model

OPTION = "--model"  # the option of `trainflow predict` that names the model file, in every refusal


class KerasClassifier:
    """A run's Keras model with its class names and evaluation transform (a predictions.Classifier)."""

    def __init__(self, path: Path):
        self.model, about = read_keras_model(str(path), OPTION)
        size = input_size(self.model, path)
        self.classes = about.get("classes") or [str(label) for label in range(self.model.output_shape[-1])]
        # one graph for every image (eager ops, one at a time, would cost more than the decode)
        self.transform = tf.function(
            lambda image: val_image(image, size), input_signature=[tf.TensorSpec([], tf.string)]
        )

    def prepare(self, path: str) -> np.ndarray:
        """The image at `path` as the run's validation saw it: normalised float32 HWC."""
        try:
            return self.transform(tf.constant(path)).numpy()
        except (tf.errors.OpError, UnicodeDecodeError):  # the latter: an error message quoting the file's bytes
            raise bad_image(path) from None

    def probabilities(self, images: list) -> np.ndarray:
        """The class probabilities of a batch of prepared images (softmax of the model's float32 logits)."""
        return tf.nn.softmax(self.model(np.stack(images), training=False)).numpy()


def input_size(model, path: Path) -> int:
    """The side of the square images the model takes (its input is (None, size, size, 3), as tf/models.py builds
    it); a model of another input: one line."""
    shape = tuple(model.input_shape)
    if len(shape) != 4 or shape[3] != 3 or not isinstance(shape[1], int) or shape[1] != shape[2]:
        raise UsageError(
            f"{OPTION} {path} takes input of shape {shape}, not square RGB images; pass the model.keras of a "
            "trainflow run"
        )
    return shape[1]
