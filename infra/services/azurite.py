"""Azurite, the Azure Blob emulator, started and stopped by trainflow itself for the local default.

It runs from the project's own node_modules (`npm ci`, which `make demo` and `make test` run), listens on a free
loopback port, and keeps its data on disk under the workdir, so data staged once stays staged across runs.
"""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.services.supervise import BOOKKEEPING_NICE, ServiceError, free_port, port_open, running_service

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "devstoreaccount1"
# Azurite's published development key (its README): not a secret, and valid for Azurite only.
DEV_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# What survives Azurite's death: the blobs it committed (on disk under data_dir) and the manifest's record of them.
RERUN = "re-run the command: staging resumes where it stopped, and finished steps are skipped"
# Its metadata databases (LokiJS, saved whole as JSON: node_modules/azurite/dist/src/blob/persistence/
# LokiBlobMetadataStore.js, and the extents' store beside it). A disk that filled or a machine that lost power
# mid-save leaves one cut short, and Azurite then dies at start-up on a JSON error naming neither the file nor a fix.
DATABASES = ("__azurite_db_blob__.json", "__azurite_db_blob_extent__.json")


class AzuriteError(ServiceError):
    """Azurite is missing or did not start."""


def azurite_binary() -> Path:
    """The azurite-blob launcher in the project's node_modules."""
    path = REPO / "node_modules" / ".bin" / "azurite-blob"
    if not path.exists():
        raise AzuriteError(f"Azurite is not installed ({path} is missing); run `npm ci` (make demo runs it)")
    return path


def connection_string(port: int) -> str:
    """The connection string of Azurite's development account on `port`."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={DEV_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};"
    )


@contextmanager
def running_azurite(data_dir: Path, startup_seconds: float = 30.0) -> Iterator[int]:
    """Start Azurite with its data in `data_dir`; yield its port; stop it at the end."""
    data_dir.mkdir(parents=True, exist_ok=True)
    check_databases(data_dir)
    port = free_port()
    cmd = [
        str(azurite_binary()),
        "--blobHost",
        "127.0.0.1",
        "--blobPort",
        str(port),
        "--location",
        str(data_dir),
        "--skipApiVersionCheck",
        "--loose",
        "--silent",
        # Azurite sends telemetry to Application Insights unless told not to (its README, "Telemetry
        # collection"), and on SIGINT/SIGTERM it tracks a stop event and waits for that send: offline or
        # firewalled, its graceful stop took 18 s instead of 0.03 s (tests/integration/infra/services/test_azurite.py).
        "--disableTelemetry",
    ]
    with running_service(
        cmd,
        data_dir / "azurite.log",
        lambda: port_open(port),
        "Azurite",
        startup_seconds,
        AzuriteError,
        endpoint=f"127.0.0.1:{port}",
        advice=RERUN,
        nice=BOOKKEEPING_NICE,
    ):
        yield port


def check_databases(data_dir: Path) -> None:
    """Refuse, before Azurite starts, a metadata database of its that is not whole JSON: one line naming the file
    and the fix (Azurite itself would die on it naming neither)."""
    for path in (data_dir / name for name in DATABASES if (data_dir / name).exists()):
        try:
            json.loads(path.read_bytes())
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise AzuriteError(
                f"Azurite's database {path} is damaged ({exc}: cut short, as a full disk or a lost machine leaves a "
                f"save); move it aside (mv {path} {path}.damaged) and re-run: Blob starts empty and staging uploads "
                "the data set again"
            ) from None
