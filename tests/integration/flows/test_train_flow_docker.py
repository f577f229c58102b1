"""The end-to-end flow on the docker pool: an image found or refused before anything moves, two container nodes
(Horovod, torchrun, a two-stage pipeline), a crashed run's leftovers removed, a killed worker failing the job, and a
user's own script on the nodes under either launcher.
Its tests share the Docker engine, so they run on one worker of the suite (tests/conftest.py's GROUPS)."""

import subprocess
import sys
from pathlib import Path

import pytest

from flows.config import FlowConfig
from flows.plan import plan_run
from flows.train_flow import train_flow
from infra.compute.docker_nodes import LABEL
from infra.engines.launchers import LaunchError
from infra.images.registry import ImageError
from tests.fakes.flow_runs import flow_config, in_a_container, killing_rank_one
from tests.fakes.paths import REPO
from tests.fakes.prefect import task_runs
from tests.fakes.registry import image_config

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(3600)]


def test_a_missing_image_fails_before_anything_moves(
    prefect_server, docker_engine, registry, digits, tmp_path, monkeypatch
):
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    for missing, where in (
        (f"{registry.host}/trainflow-cpu:never-pushed", f"registry {registry.host} does not hold"),
        ("trainflow-cpu:never-built", "the local Docker engine does not hold"),
    ):
        image = image_config(registry, use=missing).model_dump()
        cfg = flow_config(
            tmp_path / "work",
            digits,
            image=image,
            pool={"backend": "docker", "nodes": 2, "slots_per_node": 1},
            training={"launcher": "horovodrun"},
        )
        with pytest.raises(ImageError, match=where):
            train_flow(cfg)
    assert not (tmp_path / "work" / "fileshare").exists() and not (tmp_path / "work" / "pools").exists()


def crash_with_a_pool(image: str, run_id: str) -> None:
    """A process that starts a docker pool and dies without deleting it (a crashed run)."""
    code = (
        "import os\nfrom pathlib import Path\nfrom infra.compute import DockerPoolConfig, RunPaths\n"
        "from infra.compute.docker import DockerPool\n"
        f"DockerPool(DockerPoolConfig(nodes=1), RunPaths({run_id!r}, Path('synthetic'), Path('/tmp'), "
        f"Path('/tmp/{run_id}')), {image!r}).create()\n"
        "os._exit(9)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 9


def test_whole_flow_on_the_docker_pool(
    prefect_server, docker_engine, registry, cpu_image, digits, tmp_path, monkeypatch
):
    crash_with_a_pool(cpu_image["image"], "crashed-run")
    assert docker_engine.client.containers.list(all=True, filters={"label": f"{LABEL}=crashed-run"})
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    image = image_config(registry).model_dump()
    cfg = flow_config(
        tmp_path / "work",
        digits,
        image=image,
        pool={"backend": "docker", "nodes": 2, "slots_per_node": 1},
        training={"launcher": "horovodrun"},
    )
    result = train_flow(cfg)
    assert not docker_engine.client.containers.list(all=True, filters={"label": f"{LABEL}=crashed-run"})
    assert result["image"] == cpu_image["image"]
    assert result["metrics"]["backend"] == "horovod" and result["metrics"]["world_size"] == 2
    assert result["metrics"]["trainer"] == f"/scripts/{Path(result['scripts']).name}/trainer"
    shared = tmp_path / "work" / "fileshare" / "results" / result["run_id"]
    assert (shared / "model.pt").exists() and (shared / "logs" / "rank1.log").read_text()
    assert sorted(result["pool"]["nodes"]) == [f"trainflow-{result['run_id']}-node{i}" for i in range(2)]
    assert not docker_engine.client.containers.list(all=True, filters={"label": f"trainflow.run={result['run_id']}"})


# Keras's fit: TensorFlow's loop trains the very same parameters (tests/integration/trainer/test_tf_training.py), and
# its entry point is in the same image and scripts folder
@pytest.mark.parametrize("framework", ["keras"])
def test_whole_flow_with_tensorflow_on_the_docker_pool_in_its_image(
    prefect_server, docker_engine, registry, tf_cpu_image, digits, tmp_path, monkeypatch, framework
):
    """training.framework tensorflow or keras: the flow builds (here: finds) the TensorFlow image, and two container
    nodes train under horovodrun from the scripts on the share."""
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    cfg = flow_config(
        tmp_path / "work",
        digits,
        image=image_config(registry).model_dump(),
        pool={"backend": "docker", "nodes": 2, "slots_per_node": 1},
        training={"framework": framework},
    )
    result = train_flow(cfg)
    assert result["image"] == tf_cpu_image["image"] and "/trainflow-tf-cpu" in result["image"]
    metrics = result["metrics"]
    assert (metrics["framework"], metrics["backend"], metrics["world_size"]) == (framework, "horovod", 2)
    assert metrics["parameters_in_sync"] and result["receipt"]["framework"] == framework
    assert metrics["trainer"] == f"/scripts/{Path(result['scripts']).name}/trainer"
    shared = tmp_path / "work" / "fileshare" / "results" / result["run_id"]
    assert (shared / "model.keras").exists() and (shared / "logs" / "rank1.log").read_text()
    assert not docker_engine.client.containers.list(all=True, filters={"label": f"trainflow.run={result['run_id']}"})


def docker_config(tmp_path: Path, data: Path, registry, **training) -> FlowConfig:
    """Two container nodes of one slot each, torchrun on each."""
    return flow_config(
        tmp_path / "work",
        data,
        image=image_config(registry).model_dump(),
        pool={"backend": "docker", "nodes": 2, "slots_per_node": 1},
        training={"launcher": "torchrun", **training},
    )


def test_a_two_stage_pipeline_across_two_container_nodes(
    prefect_server, docker_engine, registry, cpu_image, digits, tmp_path, monkeypatch
):
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    cfg = docker_config(tmp_path, digits, registry, parallel="pipeline", stages=2, microbatches=2, steps_per_epoch=4)
    plan = {r["step"]: r for r in plan_run(cfg)}["run-training"]["detail"]
    assert (
        "node0: python -m torch.distributed.run --nnodes 2" in plan and "| node1: " in plan and "--node_rank 1" in plan
    )
    result = train_flow(cfg)
    assert result["command"] == plan  # the job ran the commands the dry run printed
    metrics = result["metrics"]
    assert metrics["status"] == "complete" and metrics["backend"] == "ddp" and metrics["world_size"] == 2
    assert metrics["parallel"] == "pipeline" and metrics["pipeline"]["stages"] == 2
    logs = tmp_path / "work" / "fileshare" / "results" / result["run_id"] / "logs"
    for rank in (0, 1):  # stage r ran on node r
        assert f"worker {rank} of 2 (ddp) on host node{rank}" in (logs / f"rank{rank}.log").read_text()
    assert not docker_engine.client.containers.list(all=True, filters={"label": f"{LABEL}={result['run_id']}"})


def test_a_worker_killed_on_a_container_node_fails_the_job_at_once(
    prefect_server, docker_engine, registry, cpu_image, digits, tmp_path, monkeypatch
):
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    cfg = docker_config(tmp_path, digits, registry, epochs=20)
    cfg.job.timeout_s = 300  # a job hung on its lost peer ends here, not at pytest's limit (and breaks the bound)
    with killing_rank_one(in_a_container, times=2) as kills:
        state = train_flow(cfg, return_state=True)
    # The job failed at once, on the kill: a job hung on its lost peer would end at the 300 s timeout, as a
    # JobTimedOut, and another attempt would be a third run of the step. (3.1 s from the second kill to the flow's
    # end, measured.)
    with pytest.raises(LaunchError, match=r"^rank 1 was killed by signal 9 \(SIGKILL\)"):
        state.result()
    training = task_runs(state.state_details.flow_run_id, {"run-training"})["run-training"]
    assert (len(kills), training.run_count) == (2, 2)  # killed in each attempt: the one retry, then the failure
    assert not docker_engine.client.containers.list(all=True, filters={"label": LABEL})


def test_the_fast_loader_decodes_only_the_crop_in_the_containers(
    prefect_server, docker_engine, registry, cpu_image, tmp_path, monkeypatch
):
    """In the containers, the trainer runs from the scripts on the share and finds the library the image built for
    that jpeg_crop.c (TRAINFLOW_JPEG_CROP_DIR): every rank decodes only each crop, as metrics.json records."""
    from infra.data.sample_data import write_digits

    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    jpegs = write_digits(tmp_path / "digits-jpg", fmt="jpg")
    result = train_flow(docker_config(tmp_path, jpegs, registry, loader="fast", epochs=1, steps_per_epoch=4))
    metrics = result["metrics"]
    assert metrics["status"] == "complete" and metrics["world_size"] == 2
    assert metrics["jpeg_decoding"] == "crop"
    logs = tmp_path / "work" / "fileshare" / "results" / result["run_id"] / "logs"
    assert "partial JPEG decoding is unavailable" not in "".join(p.read_text() for p in logs.glob("rank*.log"))


# A user's script, written as one is for either launcher: each rank joins the others (Horovod or torch.distributed),
# all-reduces a one, and says where it ran and what trainflow gave it; it writes to its output folder and, with a
# relative path, to its working folder.
NODE_SCRIPT = """\
import os, socket
import torch
if "HOROVOD_RANK" in os.environ:
    import horovod.torch as hvd
    hvd.init()
    rank, size, total = hvd.rank(), hvd.size(), hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
else:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank, size, one = dist.get_rank(), dist.get_world_size(), torch.ones(1)
    dist.all_reduce(one)
    total = one.item()
where = f"{socket.gethostname()} {os.getcwd()} nodes={os.environ['TRAINFLOW_NODES']}"
print(f"rank {rank} of {size} summed {total:g} on {where}", flush=True)
with open(os.path.join(os.environ["TRAINFLOW_OUTPUT_DIR"], f"rank{rank}.txt"), "w") as f:
    f.write(os.environ["TRAINFLOW_RUN_ID"])
with open(f"relative-{rank}.txt", "w") as f:
    f.write("kept")
"""


def script_on_docker(tmp_path: Path, registry, launcher: str, files: dict[str, str]) -> FlowConfig:
    """A user's scripts folder of `files` on two container nodes of one slot each, under `launcher`."""
    source = tmp_path / "mine"
    source.mkdir()
    for name, text in files.items():
        (source / name).write_text(text)
    return FlowConfig.model_validate(
        {
            "workdir": tmp_path / "work",
            "script": {"source": source, "entry": "train.py"},
            "image": image_config(registry).model_dump(),
            "pool": {"backend": "docker", "nodes": 2, "slots_per_node": 1},
            "training": {"launcher": launcher, "workers": 2},
        }
    )


@pytest.mark.parametrize("launcher", ["horovodrun", "torchrun"])
def test_a_users_script_runs_on_two_container_nodes_from_the_share_with_the_images_shim(
    prefect_server, docker_engine, registry, cpu_image, tmp_path, monkeypatch, launcher
):
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    cfg = script_on_docker(tmp_path, registry, launcher, {"train.py": NODE_SCRIPT})
    result = train_flow(cfg)
    assert result["image"] == cpu_image["image"]  # the framework's image as it is: the scripts are not baked in
    assert (result["metrics"]["kind"], result["metrics"]["launcher"]) == ("script", launcher)
    out = tmp_path / "work" / "runs" / result["run_id"]
    for rank in (0, 1):
        log = (out / "logs" / f"rank{rank}.log").read_text()
        assert f"[rank {rank}] rank {rank} of 2 summed 2 on node{rank} /results/work nodes=2" in log, log
        assert (out / "outputs" / f"rank{rank}.txt").read_text() == result["run_id"]
        assert (out / "work" / f"relative-{rank}.txt").read_text() == "kept"
    assert "/opt/trainflow/scriptrun/rank.py train.py" in result["command"]
    shared = tmp_path / "work" / "fileshare" / "results" / result["run_id"]
    assert (shared / "outputs" / "rank1.txt").is_file() and (shared / "script.json").is_file()
    assert not docker_engine.client.containers.list(all=True, filters={"label": f"{LABEL}={result['run_id']}"})


NEEDS_TERMCOLOR = """\
from importlib.metadata import version
import termcolor
print("termcolor", version("termcolor"), flush=True)
"""


def test_a_requirement_the_image_lacks_is_layered_over_it_once_and_a_code_edit_builds_nothing(
    prefect_server, docker_engine, registry, cpu_image, tmp_path, monkeypatch
):
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    cfg = script_on_docker(
        tmp_path, registry, "torchrun", {"train.py": NEEDS_TERMCOLOR, "requirements.txt": "termcolor\n"}
    )
    first = train_flow(cfg)
    [layer] = [step for step in first["done"] if step["step"] == "requirements-layer"]
    assert layer["did"] == "ran" and "lacks: ERROR: " in layer["why"] and "termcolor" in layer["why"], layer
    assert first["image"] != cpu_image["image"] and first["image"].startswith(cpu_image["name"])
    out = tmp_path / "work" / "runs" / first["run_id"]
    assert "[rank 1] termcolor 3.3.0" in (out / "logs" / "rank1.log").read_text()  # the lock's pin, on node1 too

    (cfg.script.source / "train.py").write_text(NEEDS_TERMCOLOR + "print('edited')\n")
    second = train_flow(cfg)
    [layer] = [step for step in second["done"] if step["step"] == "requirements-layer"]
    assert layer["did"] == "skipped" and second["image"] == first["image"], layer  # the same layer: nothing built
    assert "[rank 0] edited" in (tmp_path / "work" / "runs" / second["run_id"] / "logs" / "rank0.log").read_text()


def test_a_requirement_with_no_wheel_is_refused_in_one_line_naming_it_and_not_retried(
    prefect_server, docker_engine, registry, cpu_image, tmp_path, monkeypatch
):
    monkeypatch.setenv("REGISTRY_PASSWORD", registry.password)
    files = {"train.py": "print('never runs')\n", "requirements.txt": "no-such-package-of-trainflow==1.0\n"}
    state = train_flow(script_on_docker(tmp_path, registry, "torchrun", files), return_state=True)
    with pytest.raises(ImageError) as refused:
        state.result()
    message = str(refused.value)
    assert message.startswith("cannot fetch wheels of the script's requirements no-such-package-of-trainflow==1.0 ")
    assert "No matching distribution found for no-such-package-of-trainflow==1.0" in message, message
    build = task_runs(state.state_details.flow_run_id, {"build-image"})["build-image"]
    assert build.run_count == 1  # permanent: never retried
    assert not (tmp_path / "work" / "pools").exists() and not docker_engine.client.containers.list(
        all=True, filters={"label": LABEL}
    )
