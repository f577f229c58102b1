"""The `trainflow` command line. Most commands take --config FILE and --workdir DIR, those that read data --data DIR
(docs/reference/commands.md lists each command's options).

One module per group of commands: training.py (train, stage, run, smoke, deploy, build), services.py (ui,
mlflow-ui, and what a command holds while it runs), data.py (`trainflow data`), bench.py (`trainflow bench`) and
runs.py (`trainflow runs`), doctor.py (`trainflow doctor`), predict.py (`trainflow predict`); common.py holds what they
share."""

import sys

import typer

from cli.bench import bench_app
from cli.data import data_app
from cli.doctor import doctor
from cli.predict import predict
from cli.runs import runs_app
from cli.services import mlflow_ui, ui
from cli.training import build, deploy, run, smoke, stage, train

app = typer.Typer(
    help="Training of image classifiers on a cluster, end to end: data-parallel or pipeline-parallel.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(data_app, name="data")
app.add_typer(bench_app, name="bench")
app.add_typer(runs_app, name="runs")
for command in (train, stage, run, smoke, deploy, ui, mlflow_ui, build, doctor, predict):
    app.command()(command)


def main() -> None:
    """Entry point for `python -m cli`."""
    sys.exit(app())
