"""The one place secrets are recognised and masked: in messages, in log records, and in settings.

`redact(text)` masks every secret-shaped substring; `secret_shaped(value)` says whether there is one;
`RedactSecrets` is the logging filter that redacts a record in place (message, arguments, traceback), so
every handler it sits on (console, Prefect's API log) gets the masked record; `EnvName` is the type of
every setting that names an environment variable, which refuses a value in place of a name without
echoing it. Masking is by shape, so it also catches a secret that arrived where none was expected.
"""

import logging
import re
from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

MASK = "***"
_VALUE = r"""(?P<secret>"[^"]*"|'[^']*'|[^\s&;'",)]+)"""  # a value up to the next separator of URLs and conn strings

# (what the shape is, pattern); only the group named `secret` is masked, so the name in front stays readable.
SHAPES = [
    # SAS tokens: `sig` is the signature field (learn.microsoft.com/rest/api/storageservices/create-service-sas),
    # also URL-encoded (sig%3D) when a SAS URL travels inside another URL.
    (
        "a SAS signature",
        re.compile(r"(?i)(?:(?<![A-Za-z0-9_])|(?<=%26)|(?<=%3F))sig(?:=|%3D)(?P<secret>(?:(?!%26)[^\s&;'\"])+)"),
    ),
    # Storage connection strings: AccountKey=, SharedAccessSignature=
    # (learn.microsoft.com/azure/storage/common/storage-configure-connection-string); SharedAccessKey= in
    # Service Bus, Event Hubs and IoT Hub connection strings (learn.microsoft.com/azure/service-bus-messaging/
    # service-bus-sas); Password=/Pwd= in ADO.NET and ODBC connection strings; client_secret, access_token,
    # refresh_token and id_token in OAuth 2.0 requests and redirects (RFC 6749 sections 2.3.1, 4.2.2, 5.1).
    (
        "a secret in a name=value pair",
        re.compile(
            r"(?i)(?<![A-Za-z0-9])(?:Account_?Key|SharedAccessSignature|SharedAccessKey|password|passwd|pwd|"
            r"(?:access_|refresh_|id_)?token|client_secret|secret|api[_-]?key)\s*=\s*" + _VALUE
        ),
    ),
    # The same names as JSON members: "password": "..." (az CLI output, token responses).
    (
        "a secret in a JSON member",
        re.compile(
            r'(?i)"(?:accountKey|password|(?:access_|refresh_|id_)?token|accessToken|refreshToken|'
            r'client_secret|secret)"\s*:\s*"(?P<secret>[^"]+)"'
        ),
    ),
    # HTTP Authorization values: Bearer tokens (RFC 6750 section 2.1, b64token); Azure Storage Shared Key
    # (learn.microsoft.com/rest/api/storageservices/authorize-with-shared-key: SharedKey account:signature).
    ("a bearer token", re.compile(r"(?<![A-Za-z0-9_])Bearer\s+(?P<secret>[A-Za-z0-9\-._~+/]{16,}=*)")),
    ("a Shared Key signature", re.compile(r"SharedKey(?:Lite)?\s+[^\s:]+:(?P<secret>[A-Za-z0-9+/]+=*)")),
    # JWTs (Entra ID access and ID tokens): header and payload are base64url JSON objects, and base64 of `{"`
    # is `eyJ` (RFC 7519 section 3, RFC 7515 section 7.1 compact serialization).
    ("a JSON web token", re.compile(r"(?P<secret>eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*)")),
    # Storage account keys are 512 bits, so 88 base64 characters ending in == (learn.microsoft.com/azure/
    # storage/common/storage-account-keys-manage); Service Bus, Event Hubs and Cosmos DB keys of 256 bits are
    # 44 characters ending in =. A base64 run of exactly that length is masked wherever it stands (after a / too:
    # a key pasted into a path or URL).
    ("a storage account key", re.compile(r"(?<![A-Za-z0-9+=])(?P<secret>[A-Za-z0-9+/]{86}==)(?![A-Za-z0-9+/=])")),
    ("a 256-bit access key", re.compile(r"(?<![A-Za-z0-9+=])(?P<secret>[A-Za-z0-9+/]{43}=)(?![A-Za-z0-9+/=])")),
    # Entra ID client secrets carry `Q~` after a digit (the format gitleaks' azure-ad-client-secret rule matches).
    (
        "an Entra client secret",
        re.compile(r"(?<![A-Za-z0-9_~.-])(?P<secret>[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.-]{31,34})(?![A-Za-z0-9_~.-])"),
    ),
    # GitHub tokens (docs.github.com, "About authentication to GitHub": ghp_, gho_, ghu_, ghs_, ghr_, github_pat_).
    (
        "a GitHub token",
        re.compile(r"(?<![A-Za-z0-9_])(?P<secret>gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),
    ),
    # A password in a URL's user information, scheme://user:password@host (RFC 3986 section 3.2.1).
    ("a password in a URL", re.compile(r"://[^/\s:@]+:(?P<secret>[^/\s@]+)@")),
    # PEM private keys (RFC 7468 section 10): the whole base64 body.
    (
        "a private key",
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?P<secret>.+?)-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL),
    ),
]


def _mask(match: re.Match) -> str:
    """The match with only its `secret` group replaced by the mask."""
    start, end = match.span("secret")
    text, offset = match.group(0), match.start()
    return text[: start - offset] + MASK + text[end - offset :]


def redact(text: str) -> str:
    """`text` with every secret-shaped substring (see SHAPES) replaced by ***."""
    for _, pattern in SHAPES:
        text = pattern.sub(_mask, text)
    return text


def secret_shapes(text: str) -> list[str]:
    """What kinds of secret `text` holds, by name ("a SAS signature (sig=)", ...); empty when none."""
    return [name for name, pattern in SHAPES if pattern.search(text)]


def secret_shaped(value: object) -> bool:
    """Whether `value` (as text) holds anything secret-shaped."""
    return bool(secret_shapes(value if isinstance(value, str) else str(value)))


class RedactSecrets(logging.Filter):
    """Redacts a log record in place (message with its arguments, exception and stack text); never drops one.

    Put it on each handler (a filter on a logger does not see records that propagate from child loggers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if secret_shaped(message):
            record.msg, record.args = redact(message), None
        if record.exc_info and record.exc_info[0] is not None:
            # formatted here, once, so no later handler (Rich, Prefect's API log) renders the raw exception
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


# POSIX.1-2017 section 8.1: portable environment variable names are capital letters, digits and _,
# not starting with a digit. Anything else in such a setting is most likely the secret itself.
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
ENV_NAME_ERROR = "env_name"  # the pydantic error type, so a message never shows the refused value


def check_env_name(value: str) -> str:
    """`value` if it is a portable environment variable name; refused without being echoed otherwise."""
    if not ENV_NAME.fullmatch(value):
        raise PydanticCustomError(
            ENV_NAME_ERROR,
            "must name an environment variable (capital letters, digits and "
            "_, such as AZURE_STORAGE_SAS_TOKEN), not hold its value; the value given is not shown",
        )
    return value


NAMES_A_VARIABLE = AfterValidator(check_env_name)
EnvName = Annotated[str, NAMES_A_VARIABLE]
"""A setting that names an environment variable (which holds a secret): only a valid name is accepted."""


def names_a_variable(field) -> bool:
    """Whether a pydantic FieldInfo is an EnvName setting."""
    return NAMES_A_VARIABLE in field.metadata
