"""The end-to-end flow: image, scripts, data set, file server, pool, job, results; the pool always goes.

The image comes first: a missing or unbuildable image fails the run before any data moves.
"""

from prefect import flow
from prefect.runtime import flow_run

from flows.config import FlowConfig
from flows.report import publish_report_task
from flows.stage import blob_endpoint, stage_steps
from infra.backends import RunPaths, backend_of
from infra.build_context import wheel_cache
from tasks.build_image import build_image_task
from infra.runs import tracked_run
from infra.workdir import workdir_lock
from tasks.train_on_pool import (collect_results_task, create_pool_task, data_version, delete_pool_task, plan_pool,
                                 run_inputs, run_paths, run_training_task)


@flow(name="train-flow")
def train_flow(cfg: FlowConfig) -> dict:
    """Build (or check) the image, stage, create the pool, train, collect; the pool is deleted whatever happens.
    A run with the same inputs as an unfinished one resumes it."""
    with workdir_lock(cfg.workdir):
        image = build_image_task(cfg.image, cfg.workdir, wheel_cache()) if backend_of(cfg.pool).needs_image else None
        image = image and image["image"]
        with blob_endpoint(cfg) as port:
            scripts, upload, synced = stage_steps(cfg, port, flow_run.get_id() or "local", image)
            data = data_version(synced["path"])
            inputs = run_inputs(cfg, scripts["version"], data)
            with tracked_run(cfg.workdir / "runs", flow_run.get_id() or "local", inputs) as (run_id, resumed):
                run = run_paths(cfg, run_id, scripts["version"], data)
                described, trained = train_on_pool(cfg, run, image, resumed)
                results = collect_results_task(run.out, run_id, cfg.fileshare, cfg.storage, port, cfg.workdir)
    summary = {"run_id": run_id, "dataset": cfg.dataset_name(), "pool": described, "image": image,
               "scripts": scripts["version"], "metrics": trained["metrics"], "command": trained["command"],
               "attempts": trained["attempts"],
               "results": results, "out": str(run.out), "steps": [scripts, upload, synced]}
    return {**summary, "step_seconds": publish_report_task(summary)}


def train_on_pool(cfg: FlowConfig, run: RunPaths, image: str | None, resumed: bool) -> tuple[dict, dict]:
    """Create the run's pool, train on it, and delete it whatever happens: the pool's description and the training."""
    pool = plan_pool(cfg, run, image)
    try:
        described = create_pool_task(pool, cfg.pool, cfg.training.workers, set())
        return described, run_training_task(pool, cfg.training, run.out, cfg.job.timeout_s, resumed)
    finally:
        delete_pool_task(pool)
