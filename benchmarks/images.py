"""`trainflow bench images`: trainflow's unchanged rebuild and push against what a user runs instead, `docker build`
with its layer cache and then `docker push`, repeated; the first build and push that both follow is timed once."""

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.common import bench_progress, log_quietly, shown, spread, time_call, write_json
from flows.config import FlowConfig
from infra.images.build_context import wheel_cache
from infra.images.local_docker import local_base_image, require_binary, running_engine, running_registry
from infra.images.registry import DockerEngine, ImageConfig, registry_password
from tasks.build_image import build_and_push, build_args


def bench_images(cfg: FlowConfig, json_out: Path | None, rounds: int = 3, cold: bool = False) -> dict:
    """A first build and push of the training image (timed once; `cold`: no layer cache), then `rounds` rounds of the
    pair: trainflow's build-and-push of the unchanged context, and `docker build` (layer cache) + `docker push`.

    Both push to the registry `image.registry` names, else to an empty one with authentication that the command
    starts; the local base image (the stand-in for pulling python:3.11-slim with torch) is made before either and
    not counted.
    """
    root = cfg.workdir.resolve() / "bench" / "images"
    shutil.rmtree(root, ignore_errors=True)
    with running_engine(root / "dockerd"), bench_registry(cfg.image, root / "registry") as (image, password):
        engine = DockerEngine(image.engine)
        base = local_base_image(engine, print) if image.base_image == "local" else image.base_image
        first = build_and_push(engine, image, root / "context", wheel_cache(), password, log_quietly, nocache=cold)
        with docker_cli(image, root / "docker-config", password) as docker:
            ours, theirs = pairs(
                rounds,
                lambda: build_and_push(engine, image, root / "context", wheel_cache(), password, log_quietly),
                lambda: docker_build_and_push(docker, image, root / "context", build_args(image, base)),
            )
    result = image_result(first, ours, theirs, cold)
    show(result, cfg.image.flavour)
    write_json(result, json_out)
    return result


@contextmanager
def bench_registry(image: ImageConfig, data_dir: Path) -> Iterator[tuple[ImageConfig, str | None]]:
    """(the image's settings, the registry password): the configured registry, else an empty one with
    authentication started here for the block."""
    if image.registry:
        yield image, registry_password(image)
        return
    username, password = "bench", secrets.token_urlsafe(16)
    with running_registry(data_dir, username, password) as host:
        yield image.model_copy(update={"registry": host, "username": username}), password


def pairs(rounds: int, ours, theirs) -> tuple[list[dict], list[float]]:
    """`rounds` rounds of trainflow's call then the baseline's, with a progress bar; what each returned."""
    mine, baseline = [], []
    with bench_progress() as progress:
        task = progress.add_task("unchanged rebuild and push, both ways", total=rounds)
        for _ in range(rounds):
            mine.append(ours())
            baseline.append(time_call(theirs))
            progress.advance(task)
    return mine, baseline


@contextmanager
def docker_cli(image: ImageConfig, config_dir: Path, password: str | None) -> Iterator[list[str]]:
    """The docker command line, logged in to the image's registry with a config folder of its own (the user's is not
    touched), talking to the same engine as trainflow; yields the command's prefix (anonymous without a username)."""
    docker = require_binary("docker", "docker.io")
    config_dir.mkdir(parents=True, exist_ok=True)
    host = ["--host", image.engine] if image.engine else []
    command = [docker, "--config", str(config_dir), *host]
    if image.username and image.registry:  # bench_registry's own registry, or the configured one
        subprocess.run(
            [*command, "login", "--username", image.username, "--password-stdin", image.registry],
            input=password,
            text=True,
            check=True,
            capture_output=True,
        )
    yield command


def docker_build_and_push(docker: list[str], image: ImageConfig, context: Path, args: dict[str, str]) -> None:
    """What a user runs instead: `docker build` of the same context with the engine's layer cache (the classic builder,
    whose cache trainflow's builds fill), tagged :latest, then `docker push`."""
    tag = f"{image.image_name()}:latest"
    build_args = [arg for key, value in args.items() for arg in ("--build-arg", f"{key}={value}")]
    network = ["--network", image.build_network] if image.build_network else []
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    subprocess.run(
        [*docker, "build", "--quiet", "--tag", tag, *build_args, *network, str(context)],
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run([*docker, "push", "--quiet", tag], env=env, check=True, capture_output=True)


def image_result(first: dict, ours: list[dict], theirs: list[float], cold: bool) -> dict:
    """The figures: the first build once, each side's seconds and trainflow's speed-up within each round."""
    seconds = [run["seconds"] for run in ours]
    return {
        "image": first["image"],
        "first_seconds": first["seconds"],
        "first_without_layer_cache": cold,
        "first_built": first["built"],
        "first_pushed": first["pushed"],
        "rounds": len(ours),
        "trainflow_unchanged_seconds": spread(seconds),
        "docker_build_push_seconds": spread(theirs),
        "speedup": spread([t / s for s, t in zip(seconds, theirs)]),
        "unchanged_rebuilt": any(run["built"] for run in ours),
        "unchanged_pushed": any(run["pushed"] for run in ours),
    }


def show(result: dict, flavour: str) -> None:
    """The table: the first build, then both ways of an unchanged rebuild and push."""
    table = Table(title=f"training image {flavour}: build and push, median (min-max) of {result['rounds']}")
    for column in ("run", "seconds", "built", "pushed"):
        table.add_column(column, justify="right")
    cache = "no layer cache" if result["first_without_layer_cache"] else "the engine's layer cache"
    table.add_row(
        f"first, once ({cache})",
        f"{result['first_seconds']:.1f}",
        str(result["first_built"]),
        str(result["first_pushed"]),
    )
    table.add_row(
        "trainflow, unchanged context",
        shown(result["trainflow_unchanged_seconds"], ".2f"),
        str(result["unchanged_rebuilt"]),
        str(result["unchanged_pushed"]),
    )
    table.add_row(
        "docker build (layer cache) + docker push",
        shown(result["docker_build_push_seconds"], ".2f"),
        "cached",
        "layers exist",
    )
    Console().print(table)
    Console().print(f"unchanged context: trainflow {shown(result['speedup'], '.1f')}x faster than docker build + push")
