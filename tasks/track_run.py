"""Experiment tracking steps: open the pipeline run's MLflow run before training, close it after the report.

The engine logs into the run while it trains: `tracked_training` hands it the store and the run id as two
trainer options (infra/runs/tracking.py says where it can reach the store)."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.compute import backend_of
from infra.runs.record import RunSettings
from infra.runs.tracking import TrackingConfig, end_unfinished, engine_uri, finish_run, start_run, store_uri


class TrackedSettings(RunSettings, Protocol):
    """What tracking reads of a run's config: the run's settings and the tracking section."""

    @property
    def tracking(self) -> TrackingConfig: ...


@task(name="start-tracking", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def start_tracking_task(cfg: TrackedSettings, run_id: str, data: Path, scripts: str, image: str | None) -> dict | None:
    """Prefect step: the run's MLflow run (None with tracking.enabled false): the config as params, the data
    version, scripts version and image as tags."""
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


@task(name="finish-tracking", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def finish_tracking_task(tracked: dict | None, metrics: dict, model: Path) -> None:
    """Prefect step: the final numbers, the model (its file in the results folder) and the plot to the MLflow run,
    which ends."""
    if tracked:
        files = [p for p in (model, model.parent / "plot.svg") if p.exists()]
        finish_run(tracked, metrics, files, engine_logged=bool(tracked["engine_uri"]))


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
