"""The end-to-end flow with TensorFlow and Keras on the local default (Azurite, local folders, the process pool, 2
workers under horovodrun): the dry run names the framework's trainer, the run trains in sync, and the summary,
the receipt, the MLflow run and `trainflow runs` name the framework (the docker pool: test_train_flow_docker.py)."""

import json

import pytest

from flows.plan import plan_run
from flows.train_flow import train_flow
from tests.fakes.flow_runs import flow_config
from tests.integration.flows.test_tracking import mlflow_run
from tests.integration.flows.test_train_flow import artifacts_of, trainflow

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.mark.parametrize("framework, entry", [("tensorflow", "trainer/tf/loop.py"), ("keras", "trainer/tf/fit.py")])
def test_the_whole_flow_trains_with_the_framework_and_every_record_names_it(
    prefect_server, digits, tmp_path, framework, entry
):
    cfg = flow_config(tmp_path / "work", digits, training={"framework": framework, "workers": 2})
    planned = {row["step"]: row for row in plan_run(cfg)}["run-training"]["detail"]
    assert "horovodrun" in planned and f"/{entry} " in planned
    result = train_flow(cfg)
    metrics, receipt = result["metrics"], result["receipt"]
    assert (metrics["framework"], metrics["status"], metrics["world_size"]) == (framework, "complete", 2)
    assert metrics["parameters_in_sync"] and metrics["final_val_top1"] is not None
    assert result["framework"] == receipt["framework"] == framework
    folder = cfg.workdir / "runs" / result["run_id"]
    assert (folder / "model.keras").is_file() and result["results"]["blobs"][0].endswith("/model.keras")
    assert f"`resnet18` ({framework})" in artifacts_of(result["run_id"])["run-summary"].data
    client, run = mlflow_run(cfg.workdir, result["run_id"])
    assert run.data.tags["framework"] == run.data.params["training.framework"] == framework
    assert "model.keras" in {f.path for f in client.list_artifacts(run.info.run_id)}
    [row] = json.loads(trainflow("runs", "--workdir", str(cfg.workdir), "--json").stdout)
    assert (row["framework"], row["status"]) == (framework, "complete")
