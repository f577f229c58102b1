"""Steps 5-7: create the pool, run the training job on it, collect the results; the pool is always deleted.

The pool and its job come from the configured compute backend (infra/compute/); these steps only drive
them, and time each attempt at training (infra/runs/attempts.py). Results go to the file share under
results/<run id>/ (the whole run folder: the model, metrics.json, plot, checkpoints, logs, ledger, receipt, README),
and the model also to Blob storage.
"""

import json
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from infra.compute import JobConfig, Pool, RunConfig, RunPaths, backend_of, run_job
from infra.engines.contract import SYNTHETIC
from infra.engines.program import Program
from infra.runs.attempts import read_attempts, timed_attempt
from infra.runs.record import RECORD, RunSettings, read_record
from infra.storage.blobstore import open_store
from infra.storage.config import StorageConfig
from infra.storage.fileshare import FileShareConfig, open_share
from tasks.progress import training_progress
from tasks.retry import unless_permanent


def data_version(synced: str) -> Path:
    """The data set version the job reads: `current` resolved, so a sync during training cannot change it
    (synthetic data stays the trainer's word)."""
    return Path(synced) if synced == SYNTHETIC else Path(synced).resolve()


def run_paths(cfg: RunSettings, run_id: str, scripts: str, data: Path) -> RunPaths:
    """A run's paths: `scripts` is the version's folder on the share (scripts/<version>), as the backend's nodes
    find it; the results go to the workdir's runs/<run id>."""
    return RunPaths(
        run_id,
        data,
        backend_of(cfg.pool).scripts_root(cfg.workdir) / scripts,
        cfg.workdir / "runs" / run_id,
        cfg.dataset_name(),
    )


def plan_pool(cfg: RunConfig[Any], run: RunPaths, image: str | None) -> Pool:
    """The run's pool as the configured backend makes it (not yet created): the step and the dry run share it."""
    return backend_of(cfg.pool).pool(cfg, run, image)


@task(
    name="create-pool",
    retries=2,
    retry_delay_seconds=[5, 20],
    retry_condition_fn=unless_permanent,
    cache_policy=NO_CACHE,
)
def create_pool_task(pool: Pool, keep_runs: set[str]) -> dict:
    """Prefect step: delete pools that crashed runs left behind, then create this run's pool and wait for it (its
    config, the world size included, was checked when it was read)."""
    gone = pool.delete_leftovers(keep_runs)
    if gone:
        get_run_logger().warning("deleted pools left behind by runs %s", ", ".join(gone))
    pool.create()
    pool.wait_until_ready()
    return pool.describe()


@task(name="run-training", retries=1, retry_delay_seconds=5, retry_condition_fn=unless_permanent, cache_policy=NO_CACHE)
def run_training_task(pool: Pool, program: Program, out: Path, job_cfg: JobConfig, resumed: bool = False) -> dict:
    """Prefect step: run the program's job on the pool, each rank's lines into the run's log; a retry (or a re-run
    that `resumed` an unfinished run) resumes from checkpoints. Returns what the program gave back (the trainer's
    metrics, a script's summary), what ran, the job's command and the attempts the backend made itself."""
    if resumed:
        get_run_logger().info("resuming run %s, left unfinished, from its newest checkpoint in %s", pool.run_id, out)
    job = pool.job(program.at_attempt(len(read_attempts(out)) + 1), job_cfg.timeout_s)
    try:
        with (
            timed_attempt(out, flow_run.get_id() or "local"),  # its time counts in the ledger, however it ends
            training_progress(program.epochs) as progress,  # live in the UI (tasks/progress.py)
        ):
            log = get_run_logger().info

            def echo(line: str) -> None:  # each line logged; a script's metrics in it move the progress
                log(line)
                if found := program.metrics_in(line):
                    progress.see_metrics(found)

            run_job(job, out / "logs", echo, job_cfg.timeout_s, progress.see, job_cfg.silent_s)
    finally:
        attempts_artifact(job.attempts())
    return {
        "metrics": program.outcome(out),
        "program": program.describe(),
        "model_file": program.MODEL_FILE,
        "to_blob": program.to_blob(out),
        "command": job.describe(),
        "attempts": job.attempts(),
    }


def attempts_artifact(attempts: list[dict]) -> None:
    """The attempts a backend made itself (pre-empted, failed, completed) as a table in the Prefect UI."""
    if attempts:
        create_table_artifact(
            key="attempts",
            table=attempts,
            description="Each attempt of the training job: how "
            "and why it ended, its GPU-hours, the steps it lost since its last checkpoint",
        )


@task(name="delete-pool", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def delete_pool_task(pool: Pool) -> None:
    """Prefect step: delete the pool (also after a failed or cancelled job)."""
    pool.delete()


@task(name="collect-results", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=unless_permanent)
def collect_results_task(
    out: Path,
    run_id: str,
    share_cfg: FileShareConfig,
    storage: StorageConfig,
    azurite_port: int | None,
    workdir: Path,
    to_blob: list[str] = ["model.pt"],  # noqa: B006 - never changed: a Prefect task's parameters are kept as given
) -> dict:
    """Prefect step: the run folder, every file of it, to the file share under results/<run id>/, and the files
    `to_blob` names (relative to the folder: the trainer's model, a script's outputs) to Blob. The record goes last,
    saying complete as it will once this last step has ended: a copy whose run.json says complete is whole."""
    share = open_share(share_cfg, workdir)
    files = sorted(p for p in out.rglob("*") if p.is_file() and p != out / RECORD)
    for path in files:
        share.upload_file(path, f"results/{run_id}/{path.relative_to(out).as_posix()}")
    share.write_text(f"results/{run_id}/{RECORD}", json.dumps({**read_record(out), "status": "complete"}))
    store = open_store(storage, azurite_port, "results")
    store.ensure_container()  # a run on synthetic data has staged nothing there
    blobs = [f"results/{run_id}/{rel}" for rel in to_blob]
    for rel, blob in zip(to_blob, blobs):
        store.upload_file(out / rel, blob)
    return {"files": len(files) + 1, "share": share.url(f"results/{run_id}"), "blobs": blobs}
