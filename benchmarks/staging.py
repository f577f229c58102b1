"""`trainflow bench staging`: staging throughput, shards against one blob per file, an unchanged re-run, and what
shrinking the images at staging (`max_side`) buys.

Three paths move the same folder through Azurite to a file-server folder: trainflow's (tar shards uploaded
`upload_concurrency` at a time, manifest, sync), one blob per file one at a time (SDK defaults), and one blob per
file through a thread pool as wide as `upload_concurrency` (what a competent user writes instead: the same
parallelism, no shards). Each round runs the three in turn, then trainflow's unchanged re-run, then trainflow's
path with the JPEGs shrunk to `max_side` (the config's, else 500: the shrunk copy written, then staged); REPEATS
rounds, every figure the median with its min-max, each speed-up computed within its round. Without --data the
folder is photo-like JPEGs of ImageNet's size distribution (infra/data/sample_data.py write_photo_sized).
"""

import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from azure.storage.blob import BlobServiceClient, ContainerClient
from rich.console import Console
from rich.table import Table

from benchmarks import REPEATS
from benchmarks.common import bench_progress, count_files, shown, spread, time_call, write_json
from flows.config import FlowConfig
from infra.data.sample_data import write_photo_sized
from infra.data.shrink import shrunk_copy
from infra.services.azurite import connection_string, running_azurite
from infra.storage.blobstore import BlobStore
from infra.storage.config import StorageConfig
from infra.storage.fileserver import FileServer
from tasks.sync_file_server import sync_to_file_server
from tasks.upload_dataset import upload_dataset

PATHS = (
    "trainflow",
    "per file, one at a time",
    "per file, thread pool",
    "trainflow, unchanged re-run",
    "trainflow, shrunk (max_side)",
)
MAX_SIDE = 500  # without a max_side in the config: FFCV's size for ResNet-50 on ImageNet


def bench_staging(cfg: FlowConfig, json_out: Path | None, files: int, classes: int, repeats: int = REPEATS) -> dict:
    """Stage an ImageNet-like folder through Azurite to the file server by each path, `repeats` rounds."""
    root = cfg.workdir.resolve() / "bench" / "staging"
    data = (
        Path(cfg.data).resolve()
        if cfg.data
        else write_photo_sized(root / f"photo-sized-{files}-{classes}", files=files, classes=classes)
    )
    n, size, max_side = *count_files(data), cfg.max_side or MAX_SIDE
    shutil.rmtree(root / "azurite", ignore_errors=True)
    rounds = []
    with running_azurite(root / "azurite") as port, bench_progress() as progress:
        bar = progress.add_task("staging benchmark", total=repeats * len(PATHS))
        for repeat in range(repeats):
            storage = cfg.storage.model_copy(update={"backend": "azurite", "container": f"bench-{repeat}"})
            work, advance = root / f"round-{repeat}", lambda: progress.advance(bar)
            rounds.append(one_round(storage, port, data, work, max_side, advance))
    result = summarise(rounds, n, size, cfg.storage, max_side)
    print_staging_bench(result)
    write_json(result, json_out)
    return result


def one_round(
    storage: StorageConfig, port: int, data: Path, work: Path, max_side: int, advance: Callable[[], None]
) -> dict:
    """Seconds of each path on fresh containers and folders (trainflow's phases beside them), and the bytes the
    shrunk copy staged."""
    shutil.rmtree(work, ignore_errors=True)
    service = BlobServiceClient.from_connection_string(connection_string(port))
    phases: dict[str, float] = {}
    seconds, shrunk = {}, {}
    for path, run in (
        (PATHS[0], lambda: stage_once(storage, port, data, work / "trainflow", phases)),
        (PATHS[1], lambda: per_file(service, f"{storage.container}-one", data, work / "one", 1)),
        (
            PATHS[2],
            lambda: per_file(service, f"{storage.container}-pool", data, work / "pool", storage.upload_concurrency),
        ),
        (PATHS[3], lambda: stage_once(storage, port, data, work / "trainflow", {})),
        (PATHS[4], lambda: shrunk.update(stage_shrunk(storage, port, data, work / "shrunk", max_side, phases))),
    ):
        seconds[path] = time_call(run)
        advance()
    shutil.rmtree(work, ignore_errors=True)
    return {"seconds": seconds, "phases": phases, "shrunk": shrunk}


def stage_once(
    storage: StorageConfig,
    port: int,
    data: Path,
    work: Path,
    phases: dict[str, float],
    name: str = "bench",
    max_side: int | None = None,
) -> None:
    """Our path: upload the data set as shards, then sync it to a file server folder; times each phase."""
    store = BlobStore.connect(storage, connection_string=connection_string(port))
    phases["upload"] = time_call(lambda: upload_dataset(store, storage, data, name, work, max_side=max_side))
    phases["sync"] = time_call(lambda: sync_to_file_server(store, FileServer(work / "fileserver"), name, work))


def stage_shrunk(storage: StorageConfig, port: int, data: Path, work: Path, max_side: int, phases: dict) -> dict:
    """Our path with max_side: the shrunk copy written (one process per core), then staged as its own data set;
    the shrink's seconds in `phases`, and what it wrote."""
    done = shrunk_copy(data, work / "shrunk", max_side, progress=False)
    phases["shrink"] = done["seconds"]
    stage_once(storage, port, work / "shrunk", work, {}, "bench-shrunk", max_side)
    return done


def per_file(service: BlobServiceClient, container: str, data: Path, export: Path, workers: int) -> None:
    """The baselines: every file its own blob (SDK defaults), uploaded, then downloaded to a file-server folder,
    `workers` requests at a time."""
    client = service.get_container_client(container)
    client.create_container()
    paths = [p.relative_to(data) for p in sorted(data.rglob("*")) if p.is_file()]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda rel: upload_one(client, data, rel), paths))
        list(pool.map(lambda rel: download_one(client, export, rel), paths))


def upload_one(client: ContainerClient, data: Path, rel: Path) -> None:
    """One file as one blob."""
    with open(data / rel, "rb") as f:
        client.upload_blob(str(rel), f)


def download_one(client: ContainerClient, export: Path, rel: Path) -> None:
    """One blob to its file."""
    target = export / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(client.download_blob(str(rel)).readall())


def summarise(rounds: list[dict], files: int, size: int, storage: StorageConfig, max_side: int) -> dict:
    """Each path's seconds, files/s and MB/s over the rounds, and trainflow's speed-ups within each round."""
    paths = {
        path: {
            "seconds": spread(s := [r["seconds"][path] for r in rounds]),
            "files_per_s": spread([files / x for x in s]),
            "mb_per_s": spread([size / 1e6 / x for x in s]),
        }
        for path in PATHS
    }
    ours = [r["seconds"][PATHS[0]] for r in rounds]
    return {
        "files": files,
        "bytes": size,
        "repeats": len(rounds),
        "shard_mb": storage.shard_mb,
        "upload_concurrency": storage.upload_concurrency,
        "paths": paths,
        "speedup_vs_one_at_a_time": spread([r["seconds"][PATHS[1]] / o for r, o in zip(rounds, ours)]),
        "speedup_vs_thread_pool": spread([r["seconds"][PATHS[2]] / o for r, o in zip(rounds, ours)]),
        "rerun_fraction": spread([r["seconds"][PATHS[3]] / o for r, o in zip(rounds, ours)]),
        "phases": {k: spread([r["phases"][k] for r in rounds]) for k in ("upload", "sync", "shrink")},
        "shrunk": shrunk_figures(rounds, max_side),
    }


def shrunk_figures(rounds: list[dict], max_side: int) -> dict:
    """What max_side bought: the JPEGs shrunk, the bytes staged against the originals', and staging's seconds
    (the shrink included) as a fraction of the originals' within each round."""
    first = rounds[0]["shrunk"]
    return {
        "max_side": max_side,
        "files_shrunk": first["shrunk"],
        "bytes_staged": first["bytes_mirror"],
        "bytes_fraction": first["bytes_mirror"] / max(1, first["bytes_source"]),
        "seconds_fraction": spread([r["seconds"][PATHS[4]] / r["seconds"][PATHS[0]] for r in rounds]),
        "staging_only_fraction": spread(
            [(r["seconds"][PATHS[4]] - r["phases"]["shrink"]) / r["seconds"][PATHS[0]] for r in rounds]
        ),
    }


def print_staging_bench(r: dict) -> None:
    """The staging figures as a table: medians, min-max in brackets."""
    table = Table(
        title=f"staging {r['files']} files, {r['bytes'] / 1e6:.0f} MB, through Azurite to the file server, "
        f"median (min-max) of {r['repeats']} rounds"
    )
    for column in ("path", "seconds", "files/s", "MB/s"):
        table.add_column(column, justify="right")
    for path, figures in r["paths"].items():
        table.add_row(
            path,
            shown(figures["seconds"], ".2f"),
            shown(figures["files_per_s"], ".0f"),
            shown(figures["mb_per_s"], ".1f"),
        )
    Console().print(table)
    Console().print(
        f"trainflow phases: upload {shown(r['phases']['upload'], '.1f')} s, sync "
        f"{shown(r['phases']['sync'], '.1f')} s ({r['shard_mb']:g} MB shards, {r['upload_concurrency']} "
        f"at a time)\nspeed-up over per-file one at a time: {shown(r['speedup_vs_one_at_a_time'], '.1f')}x; "
        f"over per-file with {r['upload_concurrency']} threads: {shown(r['speedup_vs_thread_pool'], '.1f')}x; "
        f"unchanged re-run: {shown(r['rerun_fraction'], '.3f')} of the first run"
    )
    shrunk = r["shrunk"]
    Console().print(
        f"max_side {shrunk['max_side']}: {shrunk['files_shrunk']} of {r['files']} JPEGs shrunk, "
        f"{shrunk['bytes_staged'] / 1e6:.0f} MB staged instead of {r['bytes'] / 1e6:.0f} MB "
        f"({shrunk['bytes_fraction']:.2f}); staging with the shrink "
        f"({shown(r['phases']['shrink'], '.1f')} s of it) took {shown(shrunk['seconds_fraction'], '.2f')} of the "
        f"originals' time, and {shown(shrunk['staging_only_fraction'], '.2f')} without it (a re-run's shrink writes "
        "nothing)"
    )
