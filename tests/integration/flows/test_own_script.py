"""A user's own training script through the whole flow, as a user runs it (`trainflow run --script DIR -- ENTRY`):
the project's example scripts under the real torchrun and horovodrun, real Azurite, real Prefect, the process pool;
a bad flag, a script that raises, the checks before anything starts, the dry run, and Ctrl-C then the same command
resuming."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from uuid import UUID

import mlflow
import numpy as np
import psutil
import pytest
from PIL import Image
from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey

from infra.services.azurite import running_azurite
from infra.services.prefect_server import running_prefect_server
from infra.storage.blobstore import open_store
from infra.storage.config import StorageConfig
from tests.fakes.prefect import prefect_env
from tests.integration.flows.test_interrupts import Command, gone

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRAINFLOW = str(Path(sys.executable).parent / "trainflow")
EXAMPLES = Path(__file__).parents[3] / "containers" / "examples"
SEGMENTATION = [
    "--script",
    str(EXAMPLES / "pytorch-segmentation"),
    "--metric",
    "iou=iou=([0-9.]+)",
    "--",
    "train.py",
    "--epochs",
    "2",
    "--checkpoint-dir",
    "${{checkpoints}}",
    "--log-dir",
    "${{logs}}/tb",
    "--output",
    "${{output}}",
]


@pytest.fixture(scope="module", autouse=True)
def prefect_api(tmp_path_factory):
    """One Prefect server for the module's commands (each would start its own): PREFECT_API_URL names it."""
    home = tmp_path_factory.mktemp("prefect")
    with running_prefect_server(home) as api:
        saved = {name: os.environ.get(name) for name in ("PREFECT_API_URL", "PREFECT_HOME")}
        os.environ.update(prefect_env(api, home))
        yield api
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.update({name: value})


def artifacts(flow_run: str, key: str) -> list:
    """The artifacts of a flow run under `key`, from the module's Prefect server."""
    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run)])
            )
        )


def trainflow(*args: str, workdir: Path, **variables: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400", **variables}  # rich's tables unwrapped
    command = [TRAINFLOW, "run", "--workdir", str(workdir), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)


def scripts_folder(tmp_path: Path, files: dict[str, str]) -> Path:
    """A user's scripts folder of `files` (name -> text)."""
    source = tmp_path / "mine"
    source.mkdir()
    for name, text in files.items():
        (source / name).write_text(text)
    return source


def results_of(done: subprocess.CompletedProcess) -> Path:
    """The results folder the command's last lines name."""
    [line] = [line for line in done.stdout.splitlines() if line.startswith("results: ")]
    return Path(line.removeprefix("results: "))


def segmentation_data(root: Path) -> Path:
    """A folder a segmentation script reads, not a classifier's: images/ and masks/ of the same names, and a CSV."""
    rng = np.random.default_rng(0)
    for folder in ("images", "masks"):
        (root / folder).mkdir(parents=True)
    for i in range(8):
        image, mask = (rng.random((16, 16)) * 120).astype("uint8"), np.zeros((16, 16), "uint8")
        x, y = rng.integers(0, 8, 2)
        image[y : y + 8, x : x + 8] += 120
        mask[y : y + 8, x : x + 8] = 255
        Image.fromarray(image).save(root / "images" / f"{i:03d}.png")
        Image.fromarray(mask).save(root / "masks" / f"{i:03d}.png")
    (root / "splits.csv").write_text("id,split\n0,train\n")
    return root


def digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in folder.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }


def test_a_torchrun_script_of_another_task_runs_unmodified_and_its_results_and_metrics_are_collected(tmp_path):
    data = segmentation_data(tmp_path / "data")
    done = trainflow(
        "--workers", "2", "--data", str(data), *SEGMENTATION, "--data", "${{data}}", workdir=tmp_path / "w"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    staged = tmp_path / "w" / "fileserver" / "datasets" / "data" / "current"
    assert digests(staged) == digests(data)  # any layout, staged through Blob byte for byte; the script read it there
    assert "train.py (pytorch) on 2 workers (torchrun): iou " in done.stdout
    out = results_of(done)
    assert (out / "outputs" / "model.pt").is_file()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint-1.pt", "checkpoint-2.pt"]
    assert "[rank 0] epoch 2 loss=" in (out / "logs" / "rank0.log").read_text()
    assert (out / "logs" / "rank1.log").exists() and (out / "work" / "train.py").is_file()
    summary = json.loads((out / "script.json").read_text())
    assert summary["from"] == {"iou": "regex", "train/loss": "tensorboard", "train/iou": "tensorboard"}
    assert [step for step, _ in summary["series"]["train/loss"]] == [1, 2] and summary["unmatched"] == []
    shared = tmp_path / "w" / "fileshare" / "results" / out.name
    assert (shared / "outputs" / "model.pt").is_file() and (shared / "script.json").is_file()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'w' / 'mlflow' / 'mlflow.db'}")
    [run] = client.search_runs(client.get_experiment_by_name("trainflow").experiment_id)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [1, 2]
    assert run.info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(run.info.run_id, "outputs")] == ["outputs/model.pt"]
    [progress] = artifacts(out.name, "training-progress")  # the training step's live progress, from the metrics
    assert progress.data == 100.0 and progress.description.startswith("**training**: complete iou ")
    with running_azurite(tmp_path / "w" / "azurite") as port:
        blobs = open_store(StorageConfig(), port, "read").names(f"results/{out.name}/")
    assert list(blobs) == [f"results/{out.name}/outputs/model.pt"]


def test_a_horovod_script_reports_its_metrics_in_json_lines_and_each_rank_has_its_log(tmp_path):
    script = [
        "--script",
        str(EXAMPLES / "horovod-synthetic"),
        "--launcher",
        "horovodrun",
        "--metric",
        "top5=top5 ([0-9.]+)",
    ]
    done = trainflow(*script, "--", "train.py", "--iterations", "3", workdir=tmp_path / "w")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warning: --metric top5 never matched a line of rank 0; check the regex" in done.stderr
    out = results_of(done)
    summary = json.loads((out / "script.json").read_text())
    assert summary["from"] == {"loss": "json", "img_per_sec": "json"} and summary["launcher"] == "horovodrun"
    assert [step for step, _ in summary["series"]["img_per_sec"]] == [0, 1, 2]
    assert "Total img/sec on 2 CPU(s)" in (out / "logs" / "rank0.log").read_text()
    assert (out / "logs" / "rank1.log").read_text() == ""  # Horovod's examples print on rank 0 alone


def test_a_keras_script_under_horovodrun_gets_tf_keras_and_its_tensorboard_scalars_are_read(tmp_path):
    script = ["--script", str(EXAMPLES / "keras-horovod"), "--framework", "keras", "--launcher", "horovodrun"]
    args = ["--", "train.py", "--epochs", "2", "--checkpoint-dir", "${{checkpoints}}", "--log-dir", "${{logs}}/tb"]
    done = trainflow(*script, *args, workdir=tmp_path / "w")
    assert done.returncode == 0, done.stderr[-3000:]
    out = results_of(done)
    summary = json.loads((out / "script.json").read_text())
    assert summary["from"]["epoch_accuracy"] == "tensorboard" and len(summary["series"]["epoch_accuracy"]) == 2
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint-1.h5", "checkpoint-2.h5"]
    assert "[rank 1] rank 1 of 2 done" in (out / "logs" / "rank1.log").read_text()


def test_a_bad_flag_is_the_scripts_own_usage_line_exit_2_and_never_retried(tmp_path):
    script = ["--script", str(EXAMPLES / "pytorch-segmentation"), "--", "train.py", "--no-such-flag"]
    done = trainflow(*script, workdir=tmp_path / "w")
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]  # both ranks refuse the flag; the first to say so is named
    assert re.fullmatch(r"error: rank [01] failed: train.py: error: unrecognized arguments: --no-such-flag", last)
    [run] = (tmp_path / "w" / "runs").iterdir()
    assert len(json.loads((run / "attempts.json").read_text())["attempts"]) == 1


def test_a_script_that_raises_names_its_rank_and_last_lines_and_is_not_retried(tmp_path):
    source = scripts_folder(
        tmp_path, {"train.py": "import os\nprint('starting', flush=True)\nif os.environ['RANK'] == '1':\n    1 / 0\n"}
    )
    done = trainflow("--script", str(source), "--", "train.py", workdir=tmp_path / "w")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "error: rank 1 failed: ZeroDivisionError: division by zero; its last lines:" in done.stderr
    assert "[rank 1]     1 / 0" in done.stderr
    [run] = (tmp_path / "w" / "runs").iterdir()
    assert len(json.loads((run / "attempts.json").read_text())["attempts"]) == 1


def test_a_rank_killed_on_the_first_attempt_is_retried_and_the_attempt_is_counted(tmp_path):
    source = scripts_folder(tmp_path, {})
    (source / "train.py").write_text(
        "import os, signal\n"
        "print('attempt', os.environ['TRAINFLOW_ATTEMPT'], flush=True)\n"
        "if os.environ['TRAINFLOW_ATTEMPT'] == '1' and os.environ['RANK'] == '1':\n"
        "    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer, or a lost node\n"
    )
    done = trainflow("--script", str(source), "--", "train.py", workdir=tmp_path / "w")
    assert done.returncode == 0, done.stderr[-3000:]
    out = results_of(done)
    assert "[rank 1] attempt 2" in (out / "logs" / "rank1.log").read_text()
    assert [a["ended"] for a in json.loads((out / "attempts.json").read_text())["attempts"]] == ["failed", "completed"]


def test_a_script_that_goes_quiet_is_stopped_as_hung_naming_when_each_rank_last_printed(tmp_path):
    source = scripts_folder(
        tmp_path, {"train.py": "import time\nprint('waiting on a peer', flush=True)\ntime.sleep(3600)\n"}
    )
    done = trainflow("--script", str(source), "--", "train.py", workdir=tmp_path / "w", TRAINFLOW_JOB__SILENT_S="5")
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()
    hung = [line for line in last if line.startswith("error: the job was stopped as hung: ")]
    assert hung and "no line from any rank for 5 s (rank 0 last printed " in hung[0], done.stderr[-3000:]
    assert "; rank 1 last printed " in hung[0]
    [run] = (tmp_path / "w" / "runs").iterdir()
    assert len(json.loads((run / "attempts.json").read_text())["attempts"]) == 1  # a hang is not run again
    assert left_running(run) == []


def left_running(run: Path) -> list[str]:
    """The processes still running in the run's working folder (every rank of its script runs there)."""
    alive = []
    for proc in psutil.process_iter(["cwd", "cmdline"]):
        if str(proc.info["cwd"] or "").startswith(str(run)):
            alive.append(" ".join(proc.info["cmdline"] or []))
    return alive


def test_requirements_the_environment_lacks_are_installed_once_and_a_conflicting_one_is_refused(tmp_path):
    source = scripts_folder(
        tmp_path,
        {
            "requirements.txt": "numpy\ninflection==0.5.1\n",  # numpy: trainflow's own, not installed again
            "train.py": "import sys, inflection\nprint(inflection.camelize(sys.argv[1]), flush=True)\n",
        },
    )
    first = trainflow("--script", str(source), "--", "train.py", "device_mesh", workdir=tmp_path / "w")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "[rank 0] DeviceMesh" in (results_of(first) / "logs" / "rank0.log").read_text()
    [env] = (tmp_path / "w" / "envs").iterdir()
    assert (env / "inflection-0.5.1.dist-info").is_dir() and (env / "inflection.py").is_file()
    made = (env / ".complete").stat().st_mtime_ns
    again = trainflow("--script", str(source), "--", "train.py", "run_id", workdir=tmp_path / "w")
    assert again.returncode == 0, again.stderr[-3000:]
    assert [p.name for p in (tmp_path / "w" / "envs").iterdir()] == [env.name]
    assert (env / ".complete").stat().st_mtime_ns == made  # found, not made again
    (source / "requirements.txt").write_text("torch==2.0.0\n")
    refused = trainflow("--script", str(source), "--", "train.py", "x", workdir=tmp_path / "w")
    assert refused.returncode == 2
    assert "asks for torch==2.0.0, but trainflow's environments lock torch at 2.14.1" in refused.stderr


@pytest.mark.parametrize(
    ("files", "args", "says"),
    [
        ({"train.py": "def f(:\n"}, ["train.py"], r"^error: train.py, line 1: SyntaxError: "),
        ({"train.py": ""}, ["main.py"], r"^error: .*the entry main.py does not exist in "),
        ({"train.py": ""}, ["train.py", "--out", "${{outputs}}"], r"^error: .*\$\{\{outputs\}\} is not a placeholder"),
        ({"train.py": ""}, ["train.py", "--data", "${{data}}"], r"^error: .*pass --data FOLDER"),
    ],
)
def test_the_checks_before_anything_starts_refuse_in_one_line(tmp_path, files, args, says):
    source = scripts_folder(tmp_path, files)
    done = trainflow("--script", str(source), "--", *args, workdir=tmp_path / "w")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(says, done.stderr.strip()), done.stderr
    assert not (tmp_path / "w" / "runs").exists()


def test_the_trainers_own_options_are_refused_beside_a_script_naming_where_its_arguments_go(tmp_path):
    source = scripts_folder(tmp_path, {"train.py": ""})
    done = trainflow("--script", str(source), "--batch-size", "8", "--", "train.py", workdir=tmp_path / "w")
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: --batch-size set trainflow's own trainer, which a --script run does not start; your script takes its "
        "own arguments after -- (e.g. -- train.py --batch-size 64)"
    )


def test_the_dry_run_shows_the_resolved_command_and_the_variables_it_sets(tmp_path):
    done = trainflow("--dry-run", *SEGMENTATION, workdir=tmp_path / "w")
    assert done.returncode == 0, done.stderr
    assert "scriptrun/rank.py train.py --epochs 2 --checkpoint-dir " in done.stdout
    assert "/runs/<run id>/checkpoints --log-dir " in done.stdout
    assert "TRAINFLOW_CHECKPOINT_DIR" in done.stdout and "MLFLOW_RUN_ID" in done.stdout
    assert not (tmp_path / "w" / "runs").exists()


RESUMING = """\
import os, pathlib, sys, time
checkpoints = pathlib.Path(sys.argv[1])
rank = os.environ["RANK"]
if (checkpoints / f"step-{rank}").exists():
    print("resumed from", (checkpoints / f"step-{rank}").read_text(), flush=True)
    sys.exit(0)
(checkpoints / f"step-{rank}").write_text("1")
print("checkpoint written", flush=True)
while True:  # the run goes on until it is stopped
    time.sleep(1)
"""


def test_ctrl_c_stops_every_rank_and_the_same_command_resumes_the_same_run(tmp_path):
    source = scripts_folder(tmp_path, {"train.py": RESUMING})
    args = ["run", "--workdir", str(tmp_path / "w"), "--script", str(source), "--", "train.py", "${{checkpoints}}"]
    run = Command(*args)
    run.wait_for("[rank 0] checkpoint written", "[rank 1] checkpoint written")  # both, or a rank starts afresh
    started = run.family()
    run.signal(signal.SIGINT)
    output = run.finish()
    assert run.proc.returncode == 130, output[-3000:]
    assert gone(started, 5) == []
    [first] = (tmp_path / "w" / "runs").iterdir()
    again = Command(*args)
    output = again.finish(300)
    assert again.proc.returncode == 0, output[-3000:]
    assert "[rank 0] resumed from 1" in output and "[rank 1] resumed from 1" in output
    assert [p.name for p in (tmp_path / "w" / "runs").iterdir()] == [first.name]
    assert json.loads((first / "run.json").read_text())["status"] == "complete"
