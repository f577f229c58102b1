"""The device check as a lent GPU machine runs it (no orchestrator packages, no installed trainer), on this machine,
which has no GPU: it checks what it can, says there is no GPU, exits 2 and leaves its JSON."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check measures instead"),
]
ROOT = Path(__file__).resolve().parents[3]
ORCHESTRATOR = ("prefect", "typer", "rich", "pydantic", "yaml", "azure", "docker", "mlflow")
# Loaded by every Python started with this folder on PYTHONPATH (the check and the trainer it starts): the
# orchestrator's packages made unimportable, and the editable install's finder removed, so that `trainer`, `infra`
# and `benchmarks` come from the checkout's folders only, as on the GPU machine.
BLOCKER = f"""import sys
for name in {ORCHESTRATOR!r}:
    sys.modules[name] = None
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
"""


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One run of `python -m benchmarks.device_check` from the checkout's root, as the GPU machine would run it."""
    tmp = tmp_path_factory.mktemp("device-check")
    (tmp / "blocker").mkdir()
    (tmp / "blocker" / "sitecustomize.py").write_text(BLOCKER)
    command = [sys.executable, "-m", "benchmarks.device_check", "--out", str(tmp / "out"), "--work", str(tmp / "w")]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "PYTHONPATH": str(tmp / "blocker")}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300), tmp / "out"


def test_without_a_gpu_the_check_says_so_and_exits_2(checked):
    done, _ = checked
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert "device check: no CUDA GPU here (torch.cuda.is_available() is False): nothing was measured on a GPU" in (
        done.stdout
    )
    assert "Traceback" not in done.stdout + done.stderr


def test_it_checks_the_jpeg_steps_and_every_run_s_options_without_the_orchestrator(checked):
    _, out = checked
    record = json.loads((out / "device-check.json").read_text())
    assert record["complete"] is True and record["gpu"] is None and record["no_gpu"].startswith("no CUDA GPU here")
    steps = record["steps"]
    assert steps["photos"]["files"] == 32 and steps["photos"]["bytes"] > 32 * 10_000
    assert steps["shrunk"]["files"] == 32 and steps["shrunk"]["bytes_after"] <= steps["shrunk"]["bytes_before"]
    assert steps["marked"]["files"] == steps["marked"]["rewritten"] == 32  # every JPEG with restart markers
    stages = steps["gpu loader stages"]  # the loader's own functions, each stage timed alone
    assert stages["device"] == "cpu" and stages["images"] >= 8
    assert all(stages[stage]["images_per_sec"] > 0 for stage in ("read_draw_pack", "decode", "finish"))
    software = record["software"]
    assert software["torch"] == torch.__version__ and isinstance(software["partial_jpeg_decoding"], bool)
    # every GPU run skipped, none for an option the trainer lacks
    gpu_runs = [r for r in record["runs"] if not r["run"].startswith("toy on the CPU")]
    assert len(gpu_runs) == 9 and {(r["status"], r["reason"]) for r in gpu_runs} == {("skipped", "no CUDA GPU here")}


def test_it_trains_the_gpu_loader_on_the_cpu_through_the_trainer_and_keeps_its_log(checked):
    _, out = checked
    record = json.loads((out / "device-check.json").read_text())
    toy = record["runs"][-1]
    assert toy["run"] == "toy on the CPU: JPEGs, --loader gpu" and toy["status"] == "measured"
    assert toy["settings"]["loader"] == "gpu" and toy["settings"]["device"] == "cpu"
    assert toy["images_per_sec"] > 0 and 0 <= toy["data_wait_share"] <= 1
    assert toy["decoded_at_once_share"] == 1.0  # every batch's JPEGs in one decode call (libjpeg-turbo here)
    assert toy["loader_workers"] == 1  # from its metrics.json (the GPU runs': what --loader-workers auto chose)
    kept = out / "runs" / "toy-on-the-CPU-JPEGs-loader-gpu"
    assert json.loads((kept / "metrics.json").read_text())["status"] == "complete"
    assert "--loader gpu on cpu" in (kept / "train.log").read_text()
    # the JPEGs and the trainer's results (checkpoints) stay in the work folder, out of what comes back
    assert not list(out.rglob("*.JPEG")) and not list(out.rglob("checkpoints"))


def imported_packages(code: str) -> set[str]:
    """The top-level packages that a Python running `code` (from the checkout's root, the trainer's folder first on
    its path) has imported."""
    show = "; import json, sys; print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))"
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path[:0] = ['containers']; " + code + show],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_the_check_and_the_trainer_import_only_what_a_gpu_machine_has():
    # the GPU machine has its Python's standard library, torch, torchvision, Pillow, numpy and what they import
    there = imported_packages("import torch, torchvision, torchvision.io, PIL.Image, numpy") | set(
        sys.stdlib_module_names
    )
    ours = {"benchmarks", "infra", "trainer", "nodelib"}
    assert imported_packages("import benchmarks.device_check") - there == ours
    assert imported_packages("import trainer.train, trainer.gpu_decode") - there == {"trainer", "nodelib"}
