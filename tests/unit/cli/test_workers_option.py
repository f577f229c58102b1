"""`trainflow run --workers N`: the pool slots it implies, by how many nodes the configured pool has."""

import pytest

from cli.common import pool_for_workers
from flows.config import ConfigError, load_config
from tests.fakes.paths import REPO

AZURE = REPO / "flows" / "configs" / "azure.yaml"  # 2 nodes of 8 GPUs


def test_one_node_takes_a_slot_a_worker_and_several_nodes_share_the_workers_evenly(tmp_path):
    assert pool_for_workers(None, "3") == {"slots_per_node": "3"} and pool_for_workers(None, "auto") == {
        "slots_per_node": "auto"
    }
    assert pool_for_workers(AZURE, "6") == {"slots_per_node": 3} and pool_for_workers(AZURE, None) == {}
    cfg = load_config(AZURE, {"training": {"workers": 6}, "pool": pool_for_workers(AZURE, "6")}, environ={})
    assert (cfg.pool.nodes, cfg.pool.slots_per_node) == (2, 3)  # Azure ML starts 2 x 3 processes
    assert pool_for_workers(AZURE, "5") == {}  # 5 over 2 nodes: the config's check names both
    with pytest.raises(ConfigError, match=r"training.workers is 5 but the azureml pool starts pool.nodes 2 x"):
        load_config(AZURE, {"training": {"workers": 5}, "pool": pool_for_workers(AZURE, "5")}, environ={})
