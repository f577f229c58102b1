"""Services trainflow starts and that die under it: the user is told at once which one, how it ended and the last
lines of its log, and the command ends in one line as a fault (exit 1), or, for Prefect's server, goes on after a
restart on the same database. Each service is killed for real (SIGKILL to the service's own process, the leash's
child), and nothing may be left running after."""

import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from azure.storage.blob import ContainerClient

from infra.services.azurite import connection_string
from infra.services.prefect_server import running_prefect_server
from infra.services.supervise import ServiceError, free_port, port_open

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
TRAINFLOW = str(Path(sys.executable).parent / "trainflow")


class Command:
    """A trainflow command in a session of its own, its stderr and stdout read as they come, each line timed."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [TRAINFLOW, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def service(self, name: str, seconds: float = 120, listens: bool = True) -> psutil.Process:
        """The running process of the service whose command line holds `name` (a leash's child), once it listens
        (with `listens`; a server may leave listening to a process of its own)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            for leash in psutil.Process(self.proc.pid).children():
                if "leash.py" in " ".join(leash.cmdline()) and name in " ".join(leash.cmdline()):
                    children = leash.children()
                    if children and (not listens or children[0].net_connections(kind="tcp")):
                        return children[0]
            time.sleep(0.2)
        pytest.fail(f"no {name} within {seconds} s:\n{self.output()}")

    def until(self, condition, seconds: float) -> None:
        """Wait, while the command runs, until condition() holds."""
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline and self.proc.poll() is None, self.output()
            time.sleep(0.1)

    def kill(self, service: psutil.Process) -> float:
        """SIGKILL `service`; when. Every process the command had started is kept in `family`."""
        self.family = psutil.Process(self.proc.pid).children(recursive=True)
        service.kill()
        return time.monotonic()

    def finish(self, seconds: float) -> int:
        """The command's exit status, once it has ended and its output is read."""
        code = self.proc.wait(timeout=seconds)
        self.reader.join(timeout=10)
        return code

    def first(self, text: str) -> float | None:
        """When the first line holding `text` came."""
        return next((t for t, line in self.lines if text in line), None)

    def output(self) -> str:
        return "".join(line for _, line in self.lines)


@pytest.fixture
def trainflow():
    """Start trainflow commands (`Command`); any still running at the end is killed (its leashes stop the rest)."""
    started: list[Command] = []

    def start(*args: str) -> Command:
        started.append(Command(*args))
        return started[-1]

    yield start
    for command in started:
        if command.proc.poll() is None:
            command.proc.kill()
            command.proc.wait(timeout=30)


def left_running(processes: list[psutil.Process], seconds: float = 20) -> list[str]:
    """The processes still running after `seconds` (their command lines)."""
    _, alive = psutil.wait_procs(processes, timeout=seconds)
    return [" ".join(p.cmdline()) for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def blobs(port: int) -> int:
    """How many blobs the staging container holds (0 before it exists)."""
    container = ContainerClient.from_connection_string(connection_string(port), "trainflow")
    try:
        return sum(1 for _ in container.list_blobs(name_starts_with="datasets/"))
    except Exception:  # the container is not made yet
        return 0


def test_azurite_killed_mid_upload_is_named_at_once_and_stage_ends_as_a_fault(tmp_path, digits, trainflow):
    """Before: nothing for 2 min 12 s, then 'cannot reach blob storage ...; check the account URL and the network'."""
    (tmp_path / "slow.yaml").write_text("storage: {shard_mb: 0.005, upload_concurrency: 1}\n")  # ~400 shards
    stage = trainflow(
        "stage", "--config", str(tmp_path / "slow.yaml"), "--data", str(digits), "--workdir", str(tmp_path / "w")
    )
    azurite = stage.service("azurite-blob")
    port = next(c.laddr.port for c in azurite.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN)
    stage.until(lambda: blobs(port) >= 5, 180)  # mid-upload: some shards are in Blob
    killed = stage.kill(azurite)
    code = stage.finish(60)
    out = stage.output()
    named = stage.first(f"Azurite (started by trainflow, pid {azurite.pid}) was killed by signal 9 (SIGKILL)")
    assert named is not None and named - killed < 10, out
    assert code == 1, out
    log = tmp_path / "w" / "azurite" / "azurite.log"
    error = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"last lines of {log}: Azurite Blob service is starting" in error[0], out
    assert "re-run the command: staging resumes where it stopped" in error[0], out
    assert "check the account URL" not in out and "Traceback" not in out, out
    assert stage.first("error:") - killed < 20, out
    assert left_running(stage.family) == []


SHORT_RUN = (
    "training: {model: resnet18, image_size: 32, batch_size: 8, num_classes: 4, loader_workers: 0, threads: 1,\n"
    "           warmup_epochs: 0, epochs: 3, steps_per_epoch: 20, checkpoint_every: 10, log_every: 5, workers: 2}\n"
)


def flow_run_states(workdir: Path) -> list[str]:
    """The state of every flow run in the workdir's Prefect database."""
    with sqlite3.connect(workdir / "prefect" / "prefect.db") as db:
        return [row[0] for row in db.execute("select state_type from flow_run")]


@pytest.mark.slow
def test_prefects_server_killed_mid_training_is_restarted_on_its_database_and_the_run_finishes(tmp_path, trainflow):
    """Before: the run's output stopped, with no word of why."""
    (tmp_path / "short.yaml").write_text(SHORT_RUN)
    workdir = tmp_path / "w"
    run = trainflow("run", "--config", str(tmp_path / "short.yaml"), "--data", "synthetic", "--workdir", str(workdir))
    server = run.service("prefect.server.api.server:create_app")
    run.until(lambda: run.first("checkpoint step 10 saved"), 240)
    assert_bookkeeping_yields_to_training(run, server)
    killed = run.kill(server)
    code = run.finish(300)
    out = run.output()
    named = run.first(f"Prefect's server (started by trainflow, pid {server.pid}) was killed by signal 9 (SIGKILL)")
    assert named is not None and named - killed < 10, out
    assert re.search(r"Prefect's server restarted on the same database at http://127\.0\.0\.1:\d+/api in \d+ s", out)
    assert code == 0 and "Traceback" not in out, out
    assert flow_run_states(workdir) == ["COMPLETED"]
    assert left_running(run.family) == []


def assert_bookkeeping_yields_to_training(run: Command, server: psutil.Process) -> None:
    """Prefect's server and Azurite run 10 steps below the command's CPU priority (supervise.py's BOOKKEEPING_NICE),
    the training workers at the command's own."""
    command = psutil.Process(run.proc.pid).nice()
    family = psutil.Process(run.proc.pid).children(recursive=True)
    workers = [p for p in family if any(word.endswith("trainer/train.py") for word in p.cmdline())]
    assert workers and {p.nice() for p in workers} == {command}, [p.cmdline() for p in workers]
    assert server.nice() == run.service("azurite").nice() == min(command + 10, 19)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 3 MB tmpfs: too small for Prefect's database."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_service_that_fails_at_start_up_says_why_even_when_its_log_cannot_hold_it(tiny_disk):
    """Before: "Prefect's server exited with status 3 at start-up; see .../prefect/server.log", and that log was
    empty: the reason could not be written on the full disk."""
    home = tiny_disk / "prefect"
    with pytest.raises(ServiceError) as failed, running_prefect_server(home, startup_seconds=90):
        pass
    message = str(failed.value)
    assert message.startswith("Prefect's server exited with status 3 at start-up; last lines of"), message
    assert f"(not all written to {home / 'server.log'}: No space left on device)" in message, message
    assert "database or disk is full" in message and "Application startup failed" in message, message


def test_a_foreground_ui_server_that_dies_ends_its_command_in_one_line_with_its_last_lines(tmp_path, trainflow):
    """Before: `trainflow mlflow-ui` ended with the server's status (247 for SIGKILL) and no word."""
    port = free_port()
    ui = trainflow("mlflow-ui", "--workdir", str(tmp_path / "w"), "--port", str(port))
    ui.until(lambda: port_open(port), 180)
    server = ui.service("mlflow", listens=False)  # `mlflow server`, whose uvicorn listens
    killed = ui.kill(server)
    code = ui.finish(30)
    out = ui.output()
    error = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 1 and len(error) == 1, out
    assert error[0].startswith(
        f"error: MLflow UI (started by trainflow, pid {server.pid}) was killed by signal 9 (SIGKILL)"
    ), out
    assert f"last lines of {tmp_path / 'w'}" in error[0] and "Traceback" not in out, out
    assert ui.first("error:") - killed < 10
    assert left_running(ui.family) == []


@pytest.mark.slow
def test_prefects_server_that_cannot_restart_ends_the_run_at_once_in_one_line(tmp_path, trainflow):
    """Its port taken by another program the moment it died: the restart fails, and the command ends at once (its
    client would retry the dead API for minutes to record the crash: over 5 minutes, measured), the leashes taking
    its workers and services along."""
    (tmp_path / "long.yaml").write_text(SHORT_RUN.replace("epochs: 3", "epochs: 50"))
    workdir = tmp_path / "w"
    run = trainflow("run", "--config", str(tmp_path / "long.yaml"), "--data", "synthetic", "--workdir", str(workdir))
    server = run.service("prefect.server.api.server:create_app")
    port = next(c.laddr.port for c in server.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN)
    run.until(lambda: run.first("checkpoint step 10 saved"), 240)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        killed = run.kill(server)
        run.until(lambda: takes(squatter, port), 10)
        code = run.finish(300)
    out = run.output()
    error = [line for line in out.splitlines() if line.startswith("error:")]
    assert code == 1 and len(error) == 1 and "Traceback" not in out, out
    assert re.match(
        r"error: Prefect's server did not restart \(Prefect's server exited with status \d+ at start-up;", error[0]
    )
    log = workdir / "prefect" / "server.log"
    assert f"last lines of {log}: " in error[0] and "the command stops here, and all it started" in error[0], out
    assert "address already in use" in log.read_text()
    assert run.first("error:") - killed < 60, out
    assert left_running(run.family) == []


def takes(sock: socket.socket, port: int) -> bool:
    """Whether `sock` could listen on `port` now."""
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    sock.listen()
    return True
