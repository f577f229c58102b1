"""The file server every node mounts: versions of each data set, published atomically.

Locally the export is a folder under the workdir that the local workers read; on Azure it is the NFS
share the pool mounts, seen at its mount point on the machine that runs the sync. Layout:

    <export>/datasets/<name>/v-<version>/   one complete copy (train/, val/, .manifest.json)
    <export>/datasets/<name>/current        symlink to the newest complete version: what training reads

A version is written under a temporary name and renamed when complete, then `current` is switched
with one rename, so a reader sees a whole version or none.
"""

import errno
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from infra.errors import TrainflowError

MANIFEST = ".manifest.json"


class FileServerError(TrainflowError):
    """The file server cannot take the data (disk full, not writable): a retry would meet it again."""

    permanent = True


class FileServer:
    """Data set versions under one export folder."""

    def __init__(self, export: Path):
        self.export = export

    def dataset_dir(self, name: str) -> Path:
        return self.export / "datasets" / name

    def current(self, name: str) -> Path:
        """The path training reads: always a complete version."""
        return self.dataset_dir(name) / "current"

    def version_dir(self, name: str, version: str) -> Path:
        return self.dataset_dir(name) / f"v-{version}"

    def is_complete(self, name: str, version: str) -> bool:
        return (self.version_dir(name, version) / MANIFEST).is_file()

    def current_manifest(self, name: str) -> tuple[Path, dict] | None:
        """The folder and manifest of the current version, if there is one."""
        path = self.current(name) / MANIFEST
        return (self.current(name).resolve(), json.loads(path.read_text())) if path.is_file() else None

    @contextmanager
    def new_version(self, name: str, manifest: dict) -> Iterator[Path]:
        """Yield a temporary folder to fill; on success it becomes the current version, on error it goes."""
        final = self.version_dir(name, manifest["version"])
        tmp = final.with_name(f".{final.name}.partial")
        try:
            self.remove_leftovers(name)  # of a sync that crashed: never visible, safe to drop
            tmp.mkdir(parents=True)
            yield tmp
            (tmp / MANIFEST).write_text(json.dumps(manifest))
            os.replace(tmp, final)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise FileServerError(f"the file server at {self.export} is full ({manifest['bytes'] / 1e6:.1f} MB "
                                      "needed); free space there or point fileserver.export elsewhere") from None
            raise FileServerError(f"cannot write to the file server at {self.export} ({exc.strerror})") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.activate(name, manifest["version"])

    def activate(self, name: str, version: str) -> None:
        """Point `current` at a complete version with one atomic rename; keep it and the one before."""
        link = self.current(name)
        tmp = link.with_name(f".current.tmp-{os.getpid()}")
        tmp.unlink(missing_ok=True)
        os.symlink(self.version_dir(name, version).name, tmp)
        os.replace(tmp, link)
        self.prune(name, keep=2)

    def prune(self, name: str, keep: int) -> None:
        """Remove all but the newest `keep` complete versions (the current one always stays).

        A version is renamed out of sight before it is deleted, so a crash mid-delete never leaves a
        partial folder that still looks complete."""
        current = self.current(name).resolve()
        versions = sorted((p for p in self.dataset_dir(name).glob("v-*") if p.is_dir()),
                          key=lambda p: p.stat().st_mtime, reverse=True)
        for old in versions[keep:]:
            if old != current:
                doomed = old.with_name(f".{old.name}.deleting")
                os.replace(old, doomed)
                shutil.rmtree(doomed, ignore_errors=True)

    def remove_leftovers(self, name: str) -> None:
        """Delete the partial and half-deleted versions that crashed runs left behind."""
        for leftover in self.dataset_dir(name).glob(".v-*"):
            shutil.rmtree(leftover, ignore_errors=True)
