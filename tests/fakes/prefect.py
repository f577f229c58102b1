"""Prefect as the tests read it: a flow run's task runs from the API, and a client's environment for a server."""

import asyncio
import os
import time
from pathlib import Path
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.objects import TaskRun


def task_runs(flow_run_id, names: set[str], wait_s: float = 30) -> dict[str, TaskRun]:
    """The task runs of a flow run by task name, from the Prefect API (run_count: the attempts each made), once
    those of `names` are there in a final state: Prefect 3 records task runs from events, a moment after the flow
    returns."""

    async def read():
        async with get_client() as client:
            return await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(str(flow_run_id))])), limit=200
            )

    deadline = time.monotonic() + wait_s
    while True:
        runs = {run.name.rsplit("-", 1)[0]: run for run in asyncio.run(read())}
        if all(name in runs and runs[name].state and runs[name].state.is_final() for name in names):
            return runs
        assert time.monotonic() < deadline, f"task runs {names} of {flow_run_id} not final after {wait_s} s: {runs}"
        time.sleep(0.2)


def prefect_env(api: str, home: Path) -> dict[str, str]:
    """A client's environment: Prefect's API at `api`, its profile under `home`, tables wide enough to print names."""
    drop = ("PREFECT_API_URL", "PREFECT_UI_API_URL", "PREFECT_HOME")
    return {
        **{k: v for k, v in os.environ.items() if k not in drop},
        "PREFECT_API_URL": api,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "COLUMNS": "250",
    }
