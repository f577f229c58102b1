"""Staging resumes at the shard after a fault: the Azurite that `trainflow stage` started killed outright, the network
to Blob failing mid-upload, a shard that Blob lists but cannot serve. Each re-run sends exactly the shards Blob lacks
or cannot serve, says how many it skipped and sent and why, and the file server's copy is the data set.

What a killed Azurite keeps: it holds its lists of blobs and of data files in memory and saves each to disk every 5 s
(LokiJS autosave, node_modules/azurite/dist/src/blob/persistence/LokiBlobMetadataStore.js), so SIGKILL loses the
blobs it acknowledged since its last save; the data files themselves are written before it answers.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from infra.data import manifest as mf
from infra.data.sample_data import write_imagenet_shaped
from infra.services.azurite import ACCOUNT, connection_string, running_azurite
from infra.storage.blobstore import BlobStore
from infra.storage.config import StorageConfig
from infra.storage.errors import StorageError
from infra.storage.fileserver import FileServer
from tasks.sync_file_server import sync_to_file_server
from tasks.upload_dataset import WHY, upload_dataset
from tests.fakes.faultproxy import FaultProxy
from tests.integration.cli.test_stage_cli import sas_token

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TRAINFLOW = str(Path(sys.executable).parent / "trainflow")
NAME = "imagenet"  # the data set's name: its folder's
# Small shards sent one at a time, long enough an upload to interrupt (some 1,900 shards of 5 kB took 20-45 s with
# Azurite itself, 600 of 15 kB 15-30 s through the fault proxy); one retry a request.
SMALL_SHARDS = "  shard_mb: %s\n  upload_concurrency: 1\n  retry_total: 1\n  retry_initial_backoff: 0.1\n"
ACCOUNTING = re.compile(
    r"data set -> blob: (?P<name>\S+): (?P<shards>\d+) shards: (?P<skipped>\d+) in Blob and checked, skipped; "
    r"(?:none sent|(?P<sent>\d+) sent \((?P<why>[^)]*)\))"
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """An ImageNet-shaped set of 7,200 small JPEGs (about 9 MB)."""
    folder = tmp_path_factory.mktemp("data") / NAME
    write_imagenet_shaped(folder, classes=12, per_class=600, val_per_class=0, progress=False)
    return folder


def tree(root: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every image under root."""
    return {str(p.relative_to(root)): mf.sha256_file(p) for p in root.rglob("*.JPEG")}


def accounting(output: str) -> dict:
    """The upload's line on the shards it skipped and sent, and why (the last in `output`)."""
    found = list(ACCOUNTING.finditer(output))
    assert found, f"no accounting line in:\n{output[-3000:]}"
    line = found[-1]
    why = {reason: int(n) for n, reason in re.findall(r"(\d+) ([^,]+)", line["why"] or "")}
    return {"shards": int(line["shards"]), "skipped": int(line["skipped"]), "sent": int(line["sent"] or 0), **why}


def shards(store: BlobStore) -> set[str]:
    """The shard blobs Blob lists (none while the container does not exist)."""
    try:
        return set(store.names(f"datasets/{NAME}/shards/"))
    except StorageError:
        return set()


def stage(config: Path, data: Path, work: Path, **popen) -> subprocess.Popen:
    """`trainflow stage` in a process group of its own, its output to work's sibling log file."""
    log = open(work.with_suffix(".log"), "a")  # noqa: SIM115 - the process writes it after this returns
    return subprocess.Popen(
        [TRAINFLOW, "stage", "--config", str(config), "--data", str(data), "--workdir", str(work)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        **popen,
    )


def finished(proc: subprocess.Popen, work: Path, seconds: float = 300) -> tuple[int, str]:
    """The exit status and the output of a stage command."""
    proc.wait(timeout=seconds)
    return proc.returncode, work.with_suffix(".log").read_text()


def azurite_of(proc: subprocess.Popen, work: Path, seconds: float = 120) -> psutil.Process:
    """The node process of the Azurite that `proc` started for `work` (it runs on a leash: infra/services/leash.py)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                line = child.cmdline()
            except psutil.Error:
                continue
            if line and os.path.basename(line[0]) == "node" and str(work / "azurite") in line:
                return child
        time.sleep(0.1)
    pytest.fail(f"no Azurite started for {work}:\n{work.with_suffix('.log').read_text()[-3000:]}")


def wait_for(condition, seconds: float, what: str, log: Path | None = None) -> None:
    """Return once `condition()` holds; fail after `seconds`, with the tail of `log`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {seconds} s\n" + (log.read_text()[-3000:] if log else "")
        time.sleep(0.02)


def test_a_killed_azurite_forgets_its_last_seconds_and_the_rerun_sends_only_what_blob_lacks(tmp_path, dataset):
    config, work = tmp_path / "small.yaml", tmp_path / "w"
    config.write_text("storage:\n" + SMALL_SHARDS % 0.005)
    first = stage(config, dataset, work)
    node = azurite_of(first, work)
    port = int(node.cmdline()[node.cmdline().index("--blobPort") + 1])
    store = BlobStore.connect(StorageConfig(retry_total=0), connection_string=connection_string(port))
    saved = work / "azurite" / "__azurite_db_blob__.json"  # Azurite's list of blobs, as it last saved it
    wait_for(lambda: len(shards(store)) >= 3, 180, "shard in Blob")
    since = saved.stat().st_mtime
    wait_for(lambda: saved.stat().st_mtime > since, 10, "save of Azurite's list of blobs")
    time.sleep(2)  # two more seconds of shards acknowledged: its next save would come 3 s later
    acknowledged = shards(store)
    node.send_signal(signal.SIGKILL)
    code, output = finished(first, work)
    assert code == 1, output[-3000:]
    assert "Traceback" not in output

    with running_azurite(work / "azurite") as port:  # what the killed Azurite kept, as a restarted one lists it
        restarted = BlobStore.connect(StorageConfig(), connection_string=connection_string(port))
        kept = shards(restarted)
        assert mf.manifest_blob(NAME) not in restarted.names(f"datasets/{NAME}/")  # nothing looks complete
    lost = acknowledged - kept
    assert kept < acknowledged and lost, "Azurite kept everything it had acknowledged: no loss to resume from"

    code, output = finished(stage(config, dataset, work), work)
    assert code == 0, output[-3000:]
    seen = accounting(output)
    print(f"acknowledged {len(acknowledged)} shards, kept {len(kept)}, lost {len(lost)}; the re-run: {seen}")
    assert seen["skipped"] == len(kept) and seen["sent"] == seen["shards"] - len(kept), seen
    gone = seen.get(WHY["gone"], 0)  # Blob acknowledged them to the first run (its sent log): at least those lost
    assert gone >= len(lost) and seen["sent"] == seen.get("never stored", 0) + gone, seen
    current = work / "fileserver" / "datasets" / NAME / "current"
    assert f"file server copy of {NAME}: {current}" in output
    assert tree(current) == tree(dataset)


def test_a_network_fault_mid_upload_is_resumed_by_the_retry_at_the_shard(tmp_path, dataset, azurite_port):
    """The network fails every request to Blob mid-upload (the fault proxy answers 503): the step fails and Prefect
    retries it; the retry sends only the shards Blob lacks. (The step's retry and a re-run plan alike: plan_upload.)"""
    container, work = f"n-{uuid.uuid4().hex[:10]}", tmp_path / "w"
    direct = BlobStore.connect(StorageConfig(container=container), connection_string=connection_string(azurite_port))
    with FaultProxy(azurite_port) as proxy:
        config = tmp_path / "azure.yaml"
        config.write_text(
            f"storage:\n  backend: azure\n  account_url: http://127.0.0.1:{proxy.port}/{ACCOUNT}\n  auth: sas\n"
            f"  container: {container}\n" + SMALL_SHARDS % 0.015
        )
        run = stage(config, dataset, work, env={**os.environ, "AZURE_STORAGE_SAS_TOKEN": sas_token()})
        wait_for(lambda: len(shards(direct)) >= 20, 240, "20 shards in Blob")
        proxy.set_faults(fail_ratio=1.0)
        log = work.with_suffix(".log")
        wait_for(lambda: "Retry 1/3 will start" in log.read_text(), 120, "retry of the upload", log)
        stored = shards(direct)  # what the failed attempt stored: nothing more gets through
        proxy.set_faults(fail_ratio=0.0)
        code, output = finished(run, work)
    assert code == 0, output[-3000:]
    seen = accounting(output)
    print(f"stored before the fault {len(stored)}; the retry: {seen}")
    assert seen["skipped"] == len(stored) and seen["sent"] == seen["shards"] - len(stored), (seen, len(stored))
    assert seen["sent"] == seen["never stored"], seen  # a network fault loses nothing Blob acknowledged
    assert tree(work / "fileserver" / "datasets" / NAME / "current") == tree(dataset)


def forget_data_files(azurite: Path) -> None:
    """Empty a stopped Azurite's list of data files (extents), as an Azurite killed after saving its list of blobs and
    before saving that list leaves it for new files: it lists the blobs and answers 500 to any read of them. Its
    indexes are emptied with it: LokiJS saves a whole database at once, so a crash never leaves an index that
    disagrees with its data (a stale one made Azurite lose the record of a data file it had just written, and answer
    500 to every upload into it: lokijs loads binaryIndices as saved and does not rebuild them)."""
    path = azurite / "__azurite_db_blob_extent__.json"
    db = json.loads(path.read_text())
    for collection in db["collections"]:
        collection["data"], collection["idIndex"], collection["maxId"] = [], [], 0
        for index in collection.get("binaryIndices", {}).values():
            index["values"], index["dirty"] = [], False
    path.write_text(json.dumps(db))


def test_shards_that_blob_lists_but_cannot_serve_are_sent_again(tmp_path, digits):
    work, location = tmp_path / "work", tmp_path / "azurite"
    cfg = StorageConfig(container="serve", shard_mb=0.05, upload_concurrency=2)
    with running_azurite(location) as port:
        store = BlobStore.connect(cfg, connection_string=connection_string(port))
        first = upload_dataset(store, cfg, digits, "digits", work)
        store.delete(mf.manifest_blob("digits"))  # the upload had not finished: no manifest
    forget_data_files(location)
    with running_azurite(location) as port:
        store = BlobStore.connect(cfg, connection_string=connection_string(port))
        listed = set(store.names("datasets/digits/shards/"))
        assert len(listed) >= 3 and first.files == 1797
        again = upload_dataset(store, cfg, digits, "digits", work)
        _, current = sync_to_file_server(store, FileServer(work / "fileserver"), "digits", work)  # reads every shard
    assert len(list(current.rglob("*.png"))) == 1797
    assert again.plan["shards"] == (
        f"digits: {len(listed)} shards: 0 in Blob and checked, skipped; "
        f"{len(listed)} sent ({len(listed)} {WHY['unreadable']})"
    )
