"""The Azure ML specs that trainflow would send, rendered with no network and read back by azure-ai-ml's own
loaders (the schemas `az ml job create` validates against)."""

import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from azure.ai.ml import load_compute, load_environment, load_job

from flows.config import ConfigError, load_config
from flows.plan import backend_specs
from infra.compute import RunPaths
from infra.compute.azureml.attempts import Attempt, AzureMLJob, printed_lines, why_ended
from infra.compute.azureml.cluster import AzureMLPool
from infra.compute.azureml.settings import AzureMLPoolConfig, check_complete, infiniband, nccl_environment
from infra.compute.azureml.specs import HIDDEN, NFS_MOUNT
from nodelib.records import Checkpointed, Failure, Progress, event_line
from tasks.train_on_pool import run_paths
from tests.fakes.paths import REPO

AZURE = REPO / "flows" / "configs" / "azure.yaml"
PREEMPTION_ERROR = (
    'Exception : \n {"error": {"message": "AzureMLCompute job failed. PreemptionError: Nodes of this job got '
    'pre-empted."}}'
)
DIGEST = "myregistry.azurecr.io/trainflow-gpu@sha256:" + "ab" * 32


def rendered(tmp_path: Path, **overrides) -> dict:
    cfg = load_config(AZURE, {"workdir": tmp_path, **overrides}, environ={})
    return dict(backend_specs(cfg))


def loaded_job(text: str, tmp_path: Path):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return load_job(path)


@pytest.mark.parametrize("launcher", ["horovodrun", "torchrun"])
def test_nodes_times_processes_per_node_is_the_world_size(tmp_path, launcher):
    specs = rendered(tmp_path, training={"launcher": launcher, "workers": 12}, pool={"nodes": 3, "slots_per_node": 4})
    job = loaded_job(specs["job"], tmp_path)
    assert job.resources.instance_count == 3
    if launcher == "horovodrun":  # Azure ML's mpirun starts 4 trainer processes on each of the 3 nodes
        assert job.distribution.type == "mpi" and job.distribution.process_count_per_instance == 4
        assert " python ${{inputs.scripts}}/trainer/train.py " in job.command
    else:  # one torchrun per node, 4 workers each
        assert job.distribution.type == "pytorch" and job.distribution.process_count_per_instance == 1
        argv = job.command.split("&& ")[-1].split()
        assert argv[:11] == [
            "torchrun",
            "--nnodes",
            "3",
            "--nproc_per_node",
            "4",
            "--node_rank",
            "$NODE_RANK",
            "--master_addr",
            "$MASTER_ADDR",
            "--master_port",
            "$MASTER_PORT",
        ]


def test_a_world_the_nodes_do_not_make_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"training.workers is 6 but the azureml pool starts .* = 16 processes"):
        load_config(AZURE, {"workdir": tmp_path, "training": {"workers": 6}}, environ={})


def test_the_data_mount_is_the_folder_the_trainer_reads(tmp_path):
    job = loaded_job(rendered(tmp_path)["job"], tmp_path)
    mount, engine = job.command.split(" && python ")
    assert mount.startswith("flock /tmp/trainflow-nfs.lock sh -c 'mountpoint -q /mnt/fileserver || ")  # once per node
    assert "mount -t nfs -o ro,vers=4,minorversion=1,sec=sys" in mount and mount.endswith(f" {NFS_MOUNT}; }}'")
    data = engine.split("--data ")[1].split()[0]
    assert data == f"{NFS_MOUNT}/datasets/imagenet/current"
    assert engine.split("--out ")[1].split()[0] == "${{outputs.results}}"


def test_the_blob_data_path_fetches_the_staged_shards_to_the_local_disk(tmp_path):
    job = loaded_job(rendered(tmp_path, pool={"data_source": "blob", "blob_mode": "download"})["job"], tmp_path)
    fetch, train = job.command.split(" && ")
    assert (
        fetch
        == (
            "python /opt/trainflow/nodelib/staged/fetch.py --source ${{inputs.shards}} --export /tmp/trainflow "
            "--dataset imagenet"
        )
        and "mount" not in job.command
    )
    assert "--data /tmp/trainflow/datasets/imagenet/current" in train
    assert job.inputs["shards"].path == "azureml://datastores/trainflow_blob/paths/datasets/imagenet/"
    assert job.inputs["shards"].mode == "download"


def test_the_sync_runs_as_a_job_on_the_cluster_that_mounts_the_file_server_read_write(tmp_path):
    sync = loaded_job(rendered(tmp_path)["sync job"], tmp_path)
    assert sync.compute == "trainflow-a100" and sync.resources.instance_count == 1
    assert "mount -t nfs -o rw," in sync.command and sync.name == "trainflow-<run id>-sync-1"
    assert sync.command.endswith(  # the image's node-side code: a user's scripts version does not hold it
        "/opt/trainflow/nodelib/staged/fetch.py --source ${{inputs.shards}} --export /mnt/fileserver --dataset imagenet"
    )
    assert set(sync.inputs) == {"shards"}


def test_the_job_runs_the_scripts_version_and_image_the_earlier_steps_made(tmp_path):
    cfg = load_config(AZURE, {"workdir": tmp_path}, environ={})
    run = RunPaths("run-1", Path("/x"), Path("scripts/0123abcd"), tmp_path, "imagenet")
    pool = AzureMLPool(cfg.pool, run, DIGEST, cfg.image)  # the image: what build-image returned
    job = pool.job(cfg.training, 3600)
    spec = job.spec._to_job()
    assert spec.environment.image == DIGEST
    assert spec.inputs["scripts"].path == "azureml://datastores/trainflow_files/paths/scripts/0123abcd/"
    assert spec.outputs["results"].path == "azureml://datastores/trainflow_blob/paths/runs/run-1/"  # every attempt's
    assert spec.limits.timeout == 3600 and spec.resources.shm_size == "64g" and spec.name == "trainflow-run-1-train-1"
    assert (
        job.make_spec(2).name == "trainflow-run-1-train-2"
        and job.make_spec(2).outputs["results"].path == spec.outputs["results"].path
    )


def test_compute_environment_and_storage_specs(tmp_path):
    specs = rendered(tmp_path)
    (tmp_path / "compute.yaml").write_text(specs["compute"])
    compute = load_compute(tmp_path / "compute.yaml")
    assert (compute.size, compute.min_instances, compute.max_instances, compute.tier) == (
        "Standard_ND96asr_v4",
        0,
        4,
        "dedicated",
    )
    assert compute.idle_time_before_scale_down == 600 and compute.network_settings.subnet.endswith("/subnets/compute")
    assert compute.identity.type == "system_assigned" and compute.enable_node_public_ip is False  # a PUT keeps them
    grown = yaml.safe_load(
        rendered(tmp_path, pool={"nodes": 6, "low_priority": True}, training={"workers": 48})["compute"]
    )
    assert grown["max_instances"] == 6 and grown["tier"] == "low_priority"
    (tmp_path / "env.yaml").write_text(specs["environment"])
    assert load_environment(tmp_path / "env.yaml").image.startswith("myregistry.azurecr.io/trainflow-gpu:")
    assert "sig=" not in specs["storage"] and "datasets/imagenet/manifest.jsonl" in specs["storage"]


def test_infiniband_follows_the_vm_size():
    assert infiniband(AzureMLPoolConfig(vm_size="Standard_ND96asr_v4"))
    assert infiniband(AzureMLPoolConfig(vm_size="Standard_ND96isr_H100_v5"))
    assert not infiniband(AzureMLPoolConfig(vm_size="Standard_NC24ads_A100_v4"))
    assert not infiniband(AzureMLPoolConfig(vm_size="Standard_ND96asr_v4", infiniband="off"))
    assert nccl_environment(AzureMLPoolConfig(vm_size="Standard_NC6s_v3"))["NCCL_IB_DISABLE"] == "1"


def printed_specs(stdout: str) -> dict[str, str]:
    """The specs the dry run printed, by their headings (rich rules: ──── name ────)."""
    parts = re.split(r"^─+ ([\w ]+?) ─+$", stdout, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def dry_run(tmp_path: Path, digits: Path, *more: str) -> subprocess.CompletedProcess:
    """`trainflow run --dry-run` with the Azure example config on the digits set."""
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "trainflow"),
            "run",
            "--config",
            str(AZURE),
            "--data",
            str(digits),
            "--workdir",
            str(tmp_path / "work"),
            "--dry-run",
            *more,
        ],
        capture_output=True,
        text=True,
        # the digits set's 1,438 training images stand for ImageNet here: a global batch that fits them (16 x 64)
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TRAINFLOW_TRAINING__BATCH_SIZE": "64"},
    )


def test_dry_run_prints_the_specs_and_touches_nothing(tmp_path, digits):
    work = tmp_path / "work"
    proc = dry_run(tmp_path, digits)
    assert proc.returncode == 0, proc.stderr
    specs = printed_specs(proc.stdout)
    assert set(specs) == {"compute", "environment", "sync job", "job", "later attempts", "storage"}
    assert loaded_job(specs["job"], tmp_path).distribution.process_count_per_instance == 8  # ND96asr_v4: 8 GPUs
    assert "trainflow-<run id>-train-2, trainflow-<run id>-train-3" in specs["later attempts"]
    assert "sync-to-file-server" in proc.stdout and "trainflow-<run id>-sync-1" in proc.stdout
    assert not work.exists()


def test_the_dry_run_of_a_tensorflow_run_shows_an_mpi_job_in_the_tensorflow_image(tmp_path, digits):
    proc = dry_run(tmp_path, digits, "--framework", "tensorflow")
    assert proc.returncode == 0, proc.stderr
    job = loaded_job(printed_specs(proc.stdout)["job"], tmp_path)
    assert job.distribution.type == "mpi" and "/trainer/tf/loop.py " in job.command
    assert job.environment.image.startswith("myregistry.azurecr.io/trainflow-tf-gpu:")


def test_a_registry_connection_is_rendered_without_the_password(tmp_path):
    specs = rendered(tmp_path, pool={"registry_access": "connection"})
    connection = yaml.safe_load(specs["registry connection"])
    assert connection["type"] == "container_registry" and connection["target"] == "myregistry.azurecr.io"
    assert connection["credentials"] == {
        "type": "username_password",
        "username": "myregistry",
        "password": "<the value of $REGISTRY_PASSWORD>",
    }


def test_settings_that_cannot_work_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="Entra access token .*breaks pulls after about 3 h"):
        load_config(
            AZURE,
            {
                "workdir": tmp_path,
                "pool": {"registry_access": "connection"},
                "image": {"username": "00000000-0000-0000-0000-000000000000"},
            },
            environ={},
        )
    no_subnet = AzureMLPoolConfig(subscription_id="s", resource_group="g", workspace="w", node_public_ip=False)
    with pytest.raises(ValueError, match="node_public_ip false needs pool.subnet"):
        check_complete(no_subnet, reads_nfs=False)


def test_what_one_thread_prints_becomes_lines_and_the_others_print_through(capsys):
    caught: list[str] = []

    def streamer():
        with printed_lines(caught.append):
            print("[rank 0] epoch 1", flush=True)
            sys.stdout.write("[rank 1] half a ")
            other = threading.Thread(target=print, args=("from another thread",))
            other.start()
            other.join()
            sys.stdout.write("line\n[rank 0] no newline at the end")

    thread = threading.Thread(target=streamer)
    thread.start()
    thread.join()
    assert caught == ["[rank 0] epoch 1\n", "[rank 1] half a line\n", "[rank 0] no newline at the end\n"]
    assert capsys.readouterr().out == "from another thread\n"


def test_the_smoke_run_is_one_node_one_gpu_on_synthetic_data(tmp_path):
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "trainflow"),
            "smoke",
            "--config",
            str(AZURE),
            "--workdir",
            str(tmp_path / "work"),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    job = loaded_job(printed_specs(proc.stdout)["job"], tmp_path)
    assert job.resources.instance_count == 1 and job.distribution.process_count_per_instance == 1
    assert "--data synthetic" in job.command and "mount" not in job.command and "--steps-per-epoch 100" in job.command
    assert job.limits.timeout == 1800


def test_pipeline_mode_runs_torchrun_with_the_processes_its_stages_and_replicas_need(tmp_path):
    training = {"launcher": "torchrun", "workers": 16, "parallel": "pipeline", "stages": 4, "microbatches": 8}
    job = loaded_job(rendered(tmp_path, training=training)["job"], tmp_path)  # 2 nodes x 8 GPUs: 4 replicas of 4 stages
    assert job.distribution.type == "pytorch" and job.resources.instance_count * 8 == 16
    assert "--nnodes 2 --nproc_per_node 8" in job.command
    assert "--parallel pipeline --stages 4 --microbatches 8" in job.command


def test_pipeline_mode_with_horovod_is_refused():
    with pytest.raises(ConfigError, match="Horovod has no pipeline parallelism"):
        load_config(AZURE, {"training": {"parallel": "pipeline", "stages": 2}}, environ={})


def test_new_attempts_stop_at_the_gpu_hour_budget_and_lost_work_counts_from_the_last_checkpoint():
    pool = SimpleNamespace(pool=AzureMLPoolConfig(max_attempts=5, max_gpu_hours=1.0))
    job = AzureMLJob(pool, make_spec=lambda n: None, gpus=16)
    first = Attempt("trainflow-r-train-1", gpus=16, status="Failed", error=PREEMPTION_ERROR)
    first.clock("Running", 0.0)
    first.clock("Failed", 200.0)  # 200 s x 16 GPUs = 0.89 GPU-hours: another attempt may start
    for event in [Progress(1, 40, 40, 99, 2.3, 0.1, 900.0), Checkpointed(40), Progress(1, 60, 60, 99, 2.1, 0.1, 900.0)]:
        first.read(f"[rank 0] 10:00:01 INFO epoch 1 step {event.step} (human)")  # the log for people: not read
        first.read(f"[rank 0] 10:00:01 INFO {event_line(event)}")
    job.history, job.number = [first], 1
    assert why_ended(first).startswith("pre-empted") and first.lost_steps == 20 and job.refusal(first) is None
    second = Attempt("trainflow-r-train-2", gpus=16, status="Failed", seconds=60.0)  # 0.27 more: 1.16 in all
    job.history, job.number = [first, second], 2
    assert job.refusal(second) == "GPU-hours spent: 1.16 of pool.max_gpu_hours 1"
    second.read(f"[rank 0] 10:00:02 INFO {event_line(Failure('unexpected RuntimeError: NCCL timeout', 'unexpected'))}")
    assert job.refusal(second) == "GPU-hours spent: 1.16 of pool.max_gpu_hours 1"  # a fault: worth another attempt
    second.read(f"[rank 0] 10:00:02 INFO {event_line(Failure('--data /x has no train/ folder'))}")
    assert job.refusal(second) == "bad input: not retried"


def test_a_runs_scripts_are_the_folder_upload_scripts_returned(tmp_path):
    cfg = load_config(AZURE, {"workdir": tmp_path}, environ={})
    run = run_paths(cfg, "run-1", "scripts/0123abcd", Path("/x"))  # as the flow and the dry run make it
    assert run.scripts == Path("scripts/0123abcd") and run.out == tmp_path / "runs" / "run-1"
    job = AzureMLPool(cfg.pool, run, DIGEST, cfg.image).job(cfg.training, 0).spec._to_job()
    assert job.inputs["scripts"].path == "azureml://datastores/trainflow_files/paths/scripts/0123abcd/"


def test_a_scripts_job_resolves_its_folders_in_the_command_and_the_sdk_loads_it(tmp_path):
    script = {
        "source": str(REPO / "containers" / "examples" / "pytorch-segmentation"),
        "entry": "train.py",
        "args": ["--output", "${{output}}", "--note", "two words", "--format", "checkpoint-{epoch}.pt"],
        "env": {"WANDB_MODE": "offline", "RUN_LOGS": "${{logs}}"},
    }
    specs = rendered(tmp_path, script=script, training={"launcher": "torchrun", "workers": 16})
    job = loaded_job(specs["job"], tmp_path)  # the SDK's own loader accepts the job az ml job create would send
    ranks = "/opt/trainflow/scriptrun/rank.py train.py --output ${{outputs.results}}/outputs --note 'two words' "
    assert job.distribution.type == "pytorch" and ranks + "--format 'checkpoint-{epoch}.pt'" in job.command
    # Azure ML resolves ${{...}} in the command only: the variables naming the job's folders are set there
    assert "TRAINFLOW_PREPARE_FROM=${{inputs.scripts}} " in job.command
    variables = job.environment_variables  # the user's values are the dry run's to hide (tokens, say)
    assert (
        variables["WANDB_MODE"] == "<hidden: the value of script.env>" and variables["TRAINFLOW_RUN_ID"] == "<run id>"
    )
    assert f"RUN_LOGS='{HIDDEN}' TRAINFLOW_OUTPUT_DIR=" in job.command
    assert variables["OMP_NUM_THREADS"] == "1" and not any("${{" in value for value in variables.values())
