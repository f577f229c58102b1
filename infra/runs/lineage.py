"""Lineage: each run's receipt (what exactly it trained from and what it produced), the list of past runs under a
workdir, and what differed between two of them.

A run folder (<workdir>/runs/<run id>/) holds, beside run.json (infra/runs/record.py), attempts.json
(infra/runs/attempts.py) and the trainer's files (the model, metrics.json, logs/, checkpoints/):

    receipt.json   data set and its manifest hash (the staged version: a hash of every path and content), scripts
                   version, image digest, config hash, the run's inputs fingerprint (the key a re-run resumes
                   by), seed, world size, final parameter digest (the trainer's, of rank 0's parameters), and what
                   it cost over every attempt (the ledger's summary)
    config.json    the whole FlowConfig of the run (it holds no secret: the config refuses them)
    ledger.json    the cost ledger (infra/runs/ledger.py)
    README.md      what each file of the folder is (FILES)
"""

import json
from datetime import UTC, datetime
from pathlib import Path

from infra.core.errors import BadInput
from infra.core.jsonfiles import read_json, write_json
from infra.engines.script import SUMMARY
from infra.runs.attempts import ATTEMPTS, brief, read_attempts
from infra.runs.ledger import LEDGER, ledger_summary
from infra.runs.record import RECORD, RunSettings, fingerprint, standing
from nodelib.staged.names import MANIFEST  # a file server version's copy of its manifest
from trainer.model_files import IMAGENET, KERAS, MODEL_FILES, PYTORCH, framework_of

RECEIPT, CONFIG, GUIDE = "receipt.json", "config.json", "README.md"
MODEL = "the trained model (rank 0's parameters after the last step)"  # the framework names its file
FILES = {  # what the folder's README says of each file it holds, in this order
    "metrics.json": "the trainer's numbers: each epoch's loss, accuracy and images/s, the final ones, the wall time",
    "plot.svg": "loss, val top-1 and images/s per epoch (the run summary's plot in Prefect's UI)",
    LEDGER: "what the run cost: each step's seconds, node-seconds, GPU-hours and money, each attempt at training, "
    "the GPU-hours lost to attempts that did not complete",
    RECEIPT: "what was trained from what: data set and manifest hash, scripts version, image, config hash, seed, "
    "final parameter digest; and what it cost over every attempt",
    CONFIG: "the run's whole config",
    "logs": "each rank's output (rank0.log, rank1.log, ...) and the launcher's",
    "checkpoints": "the newest checkpoints: a re-run of an unfinished run resumes from them",
    RECORD: "the run's record: its inputs' fingerprint, its status, the flow runs that worked on it",
    ATTEMPTS: "each attempt at training: when it started, when it was last seen alive, how it ended",
    "bad-files.tsv": "the images left out because they cannot be decoded (path, reason)",
    "images-checked.json": "the preflight's check of every image, which the workers read instead of decoding",
    "script.json": "your script's run: its entry and arguments, how it ran, and the metrics read from its lines and "
    "TensorBoard files",
    "outputs": "what your script wrote to ${{output}} (TRAINFLOW_OUTPUT_DIR), also in Blob",
    "work": "your script's working folder: a copy of its scripts version, with what it wrote there",
    GUIDE: "this list",
}
METRICS_COMPARED = (
    "status",
    "model",
    "world_size",
    "backend",
    "device",
    "precision",
    "global_batch_size",
    "global_step",
    "final_val_top1",
    "final_val_top5",
    "images_per_sec",
    "wall_seconds",
    "resumed_from_steps",
    "parameters_in_sync",
)

# What `runs` and `runs diff` show of a user's script's run (script.json): what ran, from where, with which
# requirements, and the last value of each metric read from it.
SCRIPT_COMPARED = ("entry", "args", "source", "requirements", "launcher", "world_size", "wall_seconds", "final")


def manifest_hash(data: str) -> str | None:
    """The staged version's manifest hash of the folder training read (`v-<hash>` on the file server), None where
    it cannot be read here (synthetic data; a file server only the pool reaches)."""
    folder = Path(data)
    header = first_line(folder / MANIFEST)
    if header.get("version"):
        return header["version"]
    return folder.name[2:] if folder.name.startswith("v-") else None


def first_line(path: Path) -> dict:
    """The JSON object on a file's first line ({} when there is none)."""
    try:
        with open(path) as f:
            return json.loads(f.readline())
    except (OSError, ValueError):
        return {}


def make_receipt(
    cfg: RunSettings,
    run_id: str,
    inputs: str,
    scripts: str,
    data: str,
    image: str | None,
    metrics: dict,
    ledger: dict,
) -> dict:
    """A finished run's receipt: what it trained from, what it made, and what it cost (`ledger`, every attempt)."""
    return {
        "run_id": run_id,
        "dataset": cfg.dataset_name(),
        "data_manifest": manifest_hash(data),
        "data": data,
        "scripts": scripts,
        "image": image,
        "framework": cfg.training.framework,
        "config_hash": config_hash(cfg),
        "inputs": inputs,
        "seed": cfg.training.seed,
        "world_size": metrics.get("world_size"),
        "parameter_digest": metrics.get("parameter_digest"),
        "cost": ledger_summary(ledger),
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def config_hash(cfg: RunSettings) -> str:
    """A short hash of the whole config."""
    return fingerprint(cfg.model_dump(mode="json"))


def write_receipt(out: Path, cfg: RunSettings, receipt: dict) -> dict:
    """receipt.json and config.json in the run folder; the receipt."""
    write_json(out / CONFIG, cfg.model_dump(mode="json"))
    write_json(out / RECEIPT, receipt)
    return receipt


def write_guide(out: Path, model_file: str) -> None:
    """README.md in the run folder: what each of its files is (those it holds, in FILES' order; any other by name)."""
    known = {model_file: MODEL, **FILES}
    held = {p.name for p in out.iterdir()} | {GUIDE}
    lines = [f"# Run {out.name}", "", "What each file in this folder is:", ""]
    lines += [f"- `{name}`: {what}" for name, what in known.items() if name in held]
    lines += [f"- `{name}`" for name in sorted(held - set(known))]
    (out / GUIDE).write_text("\n".join(lines) + "\n")


def run_row(folder: Path) -> dict:
    """One past run as `trainflow runs` shows it: status, when, model, data, accuracy, time, cost over every
    attempt, receipt. A run with no ledger yet (running, or stopped) shows its status and attempts as they stand."""
    record, metrics, script = (
        read_json(folder / RECORD),
        read_json(folder / "metrics.json"),
        read_json(folder / SUMMARY),
    )
    receipt, cost = read_json(folder / RECEIPT), ledger_summary(read_json(folder / LEDGER))
    tries = cost.get("attempts") or [brief(a) for a in read_attempts(folder)]
    updated = datetime.fromtimestamp((folder / RECORD).stat().st_mtime)  # as it started, then as it ended
    damaged = damaged_files(folder)
    return {
        "run_id": folder.name,
        "status": standing(record) or metrics.get("status") or ("damaged" if damaged else "unknown"),
        "damaged": damaged,
        "updated": updated.isoformat(sep=" ", timespec="seconds"),
        "framework": receipt.get("framework") or metrics.get("framework"),
        "model": metrics.get("model") or script_label(script),
        "dataset": receipt.get("dataset"),
        "world_size": metrics.get("world_size") or script.get("world_size"),
        "val_top1": metrics.get("final_val_top1"),
        "seconds": metrics.get("wall_seconds") or script.get("wall_seconds"),
        "script": {key: script.get(key) for key in SCRIPT_COMPARED} if script else None,
        "training_seconds": cost.get("training_seconds", sum(t["seconds"] for t in tries) or None),
        "attempts": tries,
        "node_hours": cost.get("node_hours"),
        "gpu_hours": cost.get("gpu_hours"),
        "cost": cost.get("cost"),
        "currency": cost.get("currency"),
        "lost_gpu_hours": cost.get("lost_gpu_hours"),
        "receipt": receipt or None,
    }


def script_label(script: dict) -> str | None:
    """A user's script's run in the model column: its entry and arguments, marked as a script (None for none)."""
    if not script.get("entry"):
        return None
    return f"script: {' '.join([script['entry'], *script.get('args', [])])}"


def damaged_files(folder: Path) -> list[str]:
    """The run's records that are there but cannot be read as what they are (cut short, not JSON, not a mapping)."""
    damaged = []
    for name in (RECORD, "metrics.json", RECEIPT, LEDGER):
        path = folder / name
        if path.exists():
            try:
                readable = isinstance(json.loads(path.read_text()), dict)
            except (OSError, ValueError):
                readable = False
            damaged += [] if readable else [name]
    return damaged


def damage_line(row: dict, runs: Path) -> str:
    """What `trainflow runs` says of a run whose records are damaged, and the fix."""
    files = ", ".join(row["damaged"])
    return (
        f"run {row['run_id']}: {files} in {runs / row['run_id']} cannot be read; restore it from the run's copy on the "
        f"file share (results/{row['run_id']}/), or remove the run's folder"
    )


def list_runs(runs: Path) -> list[dict]:
    """Every run folder under `runs`, by when its record was last written (as the run ended, or began)."""
    folders = [f for f in runs.glob("*/") if (f / RECORD).exists()] if runs.exists() else []
    return [run_row(f) for f in sorted(folders, key=lambda f: ((f / RECORD).stat().st_mtime, f.name))]


class AmbiguousRun(BadInput):
    """A run-id prefix that begins more than one run."""


def find_run(runs: Path, given: str) -> Path:
    """The run folder a run id or an unambiguous prefix of one names; BadInput otherwise."""
    ids = sorted(f.name for f in runs.glob("*/") if (f / RECORD).exists()) if runs.exists() else []
    matches = [i for i in ids if i == given] or [i for i in ids if i.startswith(given)]
    if len(matches) == 1:
        return runs / matches[0]
    if matches:
        raise AmbiguousRun(f"run {given!r} is ambiguous: it begins {', '.join(matches)}; give more of the id")
    raise BadInput(f"no run {given!r} under {runs}; `trainflow runs --workdir {runs.parent}` lists the runs there")


def weights_file(given: str, runs: Path) -> str:
    """training.init_from as the trainer takes it: empty, imagenet, or a model file's absolute path (model_file)."""
    if not given or given == IMAGENET:
        return given
    fix = "pass a model file, a run id (`trainflow runs` lists them) or imagenet"
    return model_file(given, runs, "training.init_from", fix)


def model_file(given: str, runs: Path, option: str, fix: str) -> str:
    """The absolute path of the model file `given` names, else of the model of the run whose id, or a prefix of it,
    is given (`option` gave it: the error names it, and ends in `fix`)."""
    if "://" in given:
        raise BadInput(f"{option} {given!r} is a URL; trainflow reads local files: download it first (`curl -LO URL`)")
    path = Path(given).expanduser()
    if path.is_dir():  # a run's folder: its model
        folder = path
    elif path.exists() or path.suffix or len(path.parts) > 1:
        return str(path.resolve())
    else:
        folder = run_named(runs, given, option, fix)
    for name in MODEL_FILES.values():
        if (folder / name).is_file():
            return str((folder / name).resolve())
    raise BadInput(
        f"{folder} has no model file ({', '.join(sorted(set(MODEL_FILES.values())))}): it is not a finished run's "
        "folder; pass a finished run's id or folder, or a model file"
    )


def run_named(runs: Path, given: str, option: str, fix: str) -> Path:
    """The run folder of a run id or unambiguous prefix `given`; an ambiguous prefix is said so."""
    try:
        return find_run(runs, given)
    except AmbiguousRun as exc:
        raise BadInput(f"{option}: {exc}") from None
    except BadInput:
        raise BadInput(f"{option} {given!r} is neither a file nor a run under {runs}; {fix}") from None


def check_weights(given: str, framework: str) -> None:
    """Refuse, before anything starts, weights that a `framework` run cannot start from: a missing file, a Keras
    model for PyTorch (told from its zip's members; the TensorFlow and Keras trainers convert PyTorch's). The
    trainer's preflight checks the rest (a corrupt file, another architecture)."""
    if not given or given == IMAGENET:
        return
    path = Path(given)
    if not path.is_file():
        raise BadInput(f"training.init_from {given}: no such file; pass a model file, a run id or imagenet")
    kind, wanted = framework_of(path), PYTORCH if framework == PYTORCH else KERAS
    if kind == KERAS and wanted == PYTORCH:
        raise BadInput(
            f"training.init_from {given} is a {kind} model file ({MODEL_FILES[kind]}); a {framework} run starts "
            f"from a {MODEL_FILES[wanted]}: pass one, or train with --framework {kind}"
        )


def flat(values, prefix: str = "") -> dict:
    """Nested mappings as {"a.b": value}."""
    if not isinstance(values, dict):
        return {prefix: values}
    out = {}
    for key, value in values.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def compared(folder: Path) -> dict:
    """What `runs diff` compares of a run: its status, its receipt, its config and the metrics that sum it up."""
    metrics, script = read_json(folder / "metrics.json"), read_json(folder / SUMMARY)
    receipt = read_json(folder / RECEIPT)
    receipt.pop("cost", None)  # the ledger's summary: its totals are compared as ledger.*
    return {
        "run.status": read_json(folder / RECORD).get("status"),  # a killed run's other files may be missing
        **flat(receipt, "receipt"),
        **flat(read_json(folder / CONFIG), "config"),
        **flat({k: metrics.get(k) for k in METRICS_COMPARED if k in metrics}, "metrics"),
        **flat({k: script[k] for k in SCRIPT_COMPARED if k in script}, "script"),
        **flat(read_json(folder / LEDGER).get("total", {}), "ledger"),
    }


def diff_runs(a: Path, b: Path) -> list[dict]:
    """Every field of the two runs' receipts, configs, metrics and ledgers that differs: {field, a, b}."""
    left, right = compared(a), compared(b)
    return [
        {"field": key, "a": left.get(key), "b": right.get(key)}
        for key in sorted(set(left) | set(right))
        if left.get(key) != right.get(key) and key != "receipt.written"
    ]
