"""The image flow: build the training image from containers/, tag it by content, push it."""

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.config import FlowConfig
from infra.images.build_context import wheel_cache
from tasks.build_image import build_image_task


@flow(name="build-image")
def build_image(cfg: FlowConfig) -> dict:
    """Build and push the training image of the configured framework; returns its reference (name@digest once
    pushed)."""
    result = build_image_task(cfg.image, cfg.workdir, wheel_cache(), stack=cfg.training.IMAGE_STACK)
    done = "built" if result["built"] else "reused (unchanged context)"
    sent = (
        "pushed"
        if result["pushed"]
        else ("already in the registry" if result["digest"] else "not pushed (no registry)")
    )
    create_markdown_artifact(
        key="training-image",
        markdown=(
            f"# Training image\n\n`{result['image']}`\n\n- tag (content hash): `{result['tag']}`\n- {done}, {sent}\n"
            f"- {result['seconds']} s\n"
        ),
    )
    return result
