"""Run records: which training run a run folder holds, who runs it, how it ended, and which run a re-run resumes.

Each run folder (<workdir>/runs/<run id>/) holds run.json: the inputs' fingerprint (training settings, pool,
data set version, scripts version), the owning process, the flow runs that worked on it and the status: running,
complete, failed or interrupted. A run whose owner is gone while it says running was killed outright: the next run
marks it interrupted. A run started with the same inputs as an interrupted or failed one takes over its folder and its
run id, so the trainer resumes from the newest checkpoint there (on Azure ML too: its jobs write
runs/<run id>/ in Blob storage) instead of starting again from step 0.
"""

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from infra.compute.base import PoolSection, RunConfig, owner, owner_alive
from infra.core.jsonfiles import read_json, write_json
from infra.core.stopping import failed

RECORD = "run.json"
UNFINISHED = ("interrupted", "failed")


class RunSettings(RunConfig[PoolSection], Protocol):
    """What a run's bookkeeping reads of its config besides the backends' part (flows/config.py's FlowConfig has
    it all; infra does not import flows)."""

    def dataset_name(self) -> str: ...

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]: ...


def fingerprint(*inputs) -> str:
    """A short hash of a run's inputs (anything JSON can write)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def settings_fingerprint(cfg: RunSettings, *more) -> str:
    """The one fingerprint of a run's settings: what it trains (training), where (pool), for how long (job) and on
    which data set, then `more`. A re-run resumes an unfinished run with the same settings, data set version and
    scripts version (`run_inputs`); the ledger expects runs with the same settings and billing to take as long
    (`ledger.estimate_key`)."""
    return fingerprint(
        cfg.training.model_dump(), cfg.pool.model_dump(), cfg.job.model_dump(), cfg.dataset_name(), *more
    )


def run_inputs(cfg: RunSettings, scripts: str, data: Path) -> str:
    """The fingerprint of what a run trains: its settings, data set version and scripts version (and how a user's
    script is called: its entry, arguments and variables)."""
    return settings_fingerprint(cfg, str(data), scripts, *script_section(cfg))


def script_section(cfg: RunSettings) -> list[dict]:
    """The script section of a run that runs a user's script, as one item; none for trainflow's trainer (whose
    fingerprints stay as they were)."""
    script = cfg.model_dump(mode="json").get("script")
    return [script] if script else []


def input_values(cfg: RunSettings, scripts: str, data: Path) -> dict:
    """What run_inputs fingerprints, by name: kept in the record, so that a re-run that cannot resume says why."""
    return {
        "training": cfg.training.model_dump(mode="json"),
        "pool": cfg.pool.model_dump(mode="json"),
        "job": cfg.job.model_dump(mode="json"),
        "dataset": cfg.dataset_name(),
        "data version": str(data),
        "scripts version": scripts,
        **dict(zip(["script"], script_section(cfg))),
    }


def flattened(values: dict, prefix: str = "") -> dict:
    """Nested settings as {"training.epochs": 8, ...}."""
    flat: dict = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat |= flattened(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def not_resumed(root: Path, inputs: str, values: dict) -> str | None:
    """Why a run with these inputs does not resume the newest unfinished run (what changed, from what to what), or
    None when it resumes one or none is unfinished. Runs recorded before their values were kept say nothing."""
    return None if resumable(root, inputs) else changed_since_unfinished(root, values)


def changed_since_unfinished(root: Path, values: dict) -> str | None:
    """not_resumed's line for a run that resumes none: what changed since the newest unfinished run, if any."""
    records = [read_record(f) for f in root.glob("*/")] if root.exists() else []
    unfinished = [r for r in records if r.get("status") in UNFINISHED and isinstance(r.get("inputs"), dict)]
    if not unfinished:
        return None
    last = max(unfinished, key=lambda r: (root / r["run_id"] / RECORD).stat().st_mtime)
    old, new = flattened(last["inputs"]), flattened(values)
    changed = [
        f"{key} from {old.get(key)!r} to {new.get(key)!r}" for key in sorted(old | new) if old.get(key) != new.get(key)
    ]
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return (
        f"not resuming the {last['status']} run {last['run_id']}: {', '.join(changed[:3])}{more} changed; this is a "
        "new run (set them back to resume it)"
    )


def read_record(folder: Path) -> dict:
    """A run folder's record ({} when it has none or it cannot be read)."""
    return read_json(folder / RECORD)


def write_record(folder: Path, record: dict) -> None:
    """Replace a run folder's record in one step (a reader never sees half of it); an unfinished run's metrics.json
    that still says running says so too, so that no file in the folder looks alive."""
    write_json(folder / RECORD, record)
    metrics = read_json(folder / "metrics.json")
    if record["status"] in UNFINISHED and metrics.get("status") == "running":
        write_json(folder / "metrics.json", {**metrics, "status": record["status"]})


def standing(record: dict) -> str | None:
    """A record's status as it stands: one that says running but whose owner is gone was interrupted (killed
    outright, before it could say so)."""
    status = record.get("status")
    return "interrupted" if status == "running" and not owner_alive(record.get("owner", "")) else status


def mark_stale(root: Path) -> list[str]:
    """Mark runs that say running but whose owner is gone as interrupted; their ids."""
    stale = []
    for folder in sorted(root.glob("*/")) if root.exists() else []:
        record = read_record(folder)
        if record.get("status") != standing(record):
            write_record(folder, {**record, "status": "interrupted"})
            stale.append(folder.name)
    return stale


def resumable(root: Path, inputs: str) -> str | None:
    """The newest unfinished run (interrupted or failed) with these inputs, if any: the run a re-run resumes."""
    records = {folder: read_record(folder) for folder in root.glob("*/")} if root.exists() else {}
    folders = [
        f for f, record in records.items() if record.get("fingerprint") == inputs and record.get("status") in UNFINISHED
    ]
    return max(folders, key=lambda f: (f / RECORD).stat().st_mtime).name if folders else None


@contextmanager
def tracked_run(
    root: Path, flow_run: str, inputs: str, values: dict | None = None, say: Callable[[str], None] = print
) -> Iterator[tuple[str, bool]]:
    """Record the run under `root` for the block: yields (run id, resumed), the id being that of the unfinished
    run with the same inputs when there is one, else `flow_run`'s; the record says how the block ended, and lists
    every flow run that worked on the run (the ledger counts their steps)."""
    mark_stale(root)  # a killed run's record says running: interrupted from here on
    previous = resumable(root, inputs)
    if previous is None and values is not None and (why := changed_since_unfinished(root, values)):
        say(why)
    run_id = previous or flow_run
    earlier = read_record(root / run_id)
    record = {
        **earlier,
        "run_id": run_id,
        "fingerprint": inputs,
        **({"inputs": values} if values is not None else {}),
        "owner": owner(),
        "status": "running",
        "flow_runs": [*earlier.get("flow_runs", []), flow_run],
    }
    write_record(root / run_id, record)
    status = "failed"
    try:
        yield run_id, previous is not None
        status = "complete"
    except BaseException as exc:
        status = "failed" if failed(exc) else "interrupted"
        raise
    finally:
        write_record(root / run_id, {**record, "status": status})
