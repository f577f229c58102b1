"""The build context of a training image, and the tag that names its content.

Every image is built from one context assembled out of containers/: its Dockerfile (a framework's image stack and
the flavour: cpu.Dockerfile, gpu.Dockerfile, tf-cpu.Dockerfile, tf-gpu.Dockerfile), the training package, the rank
shim of a user's script (scriptrun/), build/ and requirements/. The CPU images also get wheels/: the Horovod sdist
and the pinned wheels of their requirements (HERMETIC) for the image's Python, so their builds need no index.
The tag is a hash of every file's path and content plus the build arguments: the same inputs give
the same tag, so an unchanged context is found in the registry and neither rebuilt nor pushed.
"""

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from infra.images.registry import ImageError

CONTAINERS = Path(__file__).resolve().parents[2] / "containers"
HOROVOD = "horovod==0.28.1"
IGNORED = ("__pycache__", ".pyc")
# The Dockerfiles that install only from the context's wheels/ (no index at build time), and the requirement files
# of containers/requirements/ whose wheels go there. tf-keras.txt is installed with --no-deps (its metadata asks for
# the full `tensorflow` wheel, the image has tensorflow-cpu); the others are complete pinned sets.
HERMETIC = {
    "cpu.Dockerfile": ("image.txt",),
    "tf-cpu.Dockerfile": ("image.txt", "tensorflow.txt", "tf-keras.txt"),
}
# The wheels' platforms: manylinux2014 (glibc 2.17) for image.txt, as ever; TensorFlow's wheels and some of its
# dependencies' are manylinux_2_27 or _2_28 only (both bases, Debian bookworm's and python:3.11-slim's, have glibc
# 2.36), and pip takes a manylinux_2_x platform literally (it accepts no older one for it), hence the list.
PLATFORMS = {"image.txt": ("manylinux2014_x86_64",)}
NEWER_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux2014_x86_64")
SDISTS = {"image.txt": (HOROVOD,)}  # built in the image: Horovod, by build/horovod-wheel.sh


def source_files(dockerfile: str) -> dict[str, Path]:
    """Context path -> source file: the Dockerfile (its name in containers/, e.g. "tf-cpu.Dockerfile"), the training
    package, the node-side library, the rank shim, build/ and requirements/."""
    if not (CONTAINERS / dockerfile).is_file():
        known = ", ".join(sorted(p.name for p in CONTAINERS.glob("*.Dockerfile")))
        raise ImageError(f"there is no containers/{dockerfile} (the Dockerfiles: {known})", permanent=True)
    files = {"Dockerfile": CONTAINERS / dockerfile}
    for folder in ("trainer", "nodelib", "scriptrun", "build", "requirements"):
        for path in sorted((CONTAINERS / folder).rglob("*")):
            if path.is_file() and not any(part in str(path) for part in IGNORED):
                files[str(path.relative_to(CONTAINERS))] = path
    return files


def assemble_context(dockerfile: str, dest: Path, python: str, wheel_cache: Path) -> Path:
    """Write the build context of containers/`dockerfile` to `dest` (replacing what was there) and return it."""
    if dest.exists():
        shutil.rmtree(dest)
    for rel, src in source_files(dockerfile).items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    wheels = dest / "wheels"
    wheels.mkdir()
    for requirements in HERMETIC.get(dockerfile, ()):
        for wheel in wheelhouse(python, wheel_cache, requirements).glob("*.*"):
            if wheel.name != ".complete":
                shutil.copy2(wheel, wheels / wheel.name)
    return dest


def wheelhouse(python: str, cache: Path, requirements: str = "image.txt") -> Path:
    """A folder with the pinned wheels of containers/requirements/`requirements` for `python` on Linux x86-64 (and
    its SDISTS), fetched once."""
    pins = (CONTAINERS / "requirements" / requirements).read_text()
    platforms, sdists = PLATFORMS.get(requirements, NEWER_PLATFORMS), SDISTS.get(requirements, ())
    key = hashlib.sha256(f"{python}\n{platforms}\n{sdists}\n{pins}".encode()).hexdigest()[:16]
    folder = cache / f"wheelhouse-{Path(requirements).stem}-py{python}-{key}"
    if (folder / ".complete").exists():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(partial)]
    binaries = ["--only-binary", ":all:", "--python-version", python, "--implementation", "cp"]
    for platform in platforms:
        binaries += ["--platform", platform]
    run_pip(pip + binaries + ["-r", str(CONTAINERS / "requirements" / requirements)])
    for sdist in sdists:
        run_pip(pip + ["--no-binary", ":all:", sdist])
    partial.rename(folder)
    (folder / ".complete").write_text(key)
    return folder


def run_pip(command: list[str]) -> None:
    """Run pip; its failure becomes an ImageError with pip's own message."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise ImageError(f"could not fetch the image's Python packages with pip:\n{tail}")


def context_tag(context: Path, build_args: dict[str, str]) -> str:
    """A tag that changes exactly when a file of the context (path or content) or a build argument changes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context).as_posix()
        digest.update(f"{rel}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    for key, value in sorted(build_args.items()):
        digest.update(f"arg {key}={value}\n".encode())
    return digest.hexdigest()[:20]


def wheel_cache() -> Path:
    """Where wheels and sdists are kept between builds (shared with `make setup`'s Horovod wheel)."""
    return Path.home() / ".cache" / "trainflow" / "wheels"
