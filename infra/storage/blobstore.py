"""Blob storage: Azure Blob, or Azurite locally, behind one small `BlobStore`.

Credentials, best first: `auth: default`, the identity (DefaultAzureCredential: az login, a managed or
workload identity) gets a user delegation key and signs a least-privilege container SAS per step, so no
account key is on the client and no step gets more than it needs; `auth: key`, the fallback, signs the
same SAS with the account key; or a SAS token or connection string made elsewhere (infra.storage.sas).
Secrets come from environment variables and never reach a message.
Single requests are retried by the SDK (exponential backoff); whole steps by Prefect.
"""

import ipaddress
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, urlparse

import requests
from azure.core.credentials import TokenCredential
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.storage.blob import BlobServiceClient, ContainerClient, ExponentialRetry, UserDelegationKey
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from infra.core.errors import BadInput, TrainflowError, first_line
from infra.core.redact import EnvName, redact
from infra.services.azurite import connection_string
from infra.services.supervise import death_at
from infra.storage.sas import MAX_DELEGATION, Window, container_sas, delegated_container_sas, validity

CONTAINER_NAME = re.compile(r"^(?=.{3,63}$)[a-z0-9](?:[a-z0-9]|-(?!-))*[a-z0-9]$")


class StorageError(TrainflowError):
    """A storage operation failed; `permanent` errors (credentials, names) are not worth a retry."""

    def __init__(self, message: str, permanent: bool | None = None):
        super().__init__(redact(message), permanent)  # whatever the SDK put in a message, no secret leaves here


class MissingSecret(BadInput, StorageError):
    """An environment variable the config names for a credential is not set (bad input: exit 2)."""


class StorageConfig(BaseModel):
    """Where the data set goes: Azure Blob storage, or Azurite started by trainflow."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    backend: Literal["azurite", "azure"] = "azurite"
    """azurite: the local emulator, started under the workdir; azure: a real storage account."""
    account_url: str | None = None
    """https://<account>.blob.core.windows.net (azure only). Plain http is refused except to loopback."""
    auth: Literal["sas", "key", "connection_string", "default"] = "sas"
    """azure only. default (recommended): the identity (DefaultAzureCredential) gets a user delegation key
    and signs a SAS per step (least privilege, sas_minutes), with no account key on the client; it needs a
    Storage Blob Data role on the account. key (the fallback): the account key signs the same SAS and never
    authorises a request itself. sas: a SAS token made elsewhere; connection_string: a connection string."""
    sas_token_env: EnvName = "AZURE_STORAGE_SAS_TOKEN"
    """Environment variable holding the SAS token."""
    account_key_env: EnvName = "AZURE_STORAGE_KEY"
    """auth key: environment variable holding the account key."""
    sas_minutes: float = Field(120, gt=0)
    """auth default or key: lifetime of the SAS tokens trainflow signs (a step's retries sign a new one);
    at most 7 days with auth default (a user delegation key's longest life)."""
    connection_string_env: EnvName = "AZURE_STORAGE_CONNECTION_STRING"
    """Environment variable holding the connection string."""
    container: str = "trainflow"
    """Blob container: 3-63 lowercase letters, digits and single hyphens."""
    shard_mb: float = Field(256, gt=0)
    """Target size of the tar shards the data set is packed into."""
    upload_concurrency: int = Field(8, ge=1)
    """Shards uploaded (or downloaded) at once."""
    retry_total: int = Field(6, ge=0)
    """SDK retries of one request (timeouts, 5xx, connection resets)."""
    retry_initial_backoff: float = Field(0.5, gt=0)
    """Seconds added to the SDK's exponential backoff (1, 2, 4, ... s, give or take 1 s)."""

    @field_validator("container")
    @classmethod
    def _valid_container(cls, name: str) -> str:
        if not CONTAINER_NAME.match(name):
            raise ValueError(
                f"container name {name!r} is invalid; use 3-63 lowercase letters, digits "
                "and single hyphens, starting and ending with a letter or digit"
            )
        return name

    @field_validator("account_url")
    @classmethod
    def _https_unless_loopback(cls, url: str | None) -> str | None:
        if url is not None:
            require_https_unless_loopback(url)
            if urlparse(url).query:
                raise ValueError(
                    "account_url must not carry a query string (the config is stored with every run); "
                    "put a SAS token in the environment variable that storage.sas_token_env names"
                )
        return url

    @model_validator(mode="after")
    def _delegation_limits(self) -> "StorageConfig":
        if self.backend == "azure" and self.auth == "default":
            if timedelta(minutes=self.sas_minutes) > MAX_DELEGATION:
                raise ValueError(
                    f"sas_minutes {self.sas_minutes:g} is longer than a user delegation key lasts "
                    f"(7 days, {MAX_DELEGATION.total_seconds() / 60:.0f} minutes) with auth default"
                )
            if self.account_url and urlparse(self.account_url).scheme != "https":
                raise ValueError(
                    "auth default sends the identity's token, which Azure accepts only over https: "
                    "use an https account_url"
                )
        return self


def require_https_unless_loopback(url: str) -> None:
    """Plain HTTP is only for emulators on this machine; anything else must be HTTPS."""
    parsed = urlparse(url)
    if parsed.scheme == "https":
        return
    if parsed.scheme == "http" and is_loopback(parsed.hostname or ""):
        return
    raise ValueError(f"storage URL {redact(url)} must use https (plain http is allowed only to loopback addresses)")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BlobStore:
    """The operations the pipeline needs from one blob container."""

    def __init__(self, container: ContainerClient, concurrency: int = 8):
        self.container, self.concurrency = container, concurrency
        self.where = redact(container.url.split("?")[0])

    @classmethod
    def connect(
        cls,
        cfg: StorageConfig,
        environ: Mapping[str, str] | None = None,
        connection_string: str | None = None,
        access: str = "stage",
        credential: TokenCredential | None = None,
        timeouts: tuple[float, float] = (10, 60),
    ) -> "BlobStore":
        """A store for cfg's container; `connection_string` is Azurite's (the local default); `access`
        (infra.storage.sas.BLOB_ACCESS) is what a signed SAS allows with auth default or key; `credential` is the
        identity of auth default (DefaultAzureCredential when None); `timeouts`: (connect, read) seconds."""
        # retry_total alone still caps 5xx, connect and read retries at 3 each: set them all.
        n = cfg.retry_total
        retry = WatchedRetry(
            initial_backoff=cfg.retry_initial_backoff,  # type: ignore[arg-type]  # typed int in azure-storage-blob;
            # it is seconds, added to the backoff: a float works
            increment_base=2,
            retry_total=n,
            retry_connect=n,
            retry_read=n,
            retry_status=n,
            random_jitter_range=1,
        )
        session = requests.Session()  # a pool big enough for every shard's parallel blocks
        session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=4 * cfg.upload_concurrency + 4))
        session.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=4 * cfg.upload_concurrency + 4))
        options = dict(
            retry_policy=retry,
            max_single_put_size=4 << 20,
            max_block_size=4 << 20,
            connection_timeout=timeouts[0],
            read_timeout=timeouts[1],
            session=session,
        )
        service = service_client(
            cfg, os.environ if environ is None else environ, connection_string, options, access, credential
        )
        try:
            require_https_unless_loopback(service.url)  # a connection string names its own endpoint
        except ValueError as exc:
            raise StorageError(str(exc), permanent=True) from None
        return cls(service.get_container_client(cfg.container), cfg.upload_concurrency)

    def ensure_container(self) -> None:
        """Create the container unless it exists (a container-scoped SAS may list it but can never create it)."""
        if self.holds() is not None:
            return
        with self.errors("create the missing container"):
            try:
                self.container.create_container()
            except ResourceExistsError:
                pass
            except HttpResponseError as exc:
                if exc.status_code != 403:
                    raise
                raise StorageError(  # what the user must fix is the missing container, not the credential
                    f"blob storage has no container at {self.where} (ContainerNotFound) and these credentials may "
                    f"not create it ({error_code(exc) or 403}; a container SAS never can): create it once (az storage "
                    "container create --name <container> --account-name <account> --auth-mode login; "
                    "infra/compute/azure makes it), or set storage.container to a container that exists",
                    permanent=True,
                ) from None

    def holds(self, prefix: str = "") -> bool | None:
        """Whether any blob's name starts with `prefix` (one page of one name); None when there is no container."""
        with self.errors("list the container"):
            try:
                page = next(
                    iter(self.container.list_blobs(name_starts_with=prefix or None, results_per_page=1).by_page())
                )
                return any(True for _ in page)
            except ResourceNotFoundError as exc:
                if error_code(exc) != "ContainerNotFound":
                    raise
                return None

    def names(self, prefix: str) -> dict[str, int]:
        """Blob names under `prefix`, with their sizes."""
        with self.errors("list blobs"):
            return {b.name: b.size for b in self.container.list_blobs(name_starts_with=prefix)}

    def upload_file(self, path: Path, name: str, metadata: dict[str, str] | None = None) -> None:
        """Upload a local file as one blob, committed atomically (block list), MD5-checked per request."""
        with self.errors(f"upload {name}"), open(path, "rb") as f:
            self.container.upload_blob(
                name, f, overwrite=True, metadata=metadata, validate_content=True, max_concurrency=4
            )

    def download_to(self, name: str, path: Path) -> None:
        """Download one blob into a local file (the caller checks what it holds against the manifest)."""
        with self.errors(f"download {name}"), open(path, "wb") as f:
            self.container.download_blob(name, max_concurrency=4).readinto(f)

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        """`length` bytes of a blob from `offset`, tried twice at most: for checks that must end soon."""
        with self.errors(f"read {name}"):
            return self.container.download_blob(name, offset=offset, length=length, retry_total=1).readall()

    def read_text(self, name: str) -> str | None:
        """A text blob, or None when it does not exist."""
        with self.errors(f"read {name}"):
            data = unless_absent(lambda: self.container.download_blob(name).readall())
            return None if data is None else data.decode("utf-8")

    def metadata(self, name: str) -> dict[str, str] | None:
        """A blob's metadata (one HEAD request), or None when it does not exist."""
        with self.errors(f"read the properties of {name}"):
            props = unless_absent(self.container.get_blob_client(name).get_blob_properties)
            return None if props is None else dict(props.metadata)

    def write_text(self, name: str, text: str) -> None:
        """Write a small text blob in one request."""
        with self.errors(f"write {name}"):
            self.container.upload_blob(name, text.encode("utf-8"), overwrite=True, validate_content=True)

    def delete(self, name: str) -> None:
        """Delete a blob if it exists."""
        with self.errors(f"delete {name}"):
            unless_absent(lambda: self.container.delete_blob(name))

    def errors(self, action: str):
        """Turn SDK errors into StorageErrors (see storage_errors)."""
        return storage_errors("blob storage", self.where, action)


@contextmanager
def storage_errors(service: str, where: str, action: str) -> Iterator[None]:
    """Turn Azure SDK errors into StorageErrors that say what failed and how to fix it, secrets removed."""
    try:
        yield
    except (ServiceRequestError, ServiceResponseError) as exc:
        raise (death_at(urlparse(where).netloc) or network_error(service, where, action, exc)) from None
    except HttpResponseError as exc:  # ClientAuthenticationError and ResourceNotFoundError included
        code = error_code(exc)
        if exc.status_code is None and not code:  # a credential that failed before any request (an identity)
            raise StorageError(
                f"{service} at {where}: the credentials failed to {action} ({first_line(exc)})", permanent=True
            ) from None
        raise storage_error(service, where, action, exc.status_code, code) from None


def network_error(
    service: str, where: str, action: str, exc: ServiceRequestError | ServiceResponseError
) -> StorageError:
    """The StorageError of a request that got no answer, after the SDK's own retries."""
    if isinstance(exc, ServiceRequestError):  # no connection at all: fail fast
        return StorageError(
            f"cannot reach {service} at {where} to {action} ({first_line(exc)}); check the account URL and the network",
            permanent=True,
        )
    # a connection dropped mid-answer: worth a step retry
    return StorageError(f"{service} at {where} dropped the connection during {action} ({first_line(exc)})")


class WatchedRetry(ExponentialRetry):
    """The SDK's exponential retry, which stops waiting on an endpoint whose service trainflow started and has died
    (a killed Azurite): between tries it checks every 0.2 s, and raises that service's fault at once
    (infra/services/supervise.py, `death_at`) instead of retrying a dead address for a minute or more."""

    def configure_retries(self, request) -> dict:
        settings = super().configure_retries(request)
        settings["endpoint"] = urlparse(request.http_request.url).netloc
        return settings

    def sleep(self, settings, transport) -> None:
        deadline = time.monotonic() + self.get_backoff_time(settings)
        while True:
            if died := death_at(settings["endpoint"]):
                raise died
            left = deadline - time.monotonic()
            if left <= 0:
                return
            transport.sleep(min(left, 0.2))


# What the service's error code (x-ms-error-code) means and what fixes it. The code, not the SDK's exception
# type, says what went wrong: a container SAS asked to create a missing container gets 403
# AuthorizationPermissionMismatch, and a HEAD on a missing container is a bare 404. Codes and meanings from
# learn.microsoft.com/rest/api/storageservices: "Common REST API error codes", "Blob Storage error codes",
# "Azure Files error codes". Azurite answers a wrong signature with AuthorizationFailure, Azure with
# AuthenticationFailed. Kinds: refused (the credential), missing (the resource), busy (transient: retried).
ERROR_CODES = {
    "AuthenticationFailed": ("refused", "the key or SAS signature is wrong, or the SAS token has expired"),
    "AuthorizationFailure": (
        "refused",
        "the key or SAS signature is wrong, the SAS token has expired, or the "
        "account's firewall does not admit this network",
    ),
    "InvalidAuthenticationInfo": ("refused", "the credential is malformed or expired"),
    "NoAuthenticationInformation": (
        "refused",
        "the request carried no credential (a SAS token without its signature?)",
    ),
    "AuthorizationPermissionMismatch": (
        "refused",
        "the SAS token's permissions (sp), or the identity's Storage data role, do not allow this operation",
    ),
    "AuthorizationResourceTypeMismatch": ("refused", "the SAS token is not valid for this kind of resource (srt, sr)"),
    "AuthorizationServiceMismatch": ("refused", "the SAS token is for another storage service (ss)"),
    "AuthorizationProtocolMismatch": ("refused", "the SAS token allows https only (spr)"),
    "AuthorizationSourceIPMismatch": ("refused", "the SAS token does not allow this machine's IP address (sip)"),
    "KeyBasedAuthenticationNotPermitted": (
        "refused",
        "the account does not allow access with its key; use storage.auth default",
    ),
    "InsufficientAccountPermissions": ("refused", "the account's credential does not allow this operation"),
    "AccountIsDisabled": ("refused", "the storage account is disabled"),
    "ContainerNotFound": (
        "missing",
        "the container does not exist; check storage.container, or create it: az "
        "storage container create --name <container> --account-name <account> "
        "--auth-mode login",
    ),
    "ShareNotFound": (
        "missing",
        "the file share does not exist; check fileshare.share, or create it: az storage "
        "share-rm create --name <share> --storage-account <account>",
    ),
    "BlobNotFound": ("missing", "the blob does not exist"),
    "ResourceNotFound": ("missing", "it does not exist"),
    "ParentNotFound": ("missing", "its parent directory does not exist"),
    "ContainerBeingDeleted": ("busy", "the container is being deleted; it can be made again about 30 s later"),
    "ShareBeingDeleted": ("busy", "the share is being deleted"),
    "ServerBusy": ("busy", "the account is over its request or bandwidth limit"),
    "OperationTimedOut": ("busy", "the operation timed out in the service"),
    "InternalError": ("busy", "the service failed"),
}
ABSENT = ("BlobNotFound", "ContainerNotFound")  # a blob is not there when its container is not either


def unless_absent(call):
    """call()'s result, or None when the blob (or its container) does not exist."""
    try:
        return call()
    except ResourceNotFoundError as exc:
        if error_code(exc) not in ABSENT:
            raise
        return None


REFUSED_FIX = (
    "check that the SAS token, key or connection string is right, unexpired and allows this operation "
    "(with auth default, that the identity's data role allows it)"
)


def storage_error(service: str, where: str, action: str, status: int | None, code: str) -> StorageError:
    """The StorageError for a failed request, by the service's error code (by status when the code is unknown)."""
    kind, why = ERROR_CODES.get(code, (None, None))
    label = code or str(status)
    if kind == "refused" or (kind is None and status in (401, 403)):
        return StorageError(
            f"{service} at {where} refused the credentials to {action} ({label}): {why or REFUSED_FIX}", permanent=True
        )
    if kind == "missing" or (kind is None and status == 404):
        return StorageError(
            f"{service} at {where} could not {action}: {why or 'it does not exist'} ({label})", permanent=True
        )
    if kind == "busy":
        return StorageError(f"{service} at {where} could not {action}: {why} ({label}); the step is retried")
    return StorageError(f"{service} refused to {action}: {status} {code}".rstrip(), permanent=status in (400, 404, 409))


def service_client(
    cfg: StorageConfig,
    environ: Mapping[str, str],
    connection_string: str | None,
    options: dict,
    access: str = "stage",
    credential: TokenCredential | None = None,
) -> BlobServiceClient:
    """A BlobServiceClient from the configured credential."""
    if cfg.backend == "azurite":
        if connection_string is None:
            raise StorageError(
                "Azurite is not running: start it with infra.services.azurite.running_azurite", permanent=True
            )
        return BlobServiceClient.from_connection_string(connection_string, **options)
    if cfg.auth == "connection_string":
        return BlobServiceClient.from_connection_string(configured_secret(cfg, environ), **options)
    if cfg.account_url is None:
        raise StorageError(
            "storage.account_url is not set; set it to https://<account>.blob.core.windows.net", permanent=True
        )
    if cfg.auth == "sas":
        return BlobServiceClient(cfg.account_url, credential=configured_secret(cfg, environ).lstrip("?"), **options)
    if cfg.auth == "key":
        token = container_sas(cfg.account_url, cfg.container, configured_secret(cfg, environ), access, cfg.sas_minutes)
        return BlobServiceClient(cfg.account_url, credential=token, **options)
    return delegated_client(cfg, cfg.account_url, credential or default_identity(), options, access)


def default_identity() -> TokenCredential:
    """DefaultAzureCredential: environment, workload or managed identity, az login, ..."""
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential()


def delegated_client(
    cfg: StorageConfig, account_url: str, identity: TokenCredential, options: dict, access: str
) -> BlobServiceClient:
    """A client of `account_url` (cfg's, checked set) holding only a user delegation SAS for `access` that `identity`
    signed (no key, no token)."""
    window = validity(cfg.sas_minutes)
    key = user_delegation_key(BlobServiceClient(account_url, credential=identity, **options), window)
    token = delegated_container_sas(account_url, cfg.container, key, access, window)
    return BlobServiceClient(account_url, credential=token, **options)


def user_delegation_key(service: BlobServiceClient, window: Window) -> UserDelegationKey:
    """A user delegation key valid for `window`, or a StorageError naming the sign-in or role that is missing."""
    where = redact(service.url.split("?")[0])
    with storage_errors("blob storage", where, "get a user delegation key"):
        try:
            return service.get_user_delegation_key(*window)
        except HttpResponseError as exc:  # ClientAuthenticationError included
            if exc.status_code == 403:
                raise missing_delegation_role(where, exc) from None
            if exc.status_code is None and isinstance(exc, ClientAuthenticationError):
                raise no_identity(exc) from None
            raise


def missing_delegation_role(where: str, exc: HttpResponseError) -> StorageError:
    """The error for a 403 on Get User Delegation Key: the identity lacks the role that allows it."""
    return StorageError(
        f"blob storage at {where} refused this identity a user delegation key ({error_code(exc)}): it needs "
        "'Storage Blob Delegator', or a Storage Blob Data role (Reader, Contributor or Owner), on the storage "
        "account; and the SAS allows no more than the identity's Storage Blob Data role, so give it Storage Blob "
        "Data Contributor to stage data. Fix: az role assignment create --assignee <principal id> --role "
        "'Storage Blob Data Contributor' --scope <storage account id> (it takes a few minutes to apply), "
        "or use auth: key",
        permanent=True,
    )


def no_identity(exc: ClientAuthenticationError) -> StorageError:
    """The error when DefaultAzureCredential finds no identity to sign in with."""
    return StorageError(
        f"no Azure identity to get a user delegation key with ({redact(first_line(exc))}); "
        "run `az login`, or run where a managed or workload identity is set up, or use auth: key",
        permanent=True,
    )


AUTH_SECRET = {"sas": "sas_token_env", "key": "account_key_env", "connection_string": "connection_string_env"}


def secret_settings(cfg: StorageConfig) -> dict[str, str]:
    """The setting that names the variable cfg's credential is read from, and that variable (none for Azurite
    or auth default)."""
    field = AUTH_SECRET.get(cfg.auth) if cfg.backend == "azure" else None
    return {f"storage.{field}": getattr(cfg, field)} if field else {}


def configured_secret(cfg: StorageConfig, environ: Mapping[str, str]) -> str:
    """The secret of cfg.auth (sas, key or connection_string), from the variable its setting names."""
    ((setting, name),) = secret_settings(cfg).items()
    return secret(environ, name, setting)


def secret(environ: Mapping[str, str], name: str, setting: str | None = None) -> str:
    """A secret from the environment, or a MissingSecret naming the variable to set (and the setting naming it)."""
    value = environ.get(name)
    if not value:
        named_by = f" (named by {setting})" if setting else ""
        raise MissingSecret(
            f"environment variable {name}{named_by} is not set; export it (its value is never shown or stored)"
        )
    return value


def error_code(exc: HttpResponseError) -> str:
    """Azure's error code of a failed request (x-ms-error-code), or "" when it sent none."""
    code = getattr(exc, "error_code", None)
    response = getattr(exc, "response", None)
    if not code and response is not None:
        code = response.headers.get("x-ms-error-code")
    return str(getattr(code, "value", code) or "")


def open_store(cfg: StorageConfig, azurite_port: int | None, access: str = "stage") -> BlobStore:
    """The blob store of the config (Azurite on `azurite_port` for the local default), for `access`."""
    if cfg.backend == "azurite" and azurite_port is None:
        raise StorageError("Azurite's port is unknown: the flow starts Azurite before staging", permanent=True)
    return BlobStore.connect(
        cfg, connection_string=connection_string(azurite_port) if azurite_port else None, access=access
    )


def quick_store(
    cfg: StorageConfig, environ: Mapping[str, str] | None = None, credential: TokenCredential | None = None
) -> BlobStore:
    """A read store for cfg's container that gives up within seconds (one retry, short timeouts): for checks made
    before a run starts. With auth default it gets the identity's user delegation key here."""
    quick = cfg.model_copy(update={"retry_total": 1, "retry_initial_backoff": 0.2})
    return BlobStore.connect(quick, environ, access="read", credential=credential, timeouts=(3, 5))


def may_create_container(cfg: StorageConfig, environ: Mapping[str, str] | None = None) -> bool:
    """Whether cfg's credential could create a missing container: the container SAS that auth key and default
    sign never can, nor a container SAS given (sr=c); an account key or an account SAS (srt) with create (sp c) may."""
    if cfg.backend == "azurite":
        return True
    if cfg.auth in ("key", "default"):
        return False
    given = configured_secret(cfg, os.environ if environ is None else environ)
    if cfg.auth == "connection_string":
        if "SharedAccessSignature=" not in given:
            return True  # the account key itself
        given = given.split("SharedAccessSignature=", 1)[1].split(";")[0]
    token = parse_qs(given.lstrip("?"))
    return "srt" in token and "c" in token.get("sp", [""])[0]
