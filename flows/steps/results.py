"""The results step (record-cost, collect-results): the run's ledger (every attempt counted), receipt, plot and
README into its folder, then the whole folder to the file share under results/<run id>/, and the model to Blob."""

from flows.report import write_plot
from flows.steps.context import Context, container_url, share_url
from infra.runs.lineage import make_receipt, write_guide, write_receipt
from infra.storage.transfers import step_plan
from tasks.track_run import record_cost_task
from tasks.train_on_pool import collect_results_task


def plan(ctx: Context) -> list[dict]:
    """Always run."""
    return [step_plan("collect-results", "run", "results/<run id>/ on the file share, the model to Blob")]


def run(ctx: Context) -> None:
    """Write the ledger, the receipt (what was trained, from what, at what cost), the plot and the README, then
    collect the run folder with them."""
    cfg, out, metrics, model = ctx.cfg, ctx.run.out, ctx.trained["metrics"], ctx.cfg.training.MODEL_FILE
    attempts = ctx.trained["attempts"] + ctx.staged["sync"].get("attempts", [])  # the backend's own
    ledger = record_cost_task(cfg, out, metrics.get("device", ""), attempts)
    receipt = make_receipt(cfg, ctx.run_id, ctx.inputs, ctx.scripts, str(ctx.data), ctx.image, metrics, ledger)
    ctx.receipt = write_receipt(out, cfg, receipt)
    write_plot(out, metrics)
    write_guide(out, model)
    ctx.results = collect_results_task(out, ctx.run_id, cfg.fileshare, cfg.storage, ctx.port, cfg.workdir, model)
    ctx.did(step_plan("collect-results", "run", f"{ctx.results['share']}, the model to Blob"), ctx.results)


def operations(ctx: Context) -> list[str]:
    """Where the results go."""
    model = f"{container_url(ctx.cfg)}/results/<run id>/{ctx.cfg.training.MODEL_FILE}"
    return [f"- put results: {share_url(ctx.cfg)}/results/<run id>/ and {model}"]
