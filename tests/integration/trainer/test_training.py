"""The real engine under the real launchers (torchrun, horovodrun) with 2 processes on the digits set."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from infra.data.restart_markers import add_restart_markers
from infra.data.sample_data import write_digits
from infra.engines.contract import trainer_argv
from infra.engines.launchers import LaunchError, local_command, route_output
from infra.engines.pytorch import PyTorchTraining
from nodelib.cores import usable_cores
from tests.fakes.training import digests, train_locally
from trainer import jpeg_crop
from trainer.checkpoint import load_checkpoint
from trainer.models import build_model
from trainer.train import main as engine_main

pytestmark = pytest.mark.integration
TINY = dict(
    workers=2,
    model="resnet18",
    image_size=32,
    epochs=3,
    steps_per_epoch=8,
    batch_size=16,
    lr=0.02,
    warmup_epochs=0.5,
    loader_workers=0,
    log_every=4,
    checkpoint_every=0,
    min_crop_scale=0.5,
    hflip=False,
)


@pytest.mark.parametrize("launcher, backend", [("torchrun", "ddp"), ("horovodrun", "horovod")])
def test_two_workers_train_and_end_identical(digits, tmp_path, launcher, backend):
    lines = []
    out = tmp_path / "out"
    metrics = train_locally(PyTorchTraining(launcher=launcher, **TINY), str(digits), out, lines.append)

    assert metrics["status"] == "complete" and metrics["world_size"] == 2 and metrics["backend"] == backend
    losses = [e["train_loss"] for e in metrics["epochs"]]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert 0 <= metrics["final_val_top1"] <= metrics["final_val_top5"] <= 1
    assert metrics["images_per_sec"] == pytest.approx(2 * metrics["epochs"][-1]["images_per_sec_per_worker"])
    assert metrics["global_step"] == 24 and metrics["parameters_in_sync"] is True

    ranks = digests(out / "logs")
    assert ranks[0] == ranks[1] == metrics["parameter_digest"][:16]
    assert any(line.startswith("[rank 1]") for line in lines)

    saved = torch.load(out / "model.pt", weights_only=False)
    model = build_model(saved["arch"], len(saved["classes"]))
    model.load_state_dict(saved["state_dict"])
    assert saved["classes"] == [str(d) for d in range(10)]
    assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1] == "step-000000024.pt"


def test_killed_run_resumes_from_its_checkpoint(digits, tmp_path):
    cfg = PyTorchTraining(**{**TINY, "epochs": 2, "checkpoint_every": 5})
    out = tmp_path / "out"
    command = local_command("torchrun", cfg.workers, trainer_argv(cfg, str(digits), out))
    proc = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = out / "checkpoints" / "step-000000005.pt"
    deadline = time.monotonic() + 240
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert first.exists(), "the run never wrote its first checkpoint"
    assert not (out / "metrics.json").exists() or json.loads((out / "metrics.json").read_text())["status"] != "complete"

    metrics = train_locally(cfg, str(digits), out, lambda line: None)
    assert metrics["status"] == "complete"
    assert metrics["resumed_from_steps"] and metrics["resumed_from_steps"][0] >= 5
    assert metrics["global_step"] == 16  # continued, not restarted: 2 epochs x 8 steps in all
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    assert "resumed from step-" in (out / "logs" / "rank0.log").read_text()


def test_awkward_images_train_in_one_process(image_tree, tmp_path):
    out = tmp_path / "out"
    code = engine_main(
        [
            "--data",
            str(image_tree),
            "--out",
            str(out),
            "--model",
            "resnet18",
            "--image-size",
            "16",
            "--epochs",
            "1",
            "--batch-size",
            "2",
            "--loader-workers",
            "0",
            "--verify-images",
        ]
    )
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "complete" and metrics["num_classes"] == 2 and metrics["backend"] == "single"
    assert metrics["epochs"][0]["val_top1"] is not None
    state = torch.load(sorted((out / "checkpoints").glob("*.pt"))[-1], weights_only=False)
    assert state["optimizer"]["param_groups"][0]["fused"] is True  # one kernel updates every parameter


def test_without_partial_jpeg_decoding_a_worker_trains_on_whole_decodes_and_says_why(
    image_tree, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(jpeg_crop.DIR, str(tmp_path / "empty"))
    monkeypatch.setenv("CC", "/bin/false")  # no compiler: the library cannot be built
    jpeg_crop._load.cache_clear()
    try:
        code = engine_main(
            [
                "--data",
                str(image_tree),
                "--out",
                str(tmp_path / "out"),
                "--model",
                "resnet18",
                "--image-size",
                "16",
                "--epochs",
                "1",
                "--batch-size",
                "2",
            ]
        )
    finally:
        jpeg_crop._load.cache_clear()
    assert code == 0
    said = capsys.readouterr().out
    assert (
        "WARNING partial JPEG decoding is unavailable (/bin/false could not build jpeg_crop.c: exit status 1): "
        "the fast loader decodes whole images" in said
    )
    assert "loader: fast (--loader auto: cpu is not a CUDA device)" in said  # the default, on the CPU
    workers = max(1, usable_cores() // 4)  # --loader-workers auto, on the CPU
    assert f"loader workers: {workers} (--loader-workers auto: " in said
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert (metrics["loader"], metrics["loader_workers"]) == ("fast", workers)


def test_decoding_only_the_crop_trains_to_the_very_parameters_of_whole_decoding(tmp_path, monkeypatch, capsys):
    """The fast loader's partial JPEG decoding gives the pixels of a whole decode and draws the same crops: on the
    digits as JPEGs, a run with it, a run on the same JPEGs rewritten with restart markers (only each crop's MCUs
    decoded) and a run without it (no compiler: whole images decoded) end with the same parameters, bit for bit.
    (tests/integration/trainer/test_loaders.py compares the loaders' accuracy.)"""
    digits = write_digits(tmp_path / "digits", fmt="jpg")
    marked = tmp_path / "marked"
    shutil.copytree(digits, marked)
    assert add_restart_markers(marked, progress=False)["rewritten"] == len(list((marked / "train").rglob("*.jpg")))
    argv = [
        "--model",
        "resnet18",
        "--image-size",
        "16",
        "--epochs",
        "1",
        "--batch-size",
        "32",
        "--loader-workers",
        "0",
        "--threads",
        "1",
        "--log-every",
        "100",
    ]
    digests = {}
    for way, folder, compiler in [
        ("partial", digits, None),
        ("restarts", marked, None),
        ("whole", digits, "/bin/false"),
    ]:
        monkeypatch.setenv(jpeg_crop.DIR, str(tmp_path / f"lib-{way}"))
        if compiler:
            monkeypatch.setenv("CC", compiler)
        jpeg_crop._load.cache_clear()
        try:
            assert engine_main([*argv, "--data", str(folder), "--out", str(tmp_path / way)]) == 0
            assert (jpeg_crop.library() is None) == (way == "whole")
        finally:
            jpeg_crop._load.cache_clear()
        digests[way] = json.loads((tmp_path / way / "metrics.json").read_text())["parameter_digest"]
    said = capsys.readouterr().out
    assert "partial JPEG decoding is unavailable" in said  # the last run did decode whole
    assert digests["partial"] == digests["restarts"] == digests["whole"]
    # The first run, on JPEGs as they come, says how to rewrite them; the second, on rewritten ones, does not.
    assert (
        said.count(
            "of 32 training JPEGs sampled have no restart markers: `trainflow data "
            "add-restart-markers --data DIR` rewrites them losslessly"
        )
        == 1
    )
    assert "32 of 32 training JPEGs sampled" in said


@pytest.mark.slow  # Inductor compiles the forward and backward passes on the CPU: a minute or more
def test_a_compiled_model_trains_and_checkpoints_under_the_model_s_own_names(image_tree, tmp_path):
    out = tmp_path / "out"
    code = engine_main(
        [
            "--data",
            str(image_tree),
            "--out",
            str(out),
            "--model",
            "resnet18",
            "--image-size",
            "16",
            "--epochs",
            "1",
            "--batch-size",
            "2",
            "--loader-workers",
            "0",
            "--compile",
            "on",
        ]
    )
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "complete" and metrics["epochs"][0]["train_loss"] > 0
    state = torch.load(sorted((out / "checkpoints").glob("*.pt"))[-1], weights_only=False)
    assert "conv1.weight" in state["model"] and not any("_orig_mod" in k for k in state["model"])


@pytest.mark.slow  # Inductor compiles on the CPU: about 40 s a launcher
@pytest.mark.parametrize("launcher, backend", [("torchrun", "ddp"), ("horovodrun", "horovod")])
def test_a_compiled_model_trains_in_sync_under_either_launcher(digits, tmp_path, launcher, backend):
    # --compile's default is on for a GPU, with either launcher: DDP's all-reduce hooks and Horovod's gradient hooks
    # must still fire on the compiled backward, or the ranks would drift apart
    settings = {**TINY, "epochs": 1, "steps_per_epoch": 4, "image_size": 16, "compile": "on"}
    out = tmp_path / "out"
    metrics = train_locally(PyTorchTraining(launcher=launcher, **settings), str(digits), out, lambda line: None)
    assert metrics["status"] == "complete" and metrics["backend"] == backend and metrics["parameters_in_sync"] is True
    ranks = digests(out / "logs")
    assert ranks[0] == ranks[1] == metrics["parameter_digest"][:16]


COMPILE = """import sys, torch
from trainer.train import compile_model
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
x = torch.randn(4, 8)
compiled = compile_model(model, sys.argv[1], torch.device("cuda"))  # a GPU's choice; the model itself stays on the CPU
compiled(x).sum().backward()
print("trained", torch.equal(compiled(x), model(x)))
"""


@pytest.mark.parametrize("choice, ends", [("auto", "trained True"), ("on", "InvalidCxxCompiler")])
def test_compile_auto_runs_eagerly_where_compiling_fails_and_on_fails(tmp_path, choice, ends):
    # a node without a working C++ compiler (CXX names one that always fails): the default must not end the run
    script = tmp_path / "compile.py"
    script.write_text(COMPILE)
    done = subprocess.run(
        [sys.executable, str(script), choice],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CXX": "/bin/false"},
    )
    assert ends in done.stdout + done.stderr and (done.returncode == 0) == (choice == "auto")


RESUME_ARGS = [
    "--data",
    "synthetic",
    "--model",
    "resnet18",
    "--image-size",
    "16",
    "--num-classes",
    "4",
    "--batch-size",
    "4",
    "--epochs",
    "2",
    "--steps-per-epoch",
    "6",
    "--warmup-epochs",
    "0.5",
    "--checkpoint-every",
    "2",
    "--keep-checkpoints",
    "10",
    "--threads",
    "1",
]


def test_resume_mid_epoch_ends_where_an_uninterrupted_run_ends(tmp_path):
    """Same seed, one process: resuming from a mid-epoch checkpoint must give the very same parameters,
    so the step, the position in the epoch, the optimizer state and the learning rate all come back."""
    args = RESUME_ARGS
    assert engine_main([*args, "--out", str(tmp_path / "whole")]) == 0
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copy(tmp_path / "whole" / "checkpoints" / "step-000000004.pt", resumed / "checkpoints")
    assert engine_main([*args, "--out", str(resumed)]) == 0

    whole, again = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("whole", "resumed"))
    assert again["resumed_from_steps"] == [4] and again["global_step"] == whole["global_step"] == 12
    assert again["parameter_digest"] == whole["parameter_digest"]


def test_a_run_resumed_with_another_lr_trains_at_that_rate(tmp_path):
    """The base rate after a resume is the run's own --lr (as the logged rate is), not the checkpoint's."""
    first, whole, resumed = tmp_path / "first", tmp_path / "whole", tmp_path / "resumed"
    assert engine_main([*RESUME_ARGS, "--lr", "0.1", "--out", str(first)]) == 0
    assert engine_main([*RESUME_ARGS, "--out", str(whole)]) == 0
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copy(first / "checkpoints" / "step-000000004.pt", resumed / "checkpoints")
    assert engine_main([*RESUME_ARGS, "--out", str(resumed)]) == 0

    def rate(out: Path) -> float:
        return load_checkpoint(out / "checkpoints" / "step-000000008.pt")["optimizer"]["param_groups"][0]["lr"]

    assert rate(resumed) == rate(whole) != rate(first)


ENDS = """import os, signal, sys, time
rank = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))
print(f"[rank {rank}] step 1", flush=True)
if rank == 1:
    sys.exit(int(sys.argv[1])) if sys.argv[1].isdigit() else os.kill(os.getpid(), getattr(signal, sys.argv[1]))
time.sleep(60)
"""


@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun"])
@pytest.mark.parametrize(
    "how, message",
    [
        (
            "SIGKILL",
            r"rank 1 was killed by signal 9 \(SIGKILL\), as the kernel does when memory runs out \(lower "
            r"training.batch_size or training.loader_workers\); its last lines:",
        ),
        ("SIGSEGV", r"rank 1 was killed by signal 11 \(SIGSEGV\); its last lines:"),
        ("SIGABRT", r"rank 1 was killed by signal 6 \(SIGABRT\); its last lines:"),
        ("3", r"rank 1 failed: it died without an error \(exit status 3\); its last lines:"),
    ],
)
def test_a_worker_killed_by_a_signal_is_named_with_the_signal(tmp_path, launcher, how, message):
    """The real launchers' own reports (torchrun's failure summary, horovodrun's status line) are read for the
    rank that ended first and how; the launcher leaves no temporary folder behind."""
    script, temporary = tmp_path / "ends.py", tmp_path / "tmp"
    script.write_text(ENDS)
    temporary.mkdir()
    proc = subprocess.Popen(
        local_command(launcher, 2, [str(script), how]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(temporary)},
    )
    with pytest.raises(LaunchError) as failed:
        route_output(proc.stdout, lambda: proc.wait(timeout=120), tmp_path / "logs", lambda line: None)
    assert not list(temporary.iterdir())  # torchrun's log folder once was, per launch (launchers.TORCHRUN_NO_LOG_DIR)
    # the rank's last lines follow; what they hold depends on how the two ranks' output interleaved before it died
    assert re.match(f"^{message}\n", str(failed.value)), str(failed.value)
