"""Data staging against a real Azurite and real folders: complete, incremental, resumable, fault-tolerant."""

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from infra.core.errors import BadInput, is_permanent
from infra.data import manifest as mf
from infra.services.azurite import connection_string
from infra.services.supervise import free_port
from infra.storage.blobstore import BlobStore
from infra.storage.config import StorageConfig
from infra.storage.errors import StorageError
from infra.storage.fileserver import FileServer, FileServerError
from nodelib.records import Failure, read_event
from tasks.sync_file_server import sync_to_file_server
from tasks.upload_dataset import upload_dataset
from tests.fakes.faultproxy import FaultProxy
from tests.fakes.image_files import write_image
from tests.fakes.paths import REPO

pytestmark = pytest.mark.integration


def make_dataset(root: Path, per_class: int = 20) -> Path:
    """Three classes of small random PNGs (about 3 KB each), train and val."""
    for c in ("cat", "dog", "émeu"):
        for i in range(per_class):
            write_image(root / "train" / c / f"img {i}.png", "RGB", size=32)
        write_image(root / "val" / c / "v.png", "RGB", size=32)
    return root


def tree(root: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every visible file under root."""
    return {
        str(p.relative_to(root)): mf.sha256_file(p)
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }


def shards_in(store: BlobStore) -> dict[str, int]:
    """The shards stored so far (none while the container does not exist yet)."""
    try:
        return store.names("datasets/pets/shards/")
    except StorageError:
        return {}


def store_at(port: int, container: str, **settings) -> tuple[BlobStore, StorageConfig]:
    cfg = StorageConfig(
        **{"container": container, "shard_mb": 0.05, "upload_concurrency": 4, "retry_initial_backoff": 0.1, **settings}
    )
    return BlobStore.connect(cfg, connection_string=connection_string(port)), cfg


@pytest.fixture
def staged(tmp_path, azurite_port):
    """A fresh container, data set and workdir."""
    store, cfg = store_at(azurite_port, f"t-{uuid.uuid4().hex[:12]}")
    return store, cfg, make_dataset(tmp_path / "data"), tmp_path / "work"


def test_upload_then_sync_gives_the_same_folder_and_reruns_move_nothing(staged):
    store, cfg, data, work = staged
    first = upload_dataset(store, cfg, data, "pets", work)
    assert first.files == 63 and first.skipped_files == 0
    assert mf.manifest_blob("pets") in store.names("datasets/pets/")
    assert len(store.names("datasets/pets/shards/")) >= 3

    server = FileServer(work / "fileserver")
    synced, current = sync_to_file_server(store, server, "pets", work)
    assert synced.files == 63 and tree(current) == tree(data)
    assert current.is_symlink() and current.resolve().name.startswith("v-")

    again = upload_dataset(store, cfg, data, "pets", work)
    assert (again.files, again.skipped_files) == (0, 63)
    resynced, _ = sync_to_file_server(store, server, "pets", work)
    assert (resynced.files, resynced.skipped_files) == (0, 63)


def test_changing_one_file_resends_only_its_shard(staged):
    store, cfg, data, work = staged
    upload_dataset(store, cfg, data, "pets", work)
    server = FileServer(work / "fileserver")
    _, current = sync_to_file_server(store, server, "pets", work)
    old_version = current.resolve()
    shards_before = set(store.names("datasets/pets/shards/"))

    write_image(data / "train" / "dog" / "img 3.png", "L", size=40)  # new content, same name
    changed = upload_dataset(store, cfg, data, "pets", work)
    shards_after = set(store.names("datasets/pets/shards/"))
    assert len(shards_after - shards_before) == 1 and shards_before <= shards_after  # old one kept for readers
    assert 1 <= changed.files < 63 and changed.files + changed.skipped_files == 63

    synced, current = sync_to_file_server(store, server, "pets", work)
    assert (synced.files, synced.skipped_files) == (1, 62)  # the one changed file; the rest are hard-linked
    assert tree(current) == tree(data) and current.resolve() != old_version
    assert old_version.is_dir()  # the previous version stays for readers that still use it


def test_a_crashed_upload_resumes_without_resending_stored_shards(staged, azurite_port):
    store, cfg, data, work = staged
    with FaultProxy(azurite_port, delay_ratio=1.0, delay_seconds=0.15, only_methods={"PUT"}) as slow:
        slow_cfg = cfg.model_copy(update={"upload_concurrency": 1})  # store_at's settings, one upload at a time
        code = (
            "from pathlib import Path; from infra.services.azurite import connection_string; "
            "from infra.storage.blobstore import BlobStore; from infra.storage.config import StorageConfig; "
            "from tasks.upload_dataset import upload_dataset; "
            f"c = StorageConfig.model_validate_json({slow_cfg.model_dump_json()!r}); "
            f"s = BlobStore.connect(c, connection_string=connection_string({slow.port})); "
            f"upload_dataset(s, c, Path({str(data)!r}), 'pets', Path({str(work)!r}))"
        )
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, start_new_session=True)
        deadline = time.monotonic() + 60
        while len(shards_in(store)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    stored = store.names("datasets/pets/shards/")
    assert len(stored) >= 2, "the upload never got going"
    assert mf.manifest_blob("pets") not in store.names("datasets/pets/"), "incomplete data set looks complete"

    resumed = upload_dataset(store, cfg, data, "pets", work)
    assert resumed.skipped_files > 0 and resumed.files + resumed.skipped_files == 63
    _, current = sync_to_file_server(store, FileServer(work / "fileserver"), "pets", work)
    assert tree(current) == tree(data)


FAULT_KINDS = ("failed_503", "resets_before", "resets_after")


@contextmanager
def faults_until_each_kind(proxy: FaultProxy, times: int = 2):
    """Let `proxy` inject faults until each kind has happened `times` times, then relay cleanly: every kind is
    seen, and no request meets the SDK's longest backoffs (2, 4, 8, ... s after consecutive failures)."""
    done = threading.Event()

    def watch():
        while not done.wait(0.01):
            if all(proxy.stats[kind] >= times for kind in FAULT_KINDS):
                proxy.set_faults(fail_ratio=0.0, reset_ratio=0.0)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield proxy.stats
    finally:
        done.set()
        watcher.join()


def test_faults_between_client_and_storage_lose_and_corrupt_nothing(staged, azurite_port):
    """503s and connection resets both before a request reaches Azurite and after Azurite acted on it (the
    write was done, its answer cut off), on the upload's writes and on the sync's reads: the upload still ends
    complete (its manifest written) and the file server's copy is the data set, byte for byte."""
    _, _, data, work = staged
    container, faults = f"f-{uuid.uuid4().hex[:12]}", dict(fail_ratio=0.2, reset_ratio=0.4)  # resets: half after
    with (
        FaultProxy(azurite_port, seed=7, only_methods={"PUT"}, **faults) as proxy,
        faults_until_each_kind(proxy) as writes,
    ):
        store, cfg = store_at(proxy.port, container, retry_total=12, shard_mb=0.02)  # ~10 shards: ~12 writes
        uploaded = upload_dataset(store, cfg, data, "pets", work)
    with (
        FaultProxy(azurite_port, seed=8, only_methods={"GET", "HEAD"}, **faults) as proxy,
        faults_until_each_kind(proxy) as reads,
    ):
        store, _ = store_at(proxy.port, container, retry_total=12)
        synced, current = sync_to_file_server(store, FileServer(work / "fileserver"), "pets", work)
    for stats in (writes, reads):
        assert all(stats[kind] >= 2 for kind in FAULT_KINDS), stats
    direct, _ = store_at(azurite_port, container)  # Azurite itself, no proxy: the data set is there whole
    assert mf.manifest_blob("pets") in direct.names("datasets/pets/")
    assert (uploaded.files, synced.files) == (63, 63) and tree(current) == tree(data)


def test_wrong_credentials_are_refused_clearly_without_the_key(staged, azurite_port):
    _, cfg, data, work = staged
    wrong_key = "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXk="
    bad = connection_string(azurite_port).replace(
        connection_string(azurite_port).split("AccountKey=")[1].split(";")[0], wrong_key
    )
    store = BlobStore.connect(cfg, connection_string=bad)
    with pytest.raises(StorageError, match="refused the credentials") as caught:
        upload_dataset(store, cfg, data, "pets", work)
    assert caught.value.permanent and wrong_key not in str(caught.value)


def test_unreachable_storage_is_named(staged):
    _, _, data, work = staged
    store, cfg = store_at(free_port(), "nobody-home", retry_total=1)
    with pytest.raises(StorageError, match="cannot reach blob storage at http://127.0.0.1"):
        upload_dataset(store, cfg, data, "pets", work)


def test_sync_of_a_never_staged_data_set_is_refused(staged):
    store, _, _, work = staged
    store.ensure_container()
    with pytest.raises(BadInput, match="data set 'ghost' was never staged.*run `trainflow stage`"):
        sync_to_file_server(store, FileServer(work / "fileserver"), "ghost", work)


@pytest.mark.parametrize(
    "problem, message",
    [
        ("not an image", "notes.txt is not an image file"),
        (
            "corrupt",
            r"1 of 64 images in .* cannot be decoded \(train/cat/broken.png: .* listed in .*bad-files-pets.tsv",
        ),
        ("case clash", "differ only in letter case"),
    ],
)
def test_bad_data_is_refused_and_nothing_looks_staged(staged, problem, message):
    store, cfg, data, work = staged
    if problem == "not an image":
        (data / "train" / "cat" / "notes.txt").write_text("hi")
    elif problem == "corrupt":
        (data / "train" / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    else:
        write_image(data / "train" / "cat" / "IMG 1.png")
    with pytest.raises(BadInput, match=message):
        upload_dataset(store, cfg, data, "pets", work)
    store.ensure_container()
    assert mf.manifest_blob("pets") not in store.names("datasets/")


def test_a_full_file_server_fails_clearly_and_leaves_no_version(staged, tmp_path):
    store, cfg, data, work = staged
    upload_dataset(store, cfg, data, "pets", work)
    export = tmp_path / "small-disk"
    export.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(export)], check=True)
    try:
        with pytest.raises(FileServerError, match=f"^no space left on the disk of {export}.*kB free there; free space"):
            sync_to_file_server(store, FileServer(export), "pets", work)
        leftovers = list((export / "datasets" / "pets").iterdir()) if (export / "datasets" / "pets").exists() else []
        assert leftovers == []
    finally:
        subprocess.run(["umount", str(export)], check=True)


def test_a_shrinking_data_set_is_followed_and_old_shards_go_one_version_later(staged):
    store, cfg, data, work = staged
    server = FileServer(work / "fileserver")
    upload_dataset(store, cfg, data, "pets", work)
    first = set(store.names("datasets/pets/shards/"))
    shutil.rmtree(data / "train" / "émeu")
    shutil.rmtree(data / "val" / "émeu")
    upload_dataset(store, cfg, data, "pets", work)
    _, current = sync_to_file_server(store, server, "pets", work)
    assert tree(current) == tree(data) and not (current / "train" / "émeu").exists()
    write_image(data / "train" / "cat" / "img 0.png", "L", size=40)
    upload_dataset(store, cfg, data, "pets", work)
    third = set(store.names("datasets/pets/shards/"))
    assert first - third, "shards that no manifest of the last two versions uses are deleted"
    _, current = sync_to_file_server(store, server, "pets", work)
    assert tree(current) == tree(data)
    assert len([p for p in current.parent.iterdir() if p.name.startswith("v-")]) == 2  # current and previous


def test_bad_images_are_checked_where_they_enter_and_the_version_carries_the_result(staged):
    """Staging decodes each new file once; with bad_files: skip the version's .verified.json lists the bad ones,
    which training then leaves out without decoding anything again (tests/integration/trainer/test_bad_data.py)."""
    store, cfg, data, work = staged
    for i in range(3):
        (data / "train" / "dog" / f"broken {i}.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(BadInput, match=r"^3 of 66 images in .* cannot be decoded .*all 3 are listed in "):
        upload_dataset(store, cfg, data, "pets", work)
    listed = (work / "cache" / "bad-files-pets.tsv").read_text().splitlines()
    assert sorted(line.split("\t")[0] for line in listed) == [f"train/dog/broken {i}.png" for i in range(3)]
    assert shards_in(store) == {}  # refused before anything moved
    upload_dataset(store, cfg, data, "pets", work, bad_files="skip")
    _, current = sync_to_file_server(store, FileServer(work / "fileserver"), "pets", work)
    verified = json.loads((current / ".verified.json").read_text())
    assert verified["files"] == 66 and verified["version"] == current.resolve().name.removeprefix("v-")
    assert [path for path, _ in verified["bad"]] == [f"train/dog/broken {i}.png" for i in range(3)]
    assert tree(current) == tree(data)  # the bad files are staged too: the data set is what the folder holds


def rewrite_manifest(store: BlobStore, work: Path, edit) -> None:
    """Rewrite the stored manifest's rows with `edit(rows)`, keeping its header and its blob's metadata, as anyone
    who can write the container could."""
    lines = store.read_text(mf.manifest_blob("pets")).splitlines()
    rows = edit([json.loads(line) for line in lines[1:]])
    path = work / "tampered.jsonl"
    path.write_text("\n".join([lines[0], *(json.dumps(r) for r in rows)]) + "\n")
    store.upload_file(path, mf.manifest_blob("pets"), store.metadata(mf.manifest_blob("pets")))


def climbing(rows: list, targets: list[str]) -> list:
    """The rows with the first ones moved to `targets` (their sizes, SHA-256 and shards kept), sorted by path."""
    return sorted([[t, *row[1:]] for t, row in zip(targets, rows)] + rows[len(targets) :])


@pytest.mark.parametrize(
    "targets",
    [
        ["../../../../escaped.png", "/tmp/trainflow-escaped-abs.png"],
        ["../../../fileshare/scripts/0123456789abcdef/trainer/__init__.py"],  # the trainer a run would import
    ],
    ids=["relative-and-absolute", "the-trainer-on-the-file-share"],
)
def test_a_manifest_row_that_leaves_the_file_server_writes_nothing_and_is_not_retried(staged, tmp_path, targets):
    store, cfg, data, work = staged
    upload_dataset(store, cfg, data, "pets", work)
    server = FileServer(work / "fileserver")
    _, current = sync_to_file_server(store, server, "pets", work)
    before, version = tree(current), current.resolve()
    write_image(data / "train" / "dog" / "img 3.png", "L", size=40)  # a new version to sync
    upload_dataset(store, cfg, data, "pets", work)
    rewrite_manifest(store, work, lambda rows: climbing(rows, targets))

    with pytest.raises(BadInput) as failure:
        sync_to_file_server(store, server, "pets", work)
    message = str(failure.value)
    assert re.match(r"staged data set 'pets' cannot be used: line \d+ of its manifest.jsonl names '", message)
    assert targets[0] in message and "nothing of it was kept" in message and "\n" not in message
    assert is_permanent(failure.value) and failure.value.exit_code == 2
    assert not any(os.path.lexists(work / "fileserver" / "datasets" / "pets" / t) for t in targets)
    assert not os.path.lexists("/tmp/trainflow-escaped-abs.png") and not (work / "fileshare").exists()
    assert current.resolve() == version and tree(current) == before  # the current version is untouched
    assert [p.name for p in current.parent.iterdir() if p.name.startswith(".v-")] == []


def test_a_shard_member_that_is_a_link_is_refused_at_once_and_leaves_no_version(staged, tmp_path):
    store, cfg, data, work = staged
    upload_dataset(store, cfg, data, "pets", work)
    shard = sorted(store.names("datasets/pets/shards/"))[0]
    store.download_to(shard, tmp_path / "shard.tar")
    with tarfile.open(tmp_path / "shard.tar") as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(tmp_path / "evil.tar", "w") as tar:
        first, _ = members[0]
        link = tarfile.TarInfo(first.name)
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
        for member, body in members[1:]:
            tar.addfile(member, io.BytesIO(body))
    store.upload_file(tmp_path / "evil.tar", shard, store.metadata(shard))

    with pytest.raises(BadInput, match=rf"holds '{re.escape(first.name)}', which is not a regular file") as failure:
        sync_to_file_server(store, FileServer(work / "fileserver"), "pets", work)
    assert is_permanent(failure.value)
    assert not (work / "fileserver" / "datasets" / "pets").exists() or not any(
        (work / "fileserver" / "datasets" / "pets").iterdir()
    )


def test_the_node_side_fetch_refuses_a_tampered_manifest_with_one_line_and_exit_2(staged, tmp_path):
    """What the Azure ML sync job runs (nodelib/staged/fetch.py on a node), on a folder standing in for the datastore
    mount of datasets/pets/."""
    store, cfg, data, work = staged
    upload_dataset(store, cfg, data, "pets", work)
    rewrite_manifest(store, work, lambda rows: climbing(rows, ["../../../../node-escaped.png"]))
    source = tmp_path / "mount"
    for name in store.names("datasets/pets/"):
        (source / name.removeprefix("datasets/pets/")).parent.mkdir(parents=True, exist_ok=True)
        store.download_to(name, source / name.removeprefix("datasets/pets/"))
    export = tmp_path / "nfs"
    script = REPO / "containers" / "nodelib" / "staged" / "fetch.py"
    args = [sys.executable, str(script), "--source", str(source), "--export", str(export), "--dataset", "pets"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    person, event = done.stderr.splitlines()  # one line for people, its event for the Azure ML attempt
    assert person.startswith("error: staged data set 'pets' cannot be used")
    assert read_event(event) == Failure(person.removeprefix("error: "), "input")
    assert not list(tmp_path.rglob("node-escaped.png")) and not os.path.lexists("/node-escaped.png")
    assert (
        not (export / "datasets" / "pets").exists()
        or [p for p in (export / "datasets" / "pets").iterdir() if p.name.startswith(("v-", ".v-"))] == []
    )

    bad_name = subprocess.run([*args[:-1], "../../escaped"], capture_output=True, text=True, timeout=60)
    assert bad_name.returncode == 2 and "data set name '../../escaped' is not a name" in bad_name.stderr


def test_a_data_set_in_the_files_layout_stages_as_it_is_and_reruns_move_nothing(staged, tmp_path):
    store, cfg, _, work = staged
    data = tmp_path / "masks-set"
    for i in range(5):
        write_image(data / "images" / f"{i}.png", "RGB", size=16)
        write_image(data / "masks" / f"{i}.png", "L", size=16)
    (data / "coco.json").write_text('{"images": []}')
    first = upload_dataset(store, cfg, data, "pets", work, layout="files")
    assert first.files == 11
    server = FileServer(work / "fileserver")
    _, current = sync_to_file_server(store, server, "pets", work)
    assert tree(current) == tree(data)
    again = upload_dataset(store, cfg, data, "pets", work, layout="files")
    assert (again.files, again.skipped_files) == (0, 11)
    with pytest.raises(BadInput, match="has no train/<class>/ folders"):  # the trainer's layout refuses it
        upload_dataset(store, cfg, data, "other", work)
