"""The CPU training images with a real Docker engine and a registry with authentication: PyTorch's built, pushed,
pulled back by digest, reused when unchanged, and running Horovod across two containers; TensorFlow's built without
torch, with Horovod for TensorFlow and tf_keras."""

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from infra.compute import DockerPoolConfig, RunPaths, train_on_pool
from infra.compute.docker import DockerPool
from infra.compute.docker_nodes import Mount, remove_nodes, running_nodes
from infra.engines.pytorch import PyTorchTraining
from infra.images.build_context import wheel_cache
from infra.images.local_docker import collect_registry_garbage, running_registry
from infra.images.registry import DockerEngine, ImageError
from infra.services.supervise import free_port
from tasks.build_image import build_and_push, use_existing
from tests.fakes.paths import REPO
from tests.fakes.registry import Registry, image_config, kept_storage

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]  # a cold first build takes ~15 min
TRAINFLOW = str(Path(sys.executable).parent / "trainflow")


def test_image_is_pushed_with_a_digest_and_pulls_back_by_it(docker_engine, registry, cpu_image):
    assert cpu_image["digest"].startswith("sha256:")
    assert cpu_image["image"] == f"{registry.host}/trainflow-cpu@{cpu_image['digest']}"
    local_id = docker_engine.client.images.get(f"{cpu_image['name']}:{cpu_image['tag']}").id
    docker_engine.client.images.remove(f"{cpu_image['name']}:{cpu_image['tag']}")
    auth = {"username": registry.username, "password": registry.password}
    assert docker_engine.pull(cpu_image["image"], auth) == local_id
    assert cpu_image["image"] in docker_engine.client.images.get(local_id).attrs["RepoDigests"]
    docker_engine.client.images.get(local_id).tag(cpu_image["name"], cpu_image["tag"])


def test_unchanged_context_is_neither_rebuilt_nor_pushed(docker_engine, registry, cpu_image, tmp_path):
    again = build_and_push(
        docker_engine, image_config(registry), tmp_path / "ctx", wheel_cache(), registry.password, print
    )
    assert (again["built"], again["pushed"]) == (False, False)
    assert again["image"] == cpu_image["image"]


def test_image_has_the_pinned_stack(docker_engine, cpu_image):
    # the last: Horovod's library reads HOROVOD_IDLE_CYCLE_TIME, i.e. it is built with horovod-idle-cycle.patch
    probe = (
        "import torch, torchvision, horovod, horovod.torch as hvd, horovod.torch.mpi_lib_v2 as lib; "
        "print(torch.__version__.split('+')[0], torchvision.__version__.split('+')[0], horovod.__version__, "
        "hvd.gloo_built(), b'HOROVOD_IDLE_CYCLE_TIME' in open(lib.__file__, 'rb').read())"
    )
    output = docker_engine.client.containers.run(
        cpu_image["image"], ["python", "-c", probe], remove=True, network_mode="none"
    )
    assert output.decode().split() == ["2.14.1", "0.29.1", "0.28.1", "True", "True"]


TF_PROBE = """
import importlib.util, os, horovod, tensorflow as tf, tf_keras
import horovod.tensorflow.keras as hvd
from tensorflow import keras
lib = importlib.util.find_spec("horovod.tensorflow.mpi_lib").origin
print(tf.__version__, tf_keras.__version__, horovod.__version__, os.environ["TF_USE_LEGACY_KERAS"],
      keras.__name__.split(".")[0], hvd.K.__name__.split(".")[0], hvd.gloo_built(),
      importlib.util.find_spec("torch") is None, b"HOROVOD_IDLE_CYCLE_TIME" in open(lib, "rb").read())
"""


def test_tf_image_has_tensorflow_tf_keras_and_horovod_and_no_torch(docker_engine, registry, tf_cpu_image):
    """tf.keras is tf_keras (TF_USE_LEGACY_KERAS=1), Horovod's Keras API takes its backend from it
    (horovod-tensorflow.patch), Horovod's TensorFlow library is built with horovod-idle-cycle.patch, torch is absent."""
    assert tf_cpu_image["image"] == f"{registry.host}/trainflow-tf-cpu@{tf_cpu_image['digest']}"
    output = docker_engine.client.containers.run(
        tf_cpu_image["image"], ["python", "-c", TF_PROBE], remove=True, network_mode="none", stderr=False
    )
    assert output.decode().split() == [
        "2.21.0",
        "2.21.0",
        "0.28.1",
        "1",
        "tf_keras",
        "tf_keras",
        "True",
        "True",
        "True",
    ]


def test_tf_image_s_horovod_is_built_for_tensorflow_alone(docker_engine, tf_cpu_image):
    output = docker_engine.client.containers.run(
        tf_cpu_image["image"], ["horovodrun", "--check-build"], remove=True, network_mode="none", stderr=False
    ).decode()
    frameworks = output.split("Available Frameworks:")[1].split("Available Controllers:")[0]
    assert "[X] TensorFlow" in frameworks and "[ ] PyTorch" in frameworks, output
    assert "[X] Gloo" in output.split("Available Controllers:")[1], output


TF_HOROVOD_FIT = """
import horovod.tensorflow.keras as hvd, tensorflow as tf, tf_keras
hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(2,))])
model.compile(hvd.DistributedOptimizer(tf_keras.optimizers.legacy.SGD(0.1 * hvd.size())), "mse")
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
model.fit(tf.ones((8, 2)) * (hvd.rank() + 1), tf.ones((8, 1)), epochs=2, verbose=0, callbacks=callbacks)
weights = hvd.allgather(tf.reshape(model.layers[0].kernel, (1, -1)))
print("rank", hvd.rank(), "sum", float(total[0]), "in-sync", bool(tf.reduce_all(weights[0] == weights[1])))
"""


def test_tf_image_fits_a_tf_keras_model_with_horovod_on_two_workers(docker_engine, tf_cpu_image):
    """Horovod's all-reduce, its Keras optimizer and callbacks on tf_keras, across two processes under horovodrun."""
    output = docker_engine.client.containers.run(
        tf_cpu_image["image"],
        ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", "python", "-c", TF_HOROVOD_FIT],
        remove=True,
        network_mode="host",  # Gloo's rendezvous: with the loopback alone (network "none"), both images' workers crash
        shm_size="256m",
        stderr=False,
    ).decode()
    for rank in (0, 1):
        assert f"rank {rank} sum 3.0 in-sync True" in output, output


def test_horovod_trains_across_two_containers_on_mounted_data(docker_engine, cpu_image, digits, tmp_path):
    cfg = PyTorchTraining(
        launcher="horovodrun",
        workers=2,
        model="resnet18",
        epochs=1,
        batch_size=16,
        image_size=32,
        hflip=False,
        loader_workers=1,
        threads=1,
        warmup_epochs=0,
        lr=0.05,
    )
    out, lines = tmp_path / "results", []
    pool = DockerPool(
        DockerPoolConfig(nodes=2, slots_per_node=1),
        RunPaths("test-hvd", digits, REPO / "containers", out),
        cpu_image["image"],
    )
    metrics = train_on_pool(pool, cfg, out, lines.append).to_json()
    assert metrics["status"] == "complete" and metrics["world_size"] == 2 and metrics["backend"] == "horovod"
    assert metrics["parameters_in_sync"] is True
    assert (out / "model.pt").exists() and (out / "logs" / "rank1.log").read_text()
    assert any("[rank 1]" in line for line in lines)
    assert not docker_engine.client.containers.list(all=True, filters={"label": "trainflow.run=test-hvd"})


def test_data_mount_is_read_only_and_nodes_reach_each_other(docker_engine, cpu_image, digits, tmp_path):
    with running_nodes(docker_engine, cpu_image["image"], 2, "test-mounts", [Mount(digits, "/data")]) as nodes:
        lines, status = nodes.exec_lines(["sh", "-c", "touch /data/x; ssh node1 hostname"])
        output = "".join(lines)
        assert status() == 0 and "Read-only file system" in output and "node1" in output
    assert remove_nodes(docker_engine, "test-mounts") == 0


def test_no_engine_is_a_clear_error(tmp_path):
    with pytest.raises(ImageError, match="no Docker engine reachable at unix://.*start Docker"):
        DockerEngine(f"unix://{tmp_path}/nothing.sock")


@pytest.mark.slow  # build_and_push makes the local base image (Debian, Python, torch) before it meets the registry
def test_unreachable_registry_is_a_clear_transient_error(docker_engine, registry, tmp_path):
    cfg = image_config(registry, registry=f"localhost:{free_port()}")
    with pytest.raises(ImageError, match="is unreachable") as failure:
        build_and_push(docker_engine, cfg, tmp_path / "ctx", wheel_cache(), registry.password, print)
    assert not failure.value.permanent


@pytest.mark.slow  # builds on the local Debian base, which only the CPU image's build makes
def test_failing_dockerfile_step_shows_the_step_and_its_output(docker_engine, registry, tmp_path):
    # A base without torch and an index that refuses connections: the torch step fails, as it would offline.
    debian = next(t for i in docker_engine.client.images.list("trainflow-local/debian-python") for t in i.tags)
    cfg = image_config(
        registry, base_image=debian, build_args={"TORCH_INDEX_URL": f"http://127.0.0.1:{free_port()}/simple"}
    )
    with pytest.raises(ImageError) as failure:
        build_and_push(docker_engine, cfg, tmp_path / "ctx", wheel_cache(), registry.password, print)
    message = str(failure.value)
    assert "failed at Step" in message and "requirements/torch.txt" in message
    assert "torch==2.14.1" in message and failure.value.permanent


def run_build(workdir: Path, config: str, password: str) -> subprocess.CompletedProcess:
    (workdir / "config.yaml").write_text(config)
    env = {**os.environ, "REGISTRY_PASSWORD": password}
    return subprocess.run(
        [TRAINFLOW, "build", "--config", str(workdir / "config.yaml"), "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def image_yaml(registry, **fields) -> str:
    values = {
        "registry": registry.host,
        "base_image": "local",
        "build_network": "host",
        "username": registry.username,
        **fields,
    }
    return "image:\n" + "".join(f"  {key}: {json.dumps(value)}\n" for key, value in values.items())


def test_cli_build_prints_the_pushed_reference(registry, cpu_image, tmp_path):
    done = run_build(tmp_path, image_yaml(registry), registry.password)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == cpu_image["image"]


@pytest.mark.parametrize(
    "fields, password, code, message",
    [
        # the build makes the local base image (Debian, Python, torch) before it logs in to the registry
        pytest.param({}, "wrong-password", 1, "refused user 'trainflow-ci'", marks=pytest.mark.slow),
        ({"repository": "Trainflow/CPU"}, "x", 2, "invalid setting image.repository"),
        ({"engine": "unix:///nonexistent/docker.sock"}, "x", 1, "no Docker engine reachable"),
    ],
)
def test_cli_build_bad_input(registry, docker_engine, tmp_path, fields, password, code, message):
    done = run_build(tmp_path, image_yaml(registry, **fields), password)
    assert done.returncode == code, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert password not in done.stderr + done.stdout or password == "x"


def test_password_from_a_prefect_secret_block(monkeypatch):
    from prefect.blocks.system import Secret
    from prefect.testing.utilities import prefect_test_harness

    from infra.images.registry import registry_password

    monkeypatch.delenv("REGISTRY_PASSWORD", raising=False)
    cfg = image_config(Registry("localhost:5000", "bob", ""), password_secret="registry-password")
    with prefect_test_harness(server_startup_timeout=120):
        Secret(value="from-the-block").save("registry-password")
        assert registry_password(cfg) == "from-the-block"
        missing = cfg.model_copy(update={"password_secret": "no-such-block"})
        with pytest.raises(ImageError, match="no Prefect Secret block named 'no-such-block'"):
            registry_password(missing)


def test_a_ready_made_image_is_used_by_its_registry_digest(docker_engine, registry, cpu_image):
    cfg = image_config(registry, use=f"{cpu_image['name']}:{cpu_image['tag']}")
    used = use_existing(docker_engine, cfg, registry.password, print)
    assert used["image"] == cpu_image["image"] and not used["built"] and not used["pushed"]


def test_bench_images_compares_an_unchanged_rebuild_with_docker_build_and_push(registry, cpu_image, tmp_path):
    """At its smallest (2 rounds), against the session's registry, which holds the session's image: the first build
    and push then finds it there, and both ways of the unchanged rebuild run for real (docker's command line against
    the same engine, logged in with a config folder of its own)."""
    (tmp_path / "config.yaml").write_text(image_yaml(registry))
    out = subprocess.run(
        [
            TRAINFLOW,
            "bench",
            "images",
            "--config",
            str(tmp_path / "config.yaml"),
            "--rounds",
            "2",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(tmp_path / "images.json"),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, "COLUMNS": "200", "REGISTRY_PASSWORD": registry.password},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((tmp_path / "images.json").read_text())
    assert result["image"] == cpu_image["image"] and not result["first_built"] and not result["first_pushed"]
    assert result["rounds"] == 2 and not result["unchanged_rebuilt"] and not result["unchanged_pushed"]
    for side in ("trainflow_unchanged_seconds", "docker_build_push_seconds", "speedup"):
        figure = result[side]
        assert len(figure["all"]) == 2 and 0 < figure["min"] <= figure["median"] <= figure["max"]
    assert result["speedup"]["all"] == pytest.approx(
        [
            d / t
            for t, d in zip(result["trainflow_unchanged_seconds"]["all"], result["docker_build_push_seconds"]["all"])
        ]
    )
    assert "x faster than docker build + push" in out.stdout.splitlines()[-1]


def tiny_image(engine: DockerEngine, repository: str, tag: str, content: bytes) -> None:
    """An image of one layer holding one file (`docker import` of a tar): no base image, no build."""
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as archive:
        info = tarfile.TarInfo("payload")
        info.size = len(content)
        archive.addfile(info, io.BytesIO(content))
    engine.api.import_image_from_data(tar.getvalue(), repository=repository, tag=tag)


def push_statuses(engine: DockerEngine, host: str, name: str, auth: dict) -> set[str]:
    """Push `name` to the registry at `host` (every tag it has there); the engine's statuses per layer."""
    events = engine.api.push(f"{host}/{name}", auth_config=auth, stream=True, decode=True)
    statuses = {event["status"] for event in events if "id" in event and "status" in event}
    assert not any("error" in s.lower() for s in statuses), statuses
    return statuses


def test_the_kept_registry_storage_sends_only_new_layers_and_keeps_only_what_the_last_session_pushed(
    docker_engine, tmp_path
):
    """The test sessions' registry storage (tests/fakes/registry.py's kept_storage, collect_registry_garbage): a
    later session starts with no tag, finds the layers an earlier one pushed, and what it did not push is deleted
    after it."""
    cache, auth = tmp_path / "cache", {"username": "u", "password": "p"}
    blobs = lambda: sorted(p.name for p in cache.glob("docker/registry/v2/blobs/sha256/*/*"))  # noqa: E731 - a one-line helper, read where it is used
    for name in ("kept-a", "kept-b"):
        tiny_image(docker_engine, f"trainflow-test/{name}", "v1", name.encode() * 1000)
    for session, pushed in enumerate([("kept-a", "kept-b"), ("kept-a",), ()]):  # the last pushes nothing
        data_dir = tmp_path / f"session-{session}"
        with kept_storage(cache, tmp_path / "fallback", lambda d=data_dir: collect_registry_garbage(d)) as storage:
            assert storage == cache and not list(cache.glob("**/_manifests/tags/*"))  # no tag left from before
            with kept_storage(cache, tmp_path / "other", lambda: None) as other:  # a second session at the same time
                assert other == tmp_path / "other"
            with running_registry(data_dir, auth["username"], auth["password"], storage=storage) as host:
                for name in pushed:
                    docker_engine.client.images.get(f"trainflow-test/{name}:v1").tag(f"{host}/{name}", "v1")
                    statuses = push_statuses(docker_engine, host, name, auth)
                    assert ("Layer already exists" in statuses) == (session == 1), statuses
                    docker_engine.client.images.remove(f"{host}/{name}:v1")
            if session == 0:
                first = blobs()
        if session == 1:
            second = blobs()
    for name in ("kept-a", "kept-b"):
        docker_engine.client.images.remove(f"trainflow-test/{name}:v1")
    # per image: its layer, its config and its manifest; the second session pushed kept-a alone; the third, nothing
    assert len(first) == 6 and len(second) == 3 and set(second) < set(first) and blobs() == second
