"""The SAS tokens trainflow signs: a user delegation SAS (auth default) carries the key's fields and only the
step's permissions for the window asked; the account-key SAS (auth key) stays the fallback."""

from datetime import UTC, datetime
from urllib.parse import parse_qsl

import pytest
from azure.identity import CredentialUnavailableError
from azure.storage.blob import UserDelegationKey
from pydantic import ValidationError

from infra.storage.blobstore import BlobStore
from infra.storage.config import StorageConfig
from infra.storage.errors import ERROR_CODES, StorageError, storage_error
from infra.storage.sas import BLOB_ACCESS, container_sas, delegated_container_sas, validity

URL = "https://acct.blob.core.windows.net"
NOW = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)


def delegation_key() -> UserDelegationKey:
    """A key as Get User Delegation Key returns it."""
    key = UserDelegationKey()
    key.signed_oid, key.signed_tid = "11111111-aaaa-4bbb-8ccc-000000000001", "22222222-aaaa-4bbb-8ccc-000000000002"
    key.signed_start, key.signed_expiry = "2026-11-23T09:55:00Z", "2026-11-23T10:30:00Z"
    key.signed_service, key.signed_version = "b", "2026-06-06"
    key.value = "a2V5LW1hZGUtZm9yLWEtdW5pdC10ZXN0LW9mLXNpZ25pbmc="
    return key


def fields(token: str) -> dict[str, str]:
    """The query fields of a SAS token, decoded."""
    return dict(parse_qsl(token, strict_parsing=True))


def test_a_delegated_read_sas_carries_the_key_and_only_read_and_list_for_the_window_asked():
    key, window = delegation_key(), validity(30, now=NOW)
    got = fields(delegated_container_sas(URL, "data", key, "read", window))
    assert (got["skoid"], got["sktid"]) == (key.signed_oid, key.signed_tid)
    assert (got["skt"], got["ske"], got["sks"], got["skv"]) == (key.signed_start, key.signed_expiry, "b", "2026-06-06")
    assert (got["sp"], got["sr"], got["spr"]) == ("rl", "c", "https")
    assert (got["st"], got["se"]) == ("2026-11-23T09:55:00Z", "2026-11-23T10:30:00Z")  # what was asked
    assert got["sig"] and key.value not in got.values()


@pytest.mark.parametrize("access", sorted(BLOB_ACCESS))
def test_each_step_gets_only_its_permissions_from_either_signer(access):
    delegated = fields(delegated_container_sas(URL, "data", delegation_key(), access, validity(5, now=NOW)))
    keyed = fields(container_sas(URL, "data", "a2V5", access, 5))
    assert delegated["sp"] == keyed["sp"] == BLOB_ACCESS[access]
    assert "skoid" not in keyed  # the fallback is signed by the account key, not an identity


def test_auth_default_refuses_a_lifetime_longer_than_a_delegation_key_and_plain_http():
    week = 7 * 24 * 60
    assert StorageConfig(backend="azure", account_url=URL, auth="default", sas_minutes=week).sas_minutes == week
    with pytest.raises(ValidationError, match="longer than a user delegation key lasts"):
        StorageConfig(backend="azure", account_url=URL, auth="default", sas_minutes=week + 1)
    with pytest.raises(ValidationError, match="only over https"):
        StorageConfig(backend="azure", account_url="http://127.0.0.1:10000/devstoreaccount1", auth="default")
    assert StorageConfig(backend="azure", account_url=URL, auth="key", sas_minutes=week + 1)  # no such limit


class NoIdentity:
    """What DefaultAzureCredential does on a machine with no sign-in."""

    def get_token(self, *scopes, **kwargs):
        raise CredentialUnavailableError("no az login, no managed identity")


def test_no_identity_is_a_permanent_error_that_says_how_to_sign_in():
    cfg = StorageConfig(backend="azure", account_url=URL, auth="default", retry_total=0)
    with pytest.raises(StorageError, match=r"no Azure identity .*az login.*auth: key") as failure:
        BlobStore.connect(cfg, environ={}, access="read", credential=NoIdentity())
    assert failure.value.permanent


@pytest.mark.parametrize("code", sorted(ERROR_CODES))
def test_each_error_code_the_service_sends_is_named_by_what_it_means(code):
    """By the service's code, not the SDK's exception type: a missing container or share is never a refused
    credential, a busy service is retried, and every message names the code."""
    kind, why = ERROR_CODES[code]
    for status in (400, 403, 404, 409, 500, 503):  # the code decides, whatever status came with it
        error = storage_error(
            "blob storage", "https://acct.blob.core.windows.net/c", "list the container", status, code
        )
        assert code in str(error) and why in str(error) and "\n" not in str(error)
        assert ("refused the credentials" in str(error)) == (kind == "refused")
        assert error.permanent == (kind != "busy")


@pytest.mark.parametrize(
    "status, code, words, permanent",
    [
        (403, "SomeNewAuthorizationCode", "refused the credentials to read x (SomeNewAuthorizationCode): check", True),
        (401, "", "refused the credentials to read x (401)", True),
        (404, "", "could not read x: it does not exist (404)", True),
        (404, "SomeNewNotFound", "could not read x: it does not exist (SomeNewNotFound)", True),
        (412, "ConditionNotMet", "refused to read x: 412 ConditionNotMet", False),
        (400, "InvalidHeaderValue", "refused to read x: 400 InvalidHeaderValue", True),
    ],
)
def test_an_unknown_code_falls_back_to_its_status(status, code, words, permanent):
    error = storage_error("Azure Files", "https://acct.file.core.windows.net/s", "read x", status, code)
    assert words in str(error) and error.permanent == permanent


def test_the_missing_share_and_container_say_which_setting_to_check():
    share = storage_error("Azure Files", "https://a.file.core.windows.net/scripts", "write a", 404, "ShareNotFound")
    container = storage_error(
        "blob storage", "https://a.blob.core.windows.net/c", "list the container", 404, "ContainerNotFound"
    )
    assert "check fileshare.share" in str(share) and "check storage.container" in str(container)
    assert "refused" not in str(share) + str(container)
