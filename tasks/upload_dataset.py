"""Step 2: write the data set to Blob storage as large tar shards, in parallel, manifest last.

Re-running with unchanged data uploads nothing; changing one file re-uploads only its shard; a run
that crashed, or whose storage failed, resumes without re-sending the shards Blob still holds and can serve
(a blob exists only once whole; each stored shard an unfinished upload left is read where Blob could have lost it).
"""

import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prefect import task
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from infra.core.errors import BadInput
from infra.data import manifest as mf
from infra.data.shrink import COPIED, KEPT, LINKED, SHRUNK, shrunk_copy
from infra.storage.blobstore import BlobStore, open_store
from infra.storage.config import StorageConfig
from infra.storage.errors import StorageError
from infra.storage.transfers import Transfer, in_parallel, step_plan, transfer_progress
from nodelib.errors import UsageError
from nodelib.image_files import bad_image_lines, bad_images_error, find_bad_images, write_bad_list
from nodelib.layout import IMAGENET_LAYOUT
from nodelib.staged.manifest import Manifest
from nodelib.staged.names import FORMAT
from tasks.retry import unless_permanent


def cache_path(workdir: Path, name: str) -> Path:
    """The index of a data set's files kept between runs (hashes and image checks by size and mtime)."""
    return workdir / "cache" / f"index-{name}.sqlite"


@contextmanager
def scan_dataset(
    data_dir: Path, workdir: Path, name: str, keep: bool = True, layout: str = IMAGENET_LAYOUT
) -> Iterator[mf.Index]:
    """Index the folder: unchanged files (same size and mtime as in the last scan) keep their hash and image check;
    new or changed files are hashed and decoded once, here, where they enter (the files layout's are not decoded:
    they need not be images). With `keep` the index is kept for the next run as soon as the scan is done (a run that
    then fails on bad files does not decode them again)."""
    cache = cache_path(workdir, name)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed} files"),
        TimeElapsedColumn(),
        transient=True,
    ) as progress:
        bar = progress.add_task(f"list, hash and check {data_dir}", total=None)
        check = find_bad_images if layout == IMAGENET_LAYOUT else no_check
        with mf.scanned(data_dir, cache, check, keep, lambda n: progress.advance(bar, n), layout) as (index, _):
            yield index


def no_check(paths: list[str]) -> list[tuple[str, str]]:
    """The files layout's check of new files: none is refused for what it holds (a script reads any file)."""
    return []


def bad_files_error(index: mf.Index, bad: list[tuple[str, str]], data_dir: Path, workdir: Path, name: str) -> BadInput:
    """The one error for a data set with bad images: the count, the first, and the list file (under the workdir);
    the first 20 are printed above it."""
    listing = write_bad_list(bad, workdir / "cache" / f"bad-files-{name}.tsv")
    Console(stderr=True, highlight=False).print("\n".join(bad_image_lines(bad)), markup=False, soft_wrap=True)
    error: UsageError = bad_images_error(bad, index.total()[0], listing, data_dir)
    return BadInput(str(error))


@dataclass
class UploadPlan:
    """What the container holds, and what this run must send."""

    index: mf.Index
    header: dict  # the new manifest's header
    stored: set[str]  # shard blobs already in the container (those it lists but cannot serve left out)
    previous: dict | None  # the stored manifest's metadata (version, shard_count, files), if any
    why: dict[str, str] = field(default_factory=dict)  # shard blob -> why it is sent, where it is not just new

    @property
    def version(self) -> str:
        return self.header["version"]

    def todo(self, name: str) -> dict[str, tuple[int, int]]:
        """The shards the container lacks, with their files and bytes."""
        return {sid: n for sid, n in self.index.shard_sizes().items() if mf.shard_blob(name, sid) not in self.stored}

    def unchanged(self) -> bool:
        """Whether the stored manifest already describes this data set."""
        return bool(self.previous and self.previous.get("version") == self.version)

    def accounting(self, name: str) -> str:
        """The shards skipped and sent, and why each was sent: the line a re-run after a fault is read by."""
        todo, shards = self.todo(name), len(self.index.shards)
        reasons = [self.why.get(mf.shard_blob(name, sid), "") for sid in todo]
        parts = [f"{reasons.count('')} never stored"] if reasons.count("") else []
        parts += [f"{n} {WHY[reason]}" for reason in WHY if (n := reasons.count(reason))]
        sent = f"{len(todo)} sent ({', '.join(parts)})" if todo else "none sent"
        return f"{name}: {shards} shards: {shards - len(todo)} in Blob and checked, skipped; {sent}"

    def row(self, name: str) -> dict:
        """The step's decision: what it sends, or why it sends nothing."""
        todo, total = self.todo(name), self.header["files"]
        files = sum(n for n, _ in todo.values())
        if not todo and self.unchanged():
            return step_plan(
                "upload-dataset", "skip", f"{name}: Blob holds all {total} files (version {self.version[:12]})", files=0
            )
        return step_plan(
            "upload-dataset",
            "run",
            f"{name}: upload {files} of {total} files in {len(todo)} of {len(self.index.shards)} shards",
            files=files,
        )


def decide_upload(
    cfg: StorageConfig,
    name: str,
    index: mf.Index,
    previous: dict | None,
    stored: set[str],
    max_side: int | None = None,
    layout: str = IMAGENET_LAYOUT,
) -> UploadPlan:
    """The shards of the index, given the stored manifest's metadata and shard blobs: the step and the dry run
    share it. The previous shard count is kept while sizes allow (files stay in their shards). A data set shrunk at
    staging says so in its header (`max_side`); its version, a hash of the contents, changes with them."""
    files, total = index.total()
    count = mf.shard_count(
        total, int(cfg.shard_mb * (1 << 20)), int(previous["shard_count"]) if previous else None, cfg.upload_concurrency
    )
    header = {
        "format": FORMAT,
        "dataset": name,
        "version": index.plan_shards(count),
        "shard_count": count,
        "files": files,
        "bytes": total,
        "verified": {"check": "decode" if layout == IMAGENET_LAYOUT else "none", "bad": index.bad()},
        **({"max_side": max_side} if max_side else {}),
        # a manifest that names no layout is in the ImageNet layout (every one staged before the files layout)
        **({"layout": layout} if layout != IMAGENET_LAYOUT else {}),
    }
    return UploadPlan(index, header, stored, previous)


# Why a shard Blob lacks is sent (one never stored has no entry), as the summary words it.
WHY = {
    "gone": "acknowledged by Blob in an earlier attempt and gone since",
    "unreadable": "listed by Blob but not served whole",
}
BLOCK = 4 << 20  # the block size of BlobStore's uploads (blobstore.py): a probe reads one byte of each block
TAR_END = 1024  # a tar ends in two zero blocks of 512 bytes (and zero padding to its 10 kB record)


def sent_log(workdir: Path, name: str) -> Path:
    """The shards Blob acknowledged to uploads of `name` until a run finds its manifest listed (an acknowledged
    manifest is not yet a kept one: a killed Azurite forgets its last seconds): a re-run tells by it a shard that
    was never stored from one that Blob stored and then lost."""
    return workdir / "cache" / f"sent-{name}.txt"


def plan_upload(
    store: BlobStore,
    cfg: StorageConfig,
    name: str,
    index: mf.Index,
    workdir: Path,
    max_side: int | None = None,
    layout: str = IMAGENET_LAYOUT,
) -> UploadPlan:
    """Read the container's state (the manifest's metadata, the shard names) and plan the shards. Unless the stored
    manifest already describes this data set, the stored shards it needs are probed: an upload that did not finish
    left them, and a killed Azurite can come back listing a shard whose data it no longer finds."""
    store.ensure_container()
    listed = store.names(mf.dataset_prefix(name) + "shards/")
    plan = decide_upload(cfg, name, index, store.metadata(mf.manifest_blob(name)), set(listed), max_side, layout)
    log = sent_log(workdir, name)
    if plan.unchanged():  # Blob lists this data set's manifest, so it kept every shard: the sent log has done its work
        log.unlink(missing_ok=True)
        return plan
    needed = {mf.shard_blob(name, sid) for sid in index.shards.values()}
    unreadable = unservable(store, {blob: size for blob, size in listed.items() if blob in needed})
    acknowledged = set(log.read_text().split()) if log.exists() else set()
    plan.stored -= unreadable
    plan.why = dict.fromkeys(acknowledged - set(listed), "gone") | dict.fromkeys(unreadable, "unreadable")
    return plan


def unservable(store: BlobStore, listed: dict[str, int]) -> set[str]:
    """The listed shards (name -> size) that Blob cannot serve whole, probed `store.concurrency` at a time."""
    with ThreadPoolExecutor(max_workers=store.concurrency) as pool:
        served = dict(zip(listed, pool.map(lambda item: servable(store, *item), listed.items())))
    return {blob for blob, ok in served.items() if not ok}


def servable(store: BlobStore, blob: str, size: int) -> bool:
    """Whether Blob serves `blob` whole: one byte of each block but the last is read, and the last KiB, which must be
    the tar's zero end. (An Azurite killed between saving its list of blobs and its list of data files lists the
    blob and answers any read of it with 500.) A failed read is a no: the shard is sent again."""
    try:
        for offset in range(0, (size - 1) // BLOCK * BLOCK, BLOCK):
            store.read_range(blob, offset, 1)
        return size >= TAR_END and store.read_range(blob, size - TAR_END, TAR_END) == bytes(TAR_END)
    except StorageError:
        return False


def synced_state(server_manifest: Path | None, name: str) -> tuple[dict | None, set[str]]:
    """The container as a stored manifest (`server_manifest`: the file server's current version, what its last sync
    read) shows it: the manifest's metadata and shard blobs. The dry run's stand-in for a container it does not
    reach, and the upload's record of which shards a sync may still be fetching."""
    if server_manifest is None:
        return None, set()
    with tempfile.TemporaryDirectory() as tmp, Manifest.load(server_manifest, Path(tmp) / "m.db", name) as synced:
        return manifest_metadata(synced.header), {mf.shard_blob(name, sid) for sid in synced.shards()}


def manifest_metadata(header: dict) -> dict[str, str]:
    """What the manifest blob's metadata says, so that a re-run compares one HEAD request, not the whole list."""
    return {"version": header["version"], "shard_count": str(header["shard_count"]), "files": str(header["files"])}


def upload_dataset(
    store: BlobStore,
    cfg: StorageConfig,
    data_dir: Path,
    name: str,
    workdir: Path,
    bad_files: str = "fail",
    max_side: int | None = None,
    layout: str = IMAGENET_LAYOUT,
) -> Transfer:
    """Index (hash and check new files), pack and upload the missing shards in parallel, write the manifest, drop
    shards no manifest uses. Bad images fail the step with one error listing them all (`bad_files: fail`), or are
    recorded in the manifest for training to leave out (`skip`)."""
    transfer = Transfer("data set -> blob")
    with ExitStack() as stack:
        with transfer.timed("list + hash + check"):
            index = stack.enter_context(scan_dataset(data_dir, workdir, name, layout=layout))
        bad = index.bad()
        if bad and bad_files == "fail":
            raise bad_files_error(index, bad, data_dir, workdir, name)
        with transfer.timed("pack + upload"):
            plan = plan_upload(store, cfg, name, index, workdir, max_side, layout)
            todo, transfer.plan = plan.todo(name), {**plan.row(name), "shards": plan.accounting(name)}
            counts = [sum(n for n, _ in todo.values()), sum(b for _, b in todo.values())]
            transfer.skipped_files, transfer.skipped_bytes = (
                plan.header["files"] - counts[0],
                plan.header["bytes"] - counts[1],
            )
            with transfer_progress(transfer, counts[1], counts[0]) as advance:
                send_shards(store, index, data_dir, name, todo, workdir, advance)
            doomed = unreferenced(store, plan, name, workdir)
        with transfer.timed("manifest"):
            if not plan.unchanged():
                path = mf.write_manifest(index, plan.header, workdir / "tmp" / f"manifest-{name}.jsonl")
                store.upload_file(path, mf.manifest_blob(name), metadata=manifest_metadata(plan.header))  # last
                path.unlink()
    for blob in doomed:
        store.delete(blob)
    return summarised(transfer, plan.version, len(bad))


def summarised(transfer: Transfer, version: str, bad: int) -> Transfer:
    """The transfer with its note: the shards' accounting (what a re-run after a fault skipped, sent, and why), which
    is also printed."""
    Console(highlight=False).print(f"data set -> blob: {transfer.plan['shards']}", markup=False, soft_wrap=True)
    transfer.notes.append(
        f"{transfer.plan['shards']}, version {version[:12]}"
        + (f", {bad} bad images left out of training" if bad else "")
    )
    return transfer


def unreferenced(store: BlobStore, plan: UploadPlan, name: str, workdir: Path) -> set[str]:
    """Stored shards that neither the new manifest nor the stored one uses (a sync that read the stored manifest
    may still be fetching its shards). The stored manifest is read only when there is something to drop."""
    extra = plan.stored - {mf.shard_blob(name, sid) for sid in plan.index.shards.values()}
    if extra and plan.previous:
        (workdir / "tmp").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=workdir / "tmp") as tmp:
            store.download_to(mf.manifest_blob(name), Path(tmp) / "previous.jsonl")
            extra -= synced_state(Path(tmp) / "previous.jsonl", name)[1]
    return extra


def send_shards(
    store: BlobStore,
    index: mf.Index,
    data_dir: Path,
    name: str,
    todo: dict[str, tuple[int, int]],
    workdir: Path,
    advance,
) -> None:
    """Build each shard in a temporary file and upload it, store.concurrency at a time; note each that Blob
    acknowledges in the sent log (see sent_log)."""
    log = sent_log(workdir, name)
    log.parent.mkdir(parents=True, exist_ok=True)
    mf.check_shard_space(workdir / "tmp", todo, store.concurrency)  # refused before the first is packed

    def send(sid: str, counts: tuple[int, int], tmp: Path) -> None:
        mf.write_shard(data_dir, index.shard_files(sid), tmp / "shard.tar")
        store.upload_file(tmp / "shard.tar", mf.shard_blob(name, sid), metadata={"files": str(counts[0])})
        with open(log, "a") as f:  # one short write: appends from the threads do not interleave
            f.write(mf.shard_blob(name, sid) + "\n")
        advance(counts[1], counts[0])

    in_parallel(todo, send, workdir / "tmp", store.concurrency)


@task(name="upload-dataset", retries=3, retry_delay_seconds=[2, 10, 30], retry_condition_fn=unless_permanent)
def upload_dataset_task(
    cfg: StorageConfig,
    azurite_port: int | None,
    data_dir: Path,
    name: str,
    workdir: Path,
    bad_files: str = "fail",
    max_side: int | None = None,
    layout: str = IMAGENET_LAYOUT,
) -> dict:
    """Prefect step: upload the data set (in its `layout`); returns the transfer summary."""
    store = open_store(cfg, azurite_port)
    transfer = upload_dataset(store, cfg, data_dir, name, workdir, bad_files, max_side, layout)
    return {**transfer.row(), "plan": transfer.plan}


@task(name="shrink-images", retries=1, retry_condition_fn=unless_permanent)
def shrink_task(data_dir: Path, shrunk: Path, max_side: int) -> dict:
    """Prefect step: bring the shrunk copy of the data folder up to date (infra/data/shrink.py), before the upload
    reads it; prints what it did and returns its counts."""
    try:
        done = shrunk_copy(data_dir, shrunk, max_side, mf.relative_paths(data_dir))
    except ValueError as exc:  # the data folder is the work folder, or inside its shrunk copies
        raise BadInput(f"{exc}; pass a --workdir outside the data folder") from None
    Console(highlight=False).print(shrink_line(done), markup=False, soft_wrap=True)
    return done


def shrink_line(done: dict) -> str:
    """One line for a shrunk copy brought up to date: what was written, the sizes, the time."""
    written = ", ".join(f"{done[kind]} {kind}" for kind in (SHRUNK, LINKED, COPIED, KEPT, "removed") if done[kind])
    return (
        f"shrunk copy ({done['max_side']} px): {done['files']} files ({written or 'none'}), "
        f"{done['bytes_source'] / 1e6:,.1f} MB -> {done['bytes_mirror'] / 1e6:,.1f} MB, {done['seconds']:.1f} s"
    )
