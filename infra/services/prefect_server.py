"""Prefect's server for one trainflow command: the API (no UI) on a free loopback port, its database under the
workdir, started and stopped by trainflow like its other services.

Prefect's own embedded server is a child in the terminal's process group: Ctrl-C kills it first, and the
interrupted flow then cannot record its end (its client retries a dead server for minutes). Started here, on a
leash in its own session, it outlives the interrupt long enough for the flow run to be marked crashed, and dies
with the command however it ends. It is the same server: the same app factory and settings as Prefect's
`SubprocessASGIServer` (prefect/server/api/server.py), which this mirrors.

A SIGTERM does not stop it (systemd and Kubernetes send one to every process of the command at once): trainflow
stops it, with SIGINT, once the interrupted flow run has recorded its end. If it dies while the command runs, it is
started again on the same port and database: Prefect's client retries a refused connection, once it has connected,
for about a minute (2, 4, ... 32 s), and the flow run goes on and is recorded
(tests/integration/infra/services/test_watched_services.py). If it cannot start again, the command ends.
"""

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.request import urlopen

from infra.services.supervise import BOOKKEEPING_NICE, ServiceError, free_port, running_service

APP_FACTORY = "prefect.server.api.server:create_app"


def api_answers(url: str) -> bool:
    """Whether `url` answers as a healthy Prefect API: GET /health gives `true` (another HTTP server gives an error or
    something else)."""
    try:
        with urlopen(f"{url.rstrip('/')}/health", timeout=2) as response:
            return response.status == 200 and response.read(16).strip() == b"true"
    except (OSError, ValueError):  # no answer, an error status, or not a URL at all
        return False


def server_command(port: int) -> list[str]:
    """uvicorn serving Prefect's API app, as Prefect starts its own embedded server, deaf to SIGTERM
    (infra/services/prefect_api.py)."""
    return [sys.executable, str(Path(__file__).with_name("prefect_api.py")), APP_FACTORY, str(port)]


@contextmanager
def running_prefect_server(home: Path, startup_seconds: float = 120) -> Iterator[str]:
    """Prefect's API with its state in `home` for the block; yields its URL (what PREFECT_API_URL names)."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {
        **{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"},
        "PREFECT_HOME": str(home),
        "PREFECT_UI_ENABLED": "0",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
    }
    with running_service(
        server_command(port),
        home / "server.log",
        lambda: api_answers(url),
        "Prefect's server",
        startup_seconds,
        ServiceError,
        env,
        advice="re-run the command: finished steps are skipped and training resumes from its last checkpoint",
        restarted=f"on the same database at {url}",  # the flow's client retries the API meanwhile
        nice=BOOKKEEPING_NICE,
    ):
        yield url
