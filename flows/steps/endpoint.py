"""The Blob endpoint the later steps reach: Azurite, started for the rest of the walk (local storage), or Azure's."""

from collections.abc import Iterator
from contextlib import contextmanager

from flows.config import FlowConfig
from flows.steps.context import Context
from infra.services.azurite import running_azurite


@contextmanager
def blob_endpoint(cfg: FlowConfig) -> Iterator[int | None]:
    """Azurite's port while the flow runs (local default), or None for Azure storage."""
    if cfg.storage.backend != "azurite":
        yield None
        return
    with running_azurite(cfg.workdir / "azurite") as port:
        yield port


def plan(ctx: Context) -> list[dict]:
    """No row: the dry run starts nothing."""
    return []


def run(ctx: Context) -> None:
    """Open the endpoint until the walk ends."""
    ctx.port = ctx.stack.enter_context(blob_endpoint(ctx.cfg))
