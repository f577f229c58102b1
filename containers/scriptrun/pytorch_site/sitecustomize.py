"""Hides TensorFlow from a PyTorch script, where one Python environment has both (the process pool's venv with its
TensorFlow layer): there `import tensorflow` before `import torchvision` kills the process (a segfault, exit 139), and
`from torch.utils.tensorboard import SummaryWriter` imports TensorFlow whenever it is installed (TensorBoard's
compatibility layer falls back to its own stub without it). The PyTorch images have no TensorFlow; this makes the
process pool the same. scriptrun/rank.py puts this folder first on a PyTorch script's PYTHONPATH.

A module that is None in sys.modules is one Python says is not there: `import tensorflow` raises ModuleNotFoundError
and importlib.util.find_spec (how torch and TensorBoard ask) returns None."""

import sys

HIDDEN = ("tensorflow", "tf_keras", "tensorflow_io", "tensorflow_estimator")

for name in HIDDEN:
    sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: "not installed", as the import system reads it
