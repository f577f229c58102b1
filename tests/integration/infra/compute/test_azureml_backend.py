"""The azureml backend at run time, against tests/fakes/azureml.py (Azure ML's rules, real processes): the
cluster created and left as configured, the job submitted, streamed, mapped, cancelled, pre-empted and resumed by
a new attempt, its results downloaded; the data reaching the nodes (the node-side fetch, the per-node mount)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from azure.ai.ml.exceptions import MlException
from azure.core.exceptions import HttpResponseError

from flows.config import load_config
from infra.compute import PoolError, RunPaths, run_job
from infra.compute.azureml.cluster import AzureMLPool
from infra.compute.azureml.specs import compute_spec, nfs_mount
from infra.data import manifest as mf
from infra.engines.contract import SYNTHETIC
from infra.engines.launchers import LaunchError, RankRefused
from infra.engines.program import RUNTIME
from infra.engines.script import ScriptProgram
from infra.engines.script_files import script_files
from infra.storage.fileshare import LocalFolderShare
from nodelib.image_files import find_bad_images
from nodelib.records import Progress, read_event
from tasks.upload_scripts import upload_scripts
from tests.fakes.azureml import Workspace
from tests.fakes.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
AZURE = REPO / "flows" / "configs" / "azure.yaml"
TINY = dict(
    launcher="torchrun",
    workers=2,
    model="resnet18",
    epochs=1,
    batch_size=8,
    image_size=16,
    num_classes=4,
    steps_per_epoch=6,
    hflip=False,
    loader_workers=0,
    threads=1,
    warmup_epochs=0,
    log_every=1,
    checkpoint_every=2,
    device="cpu",
)


def azure_run(
    tmp_path: Path, data: str = SYNTHETIC, training: dict = TINY, **azureml
) -> tuple[Workspace, AzureMLPool, object]:
    """A workspace stand-in, the scripts version in its file datastore, and the run's pool bound to it."""
    ws = Workspace(tmp_path / "azure")
    for package in ("trainer", "nodelib"):  # the training package and the node-side library it runs on
        shutil.copytree(REPO / "containers" / package, ws.datastore("trainflow_files") / f"scripts/v1/{package}")
    cfg = load_config(
        AZURE,
        {
            "workdir": tmp_path / "work",
            "data": data,
            "training": training,
            "pool": {
                "nodes": training["workers"],
                "slots_per_node": 1,
                "vm_size": "Standard_NC24ads_A100_v4",
                "max_nodes": 2,
                **azureml,
            },
        },
        environ={},
    )
    run = RunPaths("run1", Path(data), Path("scripts/v1"), tmp_path / "out", "digits" if data != SYNTHETIC else "")
    image = "registry.example/trainflow-gpu@sha256:" + "0" * 64
    pool = AzureMLPool(cfg.pool, run, image, cfg.image, runtime=RUNTIME, _client=ws.client())  # the image's code: ours
    return ws, pool, cfg


def at_step(line: str, step: int) -> bool:
    """The line is the trainer's progress event of `step` (the event, not the line for people before it: the client
    counts steps from events, and a kill between the two would leave the step unseen)."""
    event = read_event(line)
    return isinstance(event, Progress) and event.step == step


def fast(job):
    job.poll_seconds = 0.05
    return job


def test_a_run_creates_the_cluster_streams_completes_and_downloads_the_results(tmp_path):
    ws, pool, cfg = azure_run(tmp_path)
    seen: list[str] = []
    pool.create()
    pool.wait_until_ready()
    job = fast(pool.job(cfg.training, 0))
    run_job(job, pool.run.out / "logs", seen.append, 0)
    pool.delete()
    metrics = (pool.run.out / "metrics.json").read_text()
    assert '"world_size": 2' in metrics and (pool.run.out / "model.pt").is_file()  # downloaded from Blob
    assert any(line.startswith("[rank 0]") for line in seen)  # streamed (rank 0's log, as jobs.stream shows it)
    assert [a["ended"] for a in job.attempts()] == ["Completed"] and job.attempts()[0][
        "job"
    ] == "trainflow-run1-train-1"
    found = ws.client().compute.get(cfg.pool.compute)  # the cluster as configured, identity kept
    assert (found.size, found.tier, found.min_instances, found.max_instances) == (
        "Standard_NC24ads_A100_v4",
        "dedicated",
        0,
        2,
    )
    assert found.identity.type == "system_assigned" and found.network_settings.subnet.endswith("/subnets/compute")
    assert ("compute.begin_update", cfg.pool.compute) not in ws.calls  # min nodes 0: nothing sent at the end


def test_a_preempted_attempt_is_followed_by_one_that_resumes_and_the_lost_work_is_reported(tmp_path):
    ws, pool, cfg = azure_run(tmp_path, low_priority=True)
    ws.preempt = lambda name, line: name.endswith("-train-1") and at_step(line, 3)  # after step 2's checkpoint
    pool.create()
    job = fast(pool.job(cfg.training.model_copy(update={"steps_per_epoch": 40}), 0))
    run_job(job, pool.run.out / "logs", lambda line: None, 0)
    first, second = job.attempts()
    assert (first["job"], first["ended"], second["job"], second["ended"]) == (
        "trainflow-run1-train-1",
        "Failed",
        "trainflow-run1-train-2",
        "Completed",
    )
    assert first["why"].startswith("pre-empted") and first["last_checkpoint"] >= 2
    assert first["lost_steps"] == first["last_step"] - first["last_checkpoint"] >= 1
    metrics = json.loads((pool.run.out / "metrics.json").read_text())  # attempt 2 went on from the newest checkpoint
    (resumed,) = metrics["resumed_from_steps"]  # (one the log had not shown yet when the nodes went, at the most)
    assert first["last_checkpoint"] <= resumed < 40 and metrics["global_step"] == 40


def test_attempts_are_bounded_and_a_cancelled_job_is_not_retried(tmp_path):
    ws, pool, cfg = azure_run(tmp_path, low_priority=True, max_attempts=2)
    ws.preempt = lambda name, line: " step " in line and "checkpoint" not in line  # every attempt, at its first step
    pool.create()
    job = fast(pool.job(cfg.training.model_copy(update={"steps_per_epoch": 40}), 0))
    with pytest.raises(LaunchError, match="no attempts left \\(pool.max_attempts 2\\)"):
        run_job(job, pool.run.out / "logs", lambda line: None, 0)
    assert [a["ended"] for a in job.attempts()] == ["Failed", "Failed"] and len(ws.jobs) == 2

    ws2, pool2, cfg2 = azure_run(tmp_path / "cancel")
    pool2.create()
    job2 = fast(pool2.job(cfg2.training, 0))

    def interrupt(line: str) -> None:  # the flow run is cancelled (Ctrl-C) while the job streams
        if "step 1 " in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_job(job2, pool2.run.out / "logs", interrupt, 0)
    assert ("jobs.begin_cancel", "trainflow-run1-train-1") in ws2.calls
    deadline = time.monotonic() + 30
    while job2.code is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ws2.jobs["trainflow-run1-train-1"].status == "Canceled" and len(job2.attempts()) == 1
    for proc in ws2.jobs["trainflow-run1-train-1"].procs:  # nothing left running: killed, gone within seconds
        proc.wait(timeout=10)  # (SIGKILL is sent before the status turns Canceled; the exit is not instant)


def test_the_service_rules_the_backend_meets(tmp_path):
    ws, pool, cfg = azure_run(tmp_path)
    client = ws.client()
    pool.create()
    first = client.jobs.create_or_update(pool.job(cfg.training, 0).spec)
    with pytest.raises(HttpResponseError, match="already exists"):  # a retry under the same name is refused
        client.jobs.create_or_update(pool.job(cfg.training, 0).spec)
    client.jobs.begin_cancel(first.name)  # and nothing of it left running
    pool.create()  # again, as the next run does: the cluster is as configured, so nothing is sent
    assert ws.calls.count(("compute.begin_create_or_update", cfg.pool.compute)) == 1
    found = client.compute.get(cfg.pool.compute)  # get + begin_update sends "subnet": {} (finding 4)
    with pytest.raises(HttpResponseError, match="id is required"):
        client.compute.begin_update(found)
    changed = pool.pool.model_copy(update={"vm_size": "Standard_ND96asr_v4"})
    with pytest.raises(PoolError, match=r"pool.vm_size .*cannot change them in place"):
        AzureMLPool(changed, pool.run, pool.image, pool.image_cfg, _client=client).create()
    ws.private_endpoint = False
    with pytest.raises(HttpResponseError, match="requires workspace private endpoint"):
        client.compute.begin_create_or_update(compute_spec(pool.pool.model_copy(update={"compute": "other"}), 1))


def test_at_the_end_the_cluster_is_scaled_to_zero_by_its_whole_spec_or_deleted(tmp_path):
    ws, pool, cfg = azure_run(tmp_path, min_nodes=1)
    pool.create()
    pool.delete()  # scale_to_zero with min nodes 1: the whole spec again, min nodes 0, identity and subnet kept
    found = ws.client().compute.get(cfg.pool.compute)
    assert found.min_instances == 0 and found.identity.type == "system_assigned" and found.network_settings.subnet
    gone = AzureMLPool(
        pool.pool.model_copy(update={"at_end": "delete"}),
        pool.run,
        pool.image,
        pool.image_cfg,
        _client=ws.client(),
    )
    gone.delete()
    assert cfg.pool.compute not in ws.computes


def test_results_on_azure_files_cannot_be_downloaded(tmp_path):
    ws, pool, cfg = azure_run(tmp_path, blob_datastore="trainflow_files")  # the old layout: results on the share
    pool.create()
    job = fast(pool.job(cfg.training, 0))
    with pytest.raises(Exception):  # noqa: B017 - whatever the attempt fails with, it is not a download
        run_job(job, pool.run.out / "logs", lambda line: None, 0)
    with pytest.raises(MlException, match="Supported types are AzureBlob and AzureDataLakeGen2"):
        ws.client().jobs.download(job.name, download_path=tmp_path / "dl", output_name="results")


def stage_to(root: Path, data: Path, name: str) -> None:
    """The data set as the upload step stages it (manifest and shards), into a datastore folder."""
    (root / mf.dataset_prefix(name) / "shards").mkdir(parents=True)
    with mf.scanned(data, root / "index.sqlite", find_bad_images, keep=False) as (index, _):
        header = {
            "format": mf.FORMAT,
            "dataset": name,
            "version": index.plan_shards(2),
            "shard_count": 2,
            "files": index.total()[0],
            "bytes": index.total()[1],
            "verified": {"check": "decode", "bad": []},
        }
        for sid in index.shards.values():
            mf.write_shard(data, index.shard_files(sid), root / mf.shard_blob(name, sid))
        mf.write_manifest(index, header, root / mf.manifest_blob(name))


@pytest.mark.parametrize("mode", ["ro_mount", "download"])
def test_the_nodes_fetch_the_staged_shards_from_blob_to_their_local_disk(tmp_path, digits, mode):
    disk = tmp_path / "node-disk"
    ws, pool, cfg = azure_run(tmp_path, data=str(digits), data_source="blob", blob_mode=mode, local_disk=str(disk))
    stage_to(ws.datastore("trainflow_blob"), digits, "digits")
    pool.create()
    job = fast(pool.job(cfg.training.model_copy(update={"num_classes": 10}), 0))
    run_job(job, pool.run.out / "logs", lambda line: None, 0)
    assert (disk / "datasets/digits/current/.manifest.jsonl").is_file()
    metrics = json.loads((pool.run.out / "metrics.json").read_text())  # trained on the unpacked copy
    assert (metrics["data"], metrics["num_classes"]) == (str(disk / "datasets/digits/current"), 10)


def test_the_node_side_fetch_runs_once_per_node_and_the_others_wait(tmp_path, digits):
    source, export = tmp_path / "blob", tmp_path / "disk"
    stage_to(source, digits, "digits")
    command = [
        sys.executable,
        str(REPO / "containers/nodelib/staged/fetch.py"),
        "--source",
        str(source / mf.dataset_prefix("digits")),
        "--export",
        str(export),
        "--dataset",
        "digits",
    ]
    ranks = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [r.communicate()[0] for r in ranks]
    assert [r.returncode for r in ranks] == [0, 0, 0] and len({o.split()[-1] for o in outs}) == 1
    current = export / "datasets/digits/current"
    with mf.Manifest.load(current / ".manifest.jsonl", tmp_path / "m.db") as manifest:
        assert len(list((export / "datasets/digits").glob("v-*"))) == 1 and not mf.sizes_match(current, manifest.rows())
    assert json.loads((current / ".verified.json").read_text())["bad"] == []  # the ranks decode no image again
    missing = subprocess.run(command[:3] + [str(tmp_path / "nothing")] + command[4:], capture_output=True, text=True)
    assert missing.returncode == 2 and "never staged" in missing.stderr


def test_the_nfs_mount_happens_once_per_node_while_the_other_ranks_wait(tmp_path):
    """NFS cannot run here: `mount`/`mountpoint` are stand-ins that record; the lock and the check are real."""
    bin_dir, mounted = tmp_path / "bin", tmp_path / "mounted"
    bin_dir.mkdir()
    (bin_dir / "mount").write_text(f'#!/bin/sh\nsleep 0.5; echo "$@" >> {tmp_path}/mounts; touch {mounted}\n')
    (bin_dir / "mountpoint").write_text(f"#!/bin/sh\ntest -e {mounted}\n")
    for tool in ("mount", "mountpoint"):
        (bin_dir / tool).chmod(0o755)
    _, pool, cfg = azure_run(tmp_path)
    snippet = nfs_mount(cfg.pool, "ro").replace("/tmp/trainflow-nfs.lock", str(tmp_path / "lock"))
    snippet = snippet.replace("mkdir -p /mnt/fileserver", "true") + "echo ready"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    ranks = [subprocess.Popen(["sh", "-c", snippet], stdout=subprocess.PIPE, text=True, env=env) for _ in range(4)]
    assert [r.communicate()[0].strip() for r in ranks] == ["ready"] * 4
    assert len((tmp_path / "mounts").read_text().splitlines()) == 1


def test_a_keras_run_is_an_mpi_job_in_the_tensorflow_image(tmp_path):
    """TensorFlow and Keras train under Horovod: on Azure ML an MPI job (1 rank per node here: the stand-in has no
    mpirun) in the TensorFlow image; the model comes back as model.keras."""
    training = {k: v for k, v in TINY.items() if k not in ("launcher", "workers")}
    ws, pool, cfg = azure_run(tmp_path, training={**training, "framework": "keras", "workers": 1})
    pool.image = "registry.example/trainflow-tf-gpu@sha256:" + "0" * 64
    pool.create()
    pool.wait_until_ready()
    job = fast(pool.job(cfg.training, 0))
    run_job(job, pool.run.out / "logs", lambda line: None, 0)
    pool.delete()
    [submitted] = [run.job for run in ws.jobs.values()]
    assert submitted.distribution.type == "mpi" and submitted.distribution.process_count_per_instance == 1
    assert submitted.environment.image == pool.image and "/trainer/tf/fit.py " in submitted.command
    metrics = json.loads((pool.run.out / "metrics.json").read_text())
    assert (metrics["framework"], metrics["status"]) == ("keras", "complete")
    assert (pool.run.out / "model.keras").is_file()  # downloaded from the job's output


def script_run(tmp_path: Path, source: Path, args: list[str], launcher: str = "torchrun", nodes: int = 2):
    """A user's script as an Azure ML run: its folder uploaded as a scripts version to the file datastore, the run's
    pool (the image's node-side code being this checkout's containers/) and its program."""
    ws = Workspace(tmp_path / "azure")
    _, folder, _ = upload_scripts(LocalFolderShare(ws.datastore("trainflow_files")), script_files(source))
    values = {
        "workdir": tmp_path / "work",
        "script": {"source": str(source), "entry": "train.py", "args": args},
        "training": {"launcher": launcher, "workers": nodes},
        "pool": {"nodes": nodes, "slots_per_node": 1, "vm_size": "Standard_NC24ads_A100_v4", "max_nodes": nodes},
    }
    cfg = load_config(AZURE, values, environ={})
    run = RunPaths("run1", Path(SYNTHETIC), Path(folder), tmp_path / "out", "")
    image = "registry.example/trainflow-gpu@sha256:" + "0" * 64
    pool = AzureMLPool(cfg.pool, run, image, cfg.image, runtime=RUNTIME, _client=ws.client())
    pool.create()
    return ws, pool, ScriptProgram(cfg.script, cfg.training, "run1")


def test_a_torchrun_script_runs_on_two_nodes_in_its_working_folder_and_its_files_come_back(tmp_path):
    source = REPO / "containers" / "examples" / "pytorch-segmentation"
    args = ["--epochs", "1", "--steps", "2", "--checkpoint-dir", "${{checkpoints}}", "--log-dir", "${{logs}}/tb"]
    ws, pool, program = script_run(tmp_path, source, [*args, "--output", "${{output}}"])
    seen: list[str] = []
    run_job(fast(pool.job(program, 0)), pool.run.out / "logs", seen.append, 0)
    [submitted] = [run.job for run in ws.jobs.values()]
    assert submitted.distribution.type == "pytorch" and submitted.resources.instance_count == 2
    assert "${{" not in "".join(submitted.environment_variables.values())  # never resolved there: in the command
    assert submitted.command.startswith("env TRAINFLOW_OUTPUT_DIR=${{outputs.results}}/outputs ")
    out = pool.run.out  # what the nodes made and the script wrote, downloaded from the job's output
    assert (out / "work" / "train.py").read_bytes() == (source / "train.py").read_bytes()
    assert (out / "outputs" / "model.pt").is_file() and list((out / "checkpoints").iterdir())
    assert any(line.startswith("[rank 0] epoch 1 loss=") for line in seen)  # rank 0's log, streamed
    summary = program.outcome(out)
    assert summary["world_size"] == 2 and summary["from"]["train/iou"] == "tensorboard"  # read back


def test_a_horovod_script_is_an_mpi_job_and_a_failing_one_is_named_and_not_retried(tmp_path):
    source = tmp_path / "mine"
    source.mkdir()
    (source / "train.py").write_text(
        "import argparse, sys\n"
        "import horovod.torch as hvd\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--fail', action='store_true')\n"
        "args = parser.parse_args()\n"
        "hvd.init()\n"
        "print(f'hello from {hvd.rank()} of {hvd.size()}', flush=True)\n"
        "if args.fail:\n"
        "    raise RuntimeError('the loss went NaN')\n"
    )
    ws, pool, program = script_run(tmp_path, source, [], "horovodrun", nodes=1)
    seen: list[str] = []
    run_job(fast(pool.job(program, 0)), pool.run.out / "logs", seen.append, 0)
    assert "[rank 0] hello from 0 of 1" in seen
    [submitted] = [run.job for run in ws.jobs.values()]
    assert submitted.distribution.type == "mpi" and " python " in f" {submitted.command}"
    ws, pool, program = script_run(tmp_path / "failing", source, ["--fail"], "horovodrun", nodes=1)
    job = fast(pool.job(program, 0))
    with pytest.raises(LaunchError, match=r"rank 0 failed: RuntimeError: the loss went NaN; its last lines") as err:
        run_job(job, pool.run.out / "logs", lambda line: None, 0)
    assert err.value.permanent and [a["ended"] for a in job.attempts()] == ["Failed"]  # one attempt: not retried
    ws, pool, program = script_run(tmp_path / "usage", source, ["--epochs", "3"], "horovodrun", nodes=1)
    with pytest.raises(RankRefused, match=r"unrecognized arguments: --epochs 3"):
        run_job(fast(pool.job(program, 0)), pool.run.out / "logs", lambda line: None, 0)
