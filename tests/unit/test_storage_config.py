"""Storage settings: names, transport and secrets."""

import pytest
from pydantic import ValidationError

from flows.config import ConfigError, load_config
from infra.blobstore import StorageConfig, is_loopback, redact, require_https_unless_loopback


@pytest.mark.parametrize("name", ["ab", "Upper", "a--b", "-ab", "ab-", "a_b", "x" * 64])
def test_invalid_container_names_are_refused(name):
    with pytest.raises(ValidationError, match="container name .* is invalid"):
        StorageConfig(container=name)


@pytest.mark.parametrize("name", ["abc", "a-b-c", "data2026", "x" * 63])
def test_valid_container_names(name):
    assert StorageConfig(container=name).container == name


def test_invalid_container_in_a_config_file_names_the_setting(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("storage: {container: My_Data}\n")
    with pytest.raises(ConfigError, match="storage.container = 'My_Data'.*lowercase"):
        load_config(path, {}, environ={})


@pytest.mark.parametrize("url, ok", [
    ("https://acct.blob.core.windows.net", True), ("http://127.0.0.1:10000/devstoreaccount1", True),
    ("http://localhost:1/x", True), ("http://[::1]:1/x", True), ("http://acct.blob.core.windows.net", False),
    ("http://10.0.0.4/x", False), ("ftp://127.0.0.1/x", False),
])
def test_plain_http_only_to_loopback(url, ok):
    if ok:
        require_https_unless_loopback(url)
    else:
        with pytest.raises(ValueError, match="must use https"):
            require_https_unless_loopback(url)


def test_loopback():
    assert is_loopback("127.8.9.1") and is_loopback("::1") and not is_loopback("example.com")


def test_redact_hides_signatures_and_keys():
    text = "https://a.blob.core.windows.net/c?sv=1&sig=abc%2Fdef&se=2 AccountKey=Zm9vYmFy==;x"
    assert redact(text) == "https://a.blob.core.windows.net/c?sv=1&sig=***&se=2 AccountKey=***;x"


def test_a_sas_in_the_account_url_is_refused():
    with pytest.raises(ValidationError, match="must not carry a query string"):
        StorageConfig(backend="azure", account_url="https://a.blob.core.windows.net/?sv=1&sig=abc")
