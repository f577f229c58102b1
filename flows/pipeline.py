"""The end-to-end flow: scripts, data set, file server, image, pool, job, results; the pool always goes."""

from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run

from flows.config import PipelineConfig
from flows.report import publish_report_task
from flows.stage import blob_endpoint, stage_steps
from infra.build_context import wheel_cache
from tasks.build_image import build_image_task
from tasks.train_on_pool import collect_results_task, create_pool_task, delete_pool_task, make_pool, run_training_task


@flow(name="train-pipeline")
def train_pipeline(cfg: PipelineConfig) -> dict:
    """Stage, build, create the pool, train, collect the results; the pool is deleted whatever happens."""
    run_id = flow_run.get_id() or "local"
    out = cfg.workdir / "runs" / run_id
    with blob_endpoint(cfg) as port:
        scripts, upload, synced = stage_steps(cfg, port)
        image = build_image_task(cfg.image, cfg.workdir, wheel_cache()) if cfg.pool.backend == "docker" else None
        data = Path(synced["path"]).resolve()
        pool = make_pool(cfg.pool, run_id, cfg.workdir, image and image["image"], data, out, cfg.image.engine)
        try:
            described = create_pool_task(pool, cfg.training.workers, cfg.workdir / "pools", set())
            metrics = run_training_task(pool, cfg.training, data, out, cfg.job.timeout_s)
        finally:
            delete_pool_task(pool)
        results = collect_results_task(out, run_id, cfg.fileshare, cfg.storage, port, cfg.workdir)
    summary = {"run_id": run_id, "dataset": cfg.dataset_name(), "pool": described, "image": image and image["image"],
               "metrics": metrics, "results": results, "out": str(out), "steps": [scripts, upload, synced]}
    return {**summary, "step_seconds": publish_report_task(summary)}
