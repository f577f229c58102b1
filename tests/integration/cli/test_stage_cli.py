"""`trainflow stage` end to end, as a user runs it: a Prefect flow against real storage, and no secret leaks."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from azure.storage.blob import AccountSasPermissions, BlobServiceClient, ResourceTypes, generate_account_sas

from infra.data.manifest import manifest_blob
from infra.services.azurite import ACCOUNT, DEV_KEY, connection_string
from infra.services.supervise import free_port
from infra.storage.blobstore import BlobStore
from infra.storage.config import StorageConfig
from infra.storage.errors import StorageError
from infra.storage.sas import container_sas

pytestmark = pytest.mark.integration
TRAINFLOW = str(Path(sys.executable).parent / "trainflow")


def sas_token() -> str:
    """An account SAS for Azurite's dev account, valid for an hour."""
    return generate_account_sas(
        ACCOUNT,
        DEV_KEY,
        ResourceTypes(service=True, container=True, object=True),
        AccountSasPermissions(read=True, write=True, delete=True, list=True, add=True, create=True),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )


def stage(
    tmp_path: Path, port: int, data: Path, token: str, container: str = ""
) -> tuple[subprocess.CompletedProcess, Path]:
    """`trainflow stage` into `container` (a new one unless named) of Azurite's account, with a SAS token."""
    config = tmp_path / "azure.yaml"
    config.write_text(
        f"storage:\n  backend: azure\n  account_url: http://127.0.0.1:{port}/{ACCOUNT}\n"
        f"  auth: sas\n  container: {container or f'c-{uuid.uuid4().hex[:10]}'}\n  shard_mb: 0.5\n"
    )
    work = tmp_path / "work"
    env = {**os.environ, "AZURE_STORAGE_SAS_TOKEN": token}
    result = subprocess.run(
        [TRAINFLOW, "stage", "--config", str(config), "--data", str(data), "--workdir", str(work)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return result, work


def leaks(secrets: list[str], result: subprocess.CompletedProcess, work: Path) -> list[str]:
    """Where any secret shows up: the output, or any file the run wrote (Prefect's database included)."""
    found = [f"output: {s[:6]}..." for s in secrets if s in result.stdout + result.stderr]
    for path in work.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {s[:6]}..." for s in secrets if s.encode() in data]
    return found


def secrets_of(token: str) -> list[str]:
    sig = token.split("sig=")[1].split("&")[0]
    return [sig, quote(sig, safe=""), unquote(sig), DEV_KEY]


def test_stage_with_a_sas_token_puts_the_data_on_the_file_server_and_leaks_nothing(tmp_path, azurite_port, digits):
    token = sas_token()
    result, work = stage(tmp_path, azurite_port, digits, token)
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(text for text in result.stdout.splitlines() if text.startswith("file server copy of digits: "))
    current = Path(line.split(": ", 1)[1])
    assert current == work / "fileserver" / "datasets" / "digits" / "current"
    assert len(list((current / "train").rglob("*.png"))) == 1438 and len(list((current / "val").rglob("*.png"))) == 359
    assert "staging summary" in result.stdout
    assert json.loads((work / "cache" / "dataset-sources.json").read_text()) == {"digits": str(digits)}
    assert leaks(secrets_of(token), result, work) == []


def test_a_wrong_sas_token_fails_in_one_line_without_showing_it(tmp_path, azurite_port, digits):
    good = sas_token()
    sig = good.split("sig=")[1].split("&")[0]
    wrong = good.replace(sig, "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo%3D")
    result, work = stage(tmp_path, azurite_port, digits, wrong)
    assert result.returncode == 1
    errors = [text for text in result.stderr.splitlines() if text.startswith("error: ")]
    assert len(errors) == 1 and "refused the credentials" in errors[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert leaks(secrets_of(wrong), result, work) == []


@pytest.mark.parametrize(
    "args, config, message",
    [
        (["--data", "{tmp}/nowhere"], "", "data folder .*nowhere does not exist"),
        ([], "storage: {container: Bad_Name}\n", "storage.container = 'Bad_Name'.*lowercase"),
        ([], "storage: {backend: azure, account_url: 'http://example.com/acct'}\n", "must use https"),
    ],
)
def test_bad_input_stops_before_any_service_starts(tmp_path, digits, args, config, message):
    path = tmp_path / "c.yaml"
    path.write_text(config)
    args = [a.format(tmp=tmp_path) for a in args] or ["--data", str(digits)]
    config_args = ["--config", str(path)] if config else []  # an empty config file is itself refused
    result = subprocess.run(
        [TRAINFLOW, "stage", *config_args, "--workdir", str(tmp_path / "w"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), result.stderr
    assert not (tmp_path / "w" / "prefect").exists()


def test_unreachable_storage_fails_fast_with_one_line(tmp_path, digits):
    path = tmp_path / "c.yaml"
    path.write_text(
        f"storage: {{backend: azure, account_url: 'http://127.0.0.1:{free_port()}/acct', retry_total: 1}}\n"
    )
    env = {**os.environ, "AZURE_STORAGE_SAS_TOKEN": "sv=x&sig=y"}
    started = time.monotonic()
    result = subprocess.run(
        [TRAINFLOW, "stage", "--config", str(path), "--workdir", str(tmp_path / "w"), "--data", str(digits)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    # Measured 3.0-5.1 s on a loaded 2-core machine: 1.0-2.9 s to start the command, then the preflight's one
    # SDK retry after 1.2-3.2 s. A retry of the Prefect step would first start Prefect's server (10 s or more
    # here) and wait 2 s; a second SDK retry adds 3.2-5.2 s, which takes most runs past the bound too.
    assert time.monotonic() - started < 10, f"took {time.monotonic() - started:.1f} s"
    assert result.returncode == 1
    errors = [text for text in result.stderr.splitlines() if text.startswith("error: ")]
    assert len(errors) == 1 and "cannot reach blob storage at http://127.0.0.1" in errors[0]


def test_an_account_key_only_signs_least_privilege_short_lived_tokens(tmp_path, azurite_port, digits):
    container = f"c-{uuid.uuid4().hex[:10]}"
    url = f"http://127.0.0.1:{azurite_port}/{ACCOUNT}"
    BlobServiceClient.from_connection_string(connection_string(azurite_port)).create_container(
        container
    )  # as Bicep does
    config = tmp_path / "key.yaml"
    config.write_text(
        f"storage:\n  backend: azure\n  account_url: {url}\n  auth: key\n  container: {container}\n"
        "  shard_mb: 0.5\n  sas_minutes: 30\n"
    )
    work = tmp_path / "work"
    result = subprocess.run(
        [TRAINFLOW, "stage", "--config", str(config), "--data", str(digits), "--workdir", str(work)],
        capture_output=True,
        text=True,
        env={**os.environ, "AZURE_STORAGE_KEY": DEV_KEY},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert not leaks([DEV_KEY], result, work)
    cfg = StorageConfig(backend="azure", account_url=url, auth="key", container=container, sas_minutes=30)
    reader = BlobStore.connect(cfg, environ={"AZURE_STORAGE_KEY": DEV_KEY}, access="read")
    assert reader.read_text(manifest_blob("digits"))  # the sync's token reads and lists ...
    with pytest.raises(StorageError, match="refused the credentials"):  # ... and cannot write
        reader.write_text("datasets/digits/manifest.json", "{}")
    token = container_sas(url, container, DEV_KEY, "read", 30)
    fields = dict(part.split("=", 1) for part in token.split("&"))
    expiry = datetime.fromisoformat(unquote(fields["se"]).replace("Z", "+00:00"))
    assert fields["sp"] == "rl" and fields["sr"] == "c"
    assert timedelta(minutes=29) < expiry - datetime.now(UTC) <= timedelta(minutes=30)


@pytest.mark.parametrize("folder", [".", "not-made-yet"])
def test_a_tampered_manifest_in_blob_ends_stage_in_one_line_without_retries_or_writes(
    tmp_path, azurite_port, digits, folder
):
    """The hostile probe's case: anyone who can write the container rewrites the manifest so that its rows name
    paths outside the file server (sizes, SHA-256 and the blob's metadata kept); the next `trainflow stage` reads it.
    A path in a folder that does not exist yet, staged again from a folder with one file more, is met first by the
    upload step, which reads the manifest for the shards it can keep, not by the sync."""
    token, container = sas_token(), f"c-{uuid.uuid4().hex[:10]}"
    if folder != ".":
        digits = Path(shutil.copytree(digits, tmp_path / "digits"))
    first, work = stage(tmp_path, azurite_port, digits, token, container)
    assert first.returncode == 0, first.stderr[-2000:]
    store = BlobStore.connect(StorageConfig(container=container), connection_string=connection_string(azurite_port))
    header, row, *rows = store.read_text(manifest_blob("digits")).splitlines()
    escaped = (tmp_path / folder / "escaped.png").resolve()
    evil = f'["{escaped}"{row[row.index(",") :]}'  # the first row's size, digest and shard, an absolute path
    (tmp_path / "evil.jsonl").write_text("\n".join([header, evil, *rows]) + "\n")
    store.upload_file(tmp_path / "evil.jsonl", manifest_blob("digits"), store.metadata(manifest_blob("digits")))
    if folder != ".":
        shutil.copy(next((digits / "train").rglob("*.png")), digits / "train" / "0" / "one-more.png")

    again, _ = stage(tmp_path, azurite_port, digits, token, container)
    assert again.returncode == 2, again.stderr[-2000:]
    errors = [text for text in again.stderr.splitlines() if text.startswith("error: ")]
    assert errors == [
        f"error: staged data set 'digits' cannot be used: line 2 of its manifest.jsonl names '{escaped}', which is "
        "an absolute path; nothing of it was kept; delete datasets/digits/manifest.jsonl from the container, stage the "
        "data set again from its folder (`trainflow stage --data FOLDER`), and check who can write to the container"
    ]
    assert "Traceback" not in again.stdout + again.stderr and "Retrying" not in again.stdout + again.stderr
    assert not escaped.exists() and not (tmp_path / "not-made-yet").exists()
    assert len(list((work / "fileserver" / "datasets" / "digits" / "current" / "train").rglob("*.png"))) == 1438

    store.delete(manifest_blob("digits"))  # the fix the line names
    fixed, _ = stage(tmp_path, azurite_port, digits, token, container)
    assert fixed.returncode == 0, fixed.stderr[-2000:]


def test_a_manifest_row_whose_size_lies_ends_the_sync_in_one_line_naming_both_blobs_and_never_retried(
    tmp_path, azurite_port, digits
):
    """The hostile probe's case: a row's size made one byte more (its digest and the blob's metadata kept); a file
    server that lacks the version syncs it from the shards, which disagree."""
    token, container = sas_token(), f"c-{uuid.uuid4().hex[:10]}"
    first, work = stage(tmp_path, azurite_port, digits, token, container)
    assert first.returncode == 0, first.stderr[-2000:]
    store = BlobStore.connect(StorageConfig(container=container), connection_string=connection_string(azurite_port))
    header, row, *rows = store.read_text(manifest_blob("digits")).splitlines()
    path, size, digest, shard = json.loads(row)
    (tmp_path / "lie.jsonl").write_text("\n".join([header, json.dumps([path, size + 1, digest, shard]), *rows]) + "\n")
    store.upload_file(tmp_path / "lie.jsonl", manifest_blob("digits"), store.metadata(manifest_blob("digits")))
    shutil.rmtree(work / "fileserver")  # a file server that has not synced this version yet

    again, _ = stage(tmp_path, azurite_port, digits, token, container)
    assert again.returncode == 2, again.stderr[-2000:]
    [error] = [text for text in again.stderr.splitlines() if text.startswith("error: ")]
    assert f"holds {path!r} of {size} bytes, but the manifest says {size + 1}" in error, error
    assert f"delete datasets/digits/manifest.jsonl and datasets/digits/shards/{shard}.tar from the container" in error
    assert "Traceback" not in again.stdout + again.stderr and "Retrying" not in again.stdout + again.stderr
    assert not (work / "fileserver" / "datasets" / "digits" / "current").exists()  # no version left looking whole
