"""The end-to-end flow: image, scripts, data set, file server, pool, job, results; the pool always goes.

The image comes first: a missing or unbuildable image fails the run before any data moves.
"""

from prefect import flow
from prefect.runtime import flow_run

from flows.config import PipelineConfig
from flows.report import publish_report_task
from flows.stage import blob_endpoint, stage_steps
from infra.build_context import wheel_cache
from infra.pools import scripts_root
from tasks.build_image import build_image_task
from tasks.train_on_pool import (RunPaths, collect_results_task, create_pool_task, data_version, delete_pool_task,
                                  make_pool, run_training_task)


@flow(name="train-pipeline")
def train_pipeline(cfg: PipelineConfig) -> dict:
    """Build (or check) the image, stage, create the pool, train, collect; the pool is deleted whatever happens."""
    run_id = flow_run.get_id() or "local"
    share = scripts_root(cfg.pool, cfg.fileshare, cfg.workdir)
    image = build_image_task(cfg.image, cfg.workdir, wheel_cache()) if cfg.pool.backend != "process" else None
    with blob_endpoint(cfg) as port:
        scripts, upload, synced = stage_steps(cfg, port)
        paths = RunPaths(data_version(synced["path"]), share / scripts["version"], cfg.workdir / "runs" / run_id,
                         cfg.dataset_name())
        pool = make_pool(cfg.pool, run_id, cfg.workdir, image and image["image"], paths, cfg.image, cfg.azureml)
        try:
            described = create_pool_task(pool, cfg.training.workers, cfg.workdir / "pools", set())
            metrics = run_training_task(pool, cfg.training, paths, cfg.job.timeout_s)
        finally:
            delete_pool_task(pool)
        results = collect_results_task(paths.out, run_id, cfg.fileshare, cfg.storage, port, cfg.workdir)
    summary = {"run_id": run_id, "dataset": cfg.dataset_name(), "pool": described, "image": image and image["image"],
               "scripts": scripts["version"], "metrics": metrics, "results": results, "out": str(paths.out),
               "steps": [scripts, upload, synced]}
    return {**summary, "step_seconds": publish_report_task(summary)}
