"""This process's memory as Linux counts it, read from /proc/self/status (no torch import: the bench's staging
processes use it too, and importing torch would be most of what they measure).

Not getrusage's ru_maxrss: Linux carries the peak of the process that started this one across exec (a launcher
or a bench holding a million paths), which would be counted as this process's own.
"""

import resource
from pathlib import Path


def status_mb(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS: resident now, VmHWM: peak resident) in MiB."""
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:  # no procfs (macOS): the rusage peak, which may include the parent's
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return int(next(line.split()[1] for line in lines if line.startswith(f"{field}:"))) / 1024


def resident_mb() -> float:
    """This process's resident set now, in MiB."""
    return status_mb("VmRSS")


def peak_resident_mb() -> float:
    """This process's own peak resident set (VmHWM), in MiB."""
    return status_mb("VmHWM")
