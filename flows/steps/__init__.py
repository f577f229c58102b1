"""The flow's steps, in order, one module each: its decision, `plan(ctx)` (its rows in the dry run, changing
nothing), and its action, `run(ctx)` (its Prefect tasks), over one Context (flows/steps/context.py). A step may
also have `operations(ctx)`, the storage operations the dry run lists, and `in_image(cfg)`, whether it runs in the
training image (the image step makes one only then). The staging flow walks STAGING; the end-to-end flow and its
dry run walk RUN. Adding a step is one module and one line here."""

from prefect.runtime import flow_run

from flows.config import FlowConfig
from flows.steps import dataset, endpoint, image, record, results, scripts, sync, training
from flows.steps.context import Context

STAGING = [image, endpoint, scripts, dataset, sync]
RUN = [*STAGING, record, training, results]


def walk(cfg: FlowConfig, steps: list) -> Context:
    """Run `steps` in order in this flow run; what they opened (Azurite, the run's record) closes after the last,
    in reverse, also when a step fails."""
    ctx = Context(cfg, steps, flow_run.get_id() or "local")
    with ctx.stack:
        for step in steps:
            step.run(ctx)
    return ctx


def plan(ctx: Context) -> list[dict]:
    """The steps' decisions in order: the dry run's rows."""
    with ctx.stack:
        return [row for step in ctx.steps for row in step.plan(ctx)]


def operations(ctx: Context) -> list[str]:
    """The planned steps' storage operations, in order."""
    return [line for step_operations in ctx.each("operations") for line in step_operations(ctx)]
