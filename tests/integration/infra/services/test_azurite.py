"""Azurite as trainflow runs it: data kept across restarts, and a stop that does not wait on the network."""

import time

import pytest
from azure.storage.blob import BlobServiceClient

from infra.services.azurite import DATABASES, AzuriteError, connection_string, running_azurite

pytestmark = pytest.mark.integration


def test_azurite_stops_at_once_even_after_its_telemetry_would_have_started_and_keeps_the_data(tmp_path):
    """With telemetry on (Azurite's default), a stop after a few seconds of uptime waited about 18 s for a send to
    Application Insights that this offline machine cannot make; trainflow's Ctrl-C waited with it."""
    with running_azurite(tmp_path / "az") as port:
        client = BlobServiceClient.from_connection_string(connection_string(port))
        client.create_container("kept").upload_blob("b", b"kept")
        time.sleep(4)  # past Azurite's telemetry start-up, which the slow stop needed
        started = time.monotonic()
    took = time.monotonic() - started
    assert took < 5, f"Azurite took {took:.1f} s to stop"  # 0.03 s measured; 18 s with telemetry on
    with running_azurite(tmp_path / "az") as port:
        client = BlobServiceClient.from_connection_string(connection_string(port))
        assert client.get_container_client("kept").download_blob("b").readall() == b"kept"


def test_a_database_cut_short_is_named_with_the_fix_before_azurite_starts(tmp_path):
    with running_azurite(tmp_path / "az") as port:
        client = BlobServiceClient.from_connection_string(connection_string(port))
        client.create_container("kept").upload_blob("b", b"kept")
    database = tmp_path / "az" / DATABASES[0]
    database.write_bytes(database.read_bytes()[: database.stat().st_size // 2])  # as a save cut short leaves it
    with pytest.raises(AzuriteError) as caught, running_azurite(tmp_path / "az"):
        pass
    message = str(caught.value)
    assert "\n" not in message and f"Azurite's database {database} is damaged" in message, message
    assert f"mv {database} {database}.damaged" in message

    database.rename(database.with_name(database.name + ".damaged"))  # the fix, as the line says
    with running_azurite(tmp_path / "az") as port:
        assert not list(BlobServiceClient.from_connection_string(connection_string(port)).list_containers())
