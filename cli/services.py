"""The services of the CLI: what a command that starts services holds while it runs (the workdir's lock, Prefect's
API), and the commands that serve a UI in the foreground until Ctrl-C (`trainflow ui`, `trainflow mlflow-ui`)."""

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Annotated

import typer

from cli.common import ConfigOpt, WorkdirOpt, configure, friendly_errors
from flows.config import ConfigError, FlowConfig
from flows.preflight import check_access
from infra.core.diskspace import check_prefect_space
from infra.core.errors import BadInput
from infra.core.redact import RedactSecrets
from infra.runs.tracking import UI_PORT, local_ui, store_folder, store_uri, ui_command
from infra.runs.workdir import workdir_lock
from infra.services.prefect_server import api_answers
from infra.services.supervise import Service, ServiceDied, port_open, stop


@friendly_errors
def ui(
    workdir: WorkdirOpt = None,
    port: Annotated[int, typer.Option(help="Port of the UI and API.")] = 4200,
) -> None:
    """Start the Prefect server and UI on this machine (state under the workdir) until Ctrl-C."""
    cfg = configure(None, None, workdir)
    check_port_free(port, "another Prefect server or UI?")
    home = cfg.workdir / "prefect"
    home.mkdir(parents=True, exist_ok=True)
    print(
        f"Prefect UI at http://127.0.0.1:{port}  (for trainflow run/deploy against it: "
        f"export PREFECT_API_URL=http://127.0.0.1:{port}/api)",
        flush=True,
    )
    # The UI asks /ui-settings where the API is; Prefect answers PREFECT_API_URL, else its default port 4200, so
    # with --port alone every page said "Can't connect to Server API". A PREFECT_UI_API_URL of the user's (a
    # proxy) wins.
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_UI_API_URL": os.environ.get("PREFECT_UI_API_URL") or f"http://127.0.0.1:{port}/api",
    }
    prefect = str(Path(sys.executable).parent / "prefect")
    serve(
        [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env, "Prefect server", home / "ui.log"
    )


@friendly_errors
def mlflow_ui(
    config: ConfigOpt = None,
    workdir: WorkdirOpt = None,
    port: Annotated[int, typer.Option(help="Port of MLflow's UI.")] = UI_PORT,
) -> None:
    """Start MLflow's UI on this machine over the runs' tracking store (tracking.uri, else the workdir's SQLite
    store), beside Prefect's (`trainflow ui`), until Ctrl-C."""
    cfg = configure(config, None, workdir)
    check_port_free(port, "another MLflow UI?")
    uri = store_uri(cfg.tracking, cfg.workdir)
    store_folder(cfg.workdir).mkdir(parents=True, exist_ok=True)
    print(f"MLflow UI at {local_ui(port)}  (runs from {uri})", flush=True)
    log = store_folder(cfg.workdir) / "ui.log"
    serve(ui_command(sys.executable, uri, cfg.workdir, port), dict(os.environ), "MLflow UI", log)


def check_port_free(port: int, guess: str) -> None:
    """Refuse a port that something already serves on."""
    if port_open(port):
        raise ConfigError(
            f"port {port} is in use ({guess}); pass --port N, or open the one running at http://127.0.0.1:{port}"
        )


def serve(command: list[str], env: dict[str, str], name: str, log: Path) -> None:
    """Run a server in the foreground until Ctrl-C (how a UI is meant to end), its output shown and kept in `log`. It
    runs on a leash in a session of its own (Ctrl-C reaches trainflow, which stops it and whatever it started); if it
    ends otherwise, the command ends in one line that says how, with its last lines."""
    service = Service(command, log, name, env, echo=True)
    try:
        code = service.proc.wait()
    except KeyboardInterrupt:
        stop(service.proc)
        print(f"{name} stopped")
        return
    message, service.echo = service.exited(code), False  # what its leftovers print as they stop is noise
    stop(service.proc)  # what it started and left behind
    raise ServiceDied(message)


@contextmanager
def holding(cfg: FlowConfig, prefect: bool = True) -> Iterator[None]:
    """What a command that starts services holds while it runs: the workdir's lock (a second command on the same
    workdir is refused at once) and, with `prefect`, Prefect's API (`prefect_api`); the credentials and storage the
    config names are checked first (flows/preflight.py), so their mistakes end the command in about a second."""
    with workdir_lock(cfg.workdir), ExitStack() as stack:
        check_access(cfg)
        if prefect:
            stack.enter_context(prefect_api(cfg.workdir))
        yield


@contextmanager
def prefect_api(workdir: Path) -> Iterator[None]:
    """Prefect's API for the command: the server PREFECT_API_URL names, else Prefect's server started here (its
    state under the workdir) in a session of its own, so that an interrupt reaches it only after the flow has
    recorded how it ended (infra/services/prefect_server.py).

    Prefect reads its settings when it is first imported, so nothing the CLI imports at its top
    may import Prefect (a test checks)."""
    os.environ.setdefault("PREFECT_HOME", str(workdir / "prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    with ExitStack() as stack:
        check_prefect_api(os.environ.get("PREFECT_API_URL"))
        if not os.environ.get("PREFECT_API_URL"):
            from infra.services.prefect_server import running_prefect_server

            check_prefect_space(Path(os.environ["PREFECT_HOME"]))  # it would exit at start-up, its log unwritten

            os.environ["PREFECT_API_URL"] = stack.enter_context(
                running_prefect_server(Path(os.environ["PREFECT_HOME"]))
            )
            stack.callback(send_what_prefect_holds)  # before the server stops (callbacks run last first)
        import prefect.main  # noqa: F401 - sets up Prefect's logging (lazily imported otherwise), adjusted below

        for name in ("", "prefect", "prefect.flow_runs", "prefect.task_runs", "uvicorn.error"):
            for handler in logging.getLogger(name).handlers:
                handler.addFilter(RedactSecrets())
                if isinstance(handler, logging.StreamHandler):
                    handler.addFilter(without_traceback)
        yield


def check_prefect_api(url: str | None) -> None:
    """A PREFECT_API_URL that does not answer as Prefect's API ends the command in one line, before anything starts
    (Prefect's client would retry it for minutes, then print a traceback)."""
    if url and not api_answers(url):
        raise BadInput(
            f"PREFECT_API_URL is {url}, which does not answer as Prefect's API (GET {url.rstrip('/')}/health); start "
            "that server or correct the URL, or unset PREFECT_API_URL to use trainflow's own server"
        )


def send_what_prefect_holds(seconds: float = 5) -> None:
    """Send the logs and events Prefect still queues to its server while it runs (at exit, it would retry a stopped
    server for minutes)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=seconds)


def without_traceback(record: logging.LogRecord) -> bool:
    """Console lines keep their message and lose the traceback (the Prefect UI keeps it); the CLI ends with one
    error line."""
    record.exc_info, record.exc_text = None, None
    return True
