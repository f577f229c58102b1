"""The node-side fetch: bring a file server to a staged data set version (what the Azure ML sync job runs).

    python nodelib/staged/fetch.py --source <datastore mount of datasets/imagenet/> --export /mnt/fileserver \\
        --dataset imagenet

brings `<export>/datasets/imagenet/current` to the staged version: unchanged files are hard-linked from
the current version, the rest extracted from their shards and checked against the manifest; a lock in
the export makes the ranks of one node wait for the first one's fetch instead of repeating it. Bad input (a data
set never staged there, a name that is not one, a manifest or shard that breaks the format) exits 2 with one line."""

import argparse
import fcntl
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

if __package__ in (None, ""):  # run as a script on a node: `trainer` importable, its scripts version checked
    sys.pycache_prefix = sys.pycache_prefix or os.path.expanduser("~/.cache/trainflow/pycache")  # never a share's
    sys.path.insert(0, scripts := str(Path(__file__).resolve().parents[2]))
    from nodelib.scripts import exit_unless_intact

    exit_unless_intact(Path(scripts))  # before any other module of the package is imported

from nodelib.errors import DiskFull, UntrustedInput, UsageError, writing
from nodelib.records import Failure, event_line
from nodelib.staged.manifest import Manifest
from nodelib.staged.names import MANIFEST_FILE, FileEntry, check_dataset_name, shard_blob, shard_file
from nodelib.staged.versions import FILESERVER_FIX, FileServer, decide_sync, extract_members, fill_version


@contextmanager
def node_lock(export: Path) -> Iterator[None]:
    """One fetch at a time per export: the other ranks of a node wait here, then find the version complete."""
    export.mkdir(parents=True, exist_ok=True)
    with open(export / ".trainflow-fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def fetch(source: Path, export: Path, name: str, threads: int = 8) -> Path:
    """Bring `export`'s current version of `name` to the data set staged in the folder `source` (its manifest and
    shards/); the folder to read."""
    server = FileServer(export)
    with (
        node_lock(export),
        tempfile.TemporaryDirectory(prefix=".trainflow-", dir=export) as tmp,
        Manifest.load(source / MANIFEST_FILE, Path(tmp) / "manifest.db", name) as manifest,
    ):
        plan = decide_sync(server, name, manifest)
        if plan.complete:
            server.activate(name, manifest.version)
            return server.current(name)
        with server.new_version(name, manifest) as dest:

            def extract(shard: str, wanted: Iterator[FileEntry]) -> None:
                extract_members(source / shard_file(shard), wanted, dest, shard_blob(name, shard))

            fill_version(plan, dest, extract, threads)
    return server.current(name)


def main(argv: list[str] | None = None) -> int:
    """The node-side fetch as a command; bad input exits 2 with one line."""
    p = argparse.ArgumentParser(description="Bring a file server (NFS or local disk) to a staged data set version.")
    p.add_argument(
        "--source",
        type=Path,
        required=True,
        help="the staged data set's folder: manifest.jsonl, shards/ (a datastore mount of datasets/<name>/)",
    )
    p.add_argument("--export", type=Path, required=True, help="the file server's root (NFS mount or local disk)")
    p.add_argument("--dataset", required=True, help="the data set's name")
    args = p.parse_args(argv)
    try:
        check_dataset_name(args.dataset)
    except UsageError as exc:
        return stop(Failure(str(exc)))
    if not (args.source / MANIFEST_FILE).is_file():
        never = f"data set {args.dataset} was never staged there (run `trainflow stage` first)"
        return stop(Failure(f"{args.source} has no {MANIFEST_FILE}: {never}"))
    try:
        with writing(args.export, fix=FILESERVER_FIX):
            print(f"fetched {args.dataset}: {fetch(args.source, args.export, args.dataset).resolve()}", flush=True)
    except UntrustedInput as exc:
        return stop(Failure(str(exc)))
    except DiskFull as exc:
        return stop(Failure(str(exc), "fault"))
    except OSError as exc:
        return stop(Failure(f"cannot write to {args.export}: {exc.strerror}", "fault"))
    return 0


def stop(failure: Failure) -> int:
    """The error line for people and its event (nodelib/records.py: what the Azure ML attempt reads); the exit
    status: 2 for bad input, 1 for a fault."""
    print(f"error: {failure.message}", file=sys.stderr)
    print(event_line(failure), file=sys.stderr, flush=True)
    return 2 if failure.cause == "input" else 1


if __name__ == "__main__":
    sys.exit(main())
