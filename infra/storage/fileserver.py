"""The file server every node mounts: versions of each data set, published atomically.

Locally the export is a folder under the workdir that the local workers read; on Azure it is the NFS
share the pool mounts (written by the sync job on the cluster, see infra/compute/azureml/). The
layout and the version logic are the nodes' too, so they live in nodelib/staged/; this module adds
the orchestrator's errors:

    <export>/datasets/<name>/v-<version>/   one complete copy (train/, val/, .manifest.jsonl, .verified.json)
    <export>/datasets/<name>/current        symlink to the newest complete version: what training reads
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.core.diskspace import DiskFull, disk_full, is_disk_full
from infra.core.errors import TrainflowError
from nodelib.staged import versions
from nodelib.staged.manifest import Manifest


class FileServerError(TrainflowError):
    """The file server cannot take the data (disk full, not writable): a retry would meet it again. A full disk
    says the bytes needed and free (infra/core/diskspace.py)."""

    permanent = True


class FileServer(versions.FileServer):
    """Data set versions under one export folder; a failed write says what is wrong with the file server."""

    @contextmanager
    def new_version(self, name: str, manifest: Manifest) -> Iterator[Path]:
        """Yield a temporary folder to fill; on success it becomes the current version, on error it goes."""
        try:
            with super().new_version(name, manifest) as tmp:
                yield tmp
        except DiskFull as exc:  # refused before the first file (fill_version), or a writer that named itself
            raise FileServerError(str(exc)) from None
        except OSError as exc:
            if is_disk_full(exc):
                raise FileServerError(self.full(manifest)) from None
            raise FileServerError(f"cannot write to the file server at {self.export} ({exc.strerror})") from None

    def full(self, manifest: Manifest) -> str:
        """The line for a file server that filled during a sync: the version's bytes, what is free."""
        return str(disk_full(self.export, manifest.header["bytes"], fix=versions.FILESERVER_FIX))
