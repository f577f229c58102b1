"""MLflow, the experiment tracker: one MLflow run per pipeline run, in a real tracking store.

Locally the store is SQLite under the workdir (mlflow/mlflow.db, artifacts under mlflow/artifacts), which
`trainflow mlflow-ui` serves. With tracking.uri set, any MLflow tracking URI: an Azure ML workspace's
(`az ml workspace show --query mlflow_tracking_uri`; its azureml:// scheme needs the azureml-mlflow package in the
orchestrator and the image, which neither installs: not tested here), or an MLflow server's http(s):// address.

The flow makes the run (the config as params; data, scripts and image versions as tags); the engine logs its
per-step and per-epoch metrics into it while it trains (containers/trainer/tracking.py) wherever it can reach the
store; the flow adds the model, the plot and the final numbers, and ends the run. A full disk under the local
store ends the step in one line naming it (infra/core/diskspace.py).
"""

import logging
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from infra.core.diskspace import writing
from trainer.tracking import epoch_metrics

PARAMS_PER_CALL = 100  # MLflow's limit on the params of one log_batch
UI_PORT = 5000  # MLflow's own default
# The run's final numbers, as MLflow metrics (named apart from the per-step and per-epoch ones) <- metrics.json,
# and its cost over every attempt <- the ledger's summary (tasks/track_run.py's cost_metrics)
FINAL = {
    "final_val_top1": "final_val_top1",
    "final_val_top5": "final_val_top5",
    "final_images_per_sec": "images_per_sec",
    "final_steady_images_per_sec": "steady_images_per_sec",
    "wall_seconds": "wall_seconds",
    **{key: key for key in ("training_seconds", "attempts", "node_hours", "gpu_hours", "cost", "lost_gpu_hours")},
}


class TrackingConfig(BaseModel):
    """Experiment tracking in MLflow."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    enabled: bool = True
    """One MLflow run per pipeline run, the engine logging into it while it trains."""
    uri: str = ""
    """MLflow tracking URI; empty: the SQLite store under the workdir (mlflow/mlflow.db)."""
    experiment: str = "trainflow"
    """The MLflow experiment the runs are filed under."""


def store_uri(cfg: TrackingConfig, workdir: Path) -> str:
    """The tracking URI: the configured one, or the workdir's SQLite store."""
    return cfg.uri or f"sqlite:///{store_folder(workdir) / 'mlflow.db'}"


def store_folder(workdir: Path) -> Path:
    """Where the local store keeps its database and artifacts."""
    return workdir / "mlflow"


def engine_uri(uri: str, in_image: bool) -> str:
    """The URI the engine logs to: a SQLite file is reached only by an engine running on this machine's Python (the
    images carry mlflow-skinny, without SQL stores, and see other paths); "" where it cannot (the flow then logs the
    per-epoch metrics after the job)."""
    return "" if in_image and uri.startswith("sqlite:") else uri


def client(uri: str):
    """An MLflow client of the store at `uri`."""
    from mlflow import MlflowClient

    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # its "Creating initial ... tables" lines

    return MlflowClient(uri)


def experiment_id(mlflow, name: str, artifacts: Path | None) -> str:
    """The id of experiment `name`, made (its artifacts under `artifacts`, if given) when missing."""
    found = mlflow.get_experiment_by_name(name)
    if found:
        return found.experiment_id
    if artifacts:
        artifacts.mkdir(parents=True, exist_ok=True)
    return mlflow.create_experiment(name, artifact_location=artifacts.as_uri() if artifacts else None)


def flat(values: dict, prefix: str = "") -> dict[str, str]:
    """A nested mapping as dotted keys ("training.epochs") with text values."""
    out = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


def store_writes(uri: str) -> AbstractContextManager:
    """A full disk under the local SQLite store (its database, its artifacts) as one line naming the store."""
    return writing(Path(uri.removeprefix("sqlite:///")).parent) if uri.startswith("sqlite:///") else nullcontext()


def start_run(cfg: TrackingConfig, workdir: Path, name: str, params: dict, tags: dict[str, str]) -> dict:
    """A new MLflow run named `name` with `params` (nested, flattened) and `tags`: {uri, experiment_id, run_id}."""
    uri = store_uri(cfg, workdir)
    with store_writes(uri):
        return new_run(cfg, workdir, uri, name, params, tags)


def new_run(cfg: TrackingConfig, workdir: Path, uri: str, name: str, params: dict, tags: dict[str, str]) -> dict:
    """start_run's MLflow calls."""
    from mlflow.entities import Param

    mlflow = client(uri)
    experiment = experiment_id(mlflow, cfg.experiment, None if cfg.uri else store_folder(workdir) / "artifacts")
    run_id = mlflow.create_run(experiment, run_name=name, tags=tags).info.run_id
    items = [Param(k, v) for k, v in flat(params).items()]
    for at in range(0, len(items), PARAMS_PER_CALL):
        mlflow.log_batch(run_id, params=items[at : at + PARAMS_PER_CALL])
    return {"uri": uri, "experiment_id": experiment, "run_id": run_id}


MLFLOW_BATCH = 1000  # the most metrics one log_batch call takes (MLflow's REST API limit)


def finish_run(tracked: dict, metrics: dict, files: list[Path], engine_logged: bool) -> None:
    """Log the final numbers, the epochs (unless the engine logged them while it trained), a script's series (the
    metrics read from its lines and TensorBoard files, each value at its step) and `files` as artifacts; end the
    run."""
    with store_writes(tracked["uri"]):
        log_results(tracked, metrics, files, engine_logged)


def log_results(tracked: dict, metrics: dict, files: list[Path], engine_logged: bool) -> None:
    """finish_run's MLflow calls."""
    from mlflow.entities import Metric

    mlflow, run_id, step = client(tracked["uri"]), tracked["run_id"], metrics.get("global_step", 0)
    rows = [] if engine_logged else [(row["step"], epoch_metrics(row)) for row in metrics.get("epochs", [])]
    rows.append((step, {name: metrics.get(key) for name, key in FINAL.items()}))
    rows += [(at, {name: value}) for name, series in metrics.get("series", {}).items() for at, value in series]
    now = int(time.time() * 1000)
    batch = [
        Metric(key, float(value), now, at)
        for at, values in rows
        for key, value in values.items()
        if isinstance(value, (int, float))
    ]
    for start in range(0, len(batch), MLFLOW_BATCH):
        mlflow.log_batch(run_id, metrics=batch[start : start + MLFLOW_BATCH])
    for path in files:
        if path.is_dir():  # a script's outputs/, whole
            mlflow.log_artifacts(run_id, str(path), path.name)
        else:
            mlflow.log_artifact(run_id, str(path))
    mlflow.set_terminated(run_id, "FINISHED")


def end_unfinished(tracked: dict, status: str) -> None:
    """End the MLflow run as FAILED or KILLED (the flow failed or was interrupted before finish-tracking); a store
    that cannot be reached is only logged, so that the flow's own error is the one reported."""
    try:
        client(tracked["uri"]).set_terminated(tracked["run_id"], status)
    except Exception as exc:
        logging.getLogger(__name__).warning("could not mark MLflow run %s %s: %s", tracked["run_id"], status, exc)


def end_killed(uri: str, experiment: str, name: str) -> None:
    """End as KILLED the MLflow runs of pipeline run `name` that still say RUNNING: a process killed outright could
    not end them (a re-run that resumes the pipeline run makes a new one)."""
    mlflow = client(uri)
    found = mlflow.get_experiment_by_name(experiment)
    query = f"tags.`trainflow.run_id` = '{name}' and attributes.status = 'RUNNING'"
    for run in mlflow.search_runs([found.experiment_id], query) if found else []:
        mlflow.set_terminated(run.info.run_id, "KILLED")


def local_ui(port: int = UI_PORT) -> str:
    """Where `trainflow mlflow-ui` serves MLflow's UI."""
    return f"http://127.0.0.1:{port}"


def run_page(tracked: dict, ui: str) -> str:
    """The run's page in an MLflow UI at `ui`."""
    return f"{ui}/#/experiments/{tracked['experiment_id']}/runs/{tracked['run_id']}"


def ui_command(python: str, uri: str, workdir: Path, port: int) -> list[str]:
    """MLflow's UI and API on 127.0.0.1:`port`, serving the store at `uri` (artifacts as the experiments say)."""
    return [
        python,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--default-artifact-root",
        (store_folder(workdir) / "artifacts").as_uri(),
    ]
