"""The scripts step over both share backends: versioned by content, only changed files uploaded."""

from datetime import UTC, datetime, timedelta

import pytest
from azure.storage.fileshare import generate_share_sas

from infra.core.errors import BadInput
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
