"""Azure Machine Learning compute as the pool and Azure ML command jobs as the job (azure-ai-ml v2).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.launcher import SYNTHETIC, TrainingConfig
from infra.pools import PoolConfig, PoolError

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


@dataclass(frozen=True)
class JobPlan:
    """What one training job needs besides the config: its run id, the image and the scripts version."""

    run_id: str
    image: str
    scripts: str  # scripts/<version> on the datastore
    dataset: str


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


def check_world(pool: PoolConfig, workers: int) -> None:
    """Refuse a world size other than nodes x processes per node (Azure ML starts exactly that many)."""
    if pool.slots() != workers:
        raise ValueError(f"training.workers is {workers} but the azureml pool starts pool.nodes {pool.nodes} x "
                         f"pool.slots_per_node {pool.slots_per_node} (GPUs per node) = {pool.slots()} processes; "
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


def engine_command(training: TrainingConfig, pool: PoolConfig, data: str) -> str:
    """The command each node runs: the engine under MPI (Horovod) or under torchrun (one per node)."""
    from infra.launcher import engine_argv, torchrun_options

    engine = " ".join(engine_argv(training, data, RESULTS_OUTPUT, script=f"{SCRIPTS_INPUT}/trainer/train.py"))
    if training.launcher == "horovodrun":  # Azure ML's mpirun starts gpus_per_node of these per node
        return f"python {engine}"
    # Azure ML's PyTorch distribution sets MASTER_ADDR, MASTER_PORT and NODE_RANK on every node
    options = torchrun_options(pool.nodes, pool.slots_per_node, "$NODE_RANK", "$MASTER_ADDR", "$MASTER_PORT")
    return f"torchrun {' '.join(options)} {engine}"


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


def job_spec(training: TrainingConfig, cfg: AzureMLConfig, pool: PoolConfig, plan: JobPlan, timeout_s: float):
    """The Azure ML command job for one training run."""
    from azure.ai.ml import Input, MpiDistribution, Output, PyTorchDistribution, command

    check_world(pool, training.workers)
    prefix, inputs, data = data_input(cfg, plan.dataset)
    scripts = f"azureml://datastores/{cfg.datastore}/paths/{plan.scripts}"
    results = f"azureml://datastores/{cfg.datastore}/paths/results/{plan.run_id}"
    distribution = (MpiDistribution(process_count_per_instance=pool.slots_per_node) if training.launcher == "horovodrun"
                    else PyTorchDistribution(process_count_per_instance=1))
    return command(
        name=f"trainflow-{plan.run_id}", display_name=f"trainflow {plan.run_id}", experiment_name=cfg.experiment,
        command=prefix + engine_command(training, pool, data), environment=environment_spec(plan.image),
        compute=cfg.compute, instance_count=pool.nodes, distribution=distribution, shm_size=cfg.shm_size,
        inputs={"scripts": Input(type="uri_folder", path=scripts, mode="ro_mount"), **inputs},
        outputs={"results": Output(type="uri_folder", path=results, mode="rw_mount")},
        environment_variables=nccl_environment(cfg), timeout=int(timeout_s) or None, tags={"trainflow.run": plan.run_id})


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

    cfg: PoolConfig
    run_id: str
    azure: AzureMLConfig
    client: object
    image: str
    connection: object = None  # registry_connection_spec(...) when the workspace cannot pull by itself

    def create(self) -> None:
        if self.connection is not None:
            self.client.connections.create_or_update(self.connection)
        self.client.compute.begin_create_or_update(compute_spec(self.azure, self.cfg.nodes)).result()

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


@dataclass
class AzureMLJob:
    """One Azure ML command job: submitted, its logs streamed, its status polled, cancellable."""

    client: object
    spec: object
    out: Path
    name: str = ""

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
        staging = self.out / ".azureml-download"
        self.client.jobs.download(self.name, download_path=staging, output_name="results")
        for item in (staging / "named-outputs" / "results").iterdir():
            shutil.move(str(item), self.out / item.name)
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
