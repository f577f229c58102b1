"""The scripts step over both share backends: versioned by content, only changed files uploaded."""

import importlib
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from azure.storage.fileshare import generate_share_sas

from infra.core.errors import BadInput
from infra.engines.script_files import script_files
from infra.storage.azure_files import AzureFileShare
from infra.storage.fileshare import LocalFolderShare
from tasks.upload_scripts import LATEST, package_files, upload_scripts
from tests.fakes.azure_files import FakeAzureFiles

pytestmark = pytest.mark.integration


@pytest.fixture(params=["local", "azure-files-fake"])
def share(request, tmp_path):
    if request.param == "local":
        yield LocalFolderShare(tmp_path / "share")
        return
    with FakeAzureFiles(share="scripts") as fake:
        yield AzureFileShare.from_settings(fake.account_url, "scripts", fake.named_key())
        assert fake.violations == []


def test_scripts_are_versioned_and_only_changes_are_uploaded(share, tmp_path):
    extra = tmp_path / "labels.txt"
    extra.write_text("cat\ndog\n")
    files = package_files([extra])
    assert "trainer/train.py" in files and "labels.txt" in files

    first, folder, _ = upload_scripts(share, files)
    assert first.files == len(files) and share.exists(f"{folder}/.complete")
    assert share.read_text(f"{folder}/trainer/train.py") == files["trainer/train.py"].read_text()

    again, same, plan = upload_scripts(share, files)
    assert same == folder and (again.files, again.skipped_files) == (0, len(files)) and plan["action"] == "skip"

    extra.write_text("cat\ndog\nemu\n")
    changed, new_folder, _ = upload_scripts(share, package_files([extra]))
    assert new_folder != folder and (changed.files, changed.skipped_files) == (1, len(files) - 1)
    assert share.read_text(f"{new_folder}/labels.txt") == "cat\ndog\nemu\n"
    assert share.read_text(f"{new_folder}/trainer/train.py") == files["trainer/train.py"].read_text()
    assert share.read_text(f"{folder}/labels.txt") == "cat\ndog\n"  # a running job's version is untouched
    assert share.read_text(LATEST) == new_folder.split("/")[1]


def test_a_missing_extra_file_is_named(tmp_path):
    with pytest.raises(BadInput, match="extra_files names .*nope.cfg") as failure:
        package_files([tmp_path / "nope.cfg"])
    assert failure.value.exit_code == 2


def test_sas_tokens_work_and_never_appear_in_urls():
    with FakeAzureFiles(share="scripts") as fake:
        expiry = datetime.now(UTC) + timedelta(hours=1)
        sas = generate_share_sas(fake.account, "scripts", fake.key, permission="rcwdl", expiry=expiry)
        share = AzureFileShare.from_settings(fake.account_url, "scripts", sas)
        _, folder, _ = upload_scripts(share, package_files([]))
        assert "sig=" not in share.url(folder) and fake.violations == []


def trainer_help(folder: Path) -> subprocess.CompletedProcess:
    """The trainer of a scripts version, started as a node starts it (its --help: the check runs before anything)."""
    return subprocess.run(
        [sys.executable, str(folder / "trainer" / "train.py"), "--help"], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "tamper, named",
    [
        (lambda f: (f / "trainer" / "models.py").write_text("raise SystemExit(1)\n"), "trainer/models.py was changed"),
        (lambda f: (f / "trainer" / "sitecustom.py").write_text("x = 1\n"), "trainer/sitecustom.py was added to it"),
    ],
)
def test_the_trainer_refuses_a_scripts_version_whose_files_changed(tmp_path, tamper, named):
    share = LocalFolderShare(tmp_path / "share")
    _, folder, _ = upload_scripts(share, package_files([]))
    root = tmp_path / "share" / folder
    assert trainer_help(root).returncode == 0  # intact: it runs
    (root / "trainer" / "models.py").chmod(0o644)
    tamper(root)
    done = trainer_help(root)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"error: scripts version {root} cannot be run: {named}; delete the file share's scripts/ folder (the next run "
        "uploads the scripts afresh, copying nothing from it) and check who can write to the share\n"
    )


def test_a_planted_python_cache_on_the_share_is_never_executed(tmp_path):
    share = LocalFolderShare(tmp_path / "share")
    _, folder, _ = upload_scripts(share, package_files([]))
    root = tmp_path / "share" / folder
    source = root / "trainer" / "console.py"
    planted = compile("raise SystemExit('planted code ran')", str(source), "exec")
    stat = source.stat()
    pyc = root / "trainer" / "__pycache__" / f"console.{sys.implementation.cache_tag}.pyc"  # Python's own place
    pyc.parent.mkdir(exist_ok=True)
    # a valid cache of console.py's mtime and size, as py_compile writes one (its helper, with other code)
    pyc.write_bytes(importlib._bootstrap_external._code_to_timestamp_pyc(planted, stat.st_mtime, stat.st_size))
    done = trainer_help(root)
    assert done.returncode == 0 and "planted code ran" not in done.stderr + done.stdout


def test_a_users_scripts_folder_ships_as_a_version_and_a_one_line_edit_uploads_one_file(share, tmp_path):
    source = tmp_path / "mine"
    (source / "src").mkdir(parents=True)
    (source / "train.py").write_text("from src import model\n")
    (source / "src" / "model.py").write_text("LAYERS = 2\n")
    (source / ".gitignore").write_text("runs/\n")
    (source / "runs").mkdir()
    (source / "runs" / "old.ckpt").write_text("left out")
    first, folder, _ = upload_scripts(share, script_files(source))
    assert first.files == 3 and share.read_text(f"{folder}/src/model.py") == "LAYERS = 2\n"
    assert not share.exists(f"{folder}/runs/old.ckpt")
    (source / "src" / "model.py").write_text("LAYERS = 3\n")
    edited, new_folder, plan = upload_scripts(share, script_files(source))
    assert new_folder != folder and (edited.files, edited.skipped_files) == (1, 2)
    assert plan["detail"].startswith("upload 1 of 3 files as version ")  # the dry run's words for the delta
    assert plan["detail"].endswith(", 2 copied from the share's latest version")
