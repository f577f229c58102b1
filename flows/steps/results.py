"""The results step (collect-results): the run's receipt into its folder, then the folder to the file share under
results/<run id>/, and the model to Blob."""

from flows.steps.context import Context, container_url, share_url
from infra.runs.lineage import make_receipt, write_receipt
from infra.storage.transfers import step_plan
from tasks.train_on_pool import collect_results_task


def plan(ctx: Context) -> list[dict]:
    """Always run."""
    return [step_plan("collect-results", "run", "results/<run id>/ on the file share, the model to Blob")]


def run(ctx: Context) -> None:
    """Write the receipt (what was trained, from what), then collect the run folder with it."""
    cfg, out, metrics = ctx.cfg, ctx.run.out, ctx.trained["metrics"]
    receipt = make_receipt(cfg, ctx.run_id, ctx.inputs, ctx.scripts, str(ctx.data), ctx.image, metrics)
    ctx.receipt = write_receipt(out, cfg, receipt)
    model = cfg.training.MODEL_FILE
    ctx.results = collect_results_task(out, ctx.run_id, cfg.fileshare, cfg.storage, ctx.port, cfg.workdir, model)


def operations(ctx: Context) -> list[str]:
    """Where the results go."""
    model = f"{container_url(ctx.cfg)}/results/<run id>/{ctx.cfg.training.MODEL_FILE}"
    return [f"- put results: {share_url(ctx.cfg)}/results/<run id>/ and {model}"]
