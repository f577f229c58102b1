"""Deployments as a user runs them: `trainflow ui` serves the Prefect server and UI, `trainflow deploy --serve`
registers a scheduled deployment and runs what comes, and both the schedule and the client start runs."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests
from prefect.states import Cancelling

from infra.services.supervise import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]
TRAINFLOW = str(Path(sys.executable).parent / "trainflow")
TINY = """training:
  model: resnet18
  epochs: 1
  steps_per_epoch: 3
  batch_size: 8
  image_size: 32
  hflip: false
  loader_workers: 0
  threads: 1
  warmup_epochs: 0
"""


def start(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [TRAINFLOW, *args], env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def wait_for(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(2)
    raise AssertionError(f"timed out waiting for {what}")


def healthy(url: str) -> bool:
    try:
        return requests.get(f"{url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


async def finished_runs(api: str, name: str) -> list:
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName, FlowRunFilter, TaskRunFilter
    from prefect.client.schemas.sorting import FlowRunSort

    async with PrefectClient(api=api) as client:
        # TaskRunFilter(): runs that started tasks, not those the scheduler plans ahead
        return await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(),
            task_run_filter=TaskRunFilter(),
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
            limit=20,
            offset=0,
        )


async def deployment_and_manual_run(api: str, name: str):
    from prefect.client.orchestration import PrefectClient

    async with PrefectClient(api=api) as client:
        deployment = await client.read_deployment_by_name(f"train-flow/{name}")
        run = await client.create_flow_run_from_deployment(deployment.id)
        return deployment, run


def test_ui_deploy_schedule_client_runs_and_a_cancelled_run(tmp_path, digits):
    port, work = free_port(), tmp_path / "work"
    api = f"http://127.0.0.1:{port}/api"
    (tmp_path / "tiny.yaml").write_text(TINY)
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5"}
    env.pop("PREFECT_HOME", None)
    ui = start(["ui", "--workdir", str(work), "--port", str(port)], env, tmp_path / "ui.log")
    served = None
    try:
        wait_for(lambda: healthy(api), 120, "the Prefect server")
        assert "<html" in requests.get(f"http://127.0.0.1:{port}/", timeout=10).text.lower()
        served = start(
            [
                "deploy",
                "--config",
                str(tmp_path / "tiny.yaml"),
                "--data",
                str(digits),
                "--workdir",
                str(work),
                "--name",
                "every-minute",
                "--cron",
                "* * * * *",
                "--serve",
            ],
            env,
            tmp_path / "serve.log",
        )
        deployment, manual = wait_for(lambda: try_run(api), 120, "the deployment")
        assert deployment.schedules and deployment.schedules[0].schedule.cron == "* * * * *"
        runs = wait_for(lambda: completed(api, manual.id), 420, "a scheduled and a manual run to complete")
        assert any(r.auto_scheduled for r in runs) and any(r.id == manual.id for r in runs)
        spans = sorted((r.start_time, r.end_time) for r in runs)
        assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), spans  # one at a time
        cancel_a_training_run(api, deployment, work)
    finally:
        for proc in (served, ui):
            if proc:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)


async def pause_and_clear(api: str, deployment_id) -> None:
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    async with PrefectClient(api=api) as client:
        await client.pause_deployment(deployment_id)
        due = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
            ),
        )
        for run in due:
            await client.delete_flow_run(run.id)


def cancel_a_training_run(api: str, deployment, work: Path) -> None:
    """Pause the schedule and delete its runs not yet started (the UI's toggle and Delete), start a long run, cancel
    it (as the UI's Cancel button does) once its workers train: they stop, the pool goes. On a loaded machine a run
    takes longer than the cron's minute: the runs due meanwhile, older than the long one, would come first."""
    asyncio.run(pause_and_clear(api, deployment.id))
    cfg = {**deployment.parameters["cfg"]}
    cfg["training"] = {**cfg["training"], "epochs": 100, "steps_per_epoch": 0}
    run = asyncio.run(client_call(api, "create_flow_run_from_deployment", deployment.id, parameters={"cfg": cfg}))
    wait_for(lambda: workers_of(run.id), 300, "the long run's workers")  # after the scheduled run that is running
    asyncio.run(client_call(api, "set_flow_run_state", run.id, Cancelling(), force=True))
    state = wait_for(lambda: final_state(api, run.id), 120, "the run to be cancelled")
    assert state.is_cancelled(), state
    wait_for(lambda: not workers_of(run.id), 30, "the workers to stop")
    assert not (work / "pools" / str(run.id)).exists()


async def client_call(api: str, method: str, *args, **kwargs):
    from prefect.client.orchestration import PrefectClient

    async with PrefectClient(api=api) as client:
        return await getattr(client, method)(*args, **kwargs)


def workers_of(run_id) -> list[psutil.Process]:
    """The training processes of a flow run (their --out is runs/<run id>)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if any(a.endswith("train.py") for a in argv) and any(a.endswith(f"runs/{run_id}") for a in argv):
            found.append(proc)
    return found


def final_state(api: str, run_id):
    state = asyncio.run(client_call(api, "read_flow_run", run_id)).state
    return state if state and state.is_final() else None


def try_run(api: str):
    try:
        return asyncio.run(deployment_and_manual_run(api, "every-minute"))
    except Exception:  # not registered yet
        return None


def completed(api: str, manual_id) -> list | None:
    runs = [r for r in asyncio.run(finished_runs(api, "every-minute")) if r.state and r.state.is_completed()]
    failed = [r for r in asyncio.run(finished_runs(api, "every-minute")) if r.state and r.state.is_failed()]
    assert not failed, f"a run failed: {failed[0].state.message}"
    done = any(r.auto_scheduled for r in runs) and any(r.id == manual_id for r in runs)
    return runs if done else None
