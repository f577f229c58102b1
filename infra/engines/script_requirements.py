"""A scripts folder's requirements.txt against what its ranks run in: a requirement that conflicts with a pin of the
lock (containers/requirements/constraints.txt, which the images and the venv are installed from) is refused in one line
naming the package and the locked version, before anything is built or started. On the process pool, whose ranks run
in trainflow's environment, what that environment lacks is installed once per requirements content into a folder of
the workdir (envs/<digest>) that goes first on the ranks' PYTHONPATH, against the lock's pins; nothing is installed
when everything is already there."""

import hashlib
import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from infra.core.errors import BadInput
from infra.engines.contract import REPO

LOCK = REPO / "containers" / "requirements" / "constraints.txt"
REQUIREMENTS = "requirements.txt"
COMPLETE = ".complete"  # written last in an installed requirements folder: it is whole


def locked(lock: Path = LOCK) -> dict[str, str]:
    """Package -> the version the lock pins."""
    pins: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        name, equals, pinned = line.split("#")[0].strip().partition("==")
        if equals:
            pins[canonicalize_name(name)] = pinned.strip()
    return pins


def requirements_of(source: Path) -> list[Requirement]:
    """The requirements of the folder's requirements.txt (none without one); a line pip would refuse is refused."""
    path = source / REQUIREMENTS
    found = []
    for number, raw in enumerate(path.read_text().splitlines() if path.is_file() else [], 1):
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise BadInput(f"{path}, line {number}: {line!r}: give packages only (name and version), no pip options")
        try:
            found.append(Requirement(line))
        except InvalidRequirement as exc:
            raise BadInput(f"{path}, line {number}: {line!r} is not a requirement ({exc})") from None
    return found


def check_requirements(source: Path, lock: Path = LOCK) -> list[str]:
    """Refuse a requirement the lock's pins contradict; the requirements."""
    pins, found = locked(lock), []
    for requirement in requirements_of(source):
        name = canonicalize_name(requirement.name)
        if name in pins and not requirement.specifier.contains(pins[name], prereleases=True):
            raise BadInput(
                f"{source / REQUIREMENTS} asks for {requirement}, but trainflow's environments lock {requirement.name} "
                f"at {pins[name]}; loosen the requirement to admit {pins[name]} (or leave it out)"
            )
        found.append(str(requirement))
    return found


def unmet(source: Path) -> list[str]:
    """The requirements of the folder this environment does not meet."""
    missing = []
    for requirement in requirements_of(source):
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            installed = None
        if installed is None or not requirement.specifier.contains(installed, prereleases=True):
            missing.append(str(requirement))
    return missing


def requirements_env(source: Path, envs: Path, lock: Path = LOCK) -> Path | None:
    """The folder that holds what this environment lacks of the folder's requirements, installed there once per
    requirements content (and Python, and lock); None when nothing is lacking."""
    if not (missing := unmet(source)):
        return None
    key = hashlib.sha256("\n".join([*missing, sys.version, lock.read_text()]).encode()).hexdigest()[:16]
    folder = envs / key
    if (folder / COMPLETE).exists():
        return folder
    envs.mkdir(parents=True, exist_ok=True)
    partial = envs / f".{key}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "-q", "--target", str(partial), "-c", str(lock), *missing]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        said = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()
        raise BadInput(
            f"cannot install {', '.join(missing)} of {source / REQUIREMENTS} for the script: "
            f"{said[-1] if said else f'pip exited with status {done.returncode}'}"
        )
    (partial / COMPLETE).write_text(" ".join(missing))
    shutil.rmtree(folder, ignore_errors=True)  # one left half-made by a killed install
    os.replace(partial, folder)
    return folder
