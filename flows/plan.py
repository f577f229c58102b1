"""`trainflow run --dry-run`: what each step would do and what it would skip, changing nothing.

Every decision is the step's own (`plan_*` and `decide_*` beside each task), fed with what can be read
without changing anything or reaching a cloud service: the file share, the data folder hashed with the
step's cache, the file server's current copy (which stands for Blob: it is the manifest the last sync
read), the Docker engine and registry, and the backend's pool and job as they would be made.
"""

import tempfile
from pathlib import Path

from flows.config import STAGED, SYNTHETIC, FlowConfig
from infra.data import manifest as mf
from infra.compute import RunPaths, backend_of, check_fits, slots
from infra.images.build_context import wheel_cache
from infra.storage.fileserver import FileServer
from infra.storage.fileshare import open_share
from infra.storage.transfers import step_plan
from tasks.build_image import plan_image
from tasks.sync_file_server import decide_sync, sync_row
from tasks.track_run import engine_tracking, tracked_training
from tasks.train_on_pool import plan_pool, run_paths
from tasks.upload_dataset import decide_upload, scan_dataset, synced_state
from tasks.upload_scripts import package_files, plan_scripts
from trainer.datasets import Manifest

RUN_ID = "<run id>"
MLFLOW_RUN_ID = "<mlflow run id>"


def dry_run(cfg: FlowConfig) -> tuple[list[dict], dict[str, str]]:
    """One row per step (step, action run or skip, and why; the job's row: its command), and what the backend
    would send its service (as YAML, with the storage operations; nothing for local pools). Each decision is
    made once. With no data named, the digits set's place stands for it (nothing is written)."""
    cfg = cfg.model_copy(update={"data": cfg.data or str(cfg.workdir / "data" / "digits")})
    backend = backend_of(cfg.pool)
    check_fits(cfg.pool, cfg.training.workers)
    rows = [plan_image(cfg.image, wheel_cache())] if backend.needs_image else []
    image = rows[0]["image"] if rows else None
    scripts = plan_scripts_row(cfg)
    data_rows, data = plan_data(cfg)
    run = planned_run(cfg, scripts["version"], data)
    pool = plan_pool(cfg, run, image)
    if backend.sync_where(cfg) != "here" and cfg.data != SYNTHETIC:
        data_rows[1] = remote_sync_row(cfg, pool)
    rows += [scripts, *data_rows]
    rows.append(
        step_plan(
            "create-pool", "run", f"{cfg.pool.backend} pool, {slots(cfg.pool)} slots for {cfg.training.workers} workers"
        )
    )
    job = pool.job(tracked_training(cfg.training, engine_tracking(cfg, MLFLOW_RUN_ID)), cfg.job.timeout_s)
    rows.append(step_plan("run-training", "run", job.describe()))
    rows.append(step_plan("collect-results", "run", "results/<run id>/ on the file share, the model to Blob"))
    specs = backend.specs(cfg, run, image)
    if specs:
        specs["storage"] = "\n".join(storage_operations(cfg, scripts["version"])) + "\n"
    return [{k: row[k] for k in ("step", "action", "detail")} for row in rows], specs


def plan_run(cfg: FlowConfig) -> list[dict]:
    """The dry run's rows."""
    return dry_run(cfg)[0]


def backend_specs(cfg: FlowConfig) -> dict[str, str]:
    """The dry run's specs: what the backend would send its service; empty for local pools."""
    return dry_run(cfg)[1]


def planned_run(cfg: FlowConfig, version: str, data: Path) -> RunPaths:
    """The run's paths as the flow would make them, with a placeholder for the run's id."""
    return run_paths(cfg, RUN_ID, f"scripts/{version}", data)


def plan_scripts_row(cfg: FlowConfig) -> dict:
    """The scripts step's decision (an Azure share is not asked: the dry run reaches no cloud service)."""
    share = open_share(cfg.fileshare, cfg.workdir) if cfg.fileshare.backend == "local" else None
    return plan_scripts(share, package_files(cfg.fileshare.extra_files))[1]


def plan_data(cfg: FlowConfig) -> tuple[list[dict], Path]:
    """The upload's and the sync's decisions, and the data set version the job would read."""
    name, server = cfg.dataset_name(), FileServer(cfg.export_dir())
    if cfg.data == SYNTHETIC:
        return [
            step_plan("upload-dataset", "skip", "data: synthetic"),
            step_plan("sync-to-file-server", "skip", "data: synthetic"),
        ], Path(SYNTHETIC)
    if cfg.data == STAGED:
        return [
            step_plan("upload-dataset", "skip", f"data: staged, {name} is used as Blob storage holds it"),
            step_plan("sync-to-file-server", "run", f"bring the file server's copy of {name} up to Blob's manifest"),
        ], server.current(name)
    data = Path(cfg.data)
    if not data.exists():  # the digits set, not written yet
        what = f"write the digits set to {data}, then stage it (never staged)"
        return [
            step_plan("upload-dataset", "run", what),
            step_plan("sync-to-file-server", "run", what),
        ], server.current(name)
    with tempfile.TemporaryDirectory() as tmp, scan_dataset(data, cfg.workdir, name, keep=False) as index:
        previous, stored = synced_state(server.current_manifest(name), name)
        upload = decide_upload(cfg.storage, name, index, previous, stored)
        path = mf.write_manifest(index, upload.header, Path(tmp) / "manifest.jsonl")
        with Manifest.load(path, Path(tmp) / "manifest.db") as manifest:
            sync = decide_sync(server, name, manifest)
            return [upload.row(name), sync_row(sync, name)], server.version_dir(name, upload.version)


def remote_sync_row(cfg: FlowConfig, pool) -> dict:
    """The sync's row where this machine does not sync: a job on the pool, or each node as the job starts."""
    name = cfg.dataset_name()
    if backend_of(cfg.pool).sync_where(cfg) == "pool":
        return step_plan("sync-to-file-server", "run", f"{name}: {pool.sync_job().describe()}")
    return step_plan(
        "sync-to-file-server",
        "skip",
        f"{name}: each node fetches the staged shards to its local disk as the job starts (see the job's command)",
    )


def sync_operation(cfg: FlowConfig, staged: str) -> str:
    """Who reads the staged data set, and where it goes."""
    where, name = backend_of(cfg.pool).sync_where(cfg), cfg.dataset_name()
    if where == "here":
        return f"- get blobs: {staged} -> {cfg.export_dir()}/datasets/{name}/<version>, then `current` switched to it"
    who = "the pool's sync job, into the file server" if where == "pool" else "each node, into its local disk"
    return f"- get blobs: {staged} read by {who} (datasets/{name}/<version>, then `current` switched to it)"


def storage_operations(cfg: FlowConfig, scripts: str) -> list[str]:
    """The storage operations of a run, in order, with where and how they are authorised (never a secret)."""
    name, share, blob = cfg.dataset_name(), cfg.fileshare, cfg.storage
    container = f"{blob.account_url}/{blob.container}"
    return [
        f"- put scripts: {share.account_url}/{share.share}/scripts/{scripts}/ (auth: {share.auth}), .complete written "
        "last",
        f"- put blobs: {container}/{mf.dataset_prefix(name)}shards/*.tar, then {mf.manifest_blob(name)} "
        f"(auth: {blob.auth})",
        sync_operation(cfg, f"{container}/{mf.dataset_prefix(name)}"),
        "- job output: results/<run id> (written by the job), downloaded to the run folder",
        f"- put results: {share.account_url}/{share.share}/results/<run id>/ and {container}/results/<run id>/model.pt",
    ]
