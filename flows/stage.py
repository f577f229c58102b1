"""The staging flow: the staging steps of flows/steps (the image where the sync job runs in it, scripts to the file
share, the data set to Blob, Blob to the file server)."""

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.config import FlowConfig
from flows.steps import STAGING, walk
from infra.runs.workdir import workdir_lock


@flow(name="stage-data")
def stage_data(cfg: FlowConfig) -> dict:
    """Upload the scripts, upload the data set, sync it to the file server; returns each step's summary."""
    with workdir_lock(cfg.workdir):
        staged = walk(cfg, STAGING).staged
    name = cfg.dataset_name()
    create_table_artifact(
        key="staging-summary",
        table=[{k: v for k, v in s.items() if k not in ("path", "plan")} for s in staged.values()],
        description=f"Staging of data set {name}",
    )
    create_markdown_artifact(
        key="staging-locations",
        markdown=(
            f"# Data set `{name}` staged\n\n- scripts: `{staged['scripts']['path']}`\n"
            f"- file server copy: `{staged['sync']['path']}`\n"
        ),
    )
    return {"dataset": name, **staged}
