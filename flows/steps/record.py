"""The run's record (runs/<run id>; a run with the same inputs as an unfinished one resumes it) and its MLflow run
(start-tracking): both stay open for the rest of the walk, and say how it ended."""

from flows.steps.context import Context
from infra.runs.record import input_values, run_inputs, tracked_run
from tasks.track_run import ended_if_unfinished, engine_tracking, start_tracking_task
from tasks.train_on_pool import run_paths

MLFLOW_RUN_ID = "<mlflow run id>"


def plan(ctx: Context) -> list[dict]:
    """No row: the run's paths with the placeholder run id, and what the engine would be told about tracking."""
    ctx.run = run_paths(ctx.cfg, ctx.run_id, ctx.scripts, ctx.data)
    ctx.tracked = engine_tracking(ctx.cfg, MLFLOW_RUN_ID)
    return []


def run(ctx: Context) -> None:
    """Open the run's record (the unfinished run's, resumed, when one has the same inputs), then its MLflow run."""
    cfg = ctx.cfg
    ctx.inputs, values = run_inputs(cfg, ctx.scripts, ctx.data), input_values(cfg, ctx.scripts, ctx.data)
    runs = tracked_run(cfg.workdir / "runs", ctx.run_id, ctx.inputs, values)  # says why when it cannot resume
    ctx.run_id, ctx.resumed = ctx.stack.enter_context(runs)
    ctx.run = run_paths(cfg, ctx.run_id, ctx.scripts, ctx.data)
    ctx.tracked = start_tracking_task(cfg, ctx.run_id, ctx.data, ctx.scripts, ctx.image)
    ctx.stack.enter_context(ended_if_unfinished(ctx.tracked))
