"""A scripts version: the training package as the file share holds it, named after the digest of its files.

The upload step (tasks/upload_scripts.py) puts the package under `scripts/<version>/`, where the version is
`scripts_version` of every file's path and SHA-256, and writes those digests to `.hashes.json` there. A node runs
the trainer from that folder, so the trainer checks it before it imports anything else of the package
(`exit_unless_intact`, called by each entry point): every file must be the one the version was named after, and no
file may be added. Python's compiled caches are never read from the share: the entry points move them to a folder of
the user's (`sys.pycache_prefix`), so a planted `__pycache__/*.pyc` is not executed. The version is the folder's name
(scripts/<version>, as the local and Docker pools see it) or, where the share is mounted under another name (Azure
ML), what its `.complete` says; a folder with neither (this checkout's containers/, an image's copy) is not a
scripts version and is not checked.

Standard library only: it runs before the package's other modules are trusted.
"""

import hashlib
import json
import os
import re
import sys
from pathlib import Path

HASHES = ".hashes.json"  # path -> SHA-256 of every file of the version, written before .complete
COMPLETE = ".complete"  # written last: the version is whole
VERSION = re.compile(r"[0-9a-f]{16}")  # a version's name: scripts_version's digest


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def scripts_version(hashes: dict[str, str]) -> str:
    """A version id that changes exactly when a path or a content changes."""
    text = "".join(f"{path}\0{digest}\n" for path, digest in sorted(hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def expected_version(folder: Path) -> str | None:
    """The version `folder` says it is: its name when named scripts/<16 hex digits>, else its .complete's text; None
    for a folder that is not a scripts version."""
    if folder.parent.name == "scripts" and VERSION.fullmatch(folder.name):
        return folder.name
    try:
        return (folder / COMPLETE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None if not (folder / HASHES).exists() else ""


def version_files(folder: Path) -> list[str]:
    """The version's files, relative and "/"-separated: all but its two records and Python's caches."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(root, folder)
        found += [f if rel == "." else f"{rel}/{f}".replace(os.sep, "/") for f in files]
    return sorted(set(found) - {HASHES, COMPLETE})


def version_problem(folder: Path, version: str) -> str | None:
    """What keeps the scripts version at `folder` from being `version`, the one it is named after, or None."""
    try:
        hashes = json.loads((folder / HASHES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"its {HASHES}, the digests the version is named after, is missing or unreadable"
    if not (isinstance(hashes, dict) and all(isinstance(v, str) for v in hashes.values())):
        return f"its {HASHES} is not a map of file to SHA-256"
    if scripts_version(hashes) != version:
        return f"its {HASHES} was changed (its digests make version {scripts_version(hashes)})"
    for rel in version_files(folder):
        if rel not in hashes:
            return f"{rel} was added to it"
        if sha256_file(folder / rel) != hashes[rel]:
            return f"{rel} was changed"
    missing = sorted(set(hashes) - set(version_files(folder)))
    return f"{missing[0]} is missing from it" if missing else None


def exit_unless_intact(folder: Path) -> None:
    """The trainer's first act on a node: exit 2 with one line when `folder`, the scripts version that holds
    trainer/, differs from the version it is named after; otherwise return."""
    version = expected_version(folder)
    if version is not None and (problem := version_problem(folder, version)):
        print(
            f"error: scripts version {folder} cannot be run: {problem}; delete the file share's scripts/ folder "
            "(the next run uploads the scripts afresh, copying nothing from it) and check who can write to the share",
            file=sys.stderr,
        )
        sys.exit(2)
