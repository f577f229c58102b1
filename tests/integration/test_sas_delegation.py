"""auth default against a real Azurite: the identity gets a user delegation key (Azurite serves Get User
Delegation Key under `--oauth basic`, which needs HTTPS) and each step's SAS allows only what the step does.

Azurite's basic OAuth checks a token's issuer, audience and lifetime, not its signature or any role; so the
identity here is a token made in the test, and the missing-role 403 is provoked with a token for another account.
"""

import base64
import hashlib
import hmac
import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address
from pathlib import Path
from urllib.parse import parse_qsl, urlparse

import pytest
from azure.core.credentials import AccessToken
from azure.storage.blob import BlobServiceClient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from infra.services.azurite import ACCOUNT, azurite_binary
from infra.services.supervise import free_port, port_open, running_service
from infra.storage.blobstore import BlobStore, StorageConfig, StorageError

pytestmark = pytest.mark.integration
OID, TID = "5f1c0a4e-0000-4000-8000-00000000000a", "72f988bf-0000-4000-8000-00000000000b"


def b64url(data: bytes) -> str:
    """Base64url without padding, as JWTs write it."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Identity:
    """A token credential whose JWTs pass Azurite's basic OAuth check (issuer, audience, lifetime)."""

    def __init__(self, audience: str = "https://storage.azure.com"):
        self.audience = audience

    def get_token(self, *scopes, **kwargs) -> AccessToken:
        now = int(time.time())
        claims = {
            "aud": self.audience,
            "iss": f"https://sts.windows.net/{TID}/",
            "iat": now - 60,
            "nbf": now - 60,
            "exp": now + 3600,
            "oid": OID,
            "tid": TID,
        }
        header = json.dumps({"alg": "HS256", "typ": "JWT"}).encode()
        unsigned = f"{b64url(header)}.{b64url(json.dumps(claims).encode())}"
        signature = b64url(hmac.new(b"test-only", unsigned.encode(), hashlib.sha256).digest())
        return AccessToken(f"{unsigned}.{signature}", now + 3600)


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return folder / "cert.pem", folder / "key.pem"


@pytest.fixture(scope="module")
def oauth_azurite(tmp_path_factory) -> tuple[str, Path]:
    """Azurite over HTTPS with basic OAuth; yields its account URL and the certificate to trust."""
    folder = tmp_path_factory.mktemp("azurite-oauth")
    cert, key = self_signed(folder)
    port = free_port()
    cmd = [
        str(azurite_binary()),
        "--blobHost",
        "127.0.0.1",
        "--blobPort",
        str(port),
        "--inMemoryPersistence",
        "--oauth",
        "basic",
        "--cert",
        str(cert),
        "--key",
        str(key),
        "--skipApiVersionCheck",
        "--loose",
        "--silent",
    ]
    with running_service(cmd, folder / "azurite.log", lambda: port_open(port), "Azurite", 30):
        yield f"https://127.0.0.1:{port}/{ACCOUNT}", cert


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
