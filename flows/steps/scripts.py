"""The scripts step (upload-scripts): what the run's program ships to the file share as scripts/<version>, by content:
trainflow's training package, or the user's scripts folder (infra/engines/script_files.py)."""

from pathlib import Path

from flows.config import FlowConfig
from flows.steps.context import Context, share_url
from infra.engines.script_files import script_files
from infra.storage.fileshare import open_share
from tasks.upload_scripts import package_files, plan_scripts, upload_scripts_task


def shipped(cfg: FlowConfig) -> dict[str, Path]:
    """Relative path -> file of what the program ships."""
    return script_files(cfg.script.source) if cfg.script else package_files(cfg.fileshare.extra_files)


def plan(ctx: Context) -> list[dict]:
    """The step's decision (an Azure share is not asked: the dry run reaches no cloud service)."""
    cfg = ctx.cfg
    share = open_share(cfg.fileshare, cfg.workdir) if cfg.fileshare.backend == "local" else None
    row = plan_scripts(share, shipped(cfg))[1]
    ctx.scripts = f"scripts/{row['version']}"
    return [row]


def run(ctx: Context) -> None:
    """Upload the scripts unless the share holds their version."""
    ctx.staged["scripts"] = upload_scripts_task(ctx.cfg.fileshare, ctx.cfg.workdir, shipped(ctx.cfg))
    ctx.scripts = ctx.staged["scripts"]["version"]
    ctx.did(ctx.staged["scripts"]["plan"], ctx.staged["scripts"])


def operations(ctx: Context) -> list[str]:
    """Where the scripts go, and how the share is authorised."""
    auth = ctx.cfg.fileshare.auth
    return [f"- put scripts: {share_url(ctx.cfg)}/{ctx.scripts}/ (auth: {auth}), .complete written last"]
