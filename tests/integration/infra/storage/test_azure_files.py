"""AzureFileShare through the real SDK request pipeline against the local fake, and one contract for both shares."""

import base64
import os
from datetime import UTC, datetime, timedelta

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.storage.fileshare import ShareClient, ShareSasPermissions, generate_share_sas

from infra.storage.azure_files import AzureCopyError, AzureFileShare
from infra.storage.errors import StorageError
from infra.storage.fileshare import LocalFolderShare
from tests.fakes.azure_files import FakeAzureFiles

pytestmark = pytest.mark.integration

SHARE = "scripts"


@pytest.fixture
def fake():
    with FakeAzureFiles(share=SHARE) as server:
        yield server


def sas_for(fake: FakeAzureFiles) -> str:
    permission = ShareSasPermissions(read=True, create=True, write=True)
    expiry = datetime.now(UTC) + timedelta(hours=1)
    return generate_share_sas(fake.account, SHARE, fake.key, permission=permission, expiry=expiry)


CREDENTIALS = {
    "sas": sas_for,
    "key-dict": FakeAzureFiles.account_key_dict,
    "named-key": FakeAzureFiles.named_key,
}


@pytest.fixture(params=sorted(CREDENTIALS))
def azure(request, fake) -> AzureFileShare:
    share = AzureFileShare.from_settings(fake.account_url, SHARE, CREDENTIALS[request.param](fake))
    share.copy_poll_s = 0.01
    return share


@pytest.fixture(params=["local", "azure"])
def any_share(request, tmp_path):
    if request.param == "local":
        return LocalFolderShare(tmp_path / "share")
    fake = request.getfixturevalue("fake")
    return AzureFileShare.from_settings(fake.account_url, SHARE, fake.named_key())


def test_one_contract_for_both_backends(any_share, tmp_path, request):
    local = tmp_path / "train.py"
    local.write_text("print('hi')\n", encoding="utf-8")
    assert not any_share.exists("jobs/a/train.py")
    assert any_share.read_text("jobs/a/train.py") is None
    any_share.upload_file(local, "jobs/a/train.py")
    any_share.write_text("jobs/a/conf/run.json", '{"épochs": 2}')
    any_share.write_text("jobs/b/train.py", "stale")
    any_share.copy_within("jobs/a/train.py", "jobs/b/train.py")  # overwrites
    any_share.copy_within("jobs/a/train.py", "other/deep/train.py")  # creates parents
    assert any_share.exists("jobs/a/train.py") and any_share.exists("other/deep/train.py")
    assert any_share.read_text("jobs/b/train.py") == "print('hi')\n"
    assert any_share.read_text("jobs/a/conf/run.json") == '{"épochs": 2}'
    assert any_share.url("jobs/a/train.py").endswith("jobs/a/train.py")
    if isinstance(any_share, AzureFileShare):
        assert request.getfixturevalue("fake").violations == []


def test_upload_nested_large_file_round_trips_byte_for_byte(azure, fake, tmp_path):
    text = base64.b64encode(os.urandom(4 * 1024 * 1024)).decode()[: 5 * 1024 * 1024 + 123]
    local = tmp_path / "big.txt"
    local.write_bytes(text.encode())
    azure.upload_file(local, "a/b/c/big.txt")
    assert bytes(fake.files[f"{SHARE}/a/b/c/big.txt"].data) == text.encode()
    assert azure.read_text("a/b/c/big.txt") == text
    ranges = [r for r in fake.requests if r[2] == "put_range"]
    assert len(ranges) == 2  # split into 4 MiB ranges
    assert fake.violations == []


def test_chunked_download_uses_ranges(fake, tmp_path):
    client = ShareClient(
        fake.account_url,
        SHARE,
        credential=fake.named_key(),
        max_single_get_size=1024 * 1024,
        max_chunk_get_size=1024 * 1024,
    )
    share = AzureFileShare(client)
    text = "x" * (3 * 1024 * 1024 + 5)
    share.write_text("big.txt", text)
    assert share.read_text("big.txt") == text
    assert len([r for r in fake.requests if r[2] == "download"]) == 4
    assert fake.violations == []


def test_exists_read_write_copy(azure, fake):
    assert not azure.exists("x/y.txt")
    assert azure.read_text("x/y.txt") is None
    azure.write_text("x/y.txt", "héllo")
    azure.write_text("x/z.txt", "")  # empty file: create only, no range
    assert azure.exists("x/y.txt")
    assert azure.read_text("x/z.txt") == ""
    azure.copy_within("x/y.txt", "copies/y.txt")
    assert azure.read_text("copies/y.txt") == "héllo"
    assert any(r[2] == "copy" for r in fake.requests)
    assert fake.violations == []


def test_copy_waits_while_pending_and_fails_clearly(azure, fake):
    azure.write_text("s.txt", "data")
    fake.copy_outcome, fake.pending_polls = "pending", 2
    azure.copy_within("s.txt", "d.txt")
    assert azure.read_text("d.txt") == "data"
    assert len([r for r in fake.requests if r[2] == "file_properties"]) >= 3
    fake.copy_outcome = "failed"
    with pytest.raises(AzureCopyError, match="failed"):
        azure.copy_within("s.txt", "e.txt")
    assert fake.violations == []


def test_url_has_no_signature(fake):
    share = AzureFileShare.from_settings(fake.account_url, SHARE, sas_for(fake))
    url = share.url("dir/f.txt")
    assert url == f"{fake.account_url}/{SHARE}/dir/f.txt"
    assert "sig=" not in url and "?" not in url


def test_unauthenticated_client_is_refused(fake):
    # The SDK will not build a client with no credential at all; a "SAS" without its signature
    # makes it send requests that carry no authentication.
    share = AzureFileShare(ShareClient(fake.account_url, SHARE, credential="sv=2026-10-06&sp=rcw"))
    with pytest.raises(StorageError, match="Azure Files at .* refused the credentials") as refused:
        share.write_text("a.txt", "x")
    assert refused.value.permanent
    assert any("NoAuthenticationInformation" in v for v in fake.violations)
    with pytest.raises(ValueError, match="credential"):
        AzureFileShare.from_settings(fake.account_url, SHARE, None)


def test_expired_sas_is_refused(fake):
    expired = generate_share_sas(
        fake.account, SHARE, fake.key, permission="r", expiry=datetime.now(UTC) - timedelta(minutes=1)
    )
    share = AzureFileShare.from_settings(fake.account_url, SHARE, expired)
    with pytest.raises(StorageError, match="refused the credentials"):
        share.exists("a.txt")
    assert any("expiry" in v for v in fake.violations)


def test_wrong_account_key_is_refused(fake):
    wrong = {"account_name": fake.account, "account_key": base64.b64encode(os.urandom(64)).decode()}
    share = AzureFileShare.from_settings(fake.account_url, SHARE, wrong)
    with pytest.raises(StorageError, match="refused the credentials") as refused:
        share.write_text("a.txt", "x")
    assert wrong["account_key"] not in str(refused.value)
    assert any("signature" in v for v in fake.violations)


@pytest.mark.parametrize("url", ["http://files.example.com/acct", "http://10.0.0.4:10000/acct", "ftp://127.0.0.1/a"])
def test_plain_http_to_non_loopback_is_refused(url):
    with pytest.raises(ValueError, match="https"):
        AzureFileShare.from_settings(url, SHARE, "sv=2026-10-06&sig=abc")


@pytest.mark.parametrize(
    "url",
    ["http://localhost:1/acct", "http://127.9.0.1:1/acct", "http://[::1]:1/acct", "https://a.file.core.windows.net"],
)
def test_https_and_loopback_http_are_accepted(url):
    AzureFileShare.from_settings(url, SHARE, "sv=2026-10-06&sig=abc")  # builds a client; sends nothing


class _Token:
    def get_token(self, *scopes, **kwargs):
        raise AssertionError("no request is sent in this test")


def test_token_credential_gets_backup_intent_and_needs_https():
    share = AzureFileShare.from_settings("https://acct.file.core.windows.net", SHARE, _Token())
    assert share._share.file_request_intent == "backup"
    with pytest.raises(ValueError, match="HTTPS"):
        AzureFileShare.from_settings("http://127.0.0.1:1/acct", SHARE, _Token())


def test_fake_catches_client_mistakes(fake):
    """The checks are live: a missing parent directory and a range past the file's end are recorded."""
    client = ShareClient(fake.account_url, SHARE, credential=fake.named_key())
    with pytest.raises(ResourceNotFoundError):
        client.get_file_client("no/such/dir.txt").upload_file(b"x")
    short = client.get_file_client("short.txt")
    short.create_file(3)
    with pytest.raises(HttpResponseError):
        short.upload_range(b"abcdef", offset=0, length=6)
    assert [v.split(": ", 1)[1][:18] for v in fake.violations] == ["404 ParentNotFound", "416 InvalidRange: "]
