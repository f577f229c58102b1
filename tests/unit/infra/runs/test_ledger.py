"""The cost ledger's arithmetic, the price table, the estimate before a run and the budget check."""

import pytest

from flows.config import ConfigError, load_config
from infra.compute import backend_of
from infra.core.errors import BadInput
from infra.core.jsonfiles import write_json
from infra.runs.ledger import (
    LEDGER,
    CostConfig,
    NodePrice,
    check_budget,
    cost_basis,
    estimate,
    estimate_key,
    ledger_lines,
    make_ledger,
    node_price,
)
from infra.runs.record import RECORD
from tasks.train_on_pool import run_training_task
from tests.fakes.paths import REPO

AZURE = REPO / "flows" / "configs" / "azure.yaml"  # 2 nodes of Standard_ND96asr_v4, 48 h timeout, 3 attempts


def azure(tmp_path, **overrides):
    return load_config(AZURE, {"workdir": tmp_path, **overrides}, environ={})


def test_a_price_is_looked_up_by_vm_size_and_priority():
    cost = CostConfig(prices={"Standard_X8": NodePrice(gpus=8, dedicated=10.0, low_priority=2.5)})
    assert node_price(cost, "Standard_X8") == (10.0, 8)
    assert node_price(cost, "standard_x8", low_priority=True) == (2.5, 8)  # Azure's sizes are case-insensitive
    assert node_price(cost, "Standard_Unknown") == (None, None)  # money unknown, not made up
    assert node_price(cost, None) == (0.0, None)  # not a priced machine


def test_prices_given_in_the_config_are_added_to_the_defaults(tmp_path):
    prices = {"Standard_X8": {"gpus": 8, "dedicated": 10, "low_priority": 2}}
    cfg = load_config(None, {"workdir": tmp_path, "cost": {"prices": prices}}, environ={})
    assert {"Standard_X8", "Standard_ND96asr_v4"} <= set(cfg.cost.prices)


def test_the_ledger_counts_pool_steps_on_the_pool_and_the_rest_on_one_orchestrator_node():
    basis = {
        "nodes": 2,
        "gpus_per_node": 8,
        "price_per_node_hour": 10.0,
        "priced_nodes": None,
        "orchestrator_price": 1.0,
        "currency": "EUR",
        "pool_steps": ["run-training"],
    }
    attempts = [{"ended": "Failed", "gpu_hours": 1.5}, {"ended": "Completed", "gpu_hours": 4.0}]
    ledger = make_ledger(basis, {"upload-scripts": 36.0, "run-training": 1800.0}, attempts)
    scripts, training = ledger["steps"]
    assert scripts == {
        "step": "upload-scripts",
        "seconds": 36.0,
        "nodes": 1,
        "node_seconds": 36.0,
        "gpu_hours": 0.0,
        "cost": 0.01,
    }
    assert training == {
        "step": "run-training",
        "seconds": 1800.0,
        "nodes": 2,
        "node_seconds": 3600.0,
        "gpu_hours": 8.0,
        "cost": 10.0,
    }
    assert ledger["total"] == {"seconds": 1836.0, "node_seconds": 3636.0, "gpu_hours": 8.0, "cost": 10.01}
    assert ledger["lost_gpu_hours"] == 1.5 and ledger["currency"] == "EUR"
    text = "\n".join(ledger_lines(ledger))
    assert "| run-training | 2 | 3600.0 | 8.0000 | 10.00 EUR |" in text and "attempts: 1.5000" in text


def test_training_counts_every_attempt_and_those_that_did_not_complete_are_lost():
    basis = {
        "nodes": 2,
        "gpus_per_node": 4,
        "price_per_node_hour": 10.0,
        "priced_nodes": None,
        "orchestrator_price": 0.0,
        "currency": "USD",
        "pool_steps": ["run-training"],
    }
    tries = [  # killed outright (counted to its last heartbeat), then resumed by a re-run
        {"attempt": 1, "flow_run": "f1", "ended": "killed", "seconds": 900.0},
        {"attempt": 2, "flow_run": "f2", "ended": "completed", "seconds": 2700.0},
    ]
    backend = [{"ended": "Failed", "gpu_hours": 0.5}]  # a pre-empted Azure ML attempt of the last try
    ledger = make_ledger(basis, {"upload-scripts": 10.0, "run-training": 0.0}, backend, tries)
    training = {row["step"]: row for row in ledger["steps"]}["run-training"]
    assert (training["seconds"], training["node_seconds"], training["gpu_hours"], training["cost"]) == (
        3600.0,
        7200.0,
        8.0,
        20.0,
    )
    assert ledger["attempts"][0] == {
        "attempt": 1,
        "flow_run": "f1",
        "ended": "killed",
        "seconds": 900.0,
        "nodes": 2,
        "node_seconds": 1800.0,
        "gpu_hours": 2.0,
        "cost": 5.0,
    }
    assert ledger["lost_gpu_hours"] == 2.5 and ledger["total"]["seconds"] == 3610.0
    text = "\n".join(ledger_lines(ledger))
    assert "| 1 | killed | 900.0 | 1800.0 | 2.0000 | 5.00 USD |" in text
    assert "| 2 | completed | 2700.0 | 5400.0 | 6.0000 | 15.00 USD |" in text
    one = make_ledger(basis, {"run-training": 5.0}, [], tries[1:])
    assert "attempt at training" not in "\n".join(ledger_lines(one))  # one attempt that completed: no table


def test_a_step_without_a_price_has_no_money_and_neither_has_the_total():
    basis = {
        "nodes": 1,
        "gpus_per_node": 0,
        "price_per_node_hour": None,
        "priced_nodes": None,
        "orchestrator_price": 0.0,
        "currency": "USD",
        "pool_steps": ["run-training"],
    }
    ledger = make_ledger(basis, {"run-training": 60.0}, [])
    assert ledger["steps"][0]["cost"] is None and ledger["total"]["cost"] is None
    assert "n/a (no price)" in "\n".join(ledger_lines(ledger))


def test_the_azureml_pool_is_priced_at_its_vm_size_with_its_gpus(tmp_path):
    basis = cost_basis(azure(tmp_path))
    assert (basis["nodes"], basis["gpus_per_node"], basis["price_per_node_hour"]) == (2, 8, 27.20)
    assert basis["pool_steps"] == ["run-training", "sync-to-file-server"]  # the sync job runs on the cluster
    assert cost_basis(azure(tmp_path, pool={"low_priority": True}))["price_per_node_hour"] == 5.44


def test_a_local_pool_is_one_priced_machine_with_the_gpus_its_workers_used(tmp_path):
    cfg = load_config(
        None,
        {
            "workdir": tmp_path,
            "cost": {"this_machine": "Standard_NC24ads_A100_v4"},
            "pool": {"backend": "docker", "nodes": 2, "slots_per_node": 1},
        },
        environ={},
    )
    on_gpus, on_cpu = cost_basis(cfg, "cuda:0"), cost_basis(cfg, "cpu")
    assert (on_gpus["nodes"], on_gpus["priced_nodes"], on_gpus["gpus_per_node"]) == (2, 1, 1)
    assert on_cpu["gpus_per_node"] == 0 and on_cpu["orchestrator_price"] == on_cpu["price_per_node_hour"] == 3.67
    ledger = make_ledger(on_gpus, {"run-training": 3600.0}, [])
    assert ledger["steps"][0]["cost"] == 3.67 and ledger["steps"][0]["node_seconds"] == 7200.0


def test_the_worst_case_is_nodes_price_timeout_and_attempts(tmp_path):
    found = estimate(azure(tmp_path))
    assert found["cost"] == pytest.approx(2 * 27.20 * 48 * 3)  # 2 nodes, 48 h, 3 attempts
    assert "job.timeout_s 172800 s x 3 attempt(s)" in found["how"]


def test_the_local_worst_case_counts_the_training_steps_one_retry():
    assert backend_of(load_config(None, {}, environ={}).pool).billing(None)[2] == run_training_task.retries + 1


def test_a_measured_earlier_run_with_the_same_settings_sets_the_estimate(tmp_path):
    cfg = azure(tmp_path)
    folder = tmp_path / "runs" / "earlier"
    measured = [{"step": "run-training", "seconds": 900}]
    write_json(folder / LEDGER, {"estimate_key": estimate_key(cfg), "steps": measured})
    write_json(folder / RECORD, {"status": "complete"})
    found = estimate(cfg)
    assert found["cost"] == pytest.approx(2 * 27.20 * 0.25) and "run earlier's measured training time" in found["how"]
    assert estimate_key(azure(tmp_path, pool={"nodes": 1}, training={"workers": 8})) != estimate_key(cfg)
    write_json(folder / RECORD, {"status": "failed"})  # a failed run measured nothing whole
    assert "worst case" in estimate(cfg)["how"]


def test_a_budget_below_the_estimate_is_refused_in_one_line_naming_both_and_the_fixes(tmp_path):
    assert check_budget(azure(tmp_path)) is None  # no budget, no check
    assert check_budget(azure(tmp_path, budget=8000))["cost"] == pytest.approx(7833.6)
    with pytest.raises(BadInput) as refused:
        check_budget(azure(tmp_path, budget=100))
    message = str(refused.value)
    assert message.startswith("the run's estimate is 7833.60 USD (the worst case: job.timeout_s 172800 s x 3 attempt")
    assert "over budget 100 USD: raise budget (TRAINFLOW_BUDGET), lower job.timeout_s" in message
    assert "\n" not in message and refused.value.exit_code == 2


def test_a_budget_that_cannot_be_checked_is_refused(tmp_path):
    with pytest.raises(BadInput, match="job.timeout_s is 0 .* set job.timeout_s"):
        check_budget(azure(tmp_path, budget=100, job={"timeout_s": 0}))
    with pytest.raises(
        BadInput,
        match=r"no price for VM size Standard_NC4as_T4_v3; add it \(cost: \{prices: "
        r"\{Standard_NC4as_T4_v3: \{gpus: G, dedicated: P, low_priority: Q\}\}\}\)",
    ):
        check_budget(azure(tmp_path, budget=100, pool={"vm_size": "Standard_NC4as_T4_v3"}))


def test_a_local_run_without_a_priced_machine_costs_nothing_and_passes_any_budget(tmp_path):
    assert check_budget(load_config(None, {"workdir": tmp_path, "budget": 0}, environ={}))["cost"] == 0


def test_a_negative_budget_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="invalid setting budget = -1"):
        load_config(None, {"workdir": tmp_path, "budget": -1}, environ={})
