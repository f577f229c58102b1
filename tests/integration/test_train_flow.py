"""The end-to-end flow on the local default: Azurite, local folders, a process or docker pool, 2 workers."""

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from uuid import UUID

import psutil
import pytest
from prefect import flow, get_client, task
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.client.schemas.sorting import ArtifactSort
from prefect.runtime import flow_run
from prefect.testing.utilities import prefect_test_harness

from flows.config import FlowConfig
from flows.plan import plan_run
from flows.train_flow import train_flow
from infra.compute import JobTimedOut
from infra.compute.docker_nodes import LABEL
from infra.core.errors import BadInput
from infra.data.manifest import sha256_file
from infra.engines.contract import REPO
from infra.engines.launchers import LaunchError
from infra.images.registry import ImageError
from infra.runs.ledger import estimate
from infra.services.azurite import running_azurite
from infra.storage.blobstore import open_store
from tasks.train_on_pool import attempts_artifact
from tests.conftest import image_config
from tests.unit.test_retry_policy import task_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(3600)]
SMALL = dict(
    model="resnet18",
    epochs=1,
    batch_size=16,
    image_size=32,
    hflip=False,
    loader_workers=1,
    threads=1,
    warmup_epochs=0,
    lr=0.05,
    log_every=5,
)


@pytest.fixture(scope="module")
def prefect_server():
    with prefect_test_harness(server_startup_timeout=120):
        yield


def config(workdir: Path, data: Path | str, **sections) -> FlowConfig:
    values = {"workdir": workdir, "data": str(data), "training": {**SMALL, **sections.pop("training", {})}, **sections}
    return FlowConfig.model_validate(values)


def artifacts_of(run_id: str) -> dict[str, object]:
    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(run_id)])),
                sort=ArtifactSort.KEY_ASC,
                limit=50,
            )

    return {a.key: a for a in asyncio.run(read())}


def blob_sha256(cfg: FlowConfig, name: str, scratch: Path) -> str:
    """SHA-256 of blob `name` read back from the flow's own Azurite (its data stays under the workdir)."""
    with running_azurite(cfg.workdir / "azurite") as port:
        open_store(cfg.storage, port, "read").download_to(name, scratch)
    return sha256_file(scratch)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def test_whole_flow_on_the_process_pool_then_a_cached_rerun_and_a_dry_run(prefect_server, digits, tmp_path):
    cfg = config(tmp_path / "work", digits)
    planned = {row["step"]: row for row in plan_run(cfg)}  # the dry run first, on a fresh workdir
    result = train_flow(cfg)
    for step in result["steps"]:  # each step did what the dry run said it would, and moved what it said
        assert {k: step["plan"][k] for k in ("step", "action", "detail")} == planned[step["plan"]["step"]]
        assert step["files"] == step["plan"].get("files", step["files"])
    assert result["command"] == planned["run-training"]["detail"].replace("<run id>", result["run_id"]).replace(
        "<mlflow run id>", result["tracking"]["run_id"]
    )
    shared = tmp_path / "work" / "fileshare" / "results" / result["run_id"]
    metrics = json.loads((shared / "metrics.json").read_text())
    assert metrics["status"] == "complete" and metrics["world_size"] == 2
    scripts = tmp_path / "work" / "fileshare" / result["scripts"]
    assert metrics["trainer"] == str((scripts / "trainer").resolve())  # the version on the share, not the checkout
    assert (shared / "model.pt").exists() and (shared / "logs" / "rank1.log").read_text()
    assert list((shared / "checkpoints").iterdir())
    assert result["results"]["model_blob"] == f"results/{result['run_id']}/model.pt"
    model = tmp_path / "work" / "runs" / result["run_id"] / "model.pt"
    assert blob_sha256(cfg, result["results"]["model_blob"], tmp_path / "read-back") == sha256_file(model)
    assert result["pool"]["backend"] == "process" and not (tmp_path / "work" / "pools" / result["run_id"]).exists()
    artifacts = artifacts_of(result["run_id"])
    assert {"run-summary", "epochs", "training-plot", "results"} <= set(artifacts)
    summary = artifacts["run-summary"].data
    for needle in ("digits", "resnet18", "world size: 2", "images/s", "val top-1", "run-training"):
        assert needle in summary, needle
    assert "<polyline" in artifacts["training-plot"].data
    assert json.loads(artifacts["epochs"].data)[0]["epoch"] == 1
    again = train_flow(cfg)  # unchanged scripts and data: nothing moves, straight to training
    assert [step["files"] for step in again["steps"]] == [0, 0, 0]
    assert [step["skipped files"] > 0 for step in again["steps"]] == [True] * 3
    assert again["metrics"]["status"] == "complete" and again["run_id"] != result["run_id"]
    before = snapshot(tmp_path / "work")
    plan = {row["step"]: row for row in plan_run(cfg)}
    assert [plan[s]["action"] for s in ("upload-scripts", "upload-dataset", "sync-to-file-server")] == ["skip"] * 3
    assert plan["run-training"]["action"] == "run" and "torch.distributed.run" in plan["run-training"]["detail"]
    assert snapshot(tmp_path / "work") == before
    check_ledgers_receipts_and_runs(cfg, result, again, summary)


def trainflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "trainflow"), *args], capture_output=True, text=True, timeout=120
    )


def check_ledgers_receipts_and_runs(cfg: FlowConfig, first: dict, second: dict, summary: str) -> None:
    """Each run's folder holds its ledger and receipt; the next estimate is the newest run's measured time; `trainflow
    runs` lists both runs and `runs diff` tells them apart (reusing the runs of the whole-flow test)."""
    for result in (first, second):
        folder = cfg.workdir / "runs" / result["run_id"]
        ledger = json.loads((folder / "ledger.json").read_text())
        training = {row["step"]: row for row in ledger["steps"]}["run-training"]
        assert training["nodes"] == 1 and training["node_seconds"] == training["seconds"] > 0
        assert {row["nodes"] for row in ledger["steps"]} == {1}  # the process pool is this one machine
        assert ledger["total"]["gpu_hours"] == 0 and ledger["total"]["cost"] == 0  # CPU workers, no priced machine
        receipt = json.loads((folder / "receipt.json").read_text())
        metrics = json.loads((folder / "metrics.json").read_text())
        assert receipt == result["receipt"] and receipt["world_size"] == 2 and receipt["seed"] == cfg.training.seed
        assert receipt["parameter_digest"] == metrics["parameter_digest"] and receipt["scripts"] == result["scripts"]
        assert receipt["data"].endswith(f"/v-{receipt['data_manifest']}")  # the staged version training read
        assert receipt["inputs"] == json.loads((folder / "run.json").read_text())["fingerprint"]
    assert "| run-training | 1 |" in summary and "GPU-hours lost to failed or pre-empted attempts: 0.0000" in summary
    assert estimate(cfg)["how"].startswith(f"run {second['run_id']}'s measured training time")
    listed = trainflow("runs", "--workdir", str(cfg.workdir), "--json")
    rows = json.loads(listed.stdout)
    assert [r["run_id"] for r in rows] == [first["run_id"], second["run_id"]]
    assert [r["receipt"] for r in rows] == [first["receipt"], second["receipt"]]
    assert all(r["status"] == "complete" and r["val_top1"] is not None and r["node_hours"] > 0 for r in rows)
    table = trainflow("runs", "--workdir", str(cfg.workdir))
    assert table.returncode == 0 and first["run_id"][:8] in table.stdout and second["run_id"][:8] in table.stdout
    diff = trainflow("runs", "diff", first["run_id"][:8], second["run_id"][:8], "--workdir", str(cfg.workdir))
    assert diff.returncode == 0, diff.stderr
    fields = {line.split("│")[1].strip() for line in diff.stdout.splitlines() if line.count("│") == 4}
    assert {"receipt.run_id", "metrics.wall_seconds"} <= fields
    assert not fields & {"receipt.config_hash", "receipt.data_manifest", "receipt.scripts", "receipt.inputs"}
    print(table.stdout, diff.stdout, sep="\n")  # the README's examples


def test_a_run_over_its_budget_is_refused_before_anything_starts(prefect_server, tmp_path):
    cfg = config(
        tmp_path / "work",
        "synthetic",
        budget=1,
        cost={"this_machine": "Standard_NC24ads_A100_v4"},
        job={"timeout_s": 3600},
    )
    with pytest.raises(BadInput, match=r"^the run's estimate is 7.34 USD .*, over budget 1 USD"):
        train_flow(cfg)  # as a deployment or a schedule starts it, past the command line's own check
    assert not (tmp_path / "work").exists()  # no lock, no Azurite, no pool, no run folder


def kill_rank_one(done: threading.Event, times: int, ready, kills: list[float], mine) -> None:
    """Kill the rank-1 worker (SIGKILL, no last words) of this test's run (`mine(proc, argv)`: the suite runs two
    tests at once, and the other's workers are not this one's to kill) once `ready()` holds, `times` times; `kills`
    gets the time.monotonic() of each kill."""
    while times and not done.is_set():
        for proc in psutil.process_iter(["cmdline"]):
            try:
                argv = proc.info["cmdline"] or []
                if (
                    any(a.endswith("train.py") for a in argv)
                    and "--check" not in argv
                    and mine(proc, argv)
                    and proc.environ().get("RANK") == "1"
                ):
                    while not ready() and not done.is_set():
                        time.sleep(0.2)
                    proc.kill()
                    kills.append(time.monotonic())
                    times -= 1
                    break
            except (psutil.Error, OSError):
                continue
        time.sleep(0.5)


def writing_under(folder: Path):
    """A process pool's worker of a run under `folder` (its --out is there)."""
    return lambda proc, argv: str(folder) in " ".join(argv)


def in_a_container(proc: psutil.Process, argv: list[str]) -> bool:
    """A container node's process (another PID namespace): one worker of the suite runs every Docker test."""
    return os.readlink(f"/proc/{proc.pid}/ns/pid") != os.readlink("/proc/self/ns/pid")


@contextmanager
def killing_rank_one(mine, times: int, ready=lambda: True):
    done, kills = threading.Event(), []
    threading.Thread(target=kill_rank_one, args=(done, times, ready, kills, mine), daemon=True).start()
    try:
        yield kills
    finally:
        done.set()


def test_a_job_retried_after_a_worker_died_resumes_from_its_checkpoint(prefect_server, digits, tmp_path):
    checkpointed = lambda: any((tmp_path / "work" / "runs").glob("*/checkpoints/step-*.pt"))  # noqa: E731
    with killing_rank_one(writing_under(tmp_path), times=1, ready=checkpointed):
        result = train_flow(config(tmp_path / "work", digits, training={"epochs": 2, "checkpoint_every": 5}))
    metrics = result["metrics"]
    assert metrics["status"] == "complete" and metrics["resumed_from_steps"] and metrics["resumed_from_steps"][0] >= 5


def test_a_worker_killed_mid_run_fails_the_flow_and_leaves_no_pool(prefect_server, digits, tmp_path):
    with (
        killing_rank_one(writing_under(tmp_path), times=2),
        pytest.raises(LaunchError, match=r"rank 1 was killed by signal 9 \(SIGKILL\)"),
    ):
        train_flow(config(tmp_path / "work", digits, training={"epochs": 200}))
    assert not list((tmp_path / "work" / "pools").iterdir())
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def test_a_job_past_its_timeout_is_stopped_and_not_retried(prefect_server, digits, tmp_path):
    state = train_flow(
        config(tmp_path / "work", digits, job={"timeout_s": 8}, training={"epochs": 200}), return_state=True
    )
    with pytest.raises(JobTimedOut, match="ran past its timeout of 8 s"):
        state.result()
    training = task_runs(state.state_details.flow_run_id, {"run-training"})["run-training"]
    assert (training.run_count, training.state.type.value) == (1, "FAILED")  # a retry would be attempt 2
    assert not list((tmp_path / "work" / "pools").iterdir())
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def test_a_data_set_never_staged_fails_before_any_pool(prefect_server, digits, tmp_path):
    with pytest.raises(BadInput, match="data set 'never-uploaded' was never staged"):
        train_flow(config(tmp_path / "work", "staged", dataset="never-uploaded"))
    assert not (tmp_path / "work" / "pools").exists() and not (tmp_path / "work" / "runs").exists()


def test_a_missing_image_fails_before_anything_moves(
    prefect_server, docker_engine, registry, digits, tmp_path, monkeypatch
):
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    for missing, where in (
        (f"{registry.host}/trainflow-cpu:never-pushed", f"registry {registry.host} does not hold"),
        ("trainflow-cpu:never-built", "the local Docker engine does not hold"),
    ):
        image = image_config(registry, use=missing).model_dump()
        cfg = config(
            tmp_path / "work",
            digits,
            image=image,
            pool={"backend": "docker", "nodes": 2, "slots_per_node": 1},
            training={"launcher": "horovodrun"},
        )
        with pytest.raises(ImageError, match=where):
            train_flow(cfg)
    assert not (tmp_path / "work" / "fileshare").exists() and not (tmp_path / "work" / "pools").exists()


def crash_with_a_pool(image: str, run_id: str) -> None:
    """A process that starts a docker pool and dies without deleting it (a crashed run)."""
    code = (
        "import os\nfrom pathlib import Path\nfrom infra.compute import PoolConfig, RunPaths\n"
        "from infra.compute.docker import DockerPool\n"
        f"DockerPool(PoolConfig(backend='docker', nodes=1), RunPaths({run_id!r}, Path('synthetic'), Path('/tmp'), "
        f"Path('/tmp/{run_id}')), {image!r}).create()\n"
        "os._exit(9)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 9


def test_whole_flow_on_the_docker_pool(
    prefect_server, docker_engine, registry, cpu_image, digits, tmp_path, monkeypatch
):
    crash_with_a_pool(cpu_image["image"], "crashed-run")
    assert docker_engine.client.containers.list(all=True, filters={"label": f"{LABEL}=crashed-run"})
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    image = image_config(registry).model_dump()
    cfg = config(
        tmp_path / "work",
        digits,
        image=image,
        pool={"backend": "docker", "nodes": 2, "slots_per_node": 1},
        training={"launcher": "horovodrun"},
    )
    result = train_flow(cfg)
    assert not docker_engine.client.containers.list(all=True, filters={"label": f"{LABEL}=crashed-run"})
    assert result["image"] == cpu_image["image"]
    assert result["metrics"]["backend"] == "horovod" and result["metrics"]["world_size"] == 2
    assert result["metrics"]["trainer"] == f"/scripts/{Path(result['scripts']).name}/trainer"
    shared = tmp_path / "work" / "fileshare" / "results" / result["run_id"]
    assert (shared / "model.pt").exists() and (shared / "logs" / "rank1.log").read_text()
    assert sorted(result["pool"]["nodes"]) == [f"trainflow-{result['run_id']}-node{i}" for i in range(2)]
    assert not docker_engine.client.containers.list(all=True, filters={"label": f"trainflow.run={result['run_id']}"})


def docker_config(tmp_path: Path, data: Path, registry, **training) -> FlowConfig:
    """Two container nodes of one slot each, torchrun on each."""
    return config(
        tmp_path / "work",
        data,
        image=image_config(registry).model_dump(),
        pool={"backend": "docker", "nodes": 2, "slots_per_node": 1},
        training={"launcher": "torchrun", **training},
    )


def test_a_two_stage_pipeline_across_two_container_nodes(
    prefect_server, docker_engine, registry, cpu_image, digits, tmp_path, monkeypatch
):
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    cfg = docker_config(tmp_path, digits, registry, parallel="pipeline", stages=2, microbatches=2, steps_per_epoch=4)
    plan = {r["step"]: r for r in plan_run(cfg)}["run-training"]["detail"]
    assert (
        "node0: python -m torch.distributed.run --nnodes 2" in plan and "| node1: " in plan and "--node_rank 1" in plan
    )
    result = train_flow(cfg)
    assert result["command"] == plan  # the job ran the commands the dry run printed
    metrics = result["metrics"]
    assert metrics["status"] == "complete" and metrics["backend"] == "ddp" and metrics["world_size"] == 2
    assert metrics["parallel"] == "pipeline" and metrics["pipeline"]["stages"] == 2
    logs = tmp_path / "work" / "fileshare" / "results" / result["run_id"] / "logs"
    for rank in (0, 1):  # stage r ran on node r
        assert f"worker {rank} of 2 (ddp) on host node{rank}" in (logs / f"rank{rank}.log").read_text()
    assert not docker_engine.client.containers.list(all=True, filters={"label": f"{LABEL}={result['run_id']}"})


def test_a_worker_killed_on_a_container_node_fails_the_job_at_once(
    prefect_server, docker_engine, registry, cpu_image, digits, tmp_path, monkeypatch
):
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    cfg = docker_config(tmp_path, digits, registry, epochs=20)
    cfg.job.timeout_s = 300  # a job hung on its lost peer ends here, not at pytest's limit (and breaks the bound)
    with killing_rank_one(in_a_container, times=2) as kills:
        state = train_flow(cfg, return_state=True)
    ended = time.monotonic()
    with pytest.raises(LaunchError, match=r"^rank 1 was killed by signal 9 \(SIGKILL\)"):
        state.result()
    training = task_runs(state.state_details.flow_run_id, {"run-training"})["run-training"]
    assert (len(kills), training.run_count) == (2, 2)  # killed in each attempt: the one retry, then the failure
    # Measured 3.1 s from the second kill to the flow's end (the job's failure, the pool deleted). Another attempt
    # would wait 5 s, then train 20 epochs unkilled (minutes); a job hung on its lost peer would run to the 300 s
    # timeout: either breaks 30 s, which leaves room for a loaded machine.
    assert ended - kills[-1] < 30, f"the flow ended {ended - kills[-1]:.0f} s after the second kill"
    assert not docker_engine.client.containers.list(all=True, filters={"label": LABEL})


def test_the_flow_passes_the_pipeline_mode_to_the_job(prefect_server, digits, tmp_path):
    cfg = config(
        tmp_path / "work",
        digits,
        training={"parallel": "pipeline", "stages": 2, "microbatches": 2, "steps_per_epoch": 4},
    )
    assert (
        "--parallel pipeline --stages 2 --microbatches 2"
        in {r["step"]: r for r in plan_run(cfg)}["run-training"]["detail"]
    )
    result = train_flow(cfg)
    metrics = result["metrics"]
    assert metrics["parallel"] == "pipeline" and metrics["pipeline"]["stages"] == 2 and metrics["status"] == "complete"
    assert metrics["world_size"] == 2 and metrics["pipeline"]["replicas"] == 1


def test_the_attempts_a_backend_made_become_a_table_artifact(prefect_server):
    rows = [
        {
            "attempt": 1,
            "job": "trainflow-r-train-1",
            "ended": "Failed",
            "why": "pre-empted (low-priority nodes taken back)",
            "minutes": 1.0,
            "gpu_hours": 0.27,
            "last_step": 60,
            "last_checkpoint": 40,
            "lost_steps": 20,
        }
    ]

    @flow
    def report(attempts: list[dict]) -> str:
        task(attempts_artifact)(attempts)  # inside a task, as the run-training step makes it
        return flow_run.get_id()

    assert json.loads(artifacts_of(report(rows))["attempts"].data) == rows
    assert "attempts" not in artifacts_of(report([]))  # a one-attempt job adds none
