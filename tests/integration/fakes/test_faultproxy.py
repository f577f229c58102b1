"""Blob transfers through FaultProxy against a real Azurite: retries must keep every byte intact."""

import os
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from azure.storage.blob import BlobServiceClient, ExponentialRetry

from infra.services.azurite import ACCOUNT, DEV_KEY
from tests.fakes.faultproxy import FaultProxy

pytestmark = pytest.mark.integration

MIB = 1 << 20


def _client(port: int, **kwargs) -> BlobServiceClient:
    return BlobServiceClient(
        f"http://127.0.0.1:{port}/{ACCOUNT}", credential={"account_name": ACCOUNT, "account_key": DEV_KEY}, **kwargs
    )


class _QuickExponentialRetry(ExponentialRetry):
    """ExponentialRetry sleeping initial_backoff * increment_base ** count, at most 1.6 s (0.2, 0.4 ...).

    The SDK's own formula is initial_backoff + increment_base ** count with +-3 s jitter, which
    with ~40% faulty requests makes this test take over a minute. Only the sleep length differs:
    the SDK's retry loop, retryable-status list, error classification and body rewind all run.
    """

    def get_backoff_time(self, settings):
        backoff = min(self.initial_backoff * self.increment_base ** settings["count"], 1.6)
        return random.uniform(0.8 * backoff, 1.2 * backoff)


def _container(azurite_port: int, name: str) -> str:
    """Create the container straight on Azurite, so a retried create cannot answer 409."""
    _client(azurite_port).create_container(name)
    return name


def test_clean_round_trip_of_20_mb(azurite_port):
    container = _container(azurite_port, "clean")
    data = os.urandom(20 * MIB)
    with FaultProxy(azurite_port) as proxy:
        blob = _client(proxy.port).get_blob_client(container, "big.bin")
        blob.upload_blob(data, overwrite=True)
        assert blob.download_blob().readall() == data
    assert proxy.stats["forwarded"] == proxy.stats["requests"] >= 2
    assert proxy.stats["failed_503"] == proxy.stats["resets"] == 0


def test_retries_keep_bytes_intact_under_faults(azurite_port):
    container = _container(azurite_port, "faulty")
    payloads = {f"small/{i:02d}.bin": os.urandom(1 + 997 * i) for i in range(30)}
    payloads.update({f"large/{i}.bin": os.urandom(9 * MIB) for i in range(2)})

    with FaultProxy(azurite_port, fail_ratio=0.3, reset_ratio=0.1, seed=1234) as proxy:
        service = _client(
            proxy.port,
            # retry_total alone still caps 503s, connect and read errors at 3 retries each.
            retry_policy=_QuickExponentialRetry(
                initial_backoff=0.2, increment_base=2, retry_total=10, retry_status=10, retry_connect=10, retry_read=10
            ),
            max_single_put_size=4 * MIB,
            max_block_size=4 * MIB,
            max_single_get_size=4 * MIB,
            max_chunk_get_size=4 * MIB,
        )
        cont = service.get_container_client(container)

        def upload(name: str) -> None:
            # overwrite=True: a Put Blob the server already applied (reset after forwarding)
            # must be safely repeatable, which If-None-Match: * would not be.
            cont.upload_blob(name, payloads[name], overwrite=True, max_concurrency=3)

        def download(name: str) -> bytes:
            return cont.download_blob(name, max_concurrency=3).readall()

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(upload, payloads))
            downloaded = dict(zip(payloads, pool.map(download, payloads)))

        stats = dict(proxy.stats)

    for name, data in payloads.items():
        assert downloaded[name] == data, name
    assert stats["failed_503"] > 0 and stats["resets"] > 0, stats
    assert stats["resets_before"] > 0 and stats["resets_after"] > 0, stats
    assert stats["by_method"].get("PUT", 0) > 0 and stats["by_method"].get("GET", 0) > 0, stats
