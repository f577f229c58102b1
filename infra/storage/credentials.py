"""Every credential trainflow uses for Azure Storage, Blob and Files, in one module.

Best first: `auth: default`, the identity (DefaultAzureCredential: az login, a managed or workload identity) gets a
user delegation key and signs a least-privilege container SAS per step, so no account key is on the client and no
step gets more than it needs; `auth: key`, the fallback, signs the same SAS with the account key; or a SAS token or
connection string made elsewhere (infra.storage.sas). Secrets come from environment variables and never reach a
message.
"""

import os
from collections.abc import Mapping
from urllib.parse import parse_qs

from azure.core.credentials import TokenCredential
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
)
from azure.storage.blob import BlobServiceClient, UserDelegationKey

from infra.core.errors import first_line
from infra.core.redact import redact
from infra.storage.config import StorageConfig
from infra.storage.errors import MissingSecret, StorageError, error_code, storage_errors
from infra.storage.sas import Window, container_sas, delegated_container_sas, validity


def secret(environ: Mapping[str, str], name: str, setting: str | None = None) -> str:
    """A secret from the environment, or a MissingSecret naming the variable to set (and the setting naming it)."""
    value = environ.get(name)
    if not value:
        named_by = f" (named by {setting})" if setting else ""
        raise MissingSecret(
            f"environment variable {name}{named_by} is not set; export it (its value is never shown or stored)"
        )
    return value


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
