"""The scripts step (upload-scripts): the training package to the file share as scripts/<version>, by content."""

from flows.steps.context import Context, share_url
from infra.storage.fileshare import open_share
from tasks.upload_scripts import package_files, plan_scripts, upload_scripts_task


def plan(ctx: Context) -> list[dict]:
    """The step's decision (an Azure share is not asked: the dry run reaches no cloud service)."""
    cfg = ctx.cfg
    share = open_share(cfg.fileshare, cfg.workdir) if cfg.fileshare.backend == "local" else None
    row = plan_scripts(share, package_files(cfg.fileshare.extra_files))[1]
    ctx.scripts = f"scripts/{row['version']}"
    return [row]


def run(ctx: Context) -> None:
    """Upload the scripts unless the share holds their version."""
    ctx.staged["scripts"] = upload_scripts_task(ctx.cfg.fileshare, ctx.cfg.workdir)
    ctx.scripts = ctx.staged["scripts"]["version"]
    ctx.did(ctx.staged["scripts"]["plan"], ctx.staged["scripts"])


def operations(ctx: Context) -> list[str]:
    """Where the scripts go, and how the share is authorised."""
    auth = ctx.cfg.fileshare.auth
    return [f"- put scripts: {share_url(ctx.cfg)}/{ctx.scripts}/ (auth: {auth}), .complete written last"]
