"""Step 1: upload the training scripts to the file share, versioned by content.

The package goes to scripts/<version>/ where the version is a hash of every file's path and
content; a version is usable once scripts/<version>/.complete exists (written last), so a running
job never sees a half-updated set. Files unchanged since the previous version are copied inside
the share (server-side on Azure): only changed files are uploaded.
"""

import json
from pathlib import Path

from prefect import task

from infra.core.errors import BadInput
from infra.engines.contract import NODELIB, PACKAGE
from infra.storage.fileshare import FileShare, FileShareConfig, open_share
from infra.storage.transfers import Transfer, step_plan, transfer_progress
from nodelib.scripts import COMPLETE, HASHES, scripts_version, sha256_file
from tasks.retry import unless_permanent

LATEST = "scripts/LATEST"
SOURCES = (".py", ".c")  # the training package's files that travel with a scripts version


def package_files(extra_files: list[Path]) -> dict[str, Path]:
    """Relative path on the share -> local file: the training package (its Python and the C of the fast loader's
    partial decoding, which each node compiles once per version) and the node-side library it runs on, plus the
    extra files."""
    files = {
        f"{package.name}/{p.relative_to(package)}": p
        for package in (PACKAGE, NODELIB)
        for p in sorted(package.rglob("*"))
        if p.suffix in SOURCES
    }
    for extra in extra_files:
        if not extra.is_file():
            raise BadInput(f"fileshare.extra_files names {extra}, which is not a file")
        files[extra.name] = extra
    return files


def plan_scripts(share: FileShare | None, files: dict[str, Path]) -> tuple[dict[str, str], dict]:
    """The files' hashes, and the step's decision: skip when the share holds this content version (an Azure
    share is asked only by the run itself: `share` None)."""
    hashes = {rel: sha256_file(path) for rel, path in files.items()}
    version = scripts_version(hashes)
    if share is None:
        return hashes, step_plan(
            "upload-scripts",
            "run",
            f"upload {len(files)} files as scripts/{version} unless the share holds that version",
            version=version,
        )
    if share.exists(f"scripts/{version}/{COMPLETE}"):
        return hashes, step_plan(
            "upload-scripts", "skip", f"version {version} is already on the share", version=version
        )
    previous = previous_hashes(share)
    changed = sum(1 for rel, digest in hashes.items() if previous.get(rel, ("", ""))[1] != digest)
    kept = f", {len(files) - changed} copied from the share's latest version" if changed < len(files) else ""
    return hashes, step_plan(
        "upload-scripts", "run", f"upload {changed} of {len(files)} files as version {version}{kept}", version=version
    )


def upload_scripts(share: FileShare, files: dict[str, Path]) -> tuple[Transfer, str, dict]:
    """Put `files` on the share as one version; returns the transfer, the version's folder and the decision."""
    hashes, plan = plan_scripts(share, files)
    transfer, folder = Transfer("scripts -> file share"), f"scripts/{plan['version']}"
    version = plan["version"]
    if plan["action"] == "skip":
        transfer.skipped_files = len(files)
        transfer.skipped_bytes = sum(p.stat().st_size for p in files.values())
        return transfer, folder, plan
    previous = previous_hashes(share)
    unchanged = {rel for rel in files if rel in previous and previous[rel][1] == hashes[rel]}
    for rel in unchanged:
        share.copy_within(f"{previous[rel][0]}/{rel}", f"{folder}/{rel}")
    transfer.skipped_files = len(unchanged)
    transfer.skipped_bytes = sum(files[rel].stat().st_size for rel in unchanged)
    changed = {rel: path for rel, path in files.items() if rel not in unchanged}
    with transfer_progress(transfer, sum(p.stat().st_size for p in changed.values()), len(changed)) as advance:
        for rel, path in changed.items():
            share.upload_file(path, f"{folder}/{rel}")
            advance(path.stat().st_size, 1)
    share.write_text(f"{folder}/{HASHES}", json.dumps(hashes, indent=1))
    share.write_text(f"{folder}/{COMPLETE}", version)
    share.write_text(LATEST, version)
    return transfer, folder, plan


def previous_hashes(share: FileShare) -> dict[str, tuple[str, str]]:
    """Relative path -> (folder, hash) of the latest complete version, if any."""
    latest = share.read_text(LATEST)
    if not latest:
        return {}
    text = share.read_text(f"scripts/{latest.strip()}/{HASHES}")
    if not text:
        return {}
    return {rel: (f"scripts/{latest.strip()}", digest) for rel, digest in json.loads(text).items()}


@task(name="upload-scripts", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=unless_permanent)
def upload_scripts_task(cfg: FileShareConfig, workdir: Path, files: dict[str, Path]) -> dict:
    """Prefect step: upload the scripts (relative path -> file); returns the transfer summary, the version's folder
    and its URL."""
    share = open_share(cfg, workdir)
    transfer, folder, plan = upload_scripts(share, files)
    return {**transfer.row(), "path": share.url(folder), "version": folder, "plan": plan}
