"""auth default against a real Azurite: the identity gets a user delegation key (Azurite serves Get User
Delegation Key under `--oauth basic`, which needs HTTPS) and each step's SAS allows only what the step does.

Azurite's basic OAuth checks a token's issuer, audience and lifetime, not its signature or any role; so the
identity here is a token made in the test, and the missing-role 403 is provoked with a token for another account.
"""

import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qsl, urlparse

import pytest
from azure.storage.blob import BlobServiceClient

from infra.storage.blobstore import BlobStore
from infra.storage.config import StorageConfig
from infra.storage.errors import StorageError
from tests.fakes.identity import OID, TID, Identity

pytestmark = pytest.mark.integration


@pytest.fixture
def container(oauth_azurite, monkeypatch) -> str:
    """A fresh container holding one blob, made by the identity itself; the test's clients trust the certificate."""
    url, cert = oauth_azurite
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    name = f"c-{uuid.uuid4().hex[:10]}"
    client = BlobServiceClient(url, credential=Identity()).create_container(name)
    client.upload_blob("datasets/d/manifest.json", b'{"shards": []}')
    return name


def connect(url: str, container: str, access: str, identity=None) -> BlobStore:
    """A store with auth default for one step's `access`, signed in as `identity`."""
    cfg = StorageConfig(
        backend="azure", account_url=url, auth="default", container=container, sas_minutes=30, retry_total=0
    )
    return BlobStore.connect(cfg, environ={}, access=access, credential=identity or Identity())


def test_a_read_sas_signed_with_the_identitys_delegation_key_reads_and_lists_and_cannot_write(oauth_azurite, container):
    reader = connect(oauth_azurite[0], container, "read")
    assert reader.read_text("datasets/d/manifest.json") == '{"shards": []}'
    assert reader.names("datasets/") == {"datasets/d/manifest.json": 14}
    with pytest.raises(StorageError, match="refused the credentials.*AuthorizationPermissionMismatch"):
        reader.write_text("datasets/d/manifest.json", "{}")
    assert reader.container.credential is None  # the client holds the SAS alone: no token, no key
    token = dict(parse_qsl(urlparse(reader.container.url).query))
    assert (token["sp"], token["sr"], token["skoid"], token["sktid"], token["sks"]) == ("rl", "c", OID, TID, "b")
    expiry = datetime.fromisoformat(token["se"].replace("Z", "+00:00"))
    assert timedelta(minutes=29) < expiry - datetime.now(UTC) <= timedelta(minutes=30)


def test_the_stage_sas_writes_and_deletes_and_the_results_sas_cannot_delete(oauth_azurite, container):
    stage, results = connect(oauth_azurite[0], container, "stage"), connect(oauth_azurite[0], container, "results")
    stage.write_text("datasets/d/shard-0.tar", "x")
    stage.delete("datasets/d/shard-0.tar")
    results.write_text("results/run-1/metrics.json", "{}")
    with pytest.raises(StorageError, match="refused the credentials"):
        results.delete("results/run-1/metrics.json")
    assert set(stage.names("")) == {"datasets/d/manifest.json", "results/run-1/metrics.json"}


def test_a_403_on_get_user_delegation_key_names_the_role_to_assign(oauth_azurite, container):
    stranger = Identity(audience="https://someotheraccount.blob.core.windows.net")  # Azurite answers 403
    with pytest.raises(
        StorageError,
        match=r"refused this identity a user delegation key \(AuthenticationFailed\)"
        r".*'Storage Blob Delegator'.*az role assignment create",
    ) as failure:
        connect(oauth_azurite[0], container, "read", stranger)
    assert failure.value.permanent


def test_without_a_credential_given_default_azure_credential_signs_in_as_az_login_would(
    oauth_azurite, container, tmp_path, monkeypatch
):
    token = Identity().get_token()
    (tmp_path / "token.json").write_text(json.dumps({"accessToken": token.token, "expires_on": token.expires_on}))
    az = tmp_path / "az"  # stands in for the Azure CLI that DefaultAzureCredential runs after `az login`
    az.write_text(f"#!/bin/sh\ncat '{tmp_path / 'token.json'}'\n")
    az.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "AzureCliCredential")  # skip the managed identity probe
    cfg = StorageConfig(backend="azure", account_url=oauth_azurite[0], auth="default", container=container)
    assert BlobStore.connect(cfg, environ={}, access="read").names("datasets/")
