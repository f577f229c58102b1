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
    goes = "its outputs/" if ctx.cfg.script else "the model"
    return [step_plan("collect-results", "run", f"results/<run id>/ on the file share, {goes} to Blob")]


def run(ctx: Context) -> None:
    """Write the ledger, the receipt (what was trained, from what, at what cost), the plot and the README, then
    collect the run folder with them."""
    cfg, out, metrics, model = ctx.cfg, ctx.run.out, ctx.trained["metrics"], ctx.trained["model_file"]
    attempts = ctx.trained["attempts"] + ctx.staged["sync"].get("attempts", [])  # the backend's own
    ledger = record_cost_task(cfg, out, metrics.get("device", ""), attempts)
    receipt = make_receipt(cfg, ctx.run_id, ctx.inputs, ctx.scripts, str(ctx.data), ctx.image, metrics, ledger)
    ctx.receipt = write_receipt(out, cfg, receipt)
    write_plot(out, metrics)
    write_guide(out, model or "")
    to_blob = ctx.trained["to_blob"]
    ctx.results = collect_results_task(out, ctx.run_id, cfg.fileshare, cfg.storage, ctx.port, cfg.workdir, to_blob)
    ctx.did(step_plan("collect-results", "run", f"{ctx.results['share']}, {len(to_blob)} file(s) to Blob"), ctx.results)


def operations(ctx: Context) -> list[str]:
    """Where the results go."""
    blobs = (
        f"{container_url(ctx.cfg)}/results/<run id>/{'outputs/*' if ctx.cfg.script else ctx.cfg.training.MODEL_FILE}"
    )
    return [f"- put results: {share_url(ctx.cfg)}/results/<run id>/ and {blobs}"]
