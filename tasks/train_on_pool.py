"""Steps 5-7: create the pool, run the training job on it, collect the results; the pool is always deleted.

Results go to the file share under results/<run id>/ (metrics.json, model.pt, checkpoints, logs), and
the model also to Blob storage.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from infra.azureml import AzureMLConfig, AzureMLJob, AzureMLPool, JobPlan, job_spec, ml_client, registry_connection_spec
from infra.blobstore import StorageConfig
from infra.container_nodes import DATA, RESULTS, SCRIPTS, Mount, commands_on_nodes
from infra.fileshare import FileShareConfig, open_share
from infra.images import Engine, ImageConfig
from infra.jobs import ContainerJob, Job, ProcessJob, run_job
from infra.launcher import SYNTHETIC, TrainingConfig, launch_command, preflight
from infra.pools import DockerPool, Pool, PoolConfig, ProcessPool, check_fits, delete_leftovers
from tasks.build_image import registry_password
from tasks.retry import unless_permanent
from tasks.upload_dataset import connect


TRAINER = "trainer/train.py"  # the engine inside a scripts version


@dataclass(frozen=True)
class RunPaths:
    """The folders a job uses on this machine: the file server's data set, the scripts version on the
    file share (scripts/<version>), and the run's results."""

    data: Path
    scripts: Path
    out: Path
    dataset: str = ""

    @property
    def synthetic(self) -> bool:
        """Whether the engine generates its data (nothing to mount)."""
        return str(self.data) == SYNTHETIC


def data_version(synced: str) -> Path:
    """The data set version the job reads: `current` resolved, so a sync during training cannot change it
    (synthetic data stays the engine's word)."""
    return Path(synced) if synced == SYNTHETIC else Path(synced).resolve()


def make_pool(cfg: PoolConfig, run_id: str, workdir: Path, image: str | None, paths: RunPaths,
              image_cfg: ImageConfig | None = None, azure: AzureMLConfig | None = None) -> Pool:
    """The configured pool backend for this run (not yet created); docker nodes mount data, scripts and results."""
    if cfg.backend == "process":
        return ProcessPool(cfg, run_id, workdir / "pools")
    if cfg.backend == "azureml":
        connection = None
        if azure.registry_access == "connection":
            connection = registry_connection_spec(image_cfg.registry, image_cfg.username, registry_password(image_cfg))
        return AzureMLPool(cfg, run_id, azure, ml_client(azure), image, connection)
    paths.out.mkdir(parents=True, exist_ok=True)
    mounts = [Mount(paths.scripts.parent, SCRIPTS), Mount(paths.out, RESULTS, read_only=False)]
    mounts += [] if paths.synthetic else [Mount(paths.data, DATA)]
    return DockerPool(cfg, run_id, Engine(image_cfg and image_cfg.engine), image, mounts)


def engine_on(backend: str, scripts: Path) -> str:
    """The engine of the scripts version, where the workers of a `backend` pool see it."""
    if backend == "process":
        return str(scripts / TRAINER)
    return f"{SCRIPTS}/{scripts.name}/{TRAINER}"


def data_on_nodes(synthetic: bool) -> str:
    """The engine's --data on the container nodes: the mounted file server copy, or synthetic."""
    return SYNTHETIC if synthetic else DATA


def make_job(pool: Pool, training: TrainingConfig, paths: RunPaths, timeout_s: float = 0) -> Job:
    """The launcher for `pool`: local torchrun/horovodrun, horovodrun or torchrun on the container nodes, or an Azure
    ML job."""
    if isinstance(pool, AzureMLPool):
        plan = JobPlan(pool.run_id, pool.image, paths.scripts.as_posix(), paths.dataset)
        return AzureMLJob(pool.client, job_spec(training, pool.azure, pool.cfg, plan, timeout_s), paths.out)
    script = engine_on(pool.cfg.backend, paths.scripts)
    if isinstance(pool, ProcessPool):
        return ProcessJob(pool, launch_command(training, str(paths.data), paths.out, script=script))
    return ContainerJob(pool.nodes, commands_on_nodes(training, pool.nodes, pool.cfg.slots_per_node, script,
                                                      data_on_nodes(paths.synthetic)))


@task(name="create-pool", retries=2, retry_delay_seconds=[5, 20], retry_condition_fn=unless_permanent,
      cache_policy=NO_CACHE)
def create_pool_task(pool: Pool, workers: int, pools_root: Path, keep_runs: set[str]) -> dict:
    """Prefect step: delete pools that crashed runs left behind, then create this run's pool and wait for it."""
    check_fits(pool.cfg, workers)
    gone = delete_leftovers(pools_root, getattr(pool, "engine", None), keep_runs | {pool.run_id})
    if gone:
        get_run_logger().warning("deleted pools left behind by runs %s", ", ".join(gone))
    pool.create()
    pool.wait_until_ready()
    return pool.describe()


@task(name="run-training", retries=1, retry_delay_seconds=5, retry_condition_fn=unless_permanent,
      cache_policy=NO_CACHE)
def run_training_task(pool: Pool, training: TrainingConfig, paths: RunPaths, timeout_s: float) -> dict:
    """Prefect step: run the job on the pool, each rank's lines into the run's log; a retry resumes from checkpoints."""
    logger = get_run_logger()
    if isinstance(pool, ProcessPool):
        preflight(training, str(paths.data), paths.out, script=engine_on(pool.cfg.backend, paths.scripts))
    run_job(make_job(pool, training, paths, timeout_s), paths.out / "logs", logger.info, timeout_s)
    return json.loads((paths.out / "metrics.json").read_text())


@task(name="delete-pool", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def delete_pool_task(pool: Pool) -> None:
    """Prefect step: delete the pool (also after a failed or cancelled job)."""
    pool.delete()


@task(name="collect-results", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=unless_permanent)
def collect_results_task(out: Path, run_id: str, share_cfg: FileShareConfig, storage: StorageConfig,
                         azurite_port: int | None, workdir: Path) -> dict:
    """Prefect step: results to the file share under results/<run id>/, the model to Blob."""
    share = open_share(share_cfg, workdir)
    files = sorted(p for p in out.rglob("*") if p.is_file())
    for path in files:
        share.upload_file(path, f"results/{run_id}/{path.relative_to(out).as_posix()}")
    store = connect(storage, azurite_port, "results")
    store.ensure_container()  # a run on synthetic data has staged nothing there
    store.upload_file(out / "model.pt", f"results/{run_id}/model.pt")
    return {"files": len(files), "share": share.url(f"results/{run_id}"), "model_blob": f"results/{run_id}/model.pt"}
