"""The image step (build-image): build and push the training image of the run's framework (one image per
framework's libraries: training.IMAGE_STACK), or check image.use, where a later step of the walk runs in it. It comes
first: a missing or unbuildable image fails the run before any data moves. A script's requirements the image lacks
become one thin layer over it (infra/images/requirements_layer.py), which the pool then runs."""

from flows.steps.context import Context
from infra.images.build_context import wheel_cache
from infra.storage.transfers import step_plan
from tasks.build_image import build_image_task, plan_image, plan_layer


def needed(ctx: Context) -> bool:
    """Whether a step of the walk runs in the image (its `in_image`): the pool's nodes, the sync job on the pool."""
    return any(in_image(ctx.cfg) for in_image in ctx.each("in_image"))


def plan(ctx: Context) -> list[dict]:
    """The step's decision, if needed; the image is the reference the pool would run (name:tag)."""
    if not needed(ctx):
        return []
    row = plan_image(ctx.cfg.image, wheel_cache(), stack=ctx.cfg.training.IMAGE_STACK)
    ctx.image = row["image"]
    if requirements := ctx.cfg.image_requirements():
        return [row, plan_layer(row["image"], requirements)]
    return [row]


def run(ctx: Context) -> None:
    """Build (unless built) and push the image, or check image.use, if needed; the image is its reference."""
    if not needed(ctx):
        ctx.did(step_plan("build-image", "skip", f"nothing runs in an image on the {ctx.cfg.pool.backend} pool"))
        return
    cfg = ctx.cfg
    requirements = cfg.image_requirements()
    built = build_image_task(cfg.image, cfg.workdir, wheel_cache(), cfg.training.IMAGE_STACK, requirements)
    ctx.image = built["image"]
    ctx.did(built["plan"])
    if "layer" in built:
        ctx.did(built["layer"])
