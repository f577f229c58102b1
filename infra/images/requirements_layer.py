"""A user's script's requirements as one thin layer over the framework's training image.

The layer is the image plus the requirements' wheels, installed against the lock's pins (the wheels are fetched on
this machine for the image's Python, constrained by containers/requirements/constraints.txt, and installed in the
build from no index, as the images themselves are). Its tag is the image's tag and a digest of the requirements and
the lock: a code edit changes neither, so the layer is built once per requirements content and reused after.
Nothing is built when the image already holds every requirement (pip in the image installing them from no index
installs nothing and succeeds exactly then). The scripts are never baked in: they come mounted, as for the trainer.
"""

import hashlib
import shutil
import sys
from pathlib import Path

from infra.images.build_context import NEWER_PLATFORMS, run_pip
from infra.images.registry import DockerEngine, ImageError

DOCKERFILE = """\
FROM {base}
COPY wheels/ /tmp/wheels/
COPY requirements.txt /opt/trainflow/script-requirements.txt
RUN pip install --no-index --find-links /tmp/wheels -r /opt/trainflow/script-requirements.txt && rm -rf /tmp/wheels
"""
COMPLETE = ".complete"  # written last in a fetched wheel folder: it is whole


def layer_tag(base_tag: str, requirements: list[str], lock: Path) -> str:
    """The layer's tag: the image's, and what the layer adds (the requirements, against the lock)."""
    key = hashlib.sha256("\n".join([*sorted(requirements), lock.read_text()]).encode()).hexdigest()[:12]
    return f"{base_tag}-req{key}"


def pip_check(requirements: list[str]) -> list[str]:
    """The command that succeeds, installing nothing, exactly where its environment already holds `requirements`."""
    return ["python", "-m", "pip", "install", "--no-index", "--dry-run", "-q", *requirements]


def pip_said(status: int, lines: list[str]) -> str | None:
    """None for a pip_check that succeeded, else pip's line naming a requirement it lacks."""
    if status == 0:
        return None
    said = [line.strip() for line in lines if line.strip()]
    errors = [line for line in said if line.startswith("ERROR")] or said[-1:]
    return errors[0] if errors else f"pip exited with status {status}"


def unmet_in_image(engine: DockerEngine, image: str, requirements: list[str]) -> str | None:
    """None when `image` holds every requirement, else pip's line naming one it lacks."""
    container = engine.client.containers.run(image, pip_check(requirements), detach=True, network_mode="none")
    try:
        status = container.wait()["StatusCode"]
        said = container.logs().decode(errors="replace").splitlines()
    finally:
        container.remove(force=True)
    return pip_said(status, said)


def fetch_wheels(requirements: list[str], python: str, lock: Path, cache: Path) -> Path:
    """A folder with the wheels of `requirements` and their dependencies for `python` on Linux x86-64, at the lock's
    versions, fetched once per requirements content; a requirement with no wheel is refused naming pip's line."""
    key = hashlib.sha256("\n".join([*sorted(requirements), python, lock.read_text()]).encode()).hexdigest()[:16]
    folder = cache / f"script-wheels-py{python}-{key}"
    if (folder / COMPLETE).exists():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "-d", str(partial), "-c", str(lock)]
    command += ["--only-binary", ":all:", "--python-version", python, "--implementation", "cp"]
    for platform in NEWER_PLATFORMS:
        command += ["--platform", platform]
    try:
        run_pip([*command, *requirements])
    except ImageError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise ImageError(
            f"cannot fetch wheels of the script's requirements {', '.join(requirements)} for the image's Python "
            f"{python} (the image installs wheels only, from no index): {exc}",
            permanent=True,
        ) from None
    (partial / COMPLETE).write_text(key)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def layer_context(dest: Path, base: str, requirements: list[str], wheels: Path) -> Path:
    """The layer's build context in `dest` (replacing what was there): its Dockerfile, requirements.txt, wheels/."""
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "wheels").mkdir(parents=True)
    (dest / "Dockerfile").write_text(DOCKERFILE.format(base=base))
    (dest / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements))
    for wheel in wheels.glob("*.whl"):
        shutil.copy2(wheel, dest / "wheels" / wheel.name)
    return dest
