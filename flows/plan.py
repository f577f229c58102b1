"""`trainflow run --dry-run`: what each step would do and what it would skip, changing nothing.

It walks the steps of the end-to-end flow (flows/steps), each deciding as it would in the run (`plan_*` and
`decide_*` beside each task), fed with what can be read without changing anything or reaching a cloud service:
the file share, the data folder hashed with the step's cache, the file server's current copy (which stands for
Blob: it is the manifest the last sync read), the Docker engine and registry, and the backend's pool and job as
they would be made.
"""

from flows.config import FlowConfig
from flows.steps import RUN, operations, plan
from flows.steps.context import Context
from infra.compute import backend_of, check_installed
from tasks.track_run import program_of

RUN_ID = "<run id>"


def dry_run(cfg: FlowConfig) -> tuple[list[dict], dict[str, str]]:
    """One row per step (step, action run or skip, and why; the job's row: its command), and what the backend
    would send its service (as YAML, with the storage operations; nothing for local pools). Each decision is
    made once. With no data named, the digits set's place stands for it (nothing is written)."""
    cfg = cfg.model_copy(update={"data": cfg.data or str(cfg.workdir / "data" / "digits")})
    check_installed(cfg.pool, cfg.training)
    ctx = Context(cfg, RUN, RUN_ID)
    rows = plan(ctx)
    specs = backend_of(cfg.pool).specs(cfg, ctx.run, ctx.image, program_of(cfg, RUN_ID, ctx.tracked))
    if specs:
        specs["storage"] = "\n".join(operations(ctx)) + "\n"
    return [{k: row[k] for k in ("step", "action", "detail")} for row in rows], specs


def plan_run(cfg: FlowConfig) -> list[dict]:
    """The dry run's rows."""
    return dry_run(cfg)[0]


def backend_specs(cfg: FlowConfig) -> dict[str, str]:
    """The dry run's specs: what the backend would send its service; empty for local pools."""
    return dry_run(cfg)[1]
