"""The device check: what a lent GPU machine measures in under 8 minutes all told, ready to run there.

    python -m benchmarks.device_check --out DIR          (or: make device-check DEVICE_CHECK_OUT=DIR)

run from the checkout's root. Such a machine has no network and no project venv: only its own Python, torch,
torchvision, Pillow and numpy, and the checkout's files. So this command imports nothing else (no Prefect, typer,
rich, pydantic, yaml, Azure, Docker or MLflow; tests/integration/benchmarks/test_device_check.py runs it with those
blocked) and runs the trainer alone, as `python containers/trainer/train.py`, one process on GPU 0. In order:

  1. the facts: GPU, driver (nvidia-smi), CUDA, the versions, and whether the fast loader decodes only the crop
     (jpeg_crop.c needs cc and libjpeg's headers; without them it decodes whole images, and the JSON says so);
  2. 10,240 photo-like JPEGs of ImageNet's sizes written by every core (infra/data/photos.py), and their copy
     shrunk to a 500 px longer side (infra/data/shrink.py), both timed;
  3. `--loader gpu`'s stages, each alone, through the loader's own functions: a worker's reading, drawing and
     packing of a batch on one core, torchvision's batched nvJPEG decode, and the kernel that crops, resizes and
     flips the batch (ms a batch and images/s of each);
  4. ResNet-50 bf16 channels-last training runs (gpu_plan.device_check_runs): synthetic data compiled, the JPEGs
     through `--loader gpu` and `--loader fast`, the shrunk copy through `--loader fast`, the JPEGs through
     `--loader dali` where DALI is installed, then the model-step variants (torch.compile's modes, the fused
     optimizer) while time is left, each with the loader workers the trainer picks (--loader-workers auto). Each
     run's steady images/s, data-wait share, loader workers and share of batches decoded at once (from the
     trainer's metrics.json) and MFU. A run is stopped at its own budget (Run.budget_s) and started
     only if that budget fits in what is left of the check's (--budget, 480 s): the check never runs past it. A run
     whose option this trainer lacks is skipped, and the JSON says which option.

DIR/device-check.json is written again after every step, so a check cut short keeps what it measured; DIR/runs/RUN/
keeps each run's log and metrics.json. The JPEGs and the trainer's results (checkpoints) go to --work (default: a
folder in the temporary folder, kept, so a second check on the same machine reuses the JPEGs), never into DIR.

Without a CUDA GPU (this machine, CI) it checks what it can and says that it measured nothing on a GPU: the imports,
the trainer's options for every run, a few JPEGs written, shrunk and decoded on the CPU, and a toy training of the
GPU loader on the CPU through the trainer. Exit status: 0 when every step ran (or was skipped for a reason given),
1 when a step failed, 2 when there is no CUDA GPU.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__":  # the command, where nothing installs the trainer: the checkout's own
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "containers"))

from benchmarks.gpu_plan import (
    JPEGS,
    MARKED,
    PHOTOS,
    SHRUNK,
    SYNTHETIC,
    TRAINER_DEFAULTS,
    Run,
    device_check_runs,
    gpu_facts,
    loader_stages,
    mfu,
    peak_tflops,
    photo_folders,
    software_facts,
    trainer_argv,
    trainer_lacks,
    write_marked_copy,
    write_photo_set,
    write_shrunk_copy,
)
from nodelib.cores import usable_cores

BUDGET_S = 480  # 8 minutes, all told: the steps and every run at its worst (a device session is 15)
MARGIN_S = 15  # kept back from the budget: starting Python and torch, the last JSON, the runs' processes ending
PHOTOS_PER_CORE_S = 40  # photo-sized JPEGs written per second per core (42 measured on a 2-core machine, 2026-11-27)
SHRINKS_PER_CORE_S = 300  # files mirrored per second per core (930 measured there: most are linked, not shrunk)
MARKS_PER_CORE_S = 40  # JPEGs rewritten with restart markers per second per core (52 measured on one core here,
# beside a test suite, 2026-12-07: a lossless rewrite and two decodes to compare)
STAGES_S = 8  # seconds of the GPU loader's stages measured
STAGES_BUDGET_S = 25  # with the warm-up (the kernel's first compile) and the last batches
TRAIN_PY = Path(__file__).resolve().parents[1] / "containers" / "trainer" / "train.py"
# Without a GPU: a few JPEGs, and one toy training on the CPU through the trainer (its options and the JSON path)
TINY_PHOTOS = 32
TOY = dict(
    model="resnet18",
    image_size=32,
    batch_size=8,
    precision="fp32",
    channels_last="off",
    device="cpu",
    epochs=1,
    steps_per_epoch=2,
    loader_workers=1,
    compile="off",
)
NO_GPU = (
    "no CUDA GPU here (torch.cuda.is_available() is False): nothing was measured on a GPU. Checked instead: the "
    "imports, the trainer's options for every run, {files} JPEGs written, shrunk and decoded on the CPU, and a toy "
    "training of the GPU loader on the CPU. Run the check on a machine with an NVIDIA GPU and its driver"
)


class Check:
    """One device check: its clock, its folders, and its record, written whole after every step."""

    def __init__(self, out: Path, work: Path, budget_s: float, given_peak: float | None, command: str = ""):
        self.out, self.work = out, work
        self.deadline = time.monotonic() + budget_s - MARGIN_S
        self.gpu = gpu_facts()
        self.peak = peak_tflops(self.gpu["name"] if self.gpu else "", given_peak)
        self.record: dict = {
            "complete": False,
            "gpu": self.gpu,
            "no_gpu": None if self.gpu else NO_GPU.format(files=TINY_PHOTOS),
            "peak_bf16_tflops": self.peak,
            "software": software_facts(),
            "command": command,
            "budget_s": budget_s,
            "trainer_settings": TRAINER_DEFAULTS,
            "steps": {},
            "runs": [],
        }
        self.started = time.monotonic()

    def left(self) -> float:
        """Seconds left of the check's budget."""
        return self.deadline - time.monotonic()

    def save(self) -> None:
        """The record as it stands, written whole (a check stopped now leaves the last whole file)."""
        self.record["elapsed_s"] = round(time.monotonic() - self.started, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        partial = self.out / ".device-check.json.partial"
        partial.write_text(json.dumps(self.record, indent=2) + "\n")
        os.replace(partial, self.out / "device-check.json")

    def finish(self) -> None:
        """Mark the record complete (every step ran or was skipped) and save it."""
        self.record["complete"] = True
        self.save()

    def step(self, name: str, do: Callable[[], dict]) -> dict | None:
        """Run one step, print and record its outcome (its error, when it fails), save; its result."""
        result: dict | None = None
        try:
            result = self.record["steps"][name] = do()
        except Exception as exc:  # one step's failure is recorded; the next steps still run
            self.record["steps"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{name}: {json.dumps(self.record['steps'][name])}", flush=True)
        self.save()
        return result

    def add_run(self, row: dict) -> None:
        """Record one run's row, print it and save."""
        self.record["runs"].append(row)
        print(run_line(row), flush=True)
        self.save()


def worst_case(budget_s: float, cores: int) -> list[tuple[str, float]]:
    """The steps and runs of a check on a GPU machine of `cores` cores, each taking the most it may (the JPEGs at the
    rates above, the decode and every run their budgets): those it would start, with their seconds."""
    planned = [
        ("photos", PHOTOS / (PHOTOS_PER_CORE_S * cores)),
        ("shrunk", PHOTOS / (SHRINKS_PER_CORE_S * cores)),
        ("marked", PHOTOS / (MARKS_PER_CORE_S * cores)),
        ("gpu loader stages", STAGES_BUDGET_S),
    ]
    left = budget_s - MARGIN_S - sum(seconds for _, seconds in planned)
    for run in device_check_runs():
        if run.budget_s <= left:  # as start_run decides: a run starts only if its budget fits in what is left
            planned.append((run.label, run.budget_s))
            left -= run.budget_s
    return planned


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the check (the GPU's or, without one, what can be checked here); the exit status."""
    args = parser().parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks.device_check", *(sys.argv[1:] if argv is None else argv)])
    check = Check(args.out.resolve(), args.work.resolve(), args.budget, args.peak_tflops, command)
    check.save()
    status = measure_on_gpu(check) if check.gpu else check_without_gpu(check)
    check.finish()
    said = NO_GPU.format(files=TINY_PHOTOS) if not check.gpu else outcome(check.record["runs"])
    print(f"device check: {said} ({check.out / 'device-check.json'})", flush=True)
    return status if status or check.gpu else 2


def outcome(rows: list[dict]) -> str:
    """How many runs were measured, stopped at their budget, skipped and failed."""
    counts = {
        status: sum(r["status"] == status for r in rows) for status in ("measured", "stopped", "skipped", "failed")
    }
    return ", ".join(f"{count} {status}" for status, count in counts.items()) + f" of {len(rows)} runs"


def parser() -> argparse.ArgumentParser:
    """The command's options."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=__doc__.split("\n")[0])
    p.add_argument(
        "--out", type=Path, default=Path(".trainflow/device-check"), help="folder of device-check.json and the logs"
    )
    p.add_argument(
        "--work",
        type=Path,
        default=Path(tempfile.gettempdir()) / "trainflow-device-check",
        help="folder of the JPEGs and the runs' results (kept: a second check reuses the JPEGs)",
    )
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole check (default: 8 minutes)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the GPU's peak dense bf16 TFLOP/s, if unlisted")
    return p


def measure_on_gpu(check: Check) -> int:
    """The JPEGs, the GPU loader's stages and every run that fits in the budget; 1 when a step or a run failed, else
    0."""
    data = prepare_data(check, PHOTOS)
    if data:
        check.step("gpu loader stages", lambda: loader_stages(data[JPEGS], "cuda", STAGES_S))
    for run in device_check_runs():
        check.add_run(start_run(check, run, data))
    return failures(check)


def check_without_gpu(check: Check) -> int:
    """What a machine without a GPU can check: every run's options, the JPEG steps on a few files, the GPU loader's
    stages on the CPU and one toy training of the first JPEG run this trainer takes, on the CPU; 1 when one of these
    failed, else 0."""
    data = prepare_data(check, TINY_PHOTOS)
    if data:
        check.step("gpu loader stages", lambda: loader_stages(data[JPEGS], "cpu", 1, batch=8))
    runs = device_check_runs()
    for run in runs:
        lacks = trainer_lacks(run.settings)
        check.add_run(row_of(run, "skipped", lacks or "no CUDA GPU here"))
    toy = next((r for r in runs if r.data != SYNTHETIC and not trainer_lacks(r.settings)), None)
    if toy and data:
        toy = toy._replace(label=f"toy on the CPU: {toy.label}", settings=TRAINER_DEFAULTS | toy.settings | TOY)
        check.add_run(train(check, toy, data[toy.data]))
    return failures(check)


def prepare_data(check: Check, files: int) -> dict[str, Path] | None:
    """The photo-like JPEGs and their shrunk copy under the work folder (each a step; a copy a stopped check left
    half made is completed); None when one failed."""
    cores, folders = usable_cores(), photo_folders(check.work, files)
    if check.step("photos", lambda: write_photo_set(folders[JPEGS], files, cores) | {"cores": cores}) is None:
        return None
    if not check.step("shrunk", lambda: write_shrunk_copy(folders[JPEGS], folders[SHRUNK], cores) | {"cores": cores}):
        return None
    if not check.step("marked", lambda: write_marked_copy(folders[JPEGS], folders[MARKED], cores) | {"cores": cores}):
        del folders[MARKED]  # its run is skipped, saying why (the step's error); the others run
    return folders


def failures(check: Check) -> int:
    """1 when a step or a run failed, else 0."""
    failed = [s for s in check.record["steps"].values() if "error" in s]
    return 1 if failed or any(r["status"] == "failed" for r in check.record["runs"]) else 0


def start_run(check: Check, run: Run, data: dict[str, Path] | None) -> dict:
    """One run, or why it was not started: an option this trainer lacks, no data, or a budget that no longer fits."""
    if lacks := trainer_lacks(run.settings):
        return row_of(run, "skipped", lacks)
    if run.data != SYNTHETIC and not data:
        return row_of(run, "skipped", "its JPEGs could not be written (see steps)")
    if run.data != SYNTHETIC and run.data not in data:  # type: ignore[operator]
        return row_of(run, "skipped", f"its copy could not be made: {check.record['steps'][run.data]['error']}")
    if run.budget_s > check.left():
        return row_of(run, "skipped", f"its {run.budget_s:.0f} s budget does not fit in the {check.left():.0f} s left")
    folder = SYNTHETIC if run.data == SYNTHETIC else str(data[run.data])  # type: ignore[index]
    return train(check, run._replace(settings=check.record["trainer_settings"] | run.settings), folder)


def train(check: Check, run: Run, data: Path | str) -> dict:
    """The trainer on `data` with the run's settings, stopped at its budget; its row, with its log and metrics.json
    kept under the check's runs/ folder."""
    name = re.sub(r"[^A-Za-z0-9.+]+", "-", run.label).strip("-")
    results, kept = check.work / "runs" / name, check.out / "runs" / name
    shutil.rmtree(results, ignore_errors=True)  # a fresh run: a checkpoint there would be resumed
    kept.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(TRAIN_PY), "--data", str(data), "--out", str(results), *trainer_argv(run.settings)]
    started = time.monotonic()
    with open(kept / "train.log", "w") as log:
        code = run_stopped_at(argv, log, run.budget_s)
    metrics = read_metrics(results)
    if metrics:
        (kept / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return figures(check, run, metrics, code, (kept / "train.log").read_text()) | {
        "seconds": round(time.monotonic() - started, 1)
    }


def run_stopped_at(argv: list[str], log, budget_s: float) -> int | None:
    """Run `argv` (its own process group, its output to `log`); its exit status, or None when its budget ran out
    and it was stopped (the group: its DataLoader workers too)."""
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except ProcessLookupError:  # it ended meanwhile
                break
            except subprocess.TimeoutExpired:
                continue
        return None


def read_metrics(results: Path) -> dict | None:
    """The run's metrics.json (rank 0 writes it whole after every epoch), or None when it wrote none."""
    path = results / "metrics.json"
    return json.loads(path.read_text()) if path.exists() else None


def figures(check: Check, run: Run, metrics: dict | None, code: int | None, log: str) -> dict:
    """A run's row: measured (exit status 0), stopped at its budget (with the figures of its last whole epoch, if
    any), or failed (with the trainer's error line)."""
    if code == 0 and metrics:
        return row_of(run, "measured", "", metrics, check.peak)
    if code is None:
        why = f"stopped at its {run.budget_s:.0f} s budget" + ("" if metrics else " before its first epoch ended")
        return row_of(run, "stopped", why, metrics, check.peak)
    errors = [line.split(" ERROR error: ", 1)[1] for line in log.splitlines() if " ERROR error: " in line]
    said = errors[-1] if errors else (log.strip().splitlines() or ["no output"])[-1]
    return row_of(run, "failed", f"exit status {code}: {said}", metrics, check.peak)


def row_of(run: Run, status: str, reason: str, metrics: dict | None = None, peak: float | None = None) -> dict:
    """A run's row: its label, settings, status and why, and from its metrics the steady images/s, the largest rank's
    data-wait share, the MFU, the loader workers the trainer picked and (--loader gpu) the share of batches the GPU
    decoded in one call."""
    metrics = metrics or {}
    rate, waits = metrics.get("steady_images_per_sec"), metrics.get("data_wait_share") or []
    tally = metrics.get("gpu_decoding") or {}
    return {
        "run": run.label,
        "settings": run.settings,
        "budget_s": run.budget_s,
        "status": status,
        "reason": reason or None,
        "images_per_sec": rate,
        "data_wait_share": max(waits) if waits else None,
        "mfu": mfu(rate, peak) if rate and peak else None,
        "loader_workers": metrics.get("loader_workers"),
        "decoded_at_once_share": tally["batches_decoded_at_once"] / tally["batches"] if tally.get("batches") else None,
    }


def run_line(row: dict) -> str:
    """A run's row in one line."""
    if row["images_per_sec"] is None:
        return f"{row['run']}: {row['status']}: {row['reason']}"
    line = f"{row['run']}: {row['images_per_sec']:.0f} images/s, data-wait share {row['data_wait_share'] or 0:.2f}"
    line += f", MFU {row['mfu']:.1%}" if row["mfu"] else ""
    line += f", {row['loader_workers']} loader workers" if row.get("loader_workers") is not None else ""
    return line + (f" ({row['status']}: {row['reason']})" if row["reason"] else f" ({row.get('seconds', 0):.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
