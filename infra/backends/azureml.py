"""The azureml backend: Azure Machine Learning compute as the pool, Azure ML command jobs as the job (azure-ai-ml v2).

The specs (AmlCompute, Environment, command job) are built by plain functions that need no network,
so `trainflow run --dry-run` prints exactly what would be sent and the tests check it. The clients
around them are thin: create or reuse the cluster, submit the job, stream its logs, map its status,
cancel it, download its outputs, delete the cluster or scale it to zero.
"""

import queue
import re
import shutil
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.backends.base import PoolError, RunPaths
from infra.images import registry_password
from infra.launchers import torchrun_options
from infra.trainer import SYNTHETIC, TRAINER, trainer_argv

# Azure ML job statuses that end a job, and the exit status each maps to.
FINAL = {"Completed": 0, "Failed": 1, "Canceled": 1, "NotResponding": 1}
# VM sizes with InfiniBand carry an "r" among their feature letters (ND96asr_v4, ND96isr_H100_v5, NC24rs_v3).
VM_FEATURES = re.compile(r"^Standard_[A-Z]+\d+([a-z]*)")
NFS_MOUNT = "/mnt/fileserver"
SCRIPTS_INPUT, DATA_INPUT, RESULTS_OUTPUT = "${{inputs.scripts}}", "${{inputs.data}}", "${{outputs.results}}"


class AzureMLConfig(BaseModel):
    """The Azure ML workspace, the cluster (the pool) and how jobs reach data, scripts and results."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    subscription_id: str = ""
    """Azure subscription id of the workspace."""
    resource_group: str = ""
    """Resource group of the workspace."""
    workspace: str = ""
    """Azure ML workspace name."""
    compute: str = "trainflow-gpu"
    """AmlCompute cluster name; created if missing, reused if present."""
    vm_size: str = "Standard_NC24ads_A100_v4"
    """Node VM size."""
    min_nodes: int = Field(0, ge=0)
    """Nodes the cluster keeps when idle (0: it scales down to nothing)."""
    max_nodes: int = Field(4, ge=1)
    """Most nodes the cluster may grow to (raised to the job's node count when lower)."""
    idle_seconds: int = Field(600, ge=0)
    """Idle time before a node is released."""
    low_priority: bool = False
    """Low-priority (spot) nodes: much cheaper, may be pre-empted (the job resumes from checkpoints)."""
    subnet: str | None = None
    """Resource id of the VNet subnet the nodes join (the one with the storage service endpoints)."""
    at_end: Literal["delete", "scale_to_zero"] = "scale_to_zero"
    """What happens to the cluster after the run: deleted, or kept with min nodes 0."""
    infiniband: Literal["auto", "on", "off"] = "auto"
    """auto: on for VM sizes with InfiniBand (an "r" in the size's features)."""
    datastore: str = "workspaceblobstore"
    """Datastore holding scripts/, results/ and (data_source datastore) the data set copy."""
    data_source: Literal["datastore", "nfs"] = "nfs"
    """nfs: every node mounts the file server (NFS) at /mnt/fileserver; datastore: a read-only mount
    of data_path in the datastore."""
    nfs_export: str = ""
    """The NFS file server as host:/path, e.g. <account>.file.core.windows.net:/<account>/<share>."""
    data_path: str = "fileserver/datasets/{dataset}/current"
    """data_source datastore: the data set's folder in the datastore ({dataset} is replaced)."""
    registry_access: Literal["workspace", "connection"] = "workspace"
    """How Azure ML pulls the image. workspace: with the workspace's identity (the registry that infra/azure
    attaches to it, AcrPull); connection: through a workspace connection holding image.username and the
    registry password (any other registry)."""
    experiment: str = "trainflow"
    """Azure ML experiment the jobs are filed under."""
    shm_size: str = "32g"
    """/dev/shm of the job's containers (data loader workers share batches through it)."""


def check_complete(cfg: AzureMLConfig, reads_nfs: bool) -> None:
    """Refuse an azureml section that lacks what a run needs, naming the settings."""
    needed = ["subscription_id", "resource_group", "workspace"] + (["nfs_export"] if reads_nfs else [])
    missing = [f"azureml.{name}" for name in needed if not getattr(cfg, name)]
    if missing:
        raise ValueError(f"the azureml pool needs {', '.join(missing)}; infra/azure/deploy.sh prints them "
                         "for your deployment")


def infiniband(cfg: AzureMLConfig) -> bool:
    """Whether the nodes have InfiniBand (by config, or by the VM size's features)."""
    if cfg.infiniband != "auto":
        return cfg.infiniband == "on"
    match = VM_FEATURES.match(cfg.vm_size)
    return bool(match and "r" in match.group(1))


def nccl_environment(cfg: AzureMLConfig) -> dict[str, str]:
    """NCCL settings for the nodes; InfiniBand on when the VM has it."""
    env = {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    if infiniband(cfg):
        return {**env, "NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "5", "UCX_TLS": "rc"}
    return {**env, "NCCL_IB_DISABLE": "1"}


def check_world(pool, workers: int) -> None:
    """Refuse a world size other than nodes x processes per node (Azure ML starts exactly that many)."""
    slots = pool.nodes * pool.slots_per_node
    if slots != workers:
        raise ValueError(f"training.workers is {workers} but the azureml pool starts pool.nodes {pool.nodes} x "
                         f"pool.slots_per_node {pool.slots_per_node} (GPUs per node) = {slots} processes; "
                         "make them equal")


def compute_spec(cfg: AzureMLConfig, nodes: int):
    """The AmlCompute cluster, grown to at least `nodes` nodes."""
    from azure.ai.ml.entities import AmlCompute, NetworkSettings

    return AmlCompute(
        name=cfg.compute, size=cfg.vm_size, min_instances=cfg.min_nodes, max_instances=max(cfg.max_nodes, nodes),
        idle_time_before_scale_down=cfg.idle_seconds, tier="low_priority" if cfg.low_priority else "dedicated",
        network_settings=NetworkSettings(subnet=cfg.subnet) if cfg.subnet else None,
        enable_node_public_ip=cfg.subnet is None, tags={"trainflow": "pool"})


def environment_spec(image: str):
    """The job's environment: the pushed training image, by digest."""
    from azure.ai.ml.entities import Environment

    return Environment(image=image, description="trainflow training image (pushed by build-image)")


def registry_connection_spec(registry: str, username: str, password: str):
    """The workspace connection through which Azure ML pulls from a registry that is not the workspace's."""
    from azure.ai.ml.entities import UsernamePasswordConfiguration, WorkspaceConnection

    return WorkspaceConnection(name=f"trainflow-{registry.split('.')[0].split(':')[0]}", type="container_registry",
                               target=registry, credentials=UsernamePasswordConfiguration(username=username,
                                                                                          password=password))


def launch_command(training, pool, data: str) -> str:
    """The command each node runs: the trainer under MPI (Horovod) or under torchrun (one per node)."""
    trainer = " ".join(trainer_argv(training, data, RESULTS_OUTPUT, script=f"{SCRIPTS_INPUT}/{TRAINER}"))
    if training.launcher == "horovodrun":  # Azure ML's mpirun starts gpus_per_node of these per node
        return f"python {trainer}"
    # Azure ML's PyTorch distribution sets MASTER_ADDR, MASTER_PORT and NODE_RANK on every node
    options = torchrun_options(pool.nodes, pool.slots_per_node, "$NODE_RANK", "$MASTER_ADDR", "$MASTER_PORT")
    return f"torchrun {' '.join(options)} {trainer}"


def data_input(cfg: AzureMLConfig, dataset: str) -> tuple[str, dict, str]:
    """(shell prefix, inputs, --data path): the NFS file server mounted by the command, or a datastore mount."""
    from azure.ai.ml import Input

    if dataset == SYNTHETIC:
        return "", {}, SYNTHETIC
    if cfg.data_source == "nfs":
        mount = (f"mkdir -p {NFS_MOUNT} && mount -t nfs -o ro,vers=4,minorversion=1,sec=sys "
                 f"{cfg.nfs_export} {NFS_MOUNT} && ")
        return mount, {}, f"{NFS_MOUNT}/datasets/{dataset}/current"
    path = f"azureml://datastores/{cfg.datastore}/paths/{cfg.data_path.format(dataset=dataset)}"
    return "", {"data": Input(type="uri_folder", path=path, mode="ro_mount")}, DATA_INPUT


def job_spec(training, cfg: AzureMLConfig, pool, run: RunPaths, image: str, timeout_s: float):
    """The Azure ML command job for one training run."""
    from azure.ai.ml import Input, MpiDistribution, Output, PyTorchDistribution, command

    check_world(pool, training.workers)
    prefix, inputs, data = data_input(cfg, run.dataset)
    scripts = f"azureml://datastores/{cfg.datastore}/paths/{run.scripts.as_posix()}"
    results = f"azureml://datastores/{cfg.datastore}/paths/results/{run.run_id}"
    distribution = (MpiDistribution(process_count_per_instance=pool.slots_per_node) if training.launcher == "horovodrun"
                    else PyTorchDistribution(process_count_per_instance=1))
    return command(
        name=f"trainflow-{run.run_id}", display_name=f"trainflow {run.run_id}", experiment_name=cfg.experiment,
        command=prefix + launch_command(training, pool, data), environment=environment_spec(image),
        compute=cfg.compute, instance_count=pool.nodes, distribution=distribution, shm_size=cfg.shm_size,
        inputs={"scripts": Input(type="uri_folder", path=scripts, mode="ro_mount"), **inputs},
        outputs={"results": Output(type="uri_folder", path=results, mode="rw_mount")},
        environment_variables=nccl_environment(cfg), timeout=int(timeout_s) or None, tags={"trainflow.run": run.run_id})


def yaml_text(entity) -> str:
    """The YAML that `az ml ... create --file` takes for an entity (a command builder becomes its job)."""
    import io
    import logging

    logging.getLogger("azure.ai.ml._utils._experimental").setLevel(logging.ERROR)  # "experimental class" notes
    entity = entity._to_job() if hasattr(entity, "_to_job") else entity  # the job `az ml job create` takes
    buffer = io.StringIO()
    entity.dump(buffer)
    return buffer.getvalue()


def ml_client(cfg: AzureMLConfig):
    """An MLClient for the workspace, authenticated with DefaultAzureCredential (az login, managed identity, ...)."""
    from azure.ai.ml import MLClient
    from azure.identity import DefaultAzureCredential

    check_complete(cfg, reads_nfs=False)
    return MLClient(DefaultAzureCredential(), cfg.subscription_id, cfg.resource_group, cfg.workspace)


@dataclass
class AzureMLPool:
    """An AmlCompute cluster as the pool: created or reused, grown to the job's nodes, deleted or scaled to zero."""

    pool: object  # PoolConfig
    run: RunPaths
    azure: AzureMLConfig
    image: str
    image_cfg: object  # ImageConfig: the registry connection's user and password
    _client: object = field(default=None, repr=False)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def client(self):
        """The workspace's MLClient, made on first use (the dry run makes a pool without one)."""
        if self._client is None:
            self._client = ml_client(self.azure)
        return self._client

    def create(self) -> None:
        if self.azure.registry_access == "connection":
            self.client.connections.create_or_update(registry_connection_spec(
                self.image_cfg.registry, self.image_cfg.username, registry_password(self.image_cfg)))
        self.client.compute.begin_create_or_update(compute_spec(self.azure, self.pool.nodes)).result()

    def wait_until_ready(self) -> None:
        state = self.client.compute.get(self.azure.compute).provisioning_state
        if state != "Succeeded":
            raise PoolError(f"Azure ML compute {self.azure.compute} is {state}, not Succeeded; see its provisioning "
                            "errors in Azure ML studio (quota for azureml.vm_size is the usual cause)", permanent=True)

    def describe(self) -> dict:
        found = self.client.compute.get(self.azure.compute)
        return {"backend": "azureml", "run_id": self.run_id, "compute": found.name, "vm_size": found.size,
                "max_nodes": found.max_instances, "state": found.provisioning_state}

    def delete(self) -> None:
        if self.azure.at_end == "delete":
            self.client.compute.begin_delete(self.azure.compute).result()
            return
        found = self.client.compute.get(self.azure.compute)
        found.min_instances = 0
        self.client.compute.begin_update(found).result()

    def delete_leftovers(self, keep: set[str]) -> list[str]:
        """Nothing: the cluster is shared by every run and scales down by itself."""
        return []

    def job(self, training, timeout_s: float = 0) -> "AzureMLJob":
        return AzureMLJob(self, job_spec(training, self.azure, self.pool, self.run, self.image, timeout_s))


@dataclass
class AzureMLJob:
    """One Azure ML command job: submitted, its logs streamed, its status polled, cancellable."""

    pool: AzureMLPool
    spec: object
    name: str = ""

    @property
    def client(self):
        return self.pool.client

    def describe(self) -> str:
        return f"Azure ML command job on {self.pool.pool.nodes} nodes x {self.pool.pool.slots_per_node} processes: " \
               f"{self.spec.command}"

    def check(self) -> None:
        """Nothing to check here: the trainer checks its input on the nodes, where the data is."""

    def submit(self) -> None:
        self.name = self.client.jobs.create_or_update(self.spec).name

    def lines(self) -> Iterator[str]:
        """The job's log lines as Azure ML streams them (jobs.stream prints them; they are caught here)."""
        lines: queue.Queue = queue.Queue()

        def pump() -> None:
            with printed_lines(lines.put):
                try:
                    self.client.jobs.stream(self.name)
                except Exception as exc:  # a failed job ends its stream with an exception; poll() says why
                    lines.put(f"[azureml] {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}\n")
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        return iter(lines.get, None)

    def poll(self) -> int | None:
        status = self.client.jobs.get(self.name).status
        if status == "Completed":
            self.download_results()
        return FINAL.get(status)

    def cancel(self) -> None:
        if self.name:
            self.client.jobs.begin_cancel(self.name)

    def download_results(self) -> None:
        """The job's results output into the run's folder (metrics.json, model, checkpoints)."""
        out = self.pool.run.out
        staging = out / ".azureml-download"
        self.client.jobs.download(self.name, download_path=staging, output_name="results")
        for item in (staging / "named-outputs" / "results").iterdir():
            shutil.move(str(item), out / item.name)
        shutil.rmtree(staging, ignore_errors=True)


class _ThreadLines:
    """sys.stdout for one thread: its writes become whole lines handed to `emit`; other threads write through."""

    def __init__(self, emit, original, owner: int):
        self.emit, self.original, self.owner, self.pending = emit, original, owner, ""

    def write(self, text: str) -> int:
        if threading.get_ident() != self.owner:
            return self.original.write(text)
        *whole, self.pending = (self.pending + text).split("\n")
        for line in whole:
            self.emit(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, name):
        return getattr(self.original, name)


@contextmanager
def printed_lines(emit) -> Iterator[None]:
    """What this thread prints goes to `emit`, line by line, for the block."""
    original = sys.stdout
    sys.stdout = _ThreadLines(emit, original, threading.get_ident())
    try:
        yield
    finally:
        if sys.stdout.pending:
            emit(sys.stdout.pending + "\n")
        sys.stdout = original


class AzureMLBackend:
    """An Azure ML compute cluster and one command job per run."""

    name = "azureml"
    needs_image = True
    settings = AzureMLConfig

    def check(self, cfg) -> None:
        check_world(cfg.pool, cfg.training.workers)
        check_complete(cfg.azureml, reads_nfs=cfg.azureml.data_source == "nfs" and cfg.data != SYNTHETIC)
        if cfg.fileshare.backend != "azure":
            raise ValueError("the azureml pool reads the scripts from the Azure Files share; set fileshare.backend: "
                             "azure (and azureml.datastore to the datastore registered for that share)")

    def nodes(self, pool) -> int:
        return pool.nodes

    def scripts_root(self, cfg) -> Path:
        """The root of the Azure Files datastore: scripts/<version> is a path relative to it."""
        return Path()

    def pool(self, cfg, run: RunPaths, image: str | None) -> AzureMLPool:
        return AzureMLPool(cfg.pool, run, cfg.azureml, image or "<image>", cfg.image)

    def specs(self, cfg, run: RunPaths, image: str | None) -> dict[str, str]:
        """The exact specs the pool and job would send, as YAML (`az ml compute/environment/job create --file`)."""
        pool = self.pool(cfg, run, image)
        specs = {"compute": yaml_text(compute_spec(cfg.azureml, cfg.pool.nodes)),
                 "environment": yaml_text(environment_spec(pool.image)),
                 "job": yaml_text(pool.job(cfg.training, cfg.job.timeout_s).spec)}
        if cfg.azureml.registry_access == "connection":  # the password is read at run time, never shown
            placeholder = f"<the value of ${cfg.image.password_env}>"
            specs["registry connection"] = yaml_text(registry_connection_spec(cfg.image.registry, cfg.image.username,
                                                                              placeholder))
        return specs
