"""Storage settings: names, transport and secrets (no secret in any setting, only variable names in *_env)."""

import base64
import random

import pytest
import yaml
from pydantic import ValidationError

from flows.config import ConfigError, FlowConfig, load_config, secret_homes, section_type
from infra.core.redact import redact
from infra.storage.config import StorageConfig, is_loopback, require_https_unless_loopback

SAS = "sv=2024-05-04&ss=b&srt=co&sp=rwdlac&se=2031-01-01T00:00:00Z&spr=https&sig=R4nd0mS1gn4tur3%2Fw1th%3D"
# Seeded: the keys are in test ids, which must be the same in every pytest-xdist worker.
ACCOUNT_KEY = base64.b64encode(random.Random(64).randbytes(64)).decode()
CONNECTION = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={ACCOUNT_KEY};EndpointSuffix=core.windows.net"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJzdG9yYWdlIiwib2lkIjoiNDIifQ.c2lnbmF0dXJl"


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


@pytest.mark.parametrize(
    "url, ok",
    [
        ("https://acct.blob.core.windows.net", True),
        ("http://127.0.0.1:10000/devstoreaccount1", True),
        ("http://localhost:1/x", True),
        ("http://[::1]:1/x", True),
        ("http://acct.blob.core.windows.net", False),
        ("http://10.0.0.4/x", False),
        ("ftp://127.0.0.1/x", False),
    ],
)
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


def test_a_sas_in_the_account_url_is_refused_naming_where_it_belongs_without_showing_it():
    with pytest.raises(ValidationError, match="must not carry a query string"):
        StorageConfig(backend="azure", account_url="https://a.blob.core.windows.net/?sv=1&sig=abc")
    with pytest.raises(
        ConfigError,
        match=r"storage.account_url holds what looks like a SAS signature.*name it in "
        r"storage.sas_token_env.*not shown",
    ) as failure:
        load_config(
            None,
            {"storage": {"backend": "azure", "account_url": f"https://a.blob.core.windows.net/c?{SAS}"}},
            environ={},
        )
    assert "R4nd0mS1gn4tur3" not in str(failure.value) and "sig=" not in str(failure.value)


def every_env_setting(model=FlowConfig, prefix="") -> list[str]:
    """Every setting whose name ends in _env, wherever it is: each names a variable."""
    found = []
    for name, field in model.model_fields.items():
        if name.endswith("_env"):
            found.append(prefix + name)
        elif section_type(field):
            found += every_env_setting(section_type(field), f"{prefix}{name}.")
    return found


def test_every_setting_that_names_a_variable_has_the_one_env_name_type():
    assert every_env_setting() == secret_homes(FlowConfig) and len(secret_homes(FlowConfig)) >= 6


def overriding(setting: str, value) -> dict:
    """{"storage": {"sas_token_env": value}} from "storage.sas_token_env"."""
    section, name = setting.split(".")
    return {section: {name: value}}


@pytest.mark.parametrize("setting", secret_homes(FlowConfig))
@pytest.mark.parametrize(
    "pasted",
    [
        SAS,
        ACCOUNT_KEY,
        CONNECTION,
        JWT,
        "hunter2",
        "my-registry-token",
        "ghp_" + "x1Y2" * 9,
        "AZURE STORAGE KEY",
        "9LIVES",
        "",
    ],
)
def test_a_value_pasted_where_a_variable_name_belongs_is_refused_without_echoing_it(setting, pasted):
    with pytest.raises(ConfigError) as failure:
        load_config(None, overriding(setting, pasted), environ={})
    default = FlowConfig().model_dump()[setting.split(".")[0]][setting.split(".")[1]]
    assert str(failure.value) == (
        f"{setting} must name an environment variable such as {default}, not hold its "
        "value; the value given is not shown"
    )
    assert pasted not in str(failure.value) or pasted == ""


@pytest.mark.parametrize("setting", secret_homes(FlowConfig))
@pytest.mark.parametrize("name", ["MY_SAS", "_PRIVATE_TOKEN", "X", "AZURE_STORAGE_KEY_2"])
def test_valid_variable_names_are_accepted(setting, name):
    section, field = setting.split(".")
    assert getattr(getattr(load_config(None, overriding(setting, name), environ={}), section), field) == name


@pytest.mark.parametrize("source", ["file", "environment"])
@pytest.mark.parametrize(
    "setting, value, belongs",
    [
        ("dataset", CONNECTION, "storage.sas_token_env, storage.account_key_env, storage.connection_string_env"),
        ("training.model", JWT, "fileshare.sas_token_env"),
        ("storage.container", f"x;AccountKey={ACCOUNT_KEY}", "storage.connection_string_env"),
        ("fileshare.share", f"scripts?{SAS}", "fileshare.sas_token_env or fileshare.account_key_env"),
        ("workdir", f"/tmp/{ACCOUNT_KEY}", "image.password_env"),
        ("image.username", "bob:Password=hunter2;", "image.password_env"),
    ],
)
def test_no_setting_anywhere_accepts_a_secret_shaped_value(tmp_path, source, setting, value, belongs):
    """The whole config is stored by Prefect as the flow's parameters: a secret in any setting is refused."""
    if source == "file":
        path, environ = tmp_path / "c.yaml", {}
        path.write_text(yaml.safe_dump(overriding(setting, value) if "." in setting else {setting: value}))
    else:
        path, environ = None, {"TRAINFLOW_" + setting.upper().replace(".", "__"): value}
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")) as failure:
        load_config(path, {}, environ=environ)
    message = str(failure.value)
    assert redact(value).replace("***", "") not in message or value not in message
    for part in (ACCOUNT_KEY, JWT, "R4nd0mS1gn4tur3", "hunter2"):
        assert part not in message
    assert "not shown" in message and belongs in message and "\n" not in message


def test_validation_messages_show_ordinary_values_and_never_secret_ones():
    with pytest.raises(ConfigError, match=r"training.epochs = 'many'"):
        load_config(None, {"training": {"epochs": "many"}}, environ={})
    with pytest.raises(ConfigError, match=r"training.epochs holds what looks like a secret.*not shown") as failure:
        load_config(None, {"training": {"epochs": f"token={JWT}"}}, environ={})
    assert JWT not in str(failure.value)
    with pytest.raises(
        ConfigError,
        match=r"storage.sas_token holds what looks like a SAS signature.*name it in "
        r"storage.sas_token_env",
    ) as failure:
        load_config(None, {"storage": {"sas_token": SAS}}, environ={})  # the secret under a setting of its own making
    assert "R4nd0mS1gn4tur3" not in str(failure.value)
