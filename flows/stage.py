"""The staging flow: scripts to the file share, the data set to Blob, Blob to the file server."""

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.config import STAGED, PipelineConfig
from infra.azurite import running_azurite
from tasks.progress import Transfer
from tasks.sync_file_server import sync_to_file_server_task
from tasks.upload_dataset import upload_dataset_task
from tasks.upload_scripts import upload_scripts_task


@contextmanager
def blob_endpoint(cfg: PipelineConfig) -> Iterator[int | None]:
    """Azurite's port while the flow runs (local default), or None for Azure storage."""
    if cfg.storage.backend != "azurite":
        yield None
        return
    with running_azurite(cfg.workdir / "azurite") as port:
        yield port


def stage_steps(cfg: PipelineConfig, port: int | None) -> tuple[dict, dict, dict]:
    """The three staging tasks in order: scripts, data set upload, sync to the file server."""
    name = cfg.dataset_name()
    scripts = upload_scripts_task(cfg.fileshare, cfg.workdir)
    if cfg.data == STAGED:  # the sync reads Blob's manifest, and says so when the data set was never staged
        dataset = Transfer("data set -> blob (data: staged, nothing uploaded)").row()
    else:
        dataset = upload_dataset_task(cfg.storage, port, Path(cfg.data), name, cfg.workdir)
    synced = sync_to_file_server_task(cfg.storage, port, cfg.export_dir(), name, cfg.workdir)
    return scripts, dataset, synced


@flow(name="stage-data")
def stage_data(cfg: PipelineConfig) -> dict:
    """Upload the scripts, upload the data set, sync it to the file server; returns each step's summary."""
    name = cfg.dataset_name()
    with blob_endpoint(cfg) as port:
        scripts, dataset, synced = stage_steps(cfg, port)
    steps = [scripts, dataset, synced]
    create_table_artifact(key="staging-summary", table=[{k: v for k, v in s.items() if k != "path"} for s in steps],
                          description=f"Staging of data set {name}")
    create_markdown_artifact(key="staging-locations", markdown=(
        f"# Data set `{name}` staged\n\n- scripts: `{scripts['path']}`\n- file server copy: `{synced['path']}`\n"))
    return {"dataset": name, "scripts": scripts, "upload": dataset, "sync": synced}
