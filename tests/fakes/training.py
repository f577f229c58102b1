"""Training runs of the tests: a training on this machine's process pool as `trainflow train` runs it, and the
parameter digest each rank logged."""

import re
from pathlib import Path

from infra.compute.process import train_here
from nodelib.records import Progress, read_event


def digests(log_dir):
    """The final parameter digest each rank printed in its own log."""
    found = {}
    for rank in (0, 1):
        text = (log_dir / f"rank{rank}.log").read_text()
        found[rank] = re.search(r"final parameter digest (\w+)", text).group(1)
    return found


def train_locally(training, data: str, out: Path, echo) -> dict:
    """`training` on this machine's process pool, as `trainflow train` runs it; the run's metrics.json."""
    return train_here(training, data, out, out.parent / "pools", echo).to_json()


def progress_events(out: Path) -> list[Progress]:
    """The Progress events rank 0 wrote in the run's log (the latest attempt's)."""
    events = map(read_event, (out / "logs" / "rank0.log").read_text().splitlines())
    return [e for e in events if isinstance(e, Progress)]
