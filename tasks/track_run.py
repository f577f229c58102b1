"""The run's bookkeeping steps: open the pipeline run's MLflow run before training, record what the run cost over
every attempt (record-cost) before its results are copied, and close the MLflow run after the report.

The engine logs into the run while it trains: `tracked_training` hands it the store and the run id as two
trainer options (infra/runs/tracking.py says where it can reach the store)."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol
from uuid import UUID

from prefect import get_client, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.sorting import TaskRunSort

from infra.compute import backend_of
from infra.core.jsonfiles import read_json
from infra.engines import TrainingConfig
from infra.engines.program import Program
from infra.engines.script import OUTPUTS, SUMMARY, ScriptConfig, ScriptProgram
from infra.runs.attempts import read_attempts
from infra.runs.ledger import LEDGER, LedgerSettings, cost_basis, estimate_key, ledger_summary, record_ledger
from infra.runs.lineage import GUIDE, RECEIPT
from infra.runs.record import RunSettings, read_record
from infra.runs.tracking import (
    TrackingConfig,
    end_killed,
    end_unfinished,
    engine_uri,
    finish_run,
    start_run,
    store_uri,
)


class TrackedSettings(RunSettings, Protocol):
    """What tracking reads of a run's config: the run's settings and the tracking section."""

    @property
    def tracking(self) -> TrackingConfig: ...


@task(name="start-tracking", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def start_tracking_task(cfg: TrackedSettings, run_id: str, data: Path, scripts: str, image: str | None) -> dict | None:
    """Prefect step: the run's MLflow run (None with tracking.enabled false): the config as params, the data
    version, scripts version and image as tags. The runs of its killed attempts (a resumed run) end KILLED."""
    if not cfg.tracking.enabled:
        return None
    tags = {
        "trainflow.run_id": run_id,
        "data_version": str(data),
        "scripts_version": scripts,
        "image": image or "none (process pool)",
        "dataset": cfg.dataset_name(),
        "framework": cfg.training.framework,
    }
    end_killed(store_uri(cfg.tracking, cfg.workdir), cfg.tracking.experiment, run_id)  # a killed attempt's run
    tracked = start_run(cfg.tracking, cfg.workdir, run_id, cfg.model_dump(mode="json"), tags)
    engine = engine_tracking(cfg, tracked["run_id"])
    assert engine is not None  # None only with tracking.enabled false, returned above
    return {**tracked, **engine}


def engine_tracking(cfg: TrackedSettings, mlflow_run_id: str) -> dict | None:
    """What the engine is told about tracking (None with tracking.enabled false): the URI it logs to ("" where it
    cannot reach the store) and the MLflow run; the step and the dry run share it."""
    if not cfg.tracking.enabled:
        return None
    return {
        "engine_uri": engine_uri(store_uri(cfg.tracking, cfg.workdir), backend_of(cfg.pool).needs_image),
        "run_id": mlflow_run_id,
    }


def tracked_training(training, tracked: dict | None):
    """The training settings with the engine logging into the tracked run (unchanged without tracking)."""
    if not tracked or not tracked["engine_uri"]:
        return training
    return training.model_copy(update={"tracking_uri": tracked["engine_uri"], "tracking_run_id": tracked["run_id"]})


class ProgramSettings(Protocol):
    """What the program of a run is made from: its training section and, for a user's script, its script section."""

    @property
    def training(self) -> TrainingConfig: ...

    @property
    def script(self) -> ScriptConfig | None: ...

    @property
    def workdir(self) -> Path: ...


def program_of(cfg: ProgramSettings, run_id: str, tracked: dict | None) -> Program:
    """The program the run executes (infra/engines/program.py), logging into the tracked MLflow run: the user's
    script where the config names one, else trainflow's trainer."""
    if cfg.script is not None:  # what the environment lacks of its requirements goes under the workdir, once
        return ScriptProgram(cfg.script, cfg.training, run_id, tracked, cfg.workdir / "envs")
    return tracked_training(cfg.training, tracked)


def step_durations(flow_runs: list[str]) -> dict[str, float]:
    """Seconds each task of these flow runs took, by task name, summed over the flow runs (from the Prefect API;
    a task a killed flow run left running counts nothing)."""
    ids = [UUID(run) for run in flow_runs if run != "local"]  # "local": a walk outside a flow run
    if not ids:
        return {}
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
            limit=200,
        )
    durations: dict[str, float] = {}
    for run in runs:
        name = run.name.rsplit("-", 1)[0]
        durations[name] = durations.get(name, 0.0) + run.total_run_time.total_seconds()
    return durations


@task(name="record-cost", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def record_cost_task(cfg: LedgerSettings, out: Path, device: str, backend_attempts: list[dict]) -> dict:
    """Prefect step: the run's ledger (ledger.json) over every flow run that worked on it and every attempt at its
    training, a killed one's up to its death (infra/runs/attempts.py); `device`: where the trainer ran."""
    durations = step_durations(read_record(out).get("flow_runs", []))
    basis = cost_basis(cfg, device)
    return record_ledger(out, basis, durations, backend_attempts, estimate_key(cfg), read_attempts(out))


@task(name="finish-tracking", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def finish_tracking_task(tracked: dict | None, metrics: dict, out: Path, model_file: str | None) -> None:
    """Prefect step: the final numbers and the cost over every attempt (the ledger's summary), the model (its file
    in the results folder `out`, where the program writes one), a script's summary and outputs, the plot, the
    ledger, the receipt and the folder's README to the MLflow run, which ends."""
    if tracked:
        names = (model_file or "", SUMMARY, OUTPUTS, "plot.svg", LEDGER, RECEIPT, GUIDE)
        files = [out / name for name in names if name and (out / name).exists()]
        finish_run(tracked, {**metrics, **cost_metrics(read_json(out / LEDGER))}, files, bool(tracked["engine_uri"]))


def cost_metrics(ledger: dict) -> dict:
    """The ledger's summary as MLflow metrics: numbers only, the attempts as their count."""
    summary = ledger_summary(ledger)
    return {**summary, "attempts": len(summary.get("attempts", []))}


@contextmanager
def ended_if_unfinished(tracked: dict | None) -> Iterator[None]:
    """The `tracked` MLflow run ends FAILED if the block raises (KILLED on Ctrl-C), instead of staying RUNNING; after
    a block that ends well it stays open for finish-tracking."""
    try:
        yield
    except BaseException as exc:
        if tracked:
            end_unfinished(tracked, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
