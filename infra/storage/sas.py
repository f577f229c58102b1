"""SAS tokens that trainflow signs itself: least privilege for the one step that uses it, short expiry.

Each step gets a container SAS that allows only what it does (the sync reads and lists; the upload also
adds, creates, writes and deletes its stale shards; results never delete) and expires after `sas_minutes`.
Two signers, and neither ever authorises a data request itself:
- `auth: default` (recommended): the identity (DefaultAzureCredential) gets a user delegation key from
  the service and signs with it, so no account key is on the client. The key lasts at most 7 days, and
  the SAS allows no more than the identity's own Storage Blob Data role does.
- `auth: key` (the fallback): the account key, from an environment variable, signs the SAS.
"""

from datetime import UTC, datetime, timedelta
from urllib.parse import urlparse

from azure.storage.blob import ContainerSasPermissions, UserDelegationKey, generate_container_sas
from azure.storage.fileshare import ShareSasPermissions, generate_share_sas

# What each kind of step may do in the blob container (r read, a add, c create, w write, d delete, l list).
BLOB_ACCESS = {"stage": "racwdl", "read": "rl", "results": "rcwl"}
SHARE_ACCESS = "rcwl"  # the scripts and results: read, create, write, list; never delete
CLOCK_SKEW = timedelta(minutes=5)  # a token valid from a little before now, for clocks that run behind
MAX_DELEGATION = timedelta(days=7)  # the longest a user delegation key (and so its SAS) may last

Window = tuple[datetime, datetime]  # (start, expiry) of a token


def account_name(account_url: str) -> str:
    """The storage account of https://<account>.blob.core.windows.net, or of a path-style loopback URL
    (http://127.0.0.1:10000/<account>, as Azurite serves it)."""
    parsed = urlparse(account_url)
    if parsed.hostname in ("127.0.0.1", "localhost") and parsed.path.strip("/"):
        return parsed.path.strip("/").split("/")[0]
    return (parsed.hostname or "").split(".")[0]


def validity(minutes: float, now: datetime | None = None) -> Window:
    """(start, expiry) of a token made now that lasts `minutes`."""
    now = now or datetime.now(UTC)
    return now - CLOCK_SKEW, now + timedelta(minutes=minutes)


def container_sas(account_url: str, container: str, key: str, access: str, minutes: float) -> str:
    """A SAS signed with the account key for one container: the operations of `access` (a BLOB_ACCESS key)."""
    return sign_container(account_url, container, access, validity(minutes), account_key=key)


def delegated_container_sas(
    account_url: str, container: str, key: UserDelegationKey, access: str, window: Window
) -> str:
    """A user delegation SAS for one container: the operations of `access` during `window` (within the key's)."""
    return sign_container(account_url, container, access, window, user_delegation_key=key)


def sign_container(account_url: str, container: str, access: str, window: Window, **signer) -> str:
    """A container SAS for `access` during `window`, signed by `signer` (account_key or user_delegation_key)."""
    start, expiry = window
    return generate_container_sas(
        account_name(account_url),
        container,
        start=start,
        expiry=expiry,
        permission=ContainerSasPermissions.from_string(BLOB_ACCESS[access]),
        protocol=protocol(account_url),
        **signer,
    )


def share_sas(account_url: str, share: str, key: str, minutes: float) -> str:
    """A SAS for one file share: read, create, write and list for `minutes`."""
    start, expiry = validity(minutes)
    return generate_share_sas(
        account_name(account_url),
        share,
        account_key=key,
        start=start,
        expiry=expiry,
        permission=ShareSasPermissions.from_string(SHARE_ACCESS),
        protocol=protocol(account_url),
    )


def protocol(account_url: str) -> str:
    """https only, except for the loopback emulator that speaks plain http."""
    return "https" if urlparse(account_url).scheme == "https" else "https,http"
