"""`trainflow bench images`: a first build and push of the training image against an unchanged rebuild and push."""

import secrets
import shutil
from pathlib import Path

from rich.console import Console
from rich.table import Table

from flows.bench.common import log_quietly, write_json
from flows.config import FlowConfig
from infra.build_context import wheel_cache
from infra.images import DockerEngine
from infra.local_docker import local_base_image, running_engine, running_registry
from tasks.build_image import build_and_push


def bench_images(cfg: FlowConfig, json_out: Path | None) -> dict:
    """A first build and push of the training image against an unchanged rebuild and push, in one command.

    First: every Dockerfile step runs (no layer cache) and the image goes to an empty registry with
    authentication. Second: the same call again, which finds the tag in the registry. The local base
    image (the stand-in for pulling python:3.11-slim with torch) is made before either and not counted.
    """
    root = cfg.workdir.resolve() / "bench" / "images"
    shutil.rmtree(root, ignore_errors=True)
    username, password = "bench", secrets.token_urlsafe(16)
    with running_engine(root / "dockerd"), running_registry(root / "registry", username, password) as host:
        engine = DockerEngine(cfg.image.engine)
        image = cfg.image.model_copy(update={"registry": host, "username": username})
        if image.base_image == "local":
            local_base_image(engine, print)
        first = build_and_push(engine, image, root / "context", wheel_cache(), password, log_quietly, nocache=True)
        second = build_and_push(engine, image, root / "context", wheel_cache(), password, log_quietly)
    result = {"image": first["image"], "first_seconds": first["seconds"], "unchanged_seconds": second["seconds"],
              "unchanged_fraction": second["seconds"] / first["seconds"],
              "unchanged_rebuilt": second["built"], "unchanged_pushed": second["pushed"]}
    table = Table(title=f"training image {cfg.image.flavour}: build and push")
    for column in ("run", "seconds", "built", "pushed"):
        table.add_column(column, justify="right")
    table.add_row("first (no layer cache, empty registry)", f"{first['seconds']:.1f}", str(first["built"]), str(first["pushed"]))
    table.add_row("unchanged context", f"{second['seconds']:.2f}", str(second["built"]), str(second["pushed"]))
    Console().print(table)
    Console().print(f"unchanged context: {result['unchanged_fraction']:.2%} of the first build and push (goal: under 5%)")
    write_json(result, json_out)
    return result
