"""The end-to-end flow: image, scripts, data set, file server, pool, job, results; the pool always goes.

The image comes first: a missing or unbuildable image fails the run before any data moves.
"""

from prefect import flow
from prefect.runtime import flow_run

from flows.config import FlowConfig
from flows.report import publish_report_task
from flows.stage import blob_endpoint, stage_steps
from infra.compute import RunPaths, backend_of
from infra.images.build_context import wheel_cache
from infra.runs.ledger import check_budget, cost_basis, estimate_key
from infra.runs.lineage import make_receipt, write_receipt
from infra.runs.record import run_inputs, tracked_run
from infra.runs.workdir import workdir_lock
from tasks.build_image import build_image_task
from tasks.track_run import ended_if_unfinished, finish_tracking_task, start_tracking_task, tracked_training
from tasks.train_on_pool import (
    collect_results_task,
    create_pool_task,
    data_version,
    delete_pool_task,
    plan_pool,
    run_paths,
    run_training_task,
)


@flow(name="train-flow")
def train_flow(cfg: FlowConfig) -> dict:
    """Build (or check) the image, stage, create the pool, train, collect; the pool is deleted whatever happens.
    A run with the same inputs as an unfinished one resumes it; one whose cost estimate exceeds `budget` is refused
    before anything starts."""
    check_budget(cfg)
    with workdir_lock(cfg.workdir):
        image = build_image_task(cfg.image, cfg.workdir, wheel_cache()) if backend_of(cfg.pool).needs_image else None
        image = image and image["image"]
        with blob_endpoint(cfg) as port:
            scripts, upload, synced = stage_steps(cfg, port, flow_run.get_id() or "local", image)
            data = data_version(synced["path"])
            inputs = run_inputs(cfg, scripts["version"], data)
            with tracked_run(cfg.workdir / "runs", flow_run.get_id() or "local", inputs) as (run_id, resumed):
                run = run_paths(cfg, run_id, scripts["version"], data)
                tracked = start_tracking_task(cfg, run_id, data, scripts["version"], image)
                with ended_if_unfinished(tracked):
                    described, trained = train_on_pool(cfg, run, image, resumed, tracked)
                    receipt = write_receipt(
                        run.out,
                        cfg,
                        make_receipt(cfg, run_id, inputs, scripts["version"], str(data), image, trained["metrics"]),
                    )
                    results = collect_results_task(run.out, run_id, cfg.fileshare, cfg.storage, port, cfg.workdir)
    summary = {
        "run_id": run_id,
        "dataset": cfg.dataset_name(),
        "pool": described,
        "image": image,
        "scripts": scripts["version"],
        "metrics": trained["metrics"],
        "command": trained["command"],
        "attempts": trained["attempts"],
        "sync_attempts": synced.get("attempts", []),
        "receipt": receipt,
        "cost_basis": cost_basis(cfg, trained["metrics"].get("device", "")),
        "estimate_key": estimate_key(cfg),
        "results": results,
        "out": str(run.out),
        "steps": [scripts, upload, synced],
        "tracking": tracked,
    }
    durations = publish_report_task(summary)
    finish_tracking_task(tracked, trained["metrics"], run.out)  # after the report has drawn plot.svg
    return {**summary, "step_seconds": durations}


def train_on_pool(
    cfg: FlowConfig, run: RunPaths, image: str | None, resumed: bool, tracked: dict | None
) -> tuple[dict, dict]:
    """Create the run's pool, train on it (logging into the `tracked` MLflow run), and delete it whatever happens:
    the pool's description and the training."""
    pool = plan_pool(cfg, run, image)
    try:
        described = create_pool_task(pool, cfg.pool, cfg.training.workers, set())
        training = tracked_training(cfg.training, tracked)
        return described, run_training_task(pool, training, run.out, cfg.job.timeout_s, resumed)
    finally:
        delete_pool_task(pool)
