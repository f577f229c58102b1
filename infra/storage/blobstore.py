"""Blob storage: Azure Blob, or Azurite locally, behind one small `BlobStore`.

Its settings are config.py's, its credentials credentials.py's, its errors errors.py's (Azure Files uses the last
two too). Single requests are retried by the SDK (exponential backoff); whole steps by Prefect.
"""

import os
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import requests
from azure.core.credentials import TokenCredential
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
)
from azure.storage.blob import ContainerClient, ExponentialRetry

from infra.core.redact import redact
from infra.services.azurite import connection_string
from infra.services.supervise import death_at
from infra.storage.config import StorageConfig, require_https_unless_loopback
from infra.storage.credentials import service_client
from infra.storage.errors import StorageError, error_code, storage_errors, unless_absent


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
