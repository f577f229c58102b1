"""Step 4: build the training image, tag it by content, push it; later steps use the returned digest.

The tag is a hash of the build context and build arguments (infra/build_context.py). If the registry
already holds that tag, nothing is built or pushed; if the local engine holds it, it is only pushed.
"""

import os
import time
from pathlib import Path

from prefect import get_run_logger, task

from infra.build_context import assemble_context, context_tag
from infra.images import Engine, ImageConfig, ImageError, ImageRef, Log, auth_config, layer_sizes, parse_reference
from infra.local_docker import local_base_image
from tasks.progress import Transfer, transfer_progress
from tasks.retry import unless_permanent


def registry_password(cfg: ImageConfig) -> str | None:
    """The registry password: from cfg.password_env, else the Prefect Secret block cfg.password_secret."""
    if not cfg.username:
        return None
    if os.environ.get(cfg.password_env):
        return os.environ[cfg.password_env]
    if cfg.password_secret:
        return secret_value(cfg.password_secret)
    raise ImageError(f"image.username is {cfg.username!r} but there is no password: set the environment variable "
                     f"{cfg.password_env} or name a Prefect Secret block in image.password_secret", permanent=True)


def secret_value(name: str) -> str:
    """The value of the Prefect Secret block `name`."""
    from prefect.blocks.system import Secret

    try:
        return Secret.load(name).get()
    except ValueError:
        raise ImageError(f"there is no Prefect Secret block named {name!r} (image.password_secret); create it in the "
                         "UI (Blocks > Secret) or with Secret(value=...).save(name)", permanent=True) from None


def build_args(cfg: ImageConfig, base: str | None) -> dict[str, str]:
    """The Dockerfile's build arguments: the configured ones, and BASE_IMAGE when the base is replaced."""
    return {**cfg.build_args, **({"BASE_IMAGE": base} if base else {})}


def build_and_push(engine: Engine, cfg: ImageConfig, context_dir: Path, wheel_cache: Path, password: str | None,
                   log: Log, nocache: bool = False) -> dict:
    """Build (unless built) and push (unless pushed) the configured image; returns what happened and the reference.

    `nocache` runs every Dockerfile step again (the engine's layer cache is not used)."""
    started = time.perf_counter()
    base = local_base_image(engine, log) if cfg.base_image == "local" else cfg.base_image
    args = build_args(cfg, base)
    ref = ImageRef(cfg.image_name(), context_tag(assemble_context(cfg.flavour, context_dir, cfg.python, wheel_cache), args))
    auth = auth_config(cfg.username, password)
    if cfg.registry and cfg.username:
        engine.login(cfg.registry, cfg.username, password)
    digest = engine.registry_digest(ref.tagged, auth) if cfg.registry else None
    built = pushed = False
    if digest:
        log(f"{ref.tagged} is already in the registry: nothing to build or push")
    elif not engine.has_image(ref.tagged):
        log(f"building {ref.tagged} from {context_dir}")
        engine.build(context_dir, ref.tagged, args, cfg.build_network, log, nocache)
        built = True
    if cfg.registry and not digest:
        digest, pushed = push(engine, ref, auth, log), True
    final = ImageRef(ref.name, ref.tag, digest)
    return {"image": final.reference, "name": final.name, "tag": final.tag, "digest": digest, "built": built,
            "pushed": pushed, "seconds": round(time.perf_counter() - started, 2)}


def use_existing(engine: Engine, cfg: ImageConfig, password: str | None, log: Log) -> dict:
    """The ready-made image of cfg.use, by digest when it is in a registry; a permanent ImageError when it is missing."""
    host, name, tag, digest = parse_reference(cfg.use)
    if host is None:
        if not engine.has_image(cfg.use):
            raise ImageError(f"image.use names {cfg.use}, which the local Docker engine does not hold; build it "
                             "(`trainflow build`) or unset image.use to build the image in this run", permanent=True)
        return {"image": cfg.use, "name": name, "tag": tag, "digest": digest, "built": False, "pushed": False}
    if cfg.username:
        engine.login(host, cfg.username, password)
    found = engine.registry_digest(cfg.use, auth_config(cfg.username, password))
    if found is None:
        raise ImageError(f"image.use names {cfg.use}, which registry {host} does not hold; push it there (`trainflow "
                         f"build --registry {host}`) or unset image.use to build the image in this run", permanent=True)
    log(f"using {name}@{found} ({cfg.use}); nothing is built")
    return {"image": f"{name}@{found}", "name": name, "tag": tag, "digest": found, "built": False, "pushed": False}


def push(engine: Engine, ref: ImageRef, auth: dict | None, log: Log) -> str:
    """Push with a progress bar over the image's bytes; returns the registry's digest."""
    log(f"pushing {ref.tagged}")
    transfer = Transfer(f"image -> {ref.name.split('/')[0]}")
    sizes = layer_sizes(engine, ref.tagged)
    with transfer_progress(transfer, sum(sizes), len(sizes)) as advance:
        digest = engine.push(ref, auth, log, advance)
    log(f"pushed {ref.name}@{digest}")
    return digest


@task(name="build-image", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=unless_permanent)
def build_image_task(cfg: ImageConfig, workdir: Path, wheel_cache: Path) -> dict:
    """Prefect step: build and push the training image (or check image.use); build output streams into the log."""
    logger = get_run_logger()
    engine = Engine(cfg.engine)
    if cfg.use:
        return use_existing(engine, cfg, registry_password(cfg), logger.info)
    return build_and_push(engine, cfg, workdir / "build" / f"{cfg.flavour}-context", wheel_cache,
                          registry_password(cfg), logger.info)
