"""The one redaction point: every secret shape is masked, ordinary text is left alone, log records are redacted."""

import base64
import io
import logging
import random

import pytest

from infra.core.redact import MASK, SHAPES, RedactSecrets, redact, secret_shaped, secret_shapes

# Seeded: the keys are in test ids, which must be the same in every pytest-xdist worker.
KEY88 = base64.b64encode(random.Random(88).randbytes(64)).decode()  # a storage account key's shape (512 bits)
KEY44 = base64.b64encode(random.Random(44).randbytes(32)).decode()  # a Service Bus / Event Hubs key's shape (256 bits)
JWT = (
    "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJodHRwczovL3N0b3JhZ2UuYXp1cmUuY29tIiwib2lkIjoiMSJ9."
    "c2lnbmF0dXJlLWJ5dGVzLWhlcmU"
)

# (text holding a secret, the secret itself): one or more per shape, with the context each is met in
SECRETS = [
    ("https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sr=c&sp=rl&sig=Zm9v%2Bbar%3D&se=2030", "Zm9v%2Bbar%3D"),
    ("copy source https%3A%2F%2Fa.blob%2Fc%3Fsv%3D1%26sig%3DQUJDRA%253D%26se%3D2", "QUJDRA%253D"),
    ("sig=onlyTheSignature", "onlyTheSignature"),
    (f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY88};EndpointSuffix=core.windows.net", KEY88),
    ("BlobEndpoint=https://a.blob.core.windows.net/;SharedAccessSignature=sv=2022&ss=b&sig=xyz123", "xyz123"),
    (
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=root;SharedAccessKey=c2VjcmV0a2V5dmFsdWU=",
        "c2VjcmV0a2V5dmFsdWU=",
    ),
    ("Server=db;Database=x;User Id=sa;Password=Tr0ub4dor&3;", "Tr0ub4dor"),
    ("Driver={ODBC};Uid=sa;PWD=correct-horse;", "correct-horse"),
    ("https://app/callback#access_token=abc.def-ghi&token_type=Bearer", "abc.def-ghi"),
    ("client_id=1&client_secret=s3cr3t-v4lue&grant_type=client_credentials", "s3cr3t-v4lue"),
    ("export sas_token='sv=2022-11-02&sp=r'", "'sv=2022-11-02&sp=r'"),
    ('{"accessToken": "opaque-token-value", "expiresOn": "2030"}', "opaque-token-value"),
    ("Authorization: Bearer 0123456789abcdefghijKLMN.opq", "0123456789abcdefghijKLMN.opq"),
    ("Authorization: SharedKey devstoreaccount1:c2lnbmF0dXJlLWhtYWM=", "c2lnbmF0dXJlLWhtYWM="),
    (f"token {JWT} expired", JWT),
    (f"the key is {KEY88}", KEY88),
    (f"key2: {KEY44}", KEY44),
    ("AZURE_CLIENT_SECRET value abc8Q~aBcDeFgHiJkLmNoPqRsTuVwXyZ012345_x", "abc8Q~aBcDeFgHiJkLmNoPqRsTuVwXyZ012345_x"),
    ("pushed with ghp_" + "a1B2" * 9 + " to the registry", "ghp_" + "a1B2" * 9),
    ("docker login https://bob:hunter2@registry.example.com:5000/v2/", "hunter2"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA"),
]

ORDINARY = [
    "https://acct.blob.core.windows.net/trainflow/datasets/pets/manifest.json",
    "storage.sas_token_env must name an environment variable such as AZURE_STORAGE_SAS_TOKEN",
    "image.password_env = REGISTRY_PASSWORD; fileshare.account_key_env AZURE_STORAGE_KEY",
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "Bearer tokens are refused by Azure Files",
    "epoch 3 step 120 loss 0.4123 lr 0.1 max_tokens=5",
    "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/trainflow",
    "myregistry.azurecr.io/trainflow-gpu:3f2a9c1d",
    "http://127.0.0.1:10000/devstoreaccount1/c-1a2b3c?restype=container&comp=list",
    "the signature of a SAS is its sig field",
]


@pytest.mark.parametrize("text, secret", SECRETS)
def test_every_secret_shape_is_masked_and_its_name_kept(text, secret):
    masked = redact(text)
    assert secret not in masked and MASK in masked
    assert secret_shaped(text) and not secret_shaped(masked.replace(MASK, ""))
    assert redact(masked) == masked  # idempotent: a message redacted twice reads the same


def test_each_shape_is_exercised_by_a_case_above_and_its_name_can_be_shown():
    named = {name for text, _ in SECRETS for name in secret_shapes(text)}
    assert named == {name for name, _ in SHAPES}
    assert not any(secret_shaped(name) for name in named)  # messages quote the names


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_left_alone(text):
    assert redact(text) == text and not secret_shaped(text)


def logger_into(stream: io.StringIO, name: str) -> logging.Logger:
    """A logger with two handlers, the first of which redacts: the second must see the masked record too."""
    logger = logging.getLogger(name)
    logger.propagate, logger.handlers = False, []
    logger.setLevel(logging.INFO)
    first, second = logging.StreamHandler(stream), logging.StreamHandler(stream)
    first.addFilter(RedactSecrets())
    logger.addHandler(first)
    logger.addHandler(second)
    return logger


def test_the_log_filter_redacts_message_arguments_and_tracebacks_in_place():
    stream = io.StringIO()
    logger = logger_into(stream, "test_redact.filter")
    logger.warning("connecting with %s to %s", f"AccountKey={KEY88}", "https://a.blob.core.windows.net/c?sig=SiG")
    try:
        raise RuntimeError(f"refused {JWT}")
    except RuntimeError:
        logger.exception("upload failed for token=%s", "plain-token-value")
    logger.info("epoch %d done", 3)
    out = stream.getvalue()
    for secret in (KEY88, "SiG", JWT, "plain-token-value"):
        assert secret not in out
    assert out.count("Traceback (most recent call last)") == 2 and out.count("epoch 3 done") == 2
    assert "AccountKey=***" in out and "sig=***" in out


def test_a_record_without_secrets_keeps_its_arguments():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "step %d of %s", (3, "run"), None)
    assert RedactSecrets().filter(record) and record.args == (3, "run") and record.getMessage() == "step 3 of run"
