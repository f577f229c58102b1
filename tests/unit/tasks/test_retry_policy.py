"""The retry policy (tasks/retry.py over infra/core/errors.py's rule): which errors each step retries, and how often.

The rule is checked on real Prefect states, each step's retries and delays against the steps table of
docs/concepts/index.md, and Prefect's own engine against a server: a transient error is retried up to the step's
limit, a permanent one never. `task_runs` (each task run of a flow run, read from the Prefect API) is what the
flow tests count attempts with."""

import re

import pytest
from prefect import Task, flow, task
from prefect.states import Completed, Failed

from flows.report import publish_report_task
from infra.compute import JobTimedOut, PoolError
from infra.compute.silence import JobHung
from infra.core.errors import BadInput, TrainflowError
from infra.engines.launchers import LaunchError, RankRefused
from infra.images.registry import ImageError
from infra.storage.errors import MissingSecret, StorageError
from infra.storage.fileserver import FileServerError
from tasks.build_image import build_image_task
from tasks.retry import unless_permanent
from tasks.sync_file_server import sync_on_pool_task, sync_to_file_server_task
from tasks.train_on_pool import collect_results_task, create_pool_task, delete_pool_task, run_training_task
from tasks.upload_dataset import upload_dataset_task
from tasks.upload_scripts import upload_scripts_task
from tests.fakes.paths import REPO
from tests.fakes.prefect import task_runs

STEPS_PAGE = REPO / "docs" / "concepts" / "index.md"
# The steps of train-flow, by the name the steps table and the Prefect UI give them.
STEPS: dict[str, Task] = {
    t.name: t
    for t in (
        build_image_task,
        upload_scripts_task,
        upload_dataset_task,
        sync_to_file_server_task,
        create_pool_task,
        run_training_task,
        delete_pool_task,
        collect_results_task,
        publish_report_task,
    )
}
# Steps that run whatever the error: the pool must go even after a permanent failure, and the report is cheap.
RETRY_ANY_ERROR = {"delete-pool", "publish-report"}

TRANSIENT = [
    TrainflowError("a step failed"),
    StorageError("blob storage answered 503 ServerBusy"),
    LaunchError("rank 1 failed: it died"),
    PoolError("a node did not come up"),
    ImageError("the registry accepted the push but reported no digest", permanent=False),
    ConnectionResetError(104, "Connection reset by peer"),
    RuntimeError("an error trainflow does not know"),
]
PERMANENT = [
    BadInput("training.epochs must be >= 1"),
    JobTimedOut("the job ran past its timeout of 8 s"),
    JobHung("the job was stopped as hung: no line from any rank for 600 s"),
    RankRefused("rank 0 failed: train.py: error: unrecognized arguments: --bad"),
    StorageError("blob storage refused the credentials", permanent=True),
    MissingSecret("set AZURE_STORAGE_KEY"),
    FileServerError("the file server is full"),
    ImageError("invalid image name", permanent=True),
    LaunchError("horovodrun is missing", permanent=True),
]


@pytest.mark.parametrize("error", TRANSIENT, ids=lambda e: type(e).__name__)
def test_a_transient_error_is_retried(error):
    assert unless_permanent(None, None, Failed(data=error)) is True


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: type(e).__name__)
def test_a_permanent_error_is_not_retried(error):
    assert unless_permanent(None, None, Failed(data=error)) is False


def test_a_state_without_an_exception_is_retried():
    """Prefect asks only about failed states; one that carries no exception is not known to be permanent."""
    assert unless_permanent(None, None, Failed(message="crashed")) is True
    assert unless_permanent(None, None, Completed(data=BadInput)) is True  # a class, not an error that happened


def documented_retries() -> dict[str, tuple[int, list[int] | None]]:
    """The steps table of the concepts page: task name -> (retries, delays in seconds, or None where it gives none)."""
    text = STEPS_PAGE.read_text()
    table = text[text.index("| step | task | retries | skipped when |") :].split("\n\n", 1)[0]
    rows = {}
    for line in table.splitlines()[2:]:
        name, retries = re.search(r"`([a-z-]+)`", line.split("|")[2]).group(1), line.split("|")[3].strip()
        count, delays = re.match(r"(\d+)(?: \(([\d/]+) s\))?", retries).groups()
        rows[name] = (int(count), [int(d) for d in delays.split("/")] if delays else None)
    return rows


def test_every_step_retries_as_often_and_as_late_as_the_steps_table_says():
    table = documented_retries()
    assert set(table) == set(STEPS)
    for name, (retries, delays) in table.items():
        step = STEPS[name]
        assert step.retries == retries, name
        wait = step.retry_delay_seconds
        wait = wait if isinstance(wait, list) else [wait] * retries
        assert len(wait) == retries, name
        if delays is not None:
            assert wait == delays, name
        rule = step.retry_condition_fn
        assert rule is (None if name in RETRY_ANY_ERROR else unless_permanent), name


def test_the_sync_job_on_the_pool_is_retried_once_after_10_seconds():
    """The steps table: where only the pool reaches the file server, the sync is a job on the pool, retried once
    after 10 s (each attempt is a whole job), unless its error is permanent."""
    assert sync_on_pool_task.name == sync_to_file_server_task.name == "sync-to-file-server"
    assert (sync_on_pool_task.retries, sync_on_pool_task.retry_delay_seconds, sync_on_pool_task.retry_condition_fn) == (
        1,
        10,
        unless_permanent,
    )


def test_staging_steps_retry_after_2_10_and_30_seconds():
    """docs/concepts/staging.md: 'A step that fails on a passing fault is tried again by Prefect: 3 times, after 2,
    10 and 30 seconds'."""
    for step in (upload_scripts_task, upload_dataset_task, sync_to_file_server_task, collect_results_task):
        assert (step.retries, step.retry_delay_seconds, step.retry_condition_fn) == (3, [2, 10, 30], unless_permanent)


def failing(name: str, errors: list[BaseException]) -> Task:
    """A task under the steps' rule (2 retries, no delay) that raises `errors` one per attempt, then succeeds."""

    def attempt() -> str:
        if errors:
            raise errors.pop(0)
        return "done"

    return task(attempt, name=name, retries=2, retry_delay_seconds=0, retry_condition_fn=unless_permanent)


@pytest.mark.integration
def test_prefect_retries_transient_errors_up_to_the_limit_and_permanent_ones_never(prefect_server):
    steps = [
        failing("flaky", [StorageError("503"), LaunchError("rank 1 died")]),
        failing("always-transient", [LaunchError("rank 1 died") for _ in range(5)]),
        failing("bad-input", [BadInput("training.epochs must be >= 1")]),
        failing("timed-out", [JobTimedOut("the job ran past its timeout of 8 s")]),
        failing("transient-then-permanent", [StorageError("503"), BadInput("bad data")]),
    ]

    @flow
    def steps_flow():
        return [step(return_state=True) for step in steps]

    state = steps_flow(return_state=True)
    expected = {
        "flaky": (3, "COMPLETED"),
        "always-transient": (3, "FAILED"),
        "bad-input": (1, "FAILED"),
        "timed-out": (1, "FAILED"),
        "transient-then-permanent": (2, "FAILED"),
    }
    runs = task_runs(state.state_details.flow_run_id, set(expected))
    assert {name: (runs[name].run_count, runs[name].state.type.value) for name in expected} == expected
