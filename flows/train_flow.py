"""The end-to-end flow: the steps of flows/steps in order (image, scripts, data set, file server, the run's record,
pool and job, results), then the report; the pool always goes.

The image comes first: a missing or unbuildable image fails the run before any data moves.
"""

from prefect import flow

from flows.config import FlowConfig
from flows.report import publish_report_task
from flows.steps import RUN, walk
from flows.steps.context import Context
from infra.runs.ledger import check_budget
from infra.runs.workdir import workdir_lock
from tasks.track_run import finish_tracking_task


@flow(name="train-flow")
def train_flow(cfg: FlowConfig) -> dict:
    """Build (or check) the image, stage, create the pool, train, collect; the pool is deleted whatever happens.
    A run with the same inputs as an unfinished one resumes it; one whose cost estimate exceeds `budget` is refused
    before anything starts."""
    check_budget(cfg)
    with workdir_lock(cfg.workdir):
        ctx = walk(cfg, RUN)
    summary = run_summary(ctx)
    durations = publish_report_task(summary)
    finish_tracking_task(ctx.tracked, ctx.trained["metrics"], ctx.run.out, ctx.trained["model_file"])  # after the
    # report has drawn plot.svg
    return {**summary, "step_seconds": durations}


def run_summary(ctx: Context) -> dict:
    """What the run did and from what: for the report, the ledger and the command's output."""
    cfg, trained = ctx.cfg, ctx.trained
    return {
        "run_id": ctx.run_id,
        "dataset": cfg.dataset_name(),
        "framework": cfg.training.framework,
        "pool": ctx.pool,
        "image": ctx.image,
        "scripts": ctx.scripts,
        "metrics": trained["metrics"],
        "command": trained["command"],
        "program": trained["program"],
        "attempts": trained["attempts"],
        "receipt": ctx.receipt,
        "results": ctx.results,
        "out": str(ctx.run.out),
        "steps": list(ctx.staged.values()),
        "done": ctx.done,
        "tracking": ctx.tracked,
    }
