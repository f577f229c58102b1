"""The end-to-end flow: image, scripts, data set, file server, pool, job, results; the pool always goes.

The image comes first: a missing or unbuildable image fails the run before any data moves.
"""

from prefect import flow
from prefect.runtime import flow_run

from flows.config import FlowConfig
from flows.report import publish_report_task
from flows.stage import blob_endpoint, stage_steps
from infra.backends import backend_of
from infra.build_context import wheel_cache
from tasks.build_image import build_image_task
from tasks.train_on_pool import (collect_results_task, create_pool_task, data_version, delete_pool_task, plan_pool,
                                 run_paths, run_training_task)


@flow(name="train-flow")
def train_flow(cfg: FlowConfig) -> dict:
    """Build (or check) the image, stage, create the pool, train, collect; the pool is deleted whatever happens."""
    run_id = flow_run.get_id() or "local"
    backend = backend_of(cfg.pool)
    image = build_image_task(cfg.image, cfg.workdir, wheel_cache()) if backend.needs_image else None
    with blob_endpoint(cfg) as port:
        scripts, upload, synced = stage_steps(cfg, port, run_id, image and image["image"])
        run = run_paths(cfg, run_id, scripts["version"], data_version(synced["path"]))
        pool = plan_pool(cfg, run, image and image["image"])
        try:
            described = create_pool_task(pool, cfg.pool, cfg.training.workers, set())
            trained = run_training_task(pool, cfg.training, run.out, cfg.job.timeout_s)
        finally:
            delete_pool_task(pool)
        results = collect_results_task(run.out, run_id, cfg.fileshare, cfg.storage, port, cfg.workdir)
    summary = {"run_id": run_id, "dataset": cfg.dataset_name(), "pool": described, "image": image and image["image"],
               "scripts": scripts["version"], "metrics": trained["metrics"], "command": trained["command"],
               "attempts": trained["attempts"],
               "results": results, "out": str(run.out), "steps": [scripts, upload, synced]}
    return {**summary, "step_seconds": publish_report_task(summary)}
