"""PipelineConfig loading and the launcher's command lines."""

from pathlib import Path

import pytest

from flows.config import ConfigError, load_config
from infra.container_nodes import ContainerNodes, commands_on_nodes, torchrun_layout
from infra.launcher import LaunchError, TrainingConfig, check_command, launch_command, route_output
from trainer.options import build_parser


def test_defaults_of_config_and_engine_agree():
    """TrainingConfig documents the engine's defaults: they must be the engine's."""
    engine = vars(build_parser().parse_args(["--data", "d", "--out", "o"]))
    ours = TrainingConfig().model_dump(exclude={"launcher", "workers", "verify_images"})
    assert {k: engine[k] for k in ours} == ours


def test_engine_args_round_trip_through_the_engine_parser():
    cfg = TrainingConfig(model="resnet18", epochs=3, hflip=False, lr=0.5, schedule="step")
    parsed = vars(build_parser().parse_args(["--data", "d", "--out", "o", *cfg.engine_args()]))
    assert {k: parsed[k] for k in ("model", "epochs", "hflip", "lr", "schedule")} == {
        "model": "resnet18", "epochs": 3, "hflip": False, "lr": 0.5, "schedule": "step"}


def test_torchrun_command_starts_n_local_workers(tmp_path):
    cmd = launch_command(TrainingConfig(workers=3), "DATA", tmp_path, python="/venv/bin/python")
    assert cmd[:6] == ["/venv/bin/python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3"]
    assert cmd[6].endswith("containers/trainer/train.py")
    assert cmd[cmd.index("--data") + 1] == "DATA" and cmd[cmd.index("--out") + 1] == str(tmp_path)


def test_horovodrun_command_uses_gloo_on_localhost(tmp_path):
    cmd = launch_command(TrainingConfig(launcher="horovodrun", workers=2), "DATA", tmp_path, python="/venv/bin/python")
    assert cmd[:7] == ["/venv/bin/horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "--network-interfaces"]
    assert "/venv/bin/python" in cmd


def test_check_command_runs_one_process_that_knows_the_world_size():
    cmd = check_command(TrainingConfig(workers=3), "D", "O", python="py")
    assert cmd[0] == "py" and "--check" in cmd and cmd[cmd.index("--check-workers") + 1] == "3"
    assert "--verify-images" in cmd
    assert "--verify-images" not in check_command(TrainingConfig(verify_images=False), "D", "O")


def test_precedence_is_options_then_environment_then_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("training: {epochs: 3, model: resnet18, batch_size: 8}\nworkdir: /from/file\n")
    env = {"TRAINFLOW_TRAINING__EPOCHS": "5", "TRAINFLOW_TRAINING__BATCH_SIZE": "16"}
    cfg = load_config(path, {"training": {"epochs": 7, "batch_size": None}}, environ=env)
    assert (cfg.training.epochs, cfg.training.batch_size, cfg.training.model) == (7, 16, "resnet18")
    assert str(cfg.workdir) == "/from/file"


@pytest.mark.parametrize("text, message", [
    ("training: {batch_size: 0}", r"training.batch_size = 0: Input should be greater than or equal to 1"),
    ("training: {epoch: 3}", r"training.epoch: Extra inputs are not permitted"),
    ("training: [1, 2", "is not valid YAML"),
    ("- a list", "must hold a mapping"),
])
def test_bad_config_files_name_the_setting(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path, {}, environ={})


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml", {}, environ={})


def test_the_example_configs_load():
    repo = Path(__file__).resolve().parents[2]
    for path in sorted((repo / "flows" / "configs").glob("*.yaml")):
        load_config(path, {}, environ={})


def test_unknown_trainflow_variable_is_named_without_its_value():
    with pytest.raises(ConfigError, match="invalid setting registry_password: Extra inputs") as failure:
        load_config(None, {}, environ={"TRAINFLOW_REGISTRY_PASSWORD": "s3cret-value"})
    assert "s3cret-value" not in str(failure.value)


def test_docker_pool_runs_torchrun_once_per_node_or_horovodrun_on_node0():
    cfg = load_config(None, {"pool": {"backend": "docker", "nodes": 2, "slots_per_node": 1}}, environ={})
    nodes = ContainerNodes(None, "run", ["node0", "node1"])
    commands = commands_on_nodes(cfg.training, nodes, slots=1)
    assert [c[:3] for c in commands] == [["python", "-m", "torch.distributed.run"]] * 2
    for rank, command in enumerate(commands):
        line = " ".join(command)
        assert f"--nnodes 2 --nproc_per_node 1 --node_rank {rank} --master_addr node0 --master_port 29500 " in line
    cfg.training.launcher = "horovodrun"
    [horovod] = commands_on_nodes(cfg.training, nodes, slots=1)
    assert horovod[:5] == ["horovodrun", "-np", "2", "-H", "node0:1,node1:1"]


@pytest.mark.parametrize(("workers", "slots", "layout"), [(2, 1, (2, 1)), (2, 2, (1, 2)), (4, 3, (2, 2)), (6, 2, (3, 2))])
def test_torchrun_puts_the_same_number_of_workers_on_each_node(workers, slots, layout):
    assert torchrun_layout(workers, slots) == layout


def test_a_docker_pool_that_torchrun_cannot_split_evenly_is_refused():
    with pytest.raises(ConfigError, match="training.workers 3 does not split evenly .* make training.workers a multiple "
                                          "of pool.slots_per_node"):
        load_config(None, {"pool": {"backend": "docker", "nodes": 2, "slots_per_node": 2},
                           "training": {"workers": 3}}, environ={})
    load_config(None, {"pool": {"backend": "docker", "nodes": 2, "slots_per_node": 2},
                       "training": {"workers": 3, "launcher": "horovodrun"}}, environ={})


def torchrun_summary(rank: int, host: str, exitcode: int) -> list[str]:
    """The failure summary one torchrun prints (torch.distributed.elastic's ChildFailedError)."""
    return ["=" * 60 + "\n", "/scripts/v1/trainer/train.py FAILED\n", "Failures:\n", "  <NO_OTHER_FAILURES>\n",
            "Root Cause (first observed failure):\n", "[0]:\n", f"  host      : {host}\n",
            f"  rank      : {rank} (local_rank: 0)\n", f"  exitcode  : {exitcode} (pid: 77)\n"]


def test_the_node_that_failed_first_is_named_not_the_peer_that_lost_it(tmp_path):
    lines = ["[rank 0] 10:00:01 INFO epoch 1 step 5\n", "[rank 1] 10:00:01 INFO epoch 1 step 5\n",
             *torchrun_summary(1, "node1", -9),  # node1's torchrun: its worker was killed
             "[rank 0] 10:00:02 ERROR error: unexpected RuntimeError: Connection closed by peer\n",
             *torchrun_summary(0, "node0", 1)]  # node0's torchrun: its worker lost rank 1
    with pytest.raises(LaunchError, match=r"^rank 1 failed: it died without an error \(exit status 1\); its last "
                                          r"lines:\n\[rank 1\] .* step 5"):
        route_output(lines, lambda: 1, tmp_path, lambda line: None)
    assert (tmp_path / "rank0.log").read_text().count("\n") == 2


def test_a_crash_is_named_with_its_own_error(tmp_path):
    lines = ["[rank 0] 10:00:02 ERROR error: unexpected RuntimeError: Connection closed by peer\n",
             "[rank 1] 10:00:01 ERROR error: unexpected ZeroDivisionError: division by zero\n",
             *torchrun_summary(1, "node1", 1), *torchrun_summary(0, "node0", 1)]
    with pytest.raises(LaunchError, match=r"^rank 1 failed: unexpected ZeroDivisionError: division by zero$"):
        route_output(lines, lambda: 1, tmp_path, lambda line: None)


def test_an_input_error_is_named_before_the_deaths_it_set_off(tmp_path):
    lines = ["[rank 1] 10:00:01 ERROR error: --data /data: no such folder\n", *torchrun_summary(1, "node1", 1),
             "[rank 0] 10:00:02 ERROR error: unexpected RuntimeError: Connection closed by peer\n",
             *torchrun_summary(0, "node0", 1)]
    with pytest.raises(LaunchError, match=r"^rank 1 failed: --data /data: no such folder$"):
        route_output(lines, lambda: 1, tmp_path, lambda line: None)


def test_prefect_yaml_deploys_the_pipeline_with_valid_parameters():
    import importlib

    import yaml

    from flows.config import PipelineConfig

    repo = Path(__file__).resolve().parents[2]
    for deployment in yaml.safe_load((repo / "prefect.yaml").read_text())["deployments"]:
        path, name = deployment["entrypoint"].split(":")
        flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
        assert flow.name == "train-pipeline"
        PipelineConfig.model_validate(deployment["parameters"]["cfg"])
        assert deployment["schedules"][0]["cron"]
