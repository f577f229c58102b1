"""Azure Storage's errors as trainflow reports them, for Blob and Files alike: one StorageError hierarchy, the table of
the service's error codes (what each means and what fixes it), and the translation of SDK exceptions into one line
with no secret in it.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse

from azure.core.exceptions import (
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)

from infra.core.errors import BadInput, TrainflowError, first_line
from infra.core.redact import redact
from infra.services.supervise import death_at


class StorageError(TrainflowError):
    """A storage operation failed; `permanent` errors (credentials, names) are not worth a retry."""

    def __init__(self, message: str, permanent: bool | None = None):
        super().__init__(redact(message), permanent)  # whatever the SDK put in a message, no secret leaves here


class MissingSecret(BadInput, StorageError):
    """An environment variable the config names for a credential is not set (bad input: exit 2)."""


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


def error_code(exc: HttpResponseError) -> str:
    """Azure's error code of a failed request (x-ms-error-code), or "" when it sent none."""
    code = getattr(exc, "error_code", None)
    response = getattr(exc, "response", None)
    if not code and response is not None:
        code = response.headers.get("x-ms-error-code")
    return str(getattr(code, "value", code) or "")
