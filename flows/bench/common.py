"""What every benchmark shares: fresh outputs, timing, counting, quiet logs, the JSON file."""

import json
import time
from pathlib import Path


def clear_checkpoints(out: Path) -> None:
    """A benchmark run starts fresh: an earlier run's checkpoints would be resumed otherwise."""
    for path in (out / "checkpoints").glob("*.pt"):
        path.unlink()


def time_call(fn) -> float:
    """Seconds that fn() takes."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def count_files(folder: Path) -> tuple[int, int]:
    """Files under a folder and their total size."""
    sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file()]
    return len(sizes), sum(sizes)


def log_quietly(line: str) -> None:
    """Build output: only the step headers and the push's layer lines, so progress stays readable."""
    if line.startswith(("Step ", "pushing", "pushed", "building")):
        print(line, flush=True)


def write_json(result: dict, json_out: Path | None) -> None:
    """The figures as JSON, when asked for."""
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
