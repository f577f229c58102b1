"""Launch the training engine on this machine with torchrun or horovodrun, and route its output.

The engine (containers/trainer/train.py) stands apart: this module only builds its command line,
runs it, and sorts every output line by the rank that printed it.
"""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

REPO = Path(__file__).resolve().parents[1]
SYNTHETIC = "synthetic"  # the engine's word for generated images (no data folder)
RANK_LINE = re.compile(r"\[rank (\d+)\]")
ERROR_LINE = re.compile(r"\[rank (\d+)\].* ERROR error: (.*)")
# How the launchers report a worker that died without a word: torchrun's failure summary, horovodrun's line.
DIED_LINE = re.compile(r"^\s*rank\s*:\s*(\d+) \(local_rank|Process (\d+) exit with status code (\d+)")


class LaunchError(Exception):
    """Training did not finish; the message says which rank and why."""

    exit_code = 1


class BadInput(LaunchError):
    """The engine's checks refused the arguments, the data or the output folder before any worker started."""

    exit_code = 2


class TrainingConfig(BaseModel):
    """How the training engine runs. Defaults are the reference case: ResNet-50 on ImageNet."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    launcher: Literal["torchrun", "horovodrun"] = "torchrun"
    """torchrun (torch.distributed DDP) or horovodrun (Horovod over Gloo locally, MPI/NCCL on GPU nodes)."""
    workers: int = Field(2, ge=1)
    """Training processes (data-parallel replicas)."""
    model: str = "resnet50"
    """torchvision classifier name (resnet50, resnet18, ...)."""
    epochs: int = Field(90, ge=1)
    """Passes over the training split."""
    batch_size: int = Field(32, ge=1)
    """Images per worker per step; the global batch is batch_size x workers."""
    lr: float = Field(0.0125, gt=0)
    """One-worker learning rate; the engine scales it linearly with the workers (Goyal et al. 2017)."""
    momentum: float = Field(0.9, ge=0)
    """SGD momentum."""
    weight_decay: float = Field(1e-4, ge=0)
    """L2 penalty."""
    warmup_epochs: float = Field(5.0, ge=0)
    """Epochs of linear warmup from the one-worker rate to the scaled rate."""
    schedule: Literal["cosine", "step"] = "cosine"
    """Decay after warmup: cosine to zero, or /10 at lr_decay_epochs."""
    lr_decay_epochs: str = "30,60,80"
    """Epochs of the step schedule's decays, comma-separated."""
    image_size: int = Field(224, ge=1)
    """Side of the square crops the model sees."""
    min_crop_scale: float = Field(0.08, gt=0, le=1)
    """Smallest area fraction of the random-resized crop."""
    hflip: bool = True
    """Random horizontal flips (turn off for digits and text)."""
    loader_workers: int = Field(4, ge=0)
    """DataLoader processes per training process."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: a GPU when there is one."""
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """auto: bf16 autocast on GPU, fp32 on CPU."""
    threads: int = Field(0, ge=0)
    """CPU threads per worker; 0 shares the machine's cores among the workers."""
    checkpoint_every: int = Field(500, ge=0)
    """Steps between checkpoints (one is also written at every epoch end)."""
    log_every: int = Field(20, ge=1)
    """Steps between progress lines."""
    steps_per_epoch: int = Field(0, ge=0)
    """Cap on steps per epoch (0: the whole split; synthetic data: 100)."""
    num_classes: int = Field(1000, ge=1)
    """Classes of synthetic data (real data takes them from its class folders)."""
    seed: int = 0
    """Seed of initialisation, shuffling and augmentation."""
    parallel: Literal["data", "pipeline"] = "data"
    """data: every worker holds the whole model; pipeline: the model split into `stages` over that many
    workers, workers / stages replicas (torchrun only: Horovod has no pipeline parallelism)."""
    stages: int = Field(1, ge=1)
    """Pipeline stages (pipeline mode)."""
    microbatches: int = Field(1, ge=1)
    """Micro-batches per step: pipelined in pipeline mode, gradient accumulation in data mode."""
    pipeline_schedule: Literal["gpipe", "1f1b"] = "gpipe"
    """The pipeline's micro-batch schedule."""
    balance: Literal["params", "time"] = "params"
    """How the stages are balanced: parameter count, or forward+backward time measured per block."""
    verify_images: bool = True
    """Decode every image once before the workers start, so a corrupt file fails fast, by name
    (the other checks always run)."""

    @model_validator(mode="after")
    def _pipeline_layout(self) -> "TrainingConfig":
        if self.batch_size % self.microbatches:
            raise ValueError(f"training.batch_size {self.batch_size} is not divisible by training.microbatches "
                             f"{self.microbatches}")
        if self.parallel == "data" and self.stages > 1:
            raise ValueError("training.stages needs training.parallel: pipeline")
        if self.parallel == "pipeline" and self.launcher == "horovodrun":
            raise ValueError("Horovod has no pipeline parallelism: set training.launcher: torchrun for "
                             "training.parallel: pipeline")
        if self.workers % self.stages:
            raise ValueError(f"training.workers {self.workers} is not a multiple of training.stages {self.stages}: "
                             "the workers form stages x replicas")
        return self

    def engine_args(self) -> list[str]:
        """The engine's command-line options for these settings (launcher and workers excluded)."""
        args = []
        for name, value in self.model_dump(exclude={"launcher", "workers", "verify_images"}).items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else f"--no-{flag[2:]}")
            else:
                args += [flag, str(value)]
        return args


def engine_script() -> Path:
    """The training engine's entry point in this checkout."""
    return REPO / "containers" / "trainer" / "train.py"


def index_data(data: Path, verify: list[str] | None = None, headers_only: bool = False) -> dict:
    """The engine's own index of an ImageNet-layout folder (containers/trainer/layout.py), checking `verify`.

    Raises BadInput with the engine's one-line message when the folder is not usable.
    """
    cmd = [sys.executable, str(engine_script().with_name("layout.py")), str(data)]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as listing:
        if verify:
            listing.write("\n".join(verify))
            listing.flush()
            cmd += ["--verify-list", listing.name] + (["--headers-only"] if headers_only else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"data check failed with status {proc.returncode}"]
        raise BadInput(lines[-1].removeprefix("error: "))
    return json.loads(proc.stdout)


def engine_argv(cfg: TrainingConfig, data: str, out: Path, script: str | None = None) -> list[str]:
    """The engine script (this checkout's, or `script` in an image) and its arguments."""
    return [script or str(engine_script()), "--data", data, "--out", str(out), *cfg.engine_args()]


def horovodrun_options(workers: int, hosts: str, nic: str) -> list[str]:
    """horovodrun's options: `workers` processes on `hosts` (host:slots,...), Gloo over interface `nic`."""
    return ["-np", str(workers), "-H", hosts, "--gloo", "--network-interfaces", nic]


def torchrun_options(nodes: int | str, per_node: int, node_rank: int | str, master_addr: str,
                     master_port: int | str) -> list[str]:
    """torchrun's options for one node of a multi-node world (static rendezvous at master_addr:master_port)."""
    return ["--nnodes", str(nodes), "--nproc_per_node", str(per_node), "--node_rank", str(node_rank),
            "--master_addr", master_addr, "--master_port", str(master_port)]


def launch_command(cfg: TrainingConfig, data: str, out: Path, python: str = sys.executable,
                   script: str | None = None) -> list[str]:
    """The torchrun or horovodrun command line that starts cfg.workers local workers (of `script`, if given)."""
    engine = engine_argv(cfg, data, out, script)
    n = str(cfg.workers)
    if cfg.launcher == "torchrun":
        return [python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", n, *engine]
    horovodrun = str(Path(python).parent / "horovodrun")
    return [horovodrun, *horovodrun_options(cfg.workers, f"localhost:{n}", "lo"), python, *engine]


def check_command(cfg: TrainingConfig, data: str, out: Path, python: str = sys.executable,
                  script: str | None = None) -> list[str]:
    """One process that checks the arguments, output folder, data and model before any worker starts."""
    verify = ["--verify-images"] if cfg.verify_images else []
    return [python, *engine_argv(cfg, data, out, script), "--check", "--check-workers", str(cfg.workers), *verify]


def preflight(cfg: TrainingConfig, data: str, out: Path, script: str | None = None) -> None:
    """Run the engine's own checks in one process; raise BadInput with its one-line message."""
    proc = subprocess.run(check_command(cfg, data, out, script=script), capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [m.group(2) for m in map(ERROR_LINE.search, proc.stdout.splitlines()) if m]
        raise BadInput(errors[-1] if errors else f"training check failed:\n{proc.stdout}{proc.stderr}")


def run_workers(cmd: list[str], log_dir: Path, echo: Callable[[str], None]) -> int:
    """Run the launcher; write each rank's lines to rank<N>.log and all lines to launcher.log.

    Lines from the workers are passed to `echo`; the launcher's own lines only go to launcher.log.
    Raises LaunchError naming the failing rank, with its error or its last lines.
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    return route_output(proc.stdout, proc.wait, log_dir, echo)


def route_output(lines: Iterable[str], wait: Callable[[], int], log_dir: Path, echo: Callable[[str], None]) -> int:
    """Sort a launcher's output lines by rank into log_dir, then wait for its exit status (see run_workers)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    logs: dict[int, list[str]] = {}
    died: list[int] = []  # ranks the launcher reported dead, in order
    roots: list[int] = []  # torchrun's "Root Cause" ranks; with one torchrun per node, the first node's comes first
    root_next = False
    with open(log_dir / "launcher.log", "w") as all_lines:
        for line in lines:
            all_lines.write(line)
            match = RANK_LINE.search(line)
            if match:
                logs.setdefault(int(match.group(1)), []).append(line[match.start():])
                echo(line[match.start():].rstrip("\n"))
            elif "Root Cause" in line:  # torchrun lists the first rank to fail last, after the others
                root_next = True
            elif dead := DIED_LINE.search(line):
                (roots if root_next else died).append(int(dead.group(1) or dead.group(2)))
                root_next = False
        code = wait()
    for rank, lines in logs.items():
        (log_dir / f"rank{rank}.log").write_text("".join(lines))
    if code != 0:
        raise LaunchError(describe_failure(code, logs, log_dir, roots + died))
    return code


def describe_failure(code: int, logs: dict[int, list[str]], log_dir: Path, died: list[int] | None = None) -> str:
    """One message for a failed run: an input error (it set off the rest), else the rank the launcher saw die
    first (not a peer that then lost its connection to it) with its error or last lines, else any rank's
    error, else every rank's last lines."""
    errors = [(rank, m.group(2)) for rank, lines in logs.items() for m in map(ERROR_LINE.search, lines) if m]
    inputs = [e for e in errors if not e[1].startswith("unexpected ")]
    if not inputs and died:
        own = [message for rank, message in errors if rank == died[0]]
        if own:
            return f"rank {died[0]} failed: {own[0]}"
        tail = "".join(logs.get(died[0], [])[-5:]) or "(no output)\n"
        return f"rank {died[0]} failed: it died without an error (exit status {code}); its last lines:\n{tail}"
    if inputs or errors:
        rank, message = (inputs or errors)[0]
        return f"rank {rank} failed: {message}"
    tail = "".join(line for lines in logs.values() for line in lines[-5:])
    return f"training exited with status {code}; see {log_dir}/launcher.log. Last lines:\n{tail}"


def train_locally(cfg: TrainingConfig, data: str, out: Path, echo: Callable[[str], None]) -> dict:
    """Check, launch cfg.workers local workers, wait, and return the run's metrics.json."""
    cmd = launch_command(cfg, data, out)
    if not Path(cmd[0]).exists():
        raise LaunchError(f"{cmd[0]} is missing; run `make setup` to install Horovod")
    preflight(cfg, data, out)
    run_workers(cmd, out / "logs", echo)
    return json.loads((out / "metrics.json").read_text())
