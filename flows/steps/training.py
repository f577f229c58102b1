"""The training step (create-pool, run-training, delete-pool): the run's pool, the job on it, and the pool deleted
whatever happens."""

from flows.config import FlowConfig
from flows.steps.context import Context
from infra.compute import backend_of, slots
from infra.storage.transfers import step_plan
from tasks.track_run import program_of
from tasks.train_on_pool import create_pool_task, delete_pool_task, plan_pool, run_training_task


def in_image(cfg: FlowConfig) -> bool:
    """The nodes run the image where the backend needs one."""
    return backend_of(cfg.pool).needs_image


def plan(ctx: Context) -> list[dict]:
    """The pool as it would be made, and the job's command (the engine logging into the tracked run)."""
    cfg = ctx.cfg
    job = plan_pool(cfg, ctx.run, ctx.image).job(program_of(cfg, ctx.run_id, ctx.tracked), cfg.job.timeout_s)
    pool = f"{cfg.pool.backend} pool, {slots(cfg.pool)} slots for {cfg.training.workers} workers"
    return [step_plan("create-pool", "run", pool), step_plan("run-training", "run", job.describe())]


def run(ctx: Context) -> None:
    """Create the run's pool, train on it (logging into the tracked MLflow run), and delete it whatever happens."""
    cfg, pool = ctx.cfg, plan_pool(ctx.cfg, ctx.run, ctx.image)
    try:
        ctx.pool = create_pool_task(pool, set())
        ctx.did(step_plan("create-pool", "run", f"{cfg.pool.backend} pool, {slots(cfg.pool)} slots"))
        program = program_of(cfg, ctx.run_id, ctx.tracked)
        ctx.trained = run_training_task(pool, program, ctx.run.out, cfg.job, ctx.resumed)
        ctx.did(step_plan("run-training", "run", trained_how(ctx)))
    finally:
        delete_pool_task(pool)


def trained_how(ctx: Context) -> str:
    """The training step in words: what ran, on how many workers and by which launcher, resumed or afresh."""
    training, ran = ctx.cfg.training, ctx.trained["program"]
    how = f"{ran.get('model') or ran['entry']} on {training.workers} workers ({training.launcher})"
    return f"{how}, resumed run {ctx.run_id} from its last checkpoint" if ctx.resumed else how


def operations(ctx: Context) -> list[str]:
    """The job's output."""
    return ["- job output: results/<run id> (written by the job), downloaded to the run folder"]
