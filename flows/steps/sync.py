"""The sync step (sync-to-file-server): Blob to the file server where the backend says (`where`): here, by the
flow; on the pool, by a job in the image; or on each node, as the job starts. WAYS holds, for each, the step's
decision, its action and where its storage operation puts the blobs."""

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, cast

from flows.config import STAGED, SYNTHETIC, FlowConfig
from flows.steps.context import Context, container_url
from flows.steps.dataset import NOTHING, moved_plan
from infra.compute import backend_of
from infra.data import manifest as mf
from infra.storage.fileserver import FileServer
from infra.storage.transfers import Transfer, step_plan
from tasks.sync_file_server import SyncingPool, decide_sync, sync_on_pool_task, sync_row, sync_to_file_server_task
from tasks.train_on_pool import data_version, plan_pool, run_paths

STEP = "sync-to-file-server"


def where(cfg: FlowConfig) -> str:
    """Who syncs, as the backend says: "here" (the flow), "pool" (a job on the pool), "nodes" (each node)."""
    return backend_of(cfg.pool).sync_where(cfg.pool)


def in_image(cfg: FlowConfig) -> bool:
    """The sync job on the pool runs in the image (synthetic data has nothing to sync)."""
    return cfg.data != SYNTHETIC and where(cfg) == "pool"


def plan(ctx: Context) -> list[dict]:
    """The step's decision; the data set version is the one the upload's decision names."""
    ctx.data = planned_version(ctx)
    if ctx.cfg.data == SYNTHETIC:
        return [step_plan(STEP, "skip", "data: synthetic")]
    return [WAYS[where(ctx.cfg)].plan(ctx)]


def run(ctx: Context) -> None:
    """Sync (nothing for synthetic data); the data set version is the one the sync made current."""
    synthetic = ctx.cfg.data == SYNTHETIC
    ctx.staged["sync"] = {**Transfer(NOTHING).row(), "path": SYNTHETIC} if synthetic else WAYS[where(ctx.cfg)].run(ctx)
    ctx.data = data_version(ctx.staged["sync"]["path"])
    ctx.did(moved_plan(STEP, ctx.staged["sync"]), ctx.staged["sync"])


def operations(ctx: Context) -> list[str]:
    """Who reads the staged data set, and where it goes."""
    cfg, name = ctx.cfg, ctx.cfg.dataset_name()
    version = f"datasets/{name}/<version>, then `current` switched to it"
    goes = WAYS[where(cfg)].goes.format(export=cfg.export_dir(), version=version)
    return [f"- get blobs: {container_url(cfg)}/{mf.dataset_prefix(name)} {goes}"]


def planned_version(ctx: Context) -> Path:
    """The version the job would read: the one the upload's manifest names, else the file server's current one."""
    if ctx.cfg.data == SYNTHETIC:
        return Path(SYNTHETIC)
    server, name = FileServer(ctx.cfg.export_dir()), ctx.cfg.dataset_name()
    return server.version_dir(name, ctx.manifest.version) if ctx.manifest else server.current(name)


def plan_here(ctx: Context) -> dict:
    """The flow's sync, decided on the manifest the upload would write (none: staged data, or the digits set)."""
    name = ctx.cfg.dataset_name()
    if ctx.cfg.data == STAGED:
        return step_plan(STEP, "run", f"bring the file server's copy of {name} up to Blob's manifest")
    if ctx.manifest is None:  # the digits set not written yet, or the shrunk copy out of date
        return step_plan(STEP, "run", ctx.unready)
    return sync_row(decide_sync(FileServer(ctx.cfg.export_dir()), name, ctx.manifest), name)


def sync_here(ctx: Context) -> dict:
    """The flow syncs the file server, a folder it reaches."""
    cfg = ctx.cfg
    return sync_to_file_server_task(cfg.storage, ctx.port, cfg.export_dir(), cfg.dataset_name(), cfg.workdir)


def sync_pool(ctx: Context) -> SyncingPool:
    """The pool the sync job runs on (the job reads the staged data set, not a version of it)."""
    pool = plan_pool(ctx.cfg, run_paths(ctx.cfg, ctx.run_id, ctx.scripts, ctx.folder), ctx.image)
    return cast(SyncingPool, pool)  # a backend that syncs on its pool makes one (WAYS["pool"])


def plan_on_pool(ctx: Context) -> dict:
    """The sync job's command."""
    return step_plan(STEP, "run", f"{ctx.cfg.dataset_name()}: {sync_pool(ctx).sync_job().describe()}")


def sync_on_pool(ctx: Context) -> dict:
    """The pool's sync job, while the flow waits."""
    return sync_on_pool_task(sync_pool(ctx), ctx.cfg.dataset_name(), ctx.cfg.job.timeout_s)


def plan_on_nodes(ctx: Context) -> dict:
    """Nothing for the flow: each node fetches."""
    detail = "each node fetches the staged shards to its local disk as the job starts (see the job's command)"
    return step_plan(STEP, "skip", f"{ctx.cfg.dataset_name()}: {detail}")


def sync_on_nodes(ctx: Context) -> dict:
    """Nothing for the flow: the job reads the staged data set."""
    return {**Transfer("blob -> each node's local disk, as the job starts").row(), "path": str(ctx.cfg.data)}


class Way(NamedTuple):
    """One place of the sync: the step's decision there, its action, and where the blobs go ({export}: the file
    server's folder, {version}: the version in it)."""

    plan: Callable[[Context], dict]
    run: Callable[[Context], dict]
    goes: str


WAYS = {
    "here": Way(plan_here, sync_here, "-> {export}/{version}"),
    "pool": Way(plan_on_pool, sync_on_pool, "read by the pool's sync job, into the file server ({version})"),
    "nodes": Way(plan_on_nodes, sync_on_nodes, "read by each node, into its local disk ({version})"),
}
