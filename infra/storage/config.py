"""Where the data set goes (the `storage:` section): Azure Blob storage or Azurite, the credential, the container, the
shards and the retries, each checked when the config loads.
"""

import ipaddress
import re
from datetime import timedelta
from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from infra.core.redact import EnvName, redact
from infra.storage.sas import MAX_DELEGATION

CONTAINER_NAME = re.compile(r"^(?=.{3,63}$)[a-z0-9](?:[a-z0-9]|-(?!-))*[a-z0-9]$")


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
