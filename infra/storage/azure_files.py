"""Azure Files behind the `FileShare` interface (see infra/storage/fileshare.py).

A thin layer over azure-storage-file-share's `ShareClient`. Credentials are whatever the SDK
accepts: a SAS token, an account key (dict or `AzureNamedKeyCredential`), or a token credential.
"""

import time
from pathlib import Path, PurePosixPath
from typing import Literal, TypedDict
from urllib.parse import urlsplit, urlunsplit

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.storage.fileshare import ExponentialRetry, ShareClient, ShareFileClient

from infra.storage.config import require_https_unless_loopback
from infra.storage.errors import StorageError, error_code, storage_errors


class AzureCopyError(StorageError):
    """A server-side copy ended in a state other than success."""


class Timeouts(TypedDict, total=False):
    """A client's (connect, read) timeouts in seconds, as the SDK's keywords (its own defaults where absent)."""

    connection_timeout: float
    read_timeout: float


class AzureFileShare:
    """An Azure file share (one `ShareClient`); paths are "/"-separated inside the share."""

    def __init__(self, share_client: ShareClient, *, copy_poll_s: float = 1.0, copy_timeout_s: float = 600.0):
        self._share = share_client
        self.where = urlunsplit(urlsplit(share_client.url)[:3] + ("", ""))
        self.copy_poll_s = copy_poll_s
        self.copy_timeout_s = copy_timeout_s

    @classmethod
    def from_settings(
        cls, account_url: str, share: str, credential, retry_total: int = 5, timeouts: tuple[float, float] | None = None
    ) -> "AzureFileShare":
        """Connect to `share` at `account_url` (https, or http to loopback) with an SDK credential;
        `timeouts`: (connect, read) seconds, the SDK's own when None."""
        require_https_unless_loopback(account_url)
        if credential is None:
            raise ValueError("Azure Files needs a credential: a SAS token, an account key or a token credential.")
        retry = ExponentialRetry(
            initial_backoff=0.5,  # type: ignore[arg-type]  # typed int in azure-storage-file-share; float seconds work
            increment_base=2,
            retry_total=retry_total,
        )
        # a token credential needs the intent; None (any other credential) is the SDK's default
        token_intent: Literal["backup"] | None = "backup" if hasattr(credential, "get_token") else None
        timeout_options: Timeouts = {"connection_timeout": timeouts[0], "read_timeout": timeouts[1]} if timeouts else {}
        return cls(
            ShareClient(
                account_url,
                share,
                credential=credential,
                token_intent=token_intent,
                retry_policy=retry,
                **timeout_options,
            )
        )

    def _file(self, path: str) -> ShareFileClient:
        return self._share.get_file_client(path.strip("/"))

    def _make_parents(self, path: str) -> None:
        parents = PurePosixPath(path.strip("/")).parents
        for parent in reversed(list(parents)[:-1]):
            try:
                self._share.get_directory_client(str(parent)).create_directory()
            except ResourceExistsError:
                pass

    def errors(self, action: str):
        """SDK errors as StorageErrors that name the share and the action, secrets removed."""
        return storage_errors("Azure Files", self.where, action)

    def check(self) -> None:
        """One cheap authenticated request (the root directory's properties): the share exists and admits us."""
        with self.errors("reach the share"):
            self._share.get_directory_client("").get_directory_properties()

    def exists(self, path: str) -> bool:
        """Whether a file exists at `path`."""
        with self.errors(f"look up {path}"):
            return self._file(path).exists()

    def upload_file(self, local: Path, path: str) -> None:
        """Write the local file to `path`, creating parent directories."""
        with self.errors(f"upload {path}"), open(local, "rb") as data:
            self._make_parents(path)
            self._file(path).upload_file(data, max_concurrency=4)

    def copy_within(self, src: str, dst: str) -> None:
        """Copy a file inside the share, server-side, and wait until the copy has finished."""
        with self.errors(f"copy {src} to {dst}"):
            self._make_parents(dst)
            target = self._file(dst)
            started = target.start_copy_from_url(self._file(src).url)
            self._wait_for_copy(target, started["copy_status"], f"{src} -> {dst}")

    def _wait_for_copy(self, target: ShareFileClient, status: str | None, what: str) -> None:
        deadline = time.monotonic() + self.copy_timeout_s
        description = None
        while status == "pending":
            if time.monotonic() > deadline:
                raise TimeoutError(f"Azure Files copy {what} still pending after {self.copy_timeout_s} s")
            time.sleep(self.copy_poll_s)
            copy = target.get_file_properties().copy
            status, description = copy.status, copy.status_description
        if status != "success":
            raise AzureCopyError(f"Azure Files copy {what} ended {status!r}: {description or 'no description'}")

    def read_text(self, path: str) -> str | None:
        """The UTF-8 text of the file at `path`, or None when it does not exist."""
        with self.errors(f"read {path}"):
            try:
                return self._file(path).download_file().readall().decode("utf-8")
            except ResourceNotFoundError as exc:
                if error_code(exc) not in ("ResourceNotFound", "ParentNotFound"):  # ShareNotFound is no file's absence
                    raise
                return None

    def write_text(self, path: str, text: str) -> None:
        """Write UTF-8 text to `path`, creating parent directories."""
        with self.errors(f"write {path}"):
            self._make_parents(path)
            self._file(path).upload_file(text.encode("utf-8"))

    def url(self, path: str) -> str:
        """The file's URL without its query string (so never a SAS signature)."""
        scheme, netloc, url_path, _, _ = urlsplit(self._file(path).url)
        return urlunsplit((scheme, netloc, url_path, "", ""))
