"""The build context of a training image, and the tag that names its content.

Both images are built from one context assembled out of containers/: the Dockerfile of the flavour,
the training package, build/ and requirements/. The CPU image also gets wheels/: the Horovod sdist and
the pinned wheels of requirements/image.txt for the image's Python, so its build needs no index.
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


def source_files(flavour: str) -> dict[str, Path]:
    """Context path -> source file: the flavour's Dockerfile, the training package, build/ and requirements/."""
    files = {"Dockerfile": CONTAINERS / f"{flavour}.Dockerfile"}
    for folder in ("trainer", "build", "requirements"):
        for path in sorted((CONTAINERS / folder).rglob("*")):
            if path.is_file() and not any(part in str(path) for part in IGNORED):
                files[str(path.relative_to(CONTAINERS))] = path
    return files


def assemble_context(flavour: str, dest: Path, python: str, wheel_cache: Path) -> Path:
    """Write the build context of `flavour` to `dest` (replacing what was there) and return it."""
    if dest.exists():
        shutil.rmtree(dest)
    for rel, src in source_files(flavour).items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    wheels = dest / "wheels"
    wheels.mkdir()
    if flavour == "cpu":
        for wheel in wheelhouse(python, wheel_cache).glob("*.*"):
            if wheel.name != ".complete":
                shutil.copy2(wheel, wheels / wheel.name)
    return dest


def wheelhouse(python: str, cache: Path) -> Path:
    """A folder with the Horovod sdist and the pinned wheels for `python` on Linux x86-64, fetched once."""
    requirements = CONTAINERS / "requirements" / "image.txt"
    key = hashlib.sha256(f"{HOROVOD}\n{python}\n{requirements.read_text()}".encode()).hexdigest()[:16]
    folder = cache / f"wheelhouse-py{python}-{key}"
    if (folder / ".complete").exists():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(partial)]
    run_pip(
        pip
        + [
            "--only-binary",
            ":all:",
            "--platform",
            "manylinux2014_x86_64",
            "--python-version",
            python,
            "--implementation",
            "cp",
            "-r",
            str(requirements),
        ]
    )
    run_pip(pip + ["--no-binary", ":all:", HOROVOD])
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
