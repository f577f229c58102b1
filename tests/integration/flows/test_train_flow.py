"""The end-to-end flow on the local default: Azurite, local folders, the process pool, 2 workers (the docker pool:
test_train_flow_docker.py)."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from uuid import UUID

import psutil
import pytest
from prefect import flow, get_client, task
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.client.schemas.sorting import ArtifactSort
from prefect.runtime import flow_run

from flows.config import FlowConfig
from flows.plan import plan_run
from flows.train_flow import train_flow
from infra.compute import JobTimedOut
from infra.core.errors import BadInput
from infra.data.manifest import sha256_file
from infra.engines.launchers import LaunchError
from infra.runs.ledger import estimate
from infra.services.azurite import running_azurite
from infra.storage.blobstore import open_store
from tasks.train_on_pool import attempts_artifact
from tests.fakes.flow_runs import flow_config, killing_rank_one, writing_under
from tests.fakes.prefect import task_runs

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(3600)]


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
    cfg = flow_config(tmp_path / "work", digits)
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
    assert result["results"]["blobs"] == [f"results/{result['run_id']}/model.pt"]
    model = tmp_path / "work" / "runs" / result["run_id"] / "model.pt"
    assert blob_sha256(cfg, result["results"]["blobs"][0], tmp_path / "read-back") == sha256_file(model)
    assert result["pool"]["backend"] == "process" and not (tmp_path / "work" / "pools" / result["run_id"]).exists()
    artifacts = artifacts_of(result["run_id"])
    assert {"run-summary", "epochs", "training-plot", "results"} <= set(artifacts)
    summary = artifacts["run-summary"].data
    for needle in ("digits", "resnet18", "world size: 2", "images/s", "val top-1", "run-training"):
        assert needle in summary, needle
    assert artifacts["training-plot"].data.count('id="axes_') == 3  # the run's chart: a panel per quantity
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
    print(table.stdout, diff.stdout, sep="\n")  # the examples of docs/concepts/tracking-and-cost.md


def test_a_run_over_its_budget_is_refused_before_anything_starts(prefect_server, tmp_path):
    cfg = flow_config(
        tmp_path / "work",
        "synthetic",
        budget=1,
        cost={"this_machine": "Standard_NC24ads_A100_v4"},
        job={"timeout_s": 3600},
    )
    with pytest.raises(BadInput, match=r"^the run's estimate is 7.34 USD .*, over budget 1 USD"):
        train_flow(cfg)  # as a deployment or a schedule starts it, past the command line's own check
    assert not (tmp_path / "work").exists()  # no lock, no Azurite, no pool, no run folder


def test_a_job_retried_after_a_worker_died_resumes_from_its_checkpoint(prefect_server, digits, tmp_path):
    checkpointed = lambda: any((tmp_path / "work" / "runs").glob("*/checkpoints/step-*.pt"))  # noqa: E731 - a one-line helper, read where it is used
    with killing_rank_one(writing_under(tmp_path), times=1, ready=checkpointed):
        result = train_flow(flow_config(tmp_path / "work", digits, training={"epochs": 2, "checkpoint_every": 5}))
    metrics = result["metrics"]
    assert metrics["status"] == "complete" and metrics["resumed_from_steps"] and metrics["resumed_from_steps"][0] >= 5


def test_a_worker_killed_mid_run_fails_the_flow_and_leaves_no_pool(prefect_server, digits, tmp_path):
    with (
        killing_rank_one(writing_under(tmp_path), times=2),
        pytest.raises(LaunchError, match=r"rank 1 was killed by signal 9 \(SIGKILL\)"),
    ):
        train_flow(flow_config(tmp_path / "work", digits, training={"epochs": 200}))
    assert not list((tmp_path / "work" / "pools").iterdir())
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def test_a_job_past_its_timeout_is_stopped_and_not_retried(prefect_server, digits, tmp_path):
    state = train_flow(
        flow_config(tmp_path / "work", digits, job={"timeout_s": 8}, training={"epochs": 200}), return_state=True
    )
    with pytest.raises(JobTimedOut, match="ran past its timeout of 8 s"):
        state.result()
    training = task_runs(state.state_details.flow_run_id, {"run-training"})["run-training"]
    assert (training.run_count, training.state.type.value) == (1, "FAILED")  # a retry would be attempt 2
    assert not list((tmp_path / "work" / "pools").iterdir())
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]


def test_a_data_set_never_staged_fails_before_any_pool(prefect_server, digits, tmp_path):
    with pytest.raises(BadInput, match="data set 'never-uploaded' was never staged"):
        train_flow(flow_config(tmp_path / "work", "staged", dataset="never-uploaded"))
    assert not (tmp_path / "work" / "pools").exists() and not (tmp_path / "work" / "runs").exists()


def test_the_flow_passes_the_pipeline_mode_to_the_job(prefect_server, digits, tmp_path):
    cfg = flow_config(
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


def test_the_fast_loader_decodes_only_the_crop_where_the_trainer_runs_from_the_share(
    prefect_server, tmp_path, monkeypatch
):
    """The scripts version carries jpeg_crop.c, so the workers of a run compile it once (for its digest) and decode
    only each crop: before, only the trainer's *.py travelled and every rank decoded whole images, saying so."""
    from infra.data.sample_data import write_imagenet_like

    jpegs = write_imagenet_like(tmp_path / "jpegs", files=120, classes=4, kb=8)
    built = tmp_path / "jpeg-crop"
    monkeypatch.setenv("TRAINFLOW_JPEG_CROP_DIR", str(built))  # the workers' cache of the compiled library
    result = train_flow(flow_config(tmp_path / "work", jpegs, training={"loader": "fast", "epochs": 1}))
    source = tmp_path / "work" / "fileshare" / result["scripts"] / "trainer" / "jpeg_crop.c"
    assert source.is_file()
    assert [p.name for p in built.glob("jpeg_crop-*.so")] == [f"jpeg_crop-{sha256_file(source)[:16]}.so"]
    logs = tmp_path / "work" / "fileshare" / "results" / result["run_id"] / "logs"
    assert "partial JPEG decoding is unavailable" not in "".join(p.read_text() for p in logs.glob("rank*.log"))
    assert result["metrics"]["status"] == "complete" and result["metrics"]["jpeg_decoding"] == "crop"
