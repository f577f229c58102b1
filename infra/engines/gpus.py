"""The GPUs this machine's workers see, and `auto` for a count of workers: one per visible GPU, as torchrun's
`--nproc-per-node auto` and Lightning's `devices="auto"` count them, else one per usable core (torchrun's rule without
a GPU).

The GPUs are counted without CUDA: CUDA_VISIBLE_DEVICES where it is set (the devices it lists: "" and "-1" hide them
all), else the NVIDIA driver's folder per GPU, /proc/driver/nvidia/gpus/<bus id> (none without the driver)."""

import os
from collections.abc import Mapping
from pathlib import Path

from nodelib.cores import usable_cores

AUTO = "auto"
DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")


def visible_gpus(environ: Mapping[str, str] = os.environ, driver: Path | None = None) -> int:
    """The GPUs a worker started here could use."""
    driver = driver or DRIVER_GPUS
    installed = len(list(driver.iterdir())) if driver.is_dir() else 0
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return installed
    devices = []
    for device in (d.strip() for d in listed.split(",")):
        if not device or device.startswith("-"):
            break  # CUDA stops at the first invalid entry
        devices.append(device)
    return min(len(devices), installed) if installed else 0


def auto_count(value: object, environ: Mapping[str, str] = os.environ, driver: Path | None = None) -> object:
    """`auto` as a count of workers (one per visible GPU, else per usable core); any other value as it is."""
    if value == AUTO:
        return visible_gpus(environ, driver) or usable_cores()
    if isinstance(value, str) and not value.strip().isdigit():
        raise ValueError(f"{value!r} is not a count: give a whole number of at least 1, or auto (one per GPU)")
    return value


def shared_gpu(workers: int, device: str, environ: Mapping[str, str] = os.environ, driver: Path | None = None) -> str:
    """Why `workers` ranks on this machine cannot train on its GPUs (more ranks than GPUs: two on one GPU, which
    NCCL refuses), naming the fix; "" when they can, or when they do not use a GPU."""
    gpus = visible_gpus(environ, driver)
    if device == "cpu" or not gpus or workers <= gpus:
        return ""
    return (
        f"training.workers is {workers} but this machine has {gpus} visible GPU(s): two ranks would share one "
        f"GPU, which NCCL refuses; set training.workers to {gpus} (or auto: one per GPU), or training.device: cpu"
    )
