"""The docs' pictures, taken from a real run and never made by hand:

    .venv/bin/python -m cli.screenshots [--workdir DIR] [--out docs/images]

It starts `trainflow ui` and `trainflow mlflow-ui` over the workdir (a temporary one unless --workdir), trains the
digits set as `make demo` does with `trainflow run` against that Prefect server, then opens each page in headless
Chromium (Debian's, driven by playwright) at a 1280x800 viewport and saves, in --out:

    prefect-flow-run-graph.png  the flow run's page in Prefect's UI: its task run graph
    prefect-artifacts.png       the flow run's Artifacts tab
    mlflow-run.png              the run's page in MLflow's UI: its metrics
    run-plot.svg                the plot the run writes into its folder (plot.svg), as it is

Every server and process it starts is stopped when it ends, also on Ctrl-C; their logs are in WORKDIR/screenshots/."""

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from urllib.request import Request, urlopen

import yaml

from infra.core.errors import TrainflowError
from infra.runs.record import RECORD, read_record
from infra.runs.tracking import TrackingConfig, run_page
from infra.services.chromium import CHROMIUM, CHROMIUM_ARGS
from infra.services.prefect_server import api_answers
from infra.services.supervise import free_port, running_service, spawn, stop

WIDTH, HEIGHT = 1280, 800  # the viewport: each picture is this size
GRAPH, ARTIFACTS, MLFLOW = "prefect-flow-run-graph.png", "prefect-artifacts.png", "mlflow-run.png"
SHOTS = (GRAPH, ARTIFACTS, MLFLOW)
PLOTS = {"plot.svg": "run-plot.svg"}  # the run folder's plots -> their names in --out
# The demo's own run: the digits recipe of flows/configs/demo.yaml (8 epochs, about 3 minutes), one thread a worker.
TRAINING = {"threads": 1}
TRAINFLOW = [sys.executable, "-m", "cli"]  # this checkout's trainflow, whichever is installed
STARTUP_S = 300  # a server's start-up on 2 busy cores (MLflow's: about 45 s)
PAGE_MS = 60_000  # a page's first content, the same


class ScreenshotError(TrainflowError):
    """The run or a server the screenshots need failed (a page that never shows its content: playwright says which)."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: parse the options, take the pictures, say where they are."""
    parser = argparse.ArgumentParser(
        prog="python -m cli.screenshots", description="The docs' pictures, from a real run."
    )
    parser.add_argument("--workdir", type=Path, help="the run's workdir (default: a temporary one, removed after)")
    parser.add_argument("--out", type=Path, default=Path("docs/images"), help="where the pictures go")
    parser.add_argument(
        "--steps", type=int, default=0, help="cap each epoch at this many steps: a quicker run (the script's test)"
    )
    parser.add_argument("--epochs", type=int, help="train this many epochs, not the demo's (the script's test)")
    args = parser.parse_args(argv)
    training = {**TRAINING, "steps_per_epoch": args.steps, **({"epochs": args.epochs} if args.epochs else {})}
    try:
        with workdir(args.workdir) as work:
            saved = take_pictures(work, args.out.resolve(), training)
    except KeyboardInterrupt:
        print("stopped (Ctrl-C); every server and process started is stopped", file=sys.stderr)
        sys.exit(130)  # as trainflow's commands end on Ctrl-C
    except ScreenshotError as exc:
        sys.exit(f"error: {exc}")
    for path in saved:
        print(path)


@contextmanager
def workdir(given: Path | None) -> Iterator[Path]:
    """The given workdir (made if missing), else a temporary one, removed after."""
    if given:
        given.mkdir(parents=True, exist_ok=True)
        yield given.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="trainflow-screenshots-") as folder:
        yield Path(folder)


def take_pictures(work: Path, out: Path, training: dict) -> list[Path]:
    """Serve both UIs over `work`, train into it with these `training` settings, and save every picture into `out`;
    their paths."""
    logs = work / "screenshots"
    logs.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    with (
        ui_server(work, logs, "ui", lambda base: api_answers(f"{base}/api")) as prefect,
        ui_server(work, logs, "mlflow-ui", lambda base: answers(f"{base}/health")) as mlflow,
    ):
        run = train(work, f"{prefect}/api", logs, training)
        flow_run = read_record(run)["flow_runs"][-1]  # the flow run that trained it, this command's
        photograph(prefect, flow_run, mlflow_page(mlflow, run.name), out)
    return [out / name for name in SHOTS] + copy_plots(run, out)


def clean_env() -> dict[str, str]:
    """This environment less Prefect's client settings: the servers started here are the ones to use."""
    drop = ("PREFECT_API_URL", "PREFECT_UI_API_URL", "PREFECT_HOME")
    return {k: v for k, v in os.environ.items() if k not in drop}


@contextmanager
def ui_server(work: Path, logs: Path, command: str, ready: Callable[[str], bool]) -> Iterator[str]:
    """`trainflow COMMAND` (ui, mlflow-ui) over `work` on a free port until the block ends, ready once `ready(base)`
    holds; its address."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [*TRAINFLOW, command, "--workdir", str(work), "--port", str(port)]
    with running_service(
        argv,
        logs / f"{command}.log",
        partial(ready, base),
        f"trainflow {command}",
        STARTUP_S,
        ScreenshotError,
        clean_env(),
    ):
        yield base


def answers(url: str) -> bool:
    """Whether `url` answers 200."""
    try:
        with urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def train(work: Path, api: str, logs: Path, training: dict) -> Path:
    """`trainflow run` of `training` on the digits set into `work`, against Prefect's API at `api`; its run folder."""
    config = logs / "run.yaml"
    config.write_text(yaml.safe_dump({"training": training}))
    command = [*TRAINFLOW, "run", "--config", str(config), "--workdir", str(work)]
    epochs = f"{training['epochs']} epochs" if "epochs" in training else "the demo's epochs"
    print(f"training the digits set for {epochs} (output in {logs / 'run.log'})", flush=True)
    with open(logs / "run.log", "wb") as log:
        # in a session of its own on a leash, as trainflow starts its services: stopped with all it started
        proc = spawn(command, stdout=log, stderr=log, env={**clean_env(), "PREFECT_API_URL": api})
        try:
            code = proc.wait()
        except BaseException:  # Ctrl-C: a SIGINT to its group, so the run ends as a user's Ctrl-C ends it
            stop(proc)
            raise
    if code:
        tail = (logs / "run.log").read_text(errors="replace")[-2000:]
        raise ScreenshotError(f"`trainflow run` exited with status {code}; its last output:\n{tail}")
    return newest_run(work / "runs")


def newest_run(runs: Path) -> Path:
    """The run folder whose record was written last: the run just made (a given workdir may hold older ones)."""
    return max(runs.glob(f"*/{RECORD}"), key=lambda record: record.stat().st_mtime).parent


def mlflow_page(base: str, run_id: str) -> str:
    """The page, in the MLflow UI at `base`, of the newest MLflow run of pipeline run `run_id`."""
    name = TrackingConfig().experiment  # the default's: the run's config sets no other
    experiment = call(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name={name}")["experiment"]
    query = {
        "experiment_ids": [experiment["experiment_id"]],
        "filter": f"tags.`trainflow.run_id` = '{run_id}'",
        "order_by": ["attributes.start_time DESC"],
        "max_results": 1,
    }
    [found] = call(f"{base}/api/2.0/mlflow/runs/search", query)["runs"]
    return run_page({"experiment_id": found["info"]["experiment_id"], "run_id": found["info"]["run_id"]}, base)


def call(url: str, body: dict | None = None) -> dict:
    """The JSON answer of MLflow's REST API at `url` (a POST of `body` if given)."""
    data = json.dumps(body).encode() if body is not None else None
    request = Request(url, data=data, headers={"Content-Type": "application/json"})
    with urlopen(request, timeout=30) as response:
        return json.load(response)


def copy_plots(run: Path, out: Path) -> list[Path]:
    """The run folder's plots, copied as they are into `out`; their paths."""
    for name, saved in PLOTS.items():
        shutil.copyfile(run / name, out / saved)
    return [out / saved for saved in PLOTS.values()]


# What a visitor's first visit to MLflow's UI would hold once they chose the training view and closed the assistant
# panel (MLflow 3 opens it, and the GenAI view, on a first visit): set before any page script reads them.
MLFLOW_CHOICES = """
localStorage.setItem("mlflow.workflowType_v1", '"machine_learning"');
localStorage.setItem("mlflow.assistant.panelOpen_v1", "false");
localStorage.setItem("mlflow.assistant.fab.autoOpenedOnFirstLoad_v1", "true");
"""


def photograph(prefect: str, flow_run: str, mlflow: str, out: Path) -> None:
    """Open each page in headless Chromium and save it, once it shows its content, into `out`."""
    from playwright.sync_api import sync_playwright  # a dev dependency (pyproject.toml)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": WIDTH, "height": HEIGHT}, device_scale_factor=1)
            context.add_init_script(MLFLOW_CHOICES)
            page = context.new_page()
            page.set_default_timeout(PAGE_MS)
            shoot_flow_run(page, f"{prefect}/v2/runs/flow-run/{flow_run}", out)
            shoot_mlflow_run(page, mlflow, out / MLFLOW)
        finally:
            browser.close()


def shoot_flow_run(page, url: str, out: Path) -> None:
    """The flow run's page (its graph, drawn on a canvas once the graph's data has come) and its Artifacts tab."""
    from playwright.sync_api import expect

    with page.expect_response(lambda response: "/graph-v2" in response.url and response.ok):
        page.goto(url)
    expect(page.locator("canvas").first).to_be_visible()
    expect(page.get_by_text("Completed").first).to_be_visible()
    steady_shot(page, out / GRAPH)
    tab = page.get_by_role("tab", name="Artifacts")
    tab.click()
    expect(page.get_by_text("run-summary").first).to_be_visible()
    tab.evaluate("tab => tab.scrollIntoView({block: 'start'})")  # the cards, below the graph, into the viewport
    steady_shot(page, out / ARTIFACTS)


def shoot_mlflow_run(page, url: str, out: Path) -> None:
    """The MLflow run's overview: its metrics table, once a per-epoch metric is in it."""
    from playwright.sync_api import expect

    page.goto(url)
    expect(page.get_by_text("val_top1", exact=True).first).to_be_visible()
    expect(page.get_by_text("Ask questions about your")).to_be_hidden()  # the assistant: MLFLOW_CHOICES still shut it
    steady_shot(page, out)


def steady_shot(page, path: Path, tries: int = 40) -> None:
    """Save the viewport as a PNG once two shots half a second apart are the same: a graph on a canvas and a table
    fill in after the data has come, and no element says when they are done."""
    shot = page.screenshot(animations="disabled")
    for _ in range(tries):
        page.wait_for_timeout(500)  # lets the page's events in (a sleep would hold them back)
        again = page.screenshot(animations="disabled")
        if again == shot:
            break
        shot = again
    path.write_bytes(shot)


if __name__ == "__main__":
    main()
