"""The image step (build-image): build and push the training image of the run's framework (one image per
framework's libraries: training.IMAGE_STACK), or check image.use, where a later step of the walk runs in it. It comes
first: a missing or unbuildable image fails the run before any data moves."""

from flows.steps.context import Context
from infra.images.build_context import wheel_cache
from infra.storage.transfers import step_plan
from tasks.build_image import build_image_task, plan_image


def needed(ctx: Context) -> bool:
    """Whether a step of the walk runs in the image (its `in_image`): the pool's nodes, the sync job on the pool."""
    return any(in_image(ctx.cfg) for in_image in ctx.each("in_image"))


def plan(ctx: Context) -> list[dict]:
    """The step's decision, if needed; the image is the reference the pool would run (name:tag)."""
    if not needed(ctx):
        return []
    row = plan_image(ctx.cfg.image, wheel_cache(), stack=ctx.cfg.training.IMAGE_STACK)
    ctx.image = row["image"]
    return [row]


def run(ctx: Context) -> None:
    """Build (unless built) and push the image, or check image.use, if needed; the image is its reference."""
    if not needed(ctx):
        ctx.did(step_plan("build-image", "skip", f"nothing runs in an image on the {ctx.cfg.pool.backend} pool"))
        return
    built = build_image_task(ctx.cfg.image, ctx.cfg.workdir, wheel_cache(), stack=ctx.cfg.training.IMAGE_STACK)
    ctx.image = built["image"]
    ctx.did(built["plan"])
