"""The file share that holds the training scripts: a local folder, or Azure Files.

Both backends implement `FileShare`. Paths are relative, "/"-separated, inside the share.
"""

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from infra.core.redact import EnvName

if TYPE_CHECKING:  # imported where used: only an Azure share needs the Azure SDK
    from azure.core.credentials import TokenCredential

    from infra.storage.azure_files import AzureFileShare


class FileShare(Protocol):
    """The few operations the pipeline needs from a file share."""

    def exists(self, path: str) -> bool:
        """Whether a file exists at `path`."""

    def upload_file(self, local: Path, path: str) -> None:
        """Write the local file to `path`, creating parent directories."""

    def copy_within(self, src: str, dst: str) -> None:
        """Copy a file inside the share (server-side on Azure: nothing is uploaded)."""

    def read_text(self, path: str) -> str | None:
        """The UTF-8 text of the file at `path`, or None when it does not exist."""

    def write_text(self, path: str, text: str) -> None:
        """Write UTF-8 text to `path`, creating parent directories."""

    def url(self, path: str) -> str:
        """Where `path` is, for people and logs (never with a secret in it)."""


class LocalFolderShare:
    """A folder standing in for the share (the embedded local default)."""

    def __init__(self, root: Path):
        self.root = root

    def _at(self, path: str) -> Path:
        return self.root / path

    def exists(self, path: str) -> bool:
        return self._at(path).is_file()

    def _write(self, path: str, fill) -> None:
        """fill(tmp_path), then rename it to `path`: a file appears whole or not at all."""
        target = self._at(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        fill(tmp)
        os.replace(tmp, target)

    def upload_file(self, local: Path, path: str) -> None:
        self._write(path, lambda tmp: shutil.copyfile(local, tmp))

    def copy_within(self, src: str, dst: str) -> None:
        self._write(dst, lambda tmp: shutil.copyfile(self._at(src), tmp))

    def read_text(self, path: str) -> str | None:
        target = self._at(path)
        return target.read_text(encoding="utf-8") if target.is_file() else None

    def write_text(self, path: str, text: str) -> None:
        self._write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))

    def url(self, path: str) -> str:
        return str(self._at(path))


class FileShareConfig(BaseModel):
    """Where the training scripts go: a local folder (default) or an Azure Files share."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    backend: Literal["local", "azure"] = "local"
    """local: <workdir>/fileshare; azure: an Azure Files share."""
    account_url: str | None = None
    """https://<account>.file.core.windows.net (azure only)."""
    share: str = "trainflow"
    """Azure Files share name."""
    auth: Literal["sas", "key", "default"] = "sas"
    """A SAS token from sas_token_env; key: the account key signs a short-lived share SAS (read, create,
    write, list) that is used instead; or DefaultAzureCredential."""
    sas_token_env: EnvName = "AZURE_FILES_SAS_TOKEN"
    """Environment variable holding the share's SAS token."""
    account_key_env: EnvName = "AZURE_STORAGE_KEY"
    """auth key: environment variable holding the account key."""
    sas_minutes: float = Field(120, gt=0)
    """auth key: lifetime of the SAS tokens trainflow signs."""
    extra_files: list[Path] = []
    """Files sent with the training package (configs, label maps), placed beside it."""


def local_root(workdir: Path) -> Path:
    """The folder that stands in for the share on the local default."""
    return workdir / "fileshare"


SHARE_SECRET = {"sas": "sas_token_env", "key": "account_key_env"}  # auth default reads no variable


def secret_settings(cfg: FileShareConfig) -> dict[str, str]:
    """The setting that names the variable the share's credential is read from, and that variable (none for a
    local share or auth default)."""
    field = SHARE_SECRET.get(cfg.auth) if cfg.backend == "azure" else None
    return {f"fileshare.{field}": getattr(cfg, field)} if field else {}


def open_share(
    cfg: FileShareConfig, workdir: Path, environ: Mapping[str, str] | None = None, quick: bool = False
) -> FileShare:
    """The configured share; `quick`: one retry and short timeouts, for checks made before a run starts."""
    if cfg.backend == "local":
        return LocalFolderShare(local_root(workdir))
    return azure_share(cfg, environ, quick)


def azure_share(cfg: FileShareConfig, environ: Mapping[str, str] | None, quick: bool) -> "AzureFileShare":
    """The configured Azure file share (see open_share)."""
    from infra.storage.azure_files import AzureFileShare
    from infra.storage.credentials import secret
    from infra.storage.errors import StorageError

    if cfg.account_url is None:
        raise StorageError(
            "fileshare.account_url is not set; set it to https://<account>.file.core.windows.net", permanent=True
        )
    env = os.environ if environ is None else environ
    credential: str | TokenCredential
    if cfg.auth == "sas":
        credential = secret(env, cfg.sas_token_env, "fileshare.sas_token_env").lstrip("?")
    elif cfg.auth == "key":
        from infra.storage.sas import share_sas

        key = secret(env, cfg.account_key_env, "fileshare.account_key_env")
        credential = share_sas(cfg.account_url, cfg.share, key, cfg.sas_minutes)
    else:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    if quick:
        return AzureFileShare.from_settings(cfg.account_url, cfg.share, credential, retry_total=1, timeouts=(3, 5))
    return AzureFileShare.from_settings(cfg.account_url, cfg.share, credential)


def check_share(cfg: FileShareConfig, environ: Mapping[str, str] | None = None) -> None:
    """One quick authenticated call to an Azure file share: a StorageError when its variable is unset, or it
    cannot be reached, refuses the credentials or does not exist. A local share needs no check."""
    if cfg.backend == "azure":
        azure_share(cfg, environ, quick=True).check()
