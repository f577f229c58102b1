"""Fixtures of the integration tests in more than one folder: Azurite over HTTPS with basic OAuth."""

from pathlib import Path

import pytest

from infra.services.azurite import ACCOUNT, azurite_binary
from infra.services.supervise import free_port, port_open, running_service
from tests.fakes.identity import self_signed


@pytest.fixture(scope="module")
def oauth_azurite(tmp_path_factory) -> tuple[str, Path]:
    """Azurite over HTTPS with basic OAuth; yields its account URL and the certificate to trust."""
    folder = tmp_path_factory.mktemp("azurite-oauth")
    cert, key = self_signed(folder)
    port = free_port()
    cmd = [
        str(azurite_binary()),
        "--blobHost",
        "127.0.0.1",
        "--blobPort",
        str(port),
        "--inMemoryPersistence",
        "--oauth",
        "basic",
        "--cert",
        str(cert),
        "--key",
        str(key),
        "--skipApiVersionCheck",
        "--loose",
        "--silent",
    ]
    with running_service(cmd, folder / "azurite.log", lambda: port_open(port), "Azurite", 30):
        yield f"https://127.0.0.1:{port}/{ACCOUNT}", cert
