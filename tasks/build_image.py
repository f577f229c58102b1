"""Step 4: build the training image, tag it by content, push it; later steps use the returned digest.

The image is the run's framework's: its image stack ("" PyTorch, "tf-" TensorFlow and Keras: the engine's
IMAGE_STACK) picks the Dockerfile, containers/<stack><flavour>.Dockerfile, and the default repository,
trainflow-<stack><flavour>. The tag is a hash of the build context and build arguments
(infra/images/build_context.py). If the registry already holds that tag, nothing is built or pushed; if the local
engine holds it, it is only pushed.
"""

import tempfile
import time
from pathlib import Path

from prefect import get_run_logger, task

from infra.engines.script_requirements import LOCK
from infra.images.build_context import assemble_context, context_tag
from infra.images.local_docker import debootstrap_image, local_base_image, local_base_tag
from infra.images.registry import (
    DockerEngine,
    ImageConfig,
    ImageError,
    ImageRef,
    Log,
    auth_config,
    parse_reference,
    push_totals,
    registry_password,
)
from infra.images.requirements_layer import fetch_wheels, layer_context, layer_tag, unmet_in_image
from infra.storage.transfers import Transfer, step_plan, transfer_progress
from tasks.retry import unless_permanent


def build_args(cfg: ImageConfig, base: str | None) -> dict[str, str]:
    """The Dockerfile's build arguments: the configured ones, and BASE_IMAGE when the base is replaced."""
    return {**cfg.build_args, **({"BASE_IMAGE": base} if base else {})}


def image_ref(cfg: ImageConfig, context_dir: Path, wheel_cache: Path, base: str | None, stack: str = "") -> ImageRef:
    """name:<content tag> of the image the context and build arguments make (its digest comes at push)."""
    context = assemble_context(cfg.dockerfile(stack), context_dir, cfg.python, wheel_cache)
    return ImageRef(cfg.image_name(stack), context_tag(context, build_args(cfg, base)))


def local_python_tag() -> str:
    """The local Debian base with Python alone: the one local_base_image makes on its way to the torch base (the same
    name, so one debootstrap serves both)."""
    return f"trainflow-local/debian-python:{local_base_tag().rsplit(':', 1)[1]}"


def local_base(engine: DockerEngine, stack: str, log: Log) -> str:
    """`image.base_image: local` for the stack: PyTorch's image builds on Debian's Python with the pinned torch; the
    others on Debian's Python alone (their framework comes from the context's wheels; their images hold no torch)."""
    if not stack:
        return local_base_image(engine, log)
    tag = local_python_tag()
    if not engine.has_image(tag):
        debootstrap_image(engine, tag, log)
    return tag


def decide_image(
    engine: DockerEngine, cfg: ImageConfig, ref: ImageRef, password: str | None, step: str = "build-image"
) -> dict:
    """The step's decision: skip when the registry has the tag (or, with no registry, the engine has it); else
    build unless built, and push. The step and the dry run share it."""
    if cfg.registry and cfg.username:
        engine.login(cfg.registry, cfg.username, password)
    digest = engine.registry_digest(ref.tagged, auth_config(cfg.username, password)) if cfg.registry else None
    if digest:
        return step_plan(step, "skip", f"{ref.tagged} is already in the registry", digest=digest, build=False)
    built = engine.has_image(ref.tagged)
    if built and not cfg.registry:
        return step_plan(step, "skip", f"{ref.tagged} is already built (no registry)", digest=None, build=False)
    push = f", push to {cfg.registry}" if cfg.registry else ""
    return step_plan(
        step,
        "run",
        f"{ref.tagged}: {'already built' if built else 'build'}{push}",
        digest=None,
        build=not built,
    )


def plan_image(cfg: ImageConfig, wheel_cache: Path, stack: str = "") -> dict:
    """The dry run's row: the same decision, with the local base image's tag (it is not made here); its `image`
    is the reference the pool would run (name:tag; the run's has the digest the push returns). `stack`: the
    framework's image stack (module docstring)."""
    if cfg.use:
        return step_plan(
            "build-image", "skip", f"image.use: {cfg.use} (its registry is checked when the run starts)", image=cfg.use
        )
    local = local_python_tag() if stack else local_base_tag()
    base = local if cfg.base_image == "local" else cfg.base_image
    with tempfile.TemporaryDirectory() as tmp:
        ref = image_ref(cfg, Path(tmp) / "ctx", wheel_cache, base, stack)
    try:
        return {**decide_image(DockerEngine(cfg.engine), cfg, ref, registry_password(cfg)), "image": ref.tagged}
    except ImageError as exc:
        return step_plan("build-image", "run", f"{ref.tagged}; {exc}", image=ref.tagged)


def plan_layer(image: str, requirements: list[str]) -> dict:
    """The dry run's row for a script's requirements: whether the image holds them is asked of the image itself,
    which the dry run does not start; what the step will do either way."""
    return step_plan(
        "requirements-layer",
        "run",
        f"{', '.join(requirements)}: checked in {image}; a thin layer of what it lacks is built over it (once per "
        "requirements content: a code edit builds nothing)",
    )


def build_and_push(
    engine: DockerEngine,
    cfg: ImageConfig,
    context_dir: Path,
    wheel_cache: Path,
    password: str | None,
    log: Log,
    nocache: bool = False,
    stack: str = "",
) -> dict:
    """Build (unless built) and push (unless pushed) the configured image of the image stack `stack` (module
    docstring); returns what happened and the reference.

    `nocache` runs every Dockerfile step again (the engine's layer cache is not used)."""
    started = time.perf_counter()
    base = local_base(engine, stack, log) if cfg.base_image == "local" else cfg.base_image
    ref = image_ref(cfg, context_dir, wheel_cache, base, stack)
    plan = decide_image(engine, cfg, ref, password)
    log(plan["detail"])
    if plan["build"]:
        engine.build(context_dir, ref.tagged, build_args(cfg, base), cfg.build_network, log, nocache)
    digest, pushed = plan["digest"], False
    if cfg.registry and not digest:
        digest, pushed = push(engine, ref, auth_config(cfg.username, password), log), True
    final = ImageRef(ref.name, ref.tag, digest)
    return {
        "image": final.reference,
        "name": final.name,
        "tag": final.tag,
        "digest": digest,
        "built": plan["build"],
        "pushed": pushed,
        "seconds": round(time.perf_counter() - started, 2),
        "plan": plan,
    }


def use_existing(engine: DockerEngine, cfg: ImageConfig, password: str | None, log: Log) -> dict:
    """The ready-made image of cfg.use, by digest when it is in a registry; a permanent ImageError when it is
    missing."""
    assert cfg.use is not None  # the step calls it only when image.use is set
    host, name, tag, digest = parse_reference(cfg.use)
    if host is None:
        if not engine.has_image(cfg.use):
            raise ImageError(
                f"image.use names {cfg.use}, which the local Docker engine does not hold; build it "
                "(`trainflow build`) or unset image.use to build the image in this run",
                permanent=True,
            )
        return {"image": cfg.use, "name": name, "tag": tag, "digest": digest, "built": False, "pushed": False}
    if cfg.username:
        engine.login(host, cfg.username, password)
    found = engine.registry_digest(cfg.use, auth_config(cfg.username, password))
    if found is None:
        raise ImageError(
            f"image.use names {cfg.use}, which registry {host} does not hold; push it there (`trainflow "
            f"build --registry {host}`) or unset image.use to build the image in this run",
            permanent=True,
        )
    log(f"using {name}@{found} ({cfg.use}); nothing is built")
    return {"image": f"{name}@{found}", "name": name, "tag": tag, "digest": found, "built": False, "pushed": False}


def push(engine: DockerEngine, ref: ImageRef, auth: dict | None, log: Log) -> str:
    """Push with a progress bar over the image's bytes; returns the registry's digest."""
    log(f"pushing {ref.tagged}")
    transfer = Transfer(f"image -> {ref.name.split('/')[0]}")
    with transfer_progress(transfer, *push_totals(engine, ref.tagged)) as advance:
        digest = engine.push(ref, auth, log, advance)
    log(f"pushed {ref.name}@{digest}")
    return digest


def with_requirements(
    engine: DockerEngine,
    cfg: ImageConfig,
    built: dict,
    requirements: list[str],
    workdir: Path,
    wheel_cache: Path,
    password: str | None,
    log: Log,
) -> dict:
    """The image a script with `requirements` runs in: `built` itself when it holds them all, else its thin layer
    of them (infra/images/requirements_layer.py), built unless built and pushed unless pushed; `layer` says which."""
    if not requirements:
        return built
    base = f"{built['name']}:{built['tag']}" if built["tag"] else built["image"]  # image.use by digest: no tag
    if (lacking := unmet_in_image(engine, base, requirements)) is None:
        detail = f"{base} already holds the script's requirements {', '.join(requirements)}"
        log(detail)
        return {**built, "layer": step_plan("requirements-layer", "skip", detail)}
    base_tag = built["tag"] or str(built["digest"]).rsplit(":", 1)[-1][:20]
    ref = ImageRef(built["name"], layer_tag(base_tag, requirements, LOCK))
    plan = decide_image(engine, cfg, ref, password, step="requirements-layer")
    plan["detail"] += f" (over {base}, which lacks: {lacking})"
    log(plan["detail"])
    if plan["build"]:
        wheels = fetch_wheels(requirements, cfg.python, LOCK, wheel_cache)
        context = layer_context(workdir / "build" / "requirements-layer", base, requirements, wheels)
        engine.build(context, ref.tagged, {}, cfg.build_network, log)
    digest, pushed = plan["digest"], False
    if cfg.registry and not digest:
        digest, pushed = push(engine, ref, auth_config(cfg.username, password), log), True
    final = ImageRef(ref.name, ref.tag, digest)
    layered = {"image": final.reference, "tag": ref.tag, "digest": digest, "built": plan["build"], "pushed": pushed}
    return {**built, **layered, "layer": plan}


@task(name="build-image", retries=2, retry_delay_seconds=[5, 30], retry_condition_fn=unless_permanent)
def build_image_task(
    cfg: ImageConfig, workdir: Path, wheel_cache: Path, stack: str = "", requirements: list[str] | None = None
) -> dict:
    """Prefect step: build and push the training image of the framework's image stack `stack` ("" PyTorch, "tf-"
    TensorFlow and Keras), or check image.use, and the thin layer of a script's `requirements` over it where it
    lacks them; build output streams into the log."""
    logger = get_run_logger()
    engine, password = DockerEngine(cfg.engine), registry_password(cfg)
    if cfg.use:
        built = use_existing(engine, cfg, password, logger.info)
    else:
        context = workdir / "build" / f"{stack}{cfg.flavour}-context"
        built = build_and_push(engine, cfg, context, wheel_cache, password, logger.info, stack=stack)
    return with_requirements(engine, cfg, built, requirements or [], workdir, wheel_cache, password, logger.info)
