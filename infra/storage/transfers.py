"""Transfers and step plans: progress bars (files, bytes, throughput), parallel workers, and the summary of what
moved and what was skipped."""

import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn
from rich.table import Table


@dataclass
class Transfer:
    """What one step moved and skipped."""

    step: str
    files: int = 0
    bytes: int = 0
    skipped_files: int = 0
    skipped_bytes: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    plan: dict = field(default_factory=dict)  # the step's decision (step_plan), recorded beside what it moved
    phases: dict[str, float] = field(default_factory=dict)  # seconds of each phase, as `timed` records them

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the block's wall time to `phase`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[phase] = self.phases.get(phase, 0.0) + time.perf_counter() - started

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def row(self) -> dict:
        """The summary as a flat dict (for tables, artifacts and JSON)."""
        return {
            "step": self.step,
            "files": self.files,
            "MB": round(self.bytes / 1e6, 2),
            "seconds": round(self.seconds, 2),
            "MB/s": round(self.mb_per_s, 1),
            "skipped files": self.skipped_files,
            "skipped MB": round(self.skipped_bytes / 1e6, 2),
        }


def step_plan(step: str, action: str, detail: str, **facts) -> dict:
    """A step's decision (action run or skip, and why), as the dry run prints it and the step records it;
    `facts` are what the decision rests on (a version, counts), for the step's own use."""
    return {"step": step, "action": action, "detail": detail, **facts}


@contextmanager
def transfer_progress(transfer: Transfer, total_bytes: int, total_files: int) -> Iterator[Callable[[int, int], None]]:
    """A progress bar for one transfer; yields advance(bytes, files); times the transfer."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[files]}/{task.fields[total_files]} files"),
        TimeElapsedColumn(),
    )
    started = time.perf_counter()
    with Progress(*columns, transient=False) as progress:
        bar = progress.add_task(transfer.step, total=total_bytes, files=0, total_files=total_files)

        lock = threading.Lock()  # called from the transfer's worker threads

        def advance(nbytes: int, nfiles: int) -> None:
            with lock:
                transfer.bytes += nbytes
                transfer.files += nfiles
                progress.update(bar, advance=nbytes, files=transfer.files)

        yield advance
    transfer.seconds = time.perf_counter() - started


V = TypeVar("V")


def in_parallel(items: dict[str, V], work: Callable[[str, V, Path], None], tmp_root: Path, workers: int) -> None:
    """Call work(key, value, tmp) for each item, `workers` at a time, each in a temporary folder of its own."""
    tmp_root.mkdir(parents=True, exist_ok=True)

    def one(item: tuple[str, V]) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_root) as tmp:
            work(item[0], item[1], Path(tmp))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, items.items()))


def print_summary_table(rows: list[dict], console: Console | None = None, title: str = "staging summary") -> None:
    """One table of rows (by default `Transfer.row()`s: files, bytes, seconds, MB/s and what was skipped, per step)."""
    table = Table(title=title)
    for column in rows[0]:
        table.add_column(column, justify="left" if column in ("step", "detail", "did", "why") else "right")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    (console or Console()).print(table)
