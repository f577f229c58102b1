"""`trainflow bench staging`: staging throughput, shards against one blob per file, and an unchanged re-run."""

import shutil
from pathlib import Path

from azure.storage.blob import BlobServiceClient
from rich.console import Console
from rich.progress import track
from rich.table import Table

from flows.bench.common import count_files, time_call, write_json
from flows.config import FlowConfig
from infra.azurite import connection_string, running_azurite
from infra.blobstore import BlobStore
from infra.fileserver import FileServer
from infra.sample_data import write_imagenet_like
from tasks.sync_file_server import sync_to_file_server
from tasks.upload_dataset import upload_dataset


def bench_staging(cfg: FlowConfig, json_out: Path | None, files: int, classes: int) -> dict:
    """Stage an ImageNet-like folder through Azurite to the file server, our path against the naive one.

    Naive: one upload_blob per file with SDK defaults, then one download per file to the file server.
    Ours: tar shards uploaded in parallel, manifest, sync. Then an unchanged re-run of ours.
    """
    root = cfg.workdir.resolve() / "bench" / "staging"
    data = Path(cfg.data).resolve() if cfg.data else \
        write_imagenet_like(root / f"imagenet-like-{files}-{classes}", files=files, classes=classes)
    n, size = count_files(data)
    for stale in ("azurite", "work", "naive-export"):
        shutil.rmtree(root / stale, ignore_errors=True)
    with running_azurite(root / "azurite") as port:
        storage = cfg.storage.model_copy(update={"backend": "azurite"})
        phases: dict[str, float] = {}
        ours = time_call(lambda: stage_once(storage, port, data, root / "work", phases))
        rerun = time_call(lambda: stage_once(storage, port, data, root / "work", {}))
        naive = time_call(lambda: naive_staging(port, data, root / "naive-export"))
    result = {"files": n, "bytes": size, "ours_seconds": ours, "naive_seconds": naive, "rerun_seconds": rerun,
              "ours_files_per_s": n / ours, "naive_files_per_s": n / naive, "ours_mb_per_s": size / 1e6 / ours,
              "naive_mb_per_s": size / 1e6 / naive, "speedup": naive / ours, "rerun_fraction": rerun / ours,
              "ours_upload_seconds": phases["upload"], "ours_sync_seconds": phases["sync"],
              "shard_mb": storage.shard_mb}
    print_staging_bench(result)
    write_json(result, json_out)
    return result


def stage_once(storage, port: int, data: Path, work: Path, phases: dict[str, float]) -> None:
    """Our path: upload the data set as shards, then sync it to a file server folder; times each phase."""
    store = BlobStore.connect(storage, connection_string=connection_string(port))
    phases["upload"] = time_call(lambda: upload_dataset(store, storage, data, "bench", work))
    phases["sync"] = time_call(lambda: sync_to_file_server(store, FileServer(work / "fileserver"), "bench", work))


def naive_staging(port: int, data: Path, export: Path) -> None:
    """The baseline: every file its own blob, uploaded then downloaded one at a time, SDK defaults."""
    container = BlobServiceClient.from_connection_string(connection_string(port)).get_container_client("naive")
    container.create_container()
    paths = [p for p in sorted(data.rglob("*")) if p.is_file()]
    for path in track(paths, description="naive upload, one blob per file"):
        with open(path, "rb") as f:
            container.upload_blob(str(path.relative_to(data)), f)
    for path in track(paths, description="naive download to the file server"):
        target = export / path.relative_to(data)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(container.download_blob(str(path.relative_to(data))).readall())


def print_staging_bench(r: dict) -> None:
    """The staging figures as a table."""
    table = Table(title=f"staging {r['files']} files, {r['bytes'] / 1e6:.0f} MB, through Azurite to the file server")
    for column in ("path", "seconds", "files/s", "MB/s"):
        table.add_column(column, justify="right")
    table.add_row("naive (blob per file)", f"{r['naive_seconds']:.1f}", f"{r['naive_files_per_s']:.0f}", f"{r['naive_mb_per_s']:.1f}")
    table.add_row("trainflow (shards)", f"{r['ours_seconds']:.1f}", f"{r['ours_files_per_s']:.0f}", f"{r['ours_mb_per_s']:.1f}")
    table.add_row("trainflow, unchanged re-run", f"{r['rerun_seconds']:.2f}", "", "")
    Console().print(table)
    Console().print(f"trainflow phases: upload {r['ours_upload_seconds']:.1f} s, sync {r['ours_sync_seconds']:.1f} s "
                    f"({r['shard_mb']:g} MB shards)\nspeed-up over naive: {r['speedup']:.1f}x; "
                    f"unchanged re-run: {r['rerun_fraction']:.1%} of the first run")
