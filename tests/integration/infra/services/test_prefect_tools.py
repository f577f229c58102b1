"""Prefect's own tools against the servers trainflow starts: Prefect's CLI against the API a trainflow command starts
(infra/services/prefect_server.py), and every page a user opens in the UI of `trainflow ui` on a port other than
4200, in headless Chromium, with every API response recorded: any 4xx or 5xx, or a call to another port, fails.

Both servers hold real data: a flow run with two tasks, their logs, an artifact and a Secret block (a small flow run
against the server), and the train-flow's deployment made by `trainflow deploy`."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from infra.services.prefect_server import api_answers, running_prefect_server
from infra.services.supervise import free_port, running_service
from tests.fakes.browser import CHROMIUM, CHROMIUM_ARGS, ApiWatch
from tests.fakes.paths import BIN
from tests.fakes.prefect import prefect_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
RUN, ARTIFACT, LOG_LINE = "tools-check-run", "tools-check-report", "counted 42 images"
FLOW = f"""
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.blocks.system import Secret
from prefect.runtime import flow_run


@task
def count_images(n: int) -> int:
    get_run_logger().info("counted %d images", n)
    return n


@task
def write_report(n: int) -> None:
    create_markdown_artifact(f"# {{n}} images counted", key="{ARTIFACT}")


@flow(name="tools-check", flow_run_name="{RUN}")
def tools_check() -> str:
    write_report(count_images(42))
    return flow_run.get_id()


Secret(value="not-a-real-secret").save("tools-check-secret", overwrite=True)
print(tools_check())
"""


def record_a_run_and_a_deployment(api: str, tmp_path: Path) -> str:
    """Run the small flow and `trainflow deploy` against `api` side by side; the flow run's id."""
    env = prefect_env(api, tmp_path / "client")
    (tmp_path / "flow.py").write_text(FLOW)
    with open(tmp_path / "flow.log", "w") as log:
        run = subprocess.Popen(
            [sys.executable, str(tmp_path / "flow.py")], env=env, stdout=subprocess.PIPE, stderr=log, text=True
        )
        deploy = subprocess.run(
            [
                str(BIN / "trainflow"),
                "deploy",
                "--data",
                "synthetic",
                "--workdir",
                str(tmp_path / "w"),
                "--name",
                "tools-check",
                "--cron",
                "0 2 * * *",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        run_id = run.communicate(timeout=120)[0].strip()
    assert run.returncode == 0, (tmp_path / "flow.log").read_text()
    assert deploy.returncode == 0, deploy.stdout + deploy.stderr
    return run_id


def prefect_cli(api: str, home: Path, *args: str) -> str:
    """`prefect ARGS` against `api`; its output, after checking it exited 0."""
    done = subprocess.run(
        [str(BIN / "prefect"), *args], env=prefect_env(api, home), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"prefect {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


def test_prefects_cli_against_the_server_a_trainflow_command_starts(tmp_path):
    with running_prefect_server(tmp_path / "prefect") as api:
        run_id = record_a_run_and_a_deployment(api, tmp_path)
        prefect_cli(api, tmp_path / "client", "work-pool", "create", "tools-check-pool", "--type", "process")
        expected = {
            ("artifact", "ls"): [ARTIFACT],
            ("flow", "ls"): ["tools-check", "train-flow"],
            ("flow-run", "ls"): [RUN],
            ("flow-run", "logs", run_id): [LOG_LINE],
            ("deployment", "ls"): ["train-flow/tools-check"],
            ("work-pool", "ls"): ["tools-check-pool"],
            ("block", "ls"): ["tools-check-secret"],
        }
        with ThreadPoolExecutor(4) as pool:  # one at a time they take half a minute on 2 cores
            outs = dict(zip(expected, pool.map(lambda args: prefect_cli(api, tmp_path / "client", *args), expected)))
    for args, words in expected.items():
        assert all(word in outs[args] for word in words), f"prefect {' '.join(args)} lacks {words}:\n{outs[args]}"


def task_run_id(api: str, run_id: str, name: str) -> str:
    """The id of flow run `run_id`'s task run whose name starts with `name`."""
    runs = requests.post(f"{api}/task_runs/filter", json={"flow_runs": {"id": {"any_": [run_id]}}}, timeout=10).json()
    return next(r["id"] for r in runs if r["name"].startswith(name))


def browse(playwright, base: str, port: int, run_id: str, task_id: str, profile: Path) -> ApiWatch:
    """Open every page a user opens, as a user does, checking what each shows; what the API answered them."""
    from playwright.sync_api import expect

    browser = playwright.chromium.launch_persistent_context(
        str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
    )
    page = browser.new_page()
    watch = ApiWatch(page, port)

    def shows(*texts: str) -> None:  # the page shows what the API answered, and every call it made was answered
        try:
            for text in texts:
                expect(page.get_by_text(text).first).to_be_visible(timeout=30_000)
        finally:
            watch.settle()
            assert not watch.problems, f"{page.url}:\n" + "\n".join(watch.problems)

    for path, texts in (
        ("/", ("Flow Runs", "Task Runs", "Completed")),  # the dashboard of Prefect's default (v2) UI
        ("/v2/runs", (RUN, "tools-check")),
        (f"/v2/runs/flow-run/{run_id}", (RUN, LOG_LINE)),  # its graph above the Logs tab
        (f"/v2/runs/task-run/{task_id}", ("count_images", LOG_LINE)),
        ("/v2/deployments", ("tools-check", "train-flow")),
    ):
        page.goto(base + path)
        shows(*texts)
        if "/flow-run/" in path:
            expect(page.locator("canvas").first).to_be_visible()  # the graph is drawn on a canvas
            page.get_by_role("tab", name="Artifacts").click()
            shows(ARTIFACT)
    browser.close()
    return watch


def test_every_ui_page_a_user_opens_on_a_port_other_than_4200(tmp_path):
    from playwright.sync_api import sync_playwright

    port = free_port()
    base, api = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_API_URL", "PREFECT_HOME")}
    ui = [str(BIN / "trainflow"), "ui", "--workdir", str(tmp_path / "work"), "--port", str(port)]
    with (
        running_service(ui, tmp_path / "ui.log", lambda: api_answers(api), "trainflow ui", 120, env=env),
        sync_playwright() as playwright,
    ):
        run_id = record_a_run_and_a_deployment(api, tmp_path)
        watch = browse(playwright, base, port, run_id, task_run_id(api, run_id, "count_images"), tmp_path / "chromium")
    answered = {path for status, path in watch.seen if status == 200}
    assert {
        "/ui-settings",
        f"/api/flow_runs/{run_id}/graph-v2",
        "/api/logs/filter",
        "/api/artifacts/filter",
        "/api/deployments/filter",
    } <= answered, answered
