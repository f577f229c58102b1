"""PyTorch's weights files read without torch, into numpy arrays: the TensorFlow and Keras trainers fine-tune from a
PyTorch run's model.pt or torchvision's weights (their ResNets are torchvision's, layer for layer: tf/models.py), and
their image has no torch.

The format is torch.save's (torch/serialization.py, _save and _load): a zip whose `<name>/data.pkl` pickles the
object, each tensor as torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...) over a storage that the
pickle names by a persistent id ("storage", its type, its key, its location, its element count), the storage's bytes
being the member `<name>/data/<key>`, in the byte order of `<name>/byteorder`. Only the globals a weights file holds
are resolved (as torch.load's weights_only does): anything else in the pickle is refused, never run.
"""

import collections
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from nodelib.errors import UsageError

DTYPES = {  # torch's storage types and their numpy types (bfloat16 has none: such a file is refused)
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


def read_torch_file(path: Path, option: str) -> Any:
    """What torch.save wrote to `path`, each tensor as a numpy array; a file that is not one: one line."""
    try:
        with zipfile.ZipFile(path) as archive:
            [pickled] = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            prefix = pickled[: -len("data.pkl")]
            byteorder = (
                archive.read(prefix + "byteorder").decode() if prefix + "byteorder" in archive.namelist() else ""
            )
            if byteorder not in ("", "little"):
                raise ValueError(f"{byteorder}-endian tensors")
            with archive.open(pickled) as f:
                return WeightsUnpickler(f, archive, prefix).load()
    except (zipfile.BadZipFile, ValueError, KeyError, EOFError, pickle.UnpicklingError, TypeError) as exc:
        raise UsageError(
            f"{option} {path} cannot be read as PyTorch weights ({str(exc) or type(exc).__name__}); pass a model.pt "
            "of an earlier run or a torchvision weights file"
        ) from None


class WeightsUnpickler(pickle.Unpickler):
    """The unpickler of data.pkl: tensors made numpy arrays over the archive's storages, no other code resolved."""

    def __init__(self, file, archive: zipfile.ZipFile, prefix: str):
        super().__init__(file)
        self.archive, self.prefix = archive, prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return rebuild_tensor
        if (module, name) == ("torch._utils", "_rebuild_parameter"):
            return lambda data, requires_grad, hooks: data
        if module == "torch" and name in DTYPES:
            return name  # a storage type: persistent_load reads the storage by it
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a weights file")

    def persistent_load(self, pid: Any) -> np.ndarray:
        kind, storage_type, key, _, count = pid
        if kind != "storage" or storage_type not in DTYPES:
            raise pickle.UnpicklingError(f"a storage of type {storage_type} (not one numpy holds)")
        data = self.archive.read(f"{self.prefix}data/{key}")
        return np.frombuffer(data, dtype=np.dtype(DTYPES[storage_type]).newbyteorder("<"), count=count)


def rebuild_tensor(storage: np.ndarray, offset: int, size, stride, *_: Any) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2's tensor, as a numpy array (a copy, in native byte order)."""
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=tuple(size), strides=tuple(s * storage.itemsize for s in stride)
    )
    return np.array(view, dtype=view.dtype.newbyteorder("="))
