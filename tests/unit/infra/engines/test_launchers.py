"""The trainer's contract (its options as settings, its argument list) and the launchers' command lines, on this
machine and on a docker pool's nodes, and how their output names the rank that failed."""

import pytest

from flows.config import load_config
from infra.compute.docker_nodes import commands_on_nodes, torchrun_layout
from infra.engines.contract import check_command, trainer_argv
from infra.engines.launchers import LaunchError, local_command, route_output
from infra.engines.program import NodePaths
from infra.engines.pytorch import PyTorchTraining
from nodelib.records import Failure, event_line
from trainer.options import build_parser

NODE_PATHS = NodePaths("/scripts/v1", "/data", "/results", "/opt/trainflow", nodes=2, checked=False)


def launch_command(cfg, data, out, python):
    return local_command(cfg.launcher, cfg.workers, trainer_argv(cfg, data, out), python)


def test_every_trainer_option_is_a_setting_with_the_trainers_default():
    """PyTorchTraining is made from the trainer's parser: one set of defaults, every option settable."""
    parsed = vars(build_parser().parse_args(["--data", "d", "--out", "o"]))
    ours = PyTorchTraining().model_dump(exclude={"framework", "launcher", "workers", "preflight_images"})
    assert ours == {k: v for k, v in parsed.items() if k not in ("data", "out", "check", "check_workers")}
    for option in ("keep_checkpoints", "pin_memory", "channels_last", "backend", "verify_images"):
        assert option in ours
    assert PyTorchTraining(pin_memory="on").pin_memory == "on"
    for name, field in PyTorchTraining.model_fields.items():
        assert field.description, f"training.{name} has no description"


def test_trainer_args_round_trip_through_the_trainer_parser():
    cfg = PyTorchTraining(model="resnet18", epochs=3, hflip=False, lr=0.5, schedule="step", keep_checkpoints=7)
    parsed = vars(build_parser().parse_args(["--data", "d", "--out", "o", *cfg.trainer_args()]))
    assert {k: parsed[k] for k in ("model", "epochs", "hflip", "lr", "schedule", "keep_checkpoints")} == {
        "model": "resnet18",
        "epochs": 3,
        "hflip": False,
        "lr": 0.5,
        "schedule": "step",
        "keep_checkpoints": 7,
    }


def test_torchrun_command_starts_n_local_workers(tmp_path):
    cmd = launch_command(PyTorchTraining(workers=3), "DATA", tmp_path, python="/venv/bin/python")
    assert cmd[:6] == ["/venv/bin/python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3"]
    assert cmd[6:8] == ["--log-dir", "/dev/null"]  # no /tmp/torchelastic_* folder left per launch
    assert cmd[8].endswith("containers/trainer/train.py")
    assert cmd[cmd.index("--data") + 1] == "DATA" and cmd[cmd.index("--out") + 1] == str(tmp_path)


def test_horovodrun_command_uses_gloo_on_localhost(tmp_path):
    cmd = launch_command(PyTorchTraining(launcher="horovodrun", workers=2), "DATA", tmp_path, python="/venv/bin/python")
    assert cmd[:7] == ["/venv/bin/horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "--network-interfaces"]
    assert cmd[cmd.index("--cycle-time-ms") + 1] == "5"  # Horovod's background thread wakes every 5 ms, not 1
    assert "/venv/bin/python" in cmd


def test_check_command_runs_one_process_that_knows_the_world_size():
    cmd = check_command(PyTorchTraining(workers=3), "D", "O", python="py")
    assert cmd[0] == "py" and "--check" in cmd and cmd[cmd.index("--check-workers") + 1] == "3"
    assert "--verify-images" in cmd
    assert "--verify-images" not in check_command(PyTorchTraining(preflight_images=False), "D", "O")


def test_docker_pool_runs_torchrun_once_per_node_or_horovodrun_on_node0():
    cfg = load_config(None, {"pool": {"backend": "docker", "nodes": 2, "slots_per_node": 1}}, environ={})
    nodes = ["node0", "node1"]
    commands = commands_on_nodes(cfg.training, nodes, 1, NODE_PATHS)
    assert [c[:3] for c in commands] == [["python", "-m", "torch.distributed.run"]] * 2
    for rank, command in enumerate(commands):
        line = " ".join(command)
        assert f"--nnodes 2 --nproc_per_node 1 --node_rank {rank} --master_addr node0 --master_port 29500 " in line
        assert " --log-dir /dev/null " in line
    cfg.training.launcher = "horovodrun"
    [horovod] = commands_on_nodes(cfg.training, nodes, 1, NODE_PATHS)
    assert horovod[:5] == ["horovodrun", "-np", "2", "-H", "node0:1,node1:1"]
    # the trainer of the scripts version with its settings as they are (no preflight ran here for the nodes)
    assert horovod[horovod.index("python") + 1 :] == trainer_argv(cfg.training, "/data", "/results", "/scripts/v1")


@pytest.mark.parametrize(
    ("workers", "slots", "layout"), [(2, 1, (2, 1)), (2, 2, (1, 2)), (4, 3, (2, 2)), (6, 2, (3, 2))]
)
def test_torchrun_puts_the_same_number_of_workers_on_each_node(workers, slots, layout):
    assert torchrun_layout(workers, slots) == layout


def torchrun_summary(rank: int, host: str, exitcode: int) -> list[str]:
    """The failure summary one torchrun prints (torch.distributed.elastic's ChildFailedError)."""
    return [
        "=" * 60 + "\n",
        "/scripts/v1/trainer/train.py FAILED\n",
        "Failures:\n",
        "  <NO_OTHER_FAILURES>\n",
        "Root Cause (first observed failure):\n",
        "[0]:\n",
        f"  host      : {host}\n",
        f"  rank      : {rank} (local_rank: 0)\n",
        f"  exitcode  : {exitcode} (pid: 77)\n",
    ]


def stopped(rank: int, message: str, cause: str = "input") -> list[str]:
    """What a trainer's rank prints when it stops on an error (trainer/console.py): the line for people, its event."""
    return [
        f"[rank {rank}] 10:00:02 ERROR error: {message}\n",
        f"[rank {rank}] 10:00:02 INFO {event_line(Failure(message, cause))}\n",
    ]


LOST_PEER = "unexpected RuntimeError: Connection closed by peer"


def test_the_node_that_failed_first_is_named_not_the_peer_that_lost_it(tmp_path):
    lines = [
        "[rank 0] 10:00:01 INFO epoch 1 step 5\n",
        "[rank 1] 10:00:01 INFO epoch 1 step 5\n",
        *torchrun_summary(1, "node1", -9),  # node1's torchrun: its worker was killed
        *stopped(0, LOST_PEER, "unexpected"),
        *torchrun_summary(0, "node0", 1),
    ]  # node0's torchrun: its worker lost rank 1
    with pytest.raises(
        LaunchError,
        match=r"^rank 1 was killed by signal 9 \(SIGKILL\).*; its last "
        r"lines:\n\[rank 1\] .* step 5",
    ):  # its signal, as torchrun reports it
        route_output(lines, lambda: 1, tmp_path, lambda line: None)
    assert (tmp_path / "rank0.log").read_text().count("\n") == 3


def test_a_crash_is_named_with_its_own_error(tmp_path):
    lines = [
        *stopped(0, LOST_PEER, "unexpected"),
        *stopped(1, "unexpected ZeroDivisionError: division by zero", "unexpected"),
        *torchrun_summary(1, "node1", 1),
        *torchrun_summary(0, "node0", 1),
    ]
    with pytest.raises(LaunchError, match=r"^rank 1 failed: unexpected ZeroDivisionError: division by zero$"):
        route_output(lines, lambda: 1, tmp_path, lambda line: None)


def test_an_input_error_is_named_before_the_deaths_it_set_off(tmp_path):
    lines = [
        *stopped(1, "--data /data: no such folder"),
        *torchrun_summary(1, "node1", 1),
        *stopped(0, LOST_PEER, "unexpected"),
        *torchrun_summary(0, "node0", 1),
    ]
    with pytest.raises(LaunchError, match=r"^rank 1 failed: --data /data: no such folder$"):
        route_output(lines, lambda: 1, tmp_path, lambda line: None)
