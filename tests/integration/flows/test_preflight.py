"""check_access, the preflight, against a real Azurite configured as storage.backend azure (and the Azure Files
stand-in for the share): each credential or storage mistake fails at once (one retry at most), before anything
starts, with the one line a run would have printed minutes later; and storage errors are named by the service's code.

The checks take about a second on an idle machine and longer under the test suite's load, so the bound below only tells
the preflight's quick store (one retry after 2.2 s, 3 s and 5 s timeouts) from a run's (6 retries, 16 s by the 4th)."""

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.storage.blob import (
    AccountSasPermissions,
    BlobServiceClient,
    ResourceTypes,
    generate_account_sas,
    generate_container_sas,
)
from azure.storage.fileshare import generate_share_sas

from flows.config import FlowConfig, load_config
from flows.preflight import check_access
from infra.core.errors import BadInput, exit_code
from infra.data.manifest import manifest_blob
from infra.services.azurite import ACCOUNT, DEV_KEY, connection_string
from infra.services.supervise import free_port
from infra.storage.blobstore import BlobStore
from infra.storage.config import StorageConfig
from infra.storage.errors import MissingSecret, StorageError
from tests.fakes.azure_files import FakeAzureFiles
from tests.fakes.identity import Identity
from tests.fakes.paths import REPO

pytestmark = pytest.mark.integration
WRONG_KEY = ("V3JvbmdLZXk" * 8)[:86] + "=="  # a storage key's shape (88 base64 characters), not the account's key
AT_ONCE = 10.0  # seconds


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/{ACCOUNT}"


def config(port: int, container: str, data: str | None = None, **storage) -> FlowConfig:
    """A config whose storage is Azurite reached as `backend: azure` (auth key unless `storage` says otherwise)."""
    values = {
        "storage": {
            "backend": "azure",
            "account_url": url(port),
            "auth": "key",
            "container": container,
            "retry_initial_backoff": 0.1,
            **storage,
        }
    }
    if data == "staged":
        values.update(data="staged", dataset="pets")
    return load_config(None, values, environ={})


def later() -> datetime:
    """A SAS's expiry an hour from now: from when the token is made, not when the module was collected (in the whole
    suite this module's tests run more than an hour after collection, and tokens made to expire then were refused)."""
    return datetime.now(UTC) + timedelta(hours=1)


def container_token(container: str, permission: str = "rl", key: str = DEV_KEY, expiry: datetime | None = None) -> str:
    return generate_container_sas(ACCOUNT, container, account_key=key, permission=permission, expiry=expiry or later())


def account_token(**permissions) -> str:
    return generate_account_sas(
        ACCOUNT,
        DEV_KEY,
        ResourceTypes(service=True, container=True, object=True),
        AccountSasPermissions(**permissions),
        expiry=later(),
    )


@pytest.fixture
def container(azurite_port) -> str:
    """A fresh container holding the data set `pets`, staged (its manifest is its completion mark)."""
    name = f"p-{uuid.uuid4().hex[:10]}"
    service = BlobServiceClient.from_connection_string(connection_string(azurite_port))
    service.create_container(name).upload_blob(manifest_blob("pets"), b'{"shards": []}')
    return name


def timed_check(cfg: FlowConfig, environ: dict, **kwargs) -> float:
    """check_access's seconds (raises what it raises)."""
    start = time.monotonic()
    check_access(cfg, environ, **kwargs)
    return time.monotonic() - start


@pytest.mark.parametrize("data", [None, "staged"])
@pytest.mark.parametrize("auth", ["key", "account sas", "container sas", "connection_string"])
def test_a_right_config_passes_at_once(azurite_port, container, auth, data):
    environ = {
        "AZURE_STORAGE_KEY": DEV_KEY,
        "AZURE_STORAGE_CONNECTION_STRING": connection_string(azurite_port),
        "AZURE_STORAGE_SAS_TOKEN": account_token(read=True, list=True)
        if auth == "account sas"
        else container_token(container),
    }
    cfg = config(azurite_port, container, data, auth={"account sas": "sas", "container sas": "sas"}.get(auth, auth))
    assert timed_check(cfg, environ) < AT_ONCE


def case(auth: str = "key", env: dict | None = None, data: str | None = None, container: str = "{container}"):
    return {
        "auth": auth,
        "env": env if env is not None else {"AZURE_STORAGE_KEY": DEV_KEY},
        "data": data,
        "container": container,
    }


MISTAKES = {
    "wrong account key": (
        case(env={"AZURE_STORAGE_KEY": WRONG_KEY}),
        StorageError,
        r"refused the credentials to list the container \(AuthorizationFailure\): the key or SAS "
        "signature is wrong",
    ),
    "SAS signed with another key": (
        case("sas", {"AZURE_STORAGE_SAS_TOKEN": "{wrong signature}"}),
        StorageError,
        r"refused the credentials to list the container \(AuthorizationFailure\)",
    ),
    "expired SAS": (
        case("sas", {"AZURE_STORAGE_SAS_TOKEN": "{expired}"}),
        StorageError,
        r"refused the credentials to list the container \(AuthorizationFailure\): .*has expired",
    ),
    "SAS that may read but not list": (
        case("sas", {"AZURE_STORAGE_SAS_TOKEN": "{read only}"}),
        StorageError,
        r"refused the credentials to list the container "
        r"\(AuthorizationPermissionMismatch\): the SAS token's permissions",
    ),
    "staged data, no such container": (
        case(data="staged", container="nowhere-{uid}"),
        StorageError,
        r"could not list the container: the container does not exist; check "
        r"storage.container.*\(ContainerNotFound\)$",
    ),
    "key-signed SAS, no such container": (case(container="nowhere-{uid}"), StorageError, r"\(ContainerNotFound\)$"),
    "container SAS, no such container": (
        case("sas", {"AZURE_STORAGE_SAS_TOKEN": "{missing container}"}, container="nowhere-{uid}"),
        StorageError,
        r"\(ContainerNotFound\)$",
    ),
    "staged data set never staged": (
        case(data="staged", container="{empty}"),
        BadInput,
        r"^data set 'pets' was never staged: .* has no datasets/pets/manifest.jsonl; run "
        "`trainflow stage` first$",
    ),
    "unset key variable": (
        case(env={}),
        MissingSecret,
        r"^environment variable AZURE_STORAGE_KEY \(named by "
        r"storage.account_key_env\) is not set; export it",
    ),
    "unset SAS variable": (
        case("sas", {"AZURE_STORAGE_KEY": DEV_KEY}),
        MissingSecret,
        r"^environment variable AZURE_STORAGE_SAS_TOKEN \(named by storage.sas_token_env\)",
    ),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_each_mistake_fails_at_once_with_the_line_a_run_would_print(azurite_port, container, mistake):
    given, error, message = MISTAKES[mistake]
    service = BlobServiceClient.from_connection_string(connection_string(azurite_port))
    empty = f"e-{uuid.uuid4().hex[:10]}"
    service.create_container(empty)
    uid = uuid.uuid4().hex[:8]
    tokens = {
        "{wrong signature}": container_token(container, key=WRONG_KEY),
        "{expired}": container_token(container, expiry=datetime.now(UTC) - timedelta(minutes=10)),
        "{read only}": container_token(container, "r"),
        "{missing container}": container_token(f"nowhere-{uid}"),
    }
    environ = {name: tokens.get(value, value) for name, value in given["env"].items()}
    name = given["container"].format(container=container, uid=uid, empty=empty)
    cfg = config(azurite_port, name, given["data"], auth=given["auth"])
    start = time.monotonic()
    with pytest.raises(error, match=message) as failure:
        check_access(cfg, environ)
    assert time.monotonic() - start < AT_ONCE
    text = str(failure.value)
    assert "\n" not in text and ("refused" in text) == ("refused" in message)
    for secret in [DEV_KEY, WRONG_KEY, *tokens.values()]:
        assert secret not in text and secret.split("sig=")[-1] not in text
    assert exit_code(failure.value) == (2 if issubclass(error, BadInput) else 1)


def test_unreachable_storage_fails_within_seconds(tmp_path):
    cfg = config(free_port(), "anything", auth="sas")
    start = time.monotonic()
    with pytest.raises(
        StorageError,
        match=r"^cannot reach blob storage at http://127.0.0.1:\d+/devstoreaccount1/"
        r"anything to list the container .*sig=\*\*\*",
    ):
        check_access(cfg, {"AZURE_STORAGE_SAS_TOKEN": "sv=2024-05-04&sig=c2VjcmV0"})
    assert time.monotonic() - start < AT_ONCE


@pytest.mark.parametrize(
    "auth, env", [("connection_string", "AZURE_STORAGE_CONNECTION_STRING"), ("sas", "AZURE_STORAGE_SAS_TOKEN")]
)
def test_a_missing_container_passes_when_the_credential_may_create_it(azurite_port, auth, env):
    """stage makes the container; only a credential that cannot (a container SAS, auth key or default) must find it."""
    secret = (
        connection_string(azurite_port)
        if auth == "connection_string"
        else account_token(read=True, list=True, create=True, write=True, add=True)
    )
    assert timed_check(config(azurite_port, f"later-{uuid.uuid4().hex[:8]}", auth=auth), {env: secret}) < AT_ONCE


def test_nothing_is_checked_for_azurite_and_a_local_share():
    """trainflow starts Azurite itself: no variable, no request."""
    assert timed_check(load_config(None, {}, environ={}), {}) < AT_ONCE


def test_every_unset_variable_is_named_at_once():
    cfg = load_config(
        REPO / "flows" / "configs" / "azure.yaml",
        {"storage": {"auth": "key"}, "fileshare": {"auth": "key"}},
        environ={},
    )
    with pytest.raises(
        MissingSecret,
        match=r"^environment variable AZURE_STORAGE_KEY \(named by "
        r"storage.account_key_env and fileshare.account_key_env\) is not set",
    ):
        check_access(cfg, {})
    cfg = load_config(REPO / "flows" / "configs" / "azure.yaml", {"storage": {"auth": "sas"}}, environ={})
    with pytest.raises(
        MissingSecret,
        match=r"^environment variables AZURE_STORAGE_SAS_TOKEN \(named by "
        r"storage.sas_token_env\), AZURE_FILES_SAS_TOKEN \(named by "
        r"fileshare.sas_token_env\) are not set; export them",
    ):
        check_access(cfg, {"AZURE_STORAGE_KEY": DEV_KEY})


def share_config(fake: FakeAzureFiles, share: str) -> FlowConfig:
    """The Azure example config with Azurite for Blob and the stand-in for the share."""
    return load_config(
        REPO / "flows" / "configs" / "azure.yaml",
        {
            "storage": {"backend": "azurite"},
            "fileshare": {"account_url": fake.account_url, "share": share, "sas_token_env": "SCRIPTS_SAS"},
        },
        environ={},
    )


def test_the_azure_file_share_is_asked_once(tmp_path):
    with FakeAzureFiles(share="scripts") as fake:
        token = generate_share_sas(fake.account, "scripts", fake.key, permission="rcwl", expiry=later())
        assert timed_check(share_config(fake, "scripts"), {"SCRIPTS_SAS": token}) < AT_ONCE
        with pytest.raises(
            StorageError,
            match=r"^Azure Files at .*/other could not reach the share: the file share "
            r"does not exist; check fileshare.share.*\(ShareNotFound\)$",
        ):
            check_access(share_config(fake, "other"), {"SCRIPTS_SAS": token})
        expired = generate_share_sas(
            fake.account, "scripts", fake.key, permission="rl", expiry=datetime.now(UTC) - timedelta(minutes=1)
        )
        with pytest.raises(StorageError, match=r"refused the credentials to reach the share \(AuthenticationFailed\)"):
            check_access(share_config(fake, "scripts"), {"SCRIPTS_SAS": expired})
        assert fake.requests[0][2] == "directory_properties" and len(fake.requests) == 3  # one request per check
        with pytest.raises(MissingSecret, match=r"SCRIPTS_SAS \(named by fileshare.sas_token_env\)"):
            check_access(share_config(fake, "scripts"), {})


def test_auth_default_gets_the_delegation_key_and_lists_or_names_the_missing_role(oauth_azurite, monkeypatch):
    account_url, cert = oauth_azurite
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    name = f"d-{uuid.uuid4().hex[:10]}"
    BlobServiceClient(account_url, credential=Identity()).create_container(name)
    cfg = load_config(
        None,
        {"storage": {"backend": "azure", "account_url": account_url, "auth": "default", "container": name}},
        environ={},
    )
    assert timed_check(cfg, {}, credential=Identity()) < AT_ONCE
    stranger = Identity(audience="https://someotheraccount.blob.core.windows.net")
    with pytest.raises(StorageError, match=r"refused this identity a user delegation key.*Storage Blob Delegator"):
        check_access(cfg, {}, credential=stranger)
    missing = cfg.model_copy(update={"storage": cfg.storage.model_copy(update={"container": "nowhere"})})
    with pytest.raises(StorageError, match=r"\(ContainerNotFound\)$"):  # its SAS is for one container: cannot make it
        check_access(missing, {}, credential=Identity())


def store(port: int, container: str, access: str = "stage", key: str = DEV_KEY) -> BlobStore:
    cfg = StorageConfig(backend="azure", account_url=url(port), auth="key", container=container, retry_total=0)
    return BlobStore.connect(cfg, environ={"AZURE_STORAGE_KEY": key}, access=access)


def test_storage_errors_are_named_by_the_services_code_not_the_exception_type(azurite_port, container):
    missing = store(azurite_port, f"nowhere-{uuid.uuid4().hex[:8]}")
    with pytest.raises(
        StorageError,
        match=r"^blob storage has no container at .*/nowhere-\w+ \(ContainerNotFound\) "
        r"and these credentials may not create it \(AuthorizationPermissionMismatch; "
        r"a container SAS never can\): create it once",
    ) as failure:
        missing.ensure_container()  # what used to be reported as refused credentials
    assert "refused" not in str(failure.value) and failure.value.permanent
    with pytest.raises(
        StorageError, match=r"could not list blobs: the container does not exist.*\(ContainerNotFound\)"
    ):
        missing.names("datasets/")
    assert missing.read_text("datasets/pets/manifest.json") is None  # no container, so no blob either
    reader = store(azurite_port, container, "read")
    assert reader.read_text("datasets/ghost/manifest.json") is None
    with pytest.raises(StorageError, match=r"refused the credentials to write x \(AuthorizationPermissionMismatch\)"):
        reader.write_text("x", "1")
    with pytest.raises(
        StorageError, match=r"refused the credentials to list blobs \(AuthorizationFailure\)"
    ) as failure:
        store(azurite_port, container, key=WRONG_KEY).names("")
    assert WRONG_KEY not in str(failure.value) and failure.value.permanent
