"""The azureml backend: Azure Machine Learning compute as the pool, Azure ML command jobs as the job (azure-ai-ml v2).

The specs (AmlCompute, Environment, the sync and training command jobs) are built by plain functions
that need no network, so `trainflow run --dry-run` prints exactly what would be sent and the tests check
it. The clients around them are thin: create the cluster or reuse it as it is, run the sync job on it
(the NFS file server is only reachable inside the VNet), submit the training job as attempts (each its
own job name; a pre-empted or failed one is followed by the next, which resumes from the checkpoints all
attempts keep in one Blob datastore path), stream logs, map statuses, cancel, download the results,
scale the cluster to zero or delete it. tests/fakes/azureml.py is the service these run against here.
"""

import queue
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from infra.compute.base import Billing, PoolError, PoolSection, RunConfig, RunPaths, SyncWhere
from infra.core.errors import first_line
from infra.engines.contract import CHECKPOINT_LINE, ERROR_LINE, SYNTHETIC, TrainingSettings, trainer_argv
from infra.engines.launchers import LaunchError, torchrun_options
from infra.images.registry import ImageConfig, registry_password
from trainer.staged.fetch import BAD_INPUT
from trainer.staged.names import dataset_prefix

# Azure ML job statuses that end a job, and the exit status each maps to.
FINAL = {"Completed": 0, "Failed": 1, "Canceled": 1, "NotResponding": 1}
# VM sizes with InfiniBand carry an "r" among their feature letters (ND96asr_v4, ND96isr_H100_v5, NC24rs_v3).
VM_FEATURES = re.compile(r"^Standard_[A-Z]+\d+([a-z]*)")
NFS_MOUNT = "/mnt/fileserver"
SCRIPTS_INPUT, SHARDS_INPUT, RESULTS_OUTPUT = "${{inputs.scripts}}", "${{inputs.shards}}", "${{outputs.results}}"


class AzureMLPoolConfig(PoolSection):
    """The azureml pool: the Azure ML workspace, the cluster, how jobs reach data, scripts and results, and retries;
    the job starts nodes x slots_per_node (GPUs per node) processes."""

    backend: Literal["azureml"] = "azureml"
    subscription_id: str = ""
    """Azure subscription id of the workspace."""
    resource_group: str = ""
    """Resource group of the workspace."""
    workspace: str = ""
    """Azure ML workspace name."""
    compute: str = "trainflow-gpu"
    """AmlCompute cluster name; created if missing, reused if present (never replaced: see vm_size)."""
    vm_size: str = "Standard_NC24ads_A100_v4"
    """Node VM size. Fixed once the cluster exists: a different one is refused (pick another compute name)."""
    min_nodes: int = Field(0, ge=0)
    """Nodes the cluster keeps when idle (0: it scales down to nothing after idle_seconds)."""
    max_nodes: int = Field(4, ge=1)
    """Most nodes the cluster may grow to (raised to the job's node count when lower)."""
    idle_seconds: int = Field(600, ge=0)
    """Idle time before a node is released."""
    low_priority: bool = False
    """Low-priority (spot) nodes: much cheaper, may be pre-empted (a new attempt resumes from the checkpoints).
    Fixed once the cluster exists, like vm_size."""
    subnet: str | None = None
    """Resource id of the VNet subnet the nodes join (the one that reaches the NFS share and the registry)."""
    node_public_ip: bool = True
    """false: nodes without public IPs; needs `subnet` and a workspace private endpoint (infra/compute/azure
    makes one)."""
    at_end: Literal["delete", "scale_to_zero"] = "scale_to_zero"
    """After the run: delete the cluster, or keep it with min nodes 0 (with min_nodes 0 nothing is sent: it
    already scales to zero after idle_seconds)."""
    infiniband: Literal["auto", "on", "off"] = "auto"
    """auto: on for VM sizes with InfiniBand (an "r" in the size's features)."""
    datastore: str = "trainflow_files"
    """The Azure Files datastore of the file share: the job mounts scripts/<version> from it."""
    blob_datastore: str = "trainflow_blob"
    """The Blob datastore of storage.container: staged shards are read from it and every attempt writes its
    checkpoints and results to runs/<run id>/ in it (Azure ML downloads outputs from Blob, not Azure Files)."""
    data_source: Literal["nfs", "blob"] = "nfs"
    """nfs: a sync job on the cluster brings the NFS file server to the staged version and every node mounts it
    (once per node); blob: every node fetches the staged shards from blob_datastore to its local disk."""
    nfs_export: str = ""
    """The NFS file server as host:/path, e.g. <account>.file.core.windows.net:/<account>/<share>."""
    blob_mode: Literal["ro_mount", "download"] = "ro_mount"
    """data_source blob: how the shards reach the node before they are unpacked (ro_mount streams them; download
    copies them first, then the unpack reads local files)."""
    local_disk: str = "/tmp/trainflow"
    """data_source blob: the folder on each node's local disk the data set is unpacked into."""
    max_attempts: int = Field(3, ge=1)
    """Attempts of the training job: a pre-empted or failed attempt (not bad input) is followed by a new one,
    under a new job name, that resumes from the newest checkpoint."""
    max_gpu_hours: float = Field(0, ge=0)
    """No new attempt once the run's attempts have used this many GPU-hours (0: no bound)."""
    registry_access: Literal["workspace", "connection"] = "workspace"
    """How Azure ML pulls the image. workspace: with the cluster's identity (AcrPull on the registry that
    infra/compute/azure makes); connection: through a workspace connection holding image.username and the registry
    password (an ACR token or admin user: an Entra access token expires in about 3 h and is refused)."""
    experiment: str = "trainflow"
    """Azure ML experiment the jobs are filed under."""
    shm_size: str = "32g"
    """/dev/shm of the job's containers (data loader workers share batches through it)."""


ENTRA_TOKEN_USER = "00000000-0000-0000-0000-000000000000"  # `az acr login --expose-token`'s user name
ERROR_MESSAGE = re.compile(r'"message":\s*"((?:[^"\\]|\\.)*)"')  # in the error JSON that jobs.stream raises
PREEMPTED = re.compile(r"pre-?empt", re.IGNORECASE)  # "PreemptionError: Nodes of this job got pre-empted"
STEP_LINE = re.compile(r"epoch \d+ step (\d+) ")  # the trainer's progress line (every training.log_every steps)


def check_complete(cfg: AzureMLPoolConfig, reads_nfs: bool) -> None:
    """Refuse an azureml section that lacks what a run needs, naming the settings."""
    needed = ["subscription_id", "resource_group", "workspace"] + (["nfs_export"] if reads_nfs else [])
    missing = [f"pool.{name}" for name in needed if not getattr(cfg, name)]
    if missing:
        raise ValueError(
            f"the azureml pool needs {', '.join(missing)}; infra/compute/azure/deploy.sh prints them "
            "for your deployment"
        )
    if not cfg.node_public_ip and not cfg.subnet:
        raise ValueError(
            "pool.node_public_ip false needs pool.subnet (a subnet of a VNet with a workspace "
            "private endpoint, as infra/compute/azure/main.bicep makes)"
        )


def check_registry(cfg: AzureMLPoolConfig, image_cfg: ImageConfig) -> None:
    """Refuse a registry connection without a registry and user, or holding an Entra access token: it expires in
    about 3 h, and a later attempt's nodes pull the image again."""
    if cfg.registry_access != "connection":
        return
    if not (image_cfg.registry and image_cfg.username):
        raise ValueError(
            "pool.registry_access connection needs image.registry and image.username (the user whose "
            "password the connection holds); set them, or use registry_access: workspace"
        )
    if image_cfg.username == ENTRA_TOKEN_USER:
        raise ValueError(
            "pool.registry_access connection with an Entra access token (image.username "
            f"{ENTRA_TOKEN_USER}) breaks pulls after about 3 h; use registry_access: workspace (the "
            "cluster's identity has AcrPull) or an ACR token (az acr token create) as image.username"
        )


def infiniband(cfg: AzureMLPoolConfig) -> bool:
    """Whether the nodes have InfiniBand (by config, or by the VM size's features)."""
    if cfg.infiniband != "auto":
        return cfg.infiniband == "on"
    match = VM_FEATURES.match(cfg.vm_size)
    return bool(match and "r" in match.group(1))


def nccl_environment(cfg: AzureMLPoolConfig) -> dict[str, str]:
    """NCCL settings for the nodes; InfiniBand on when the VM has it."""
    env = {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
    if infiniband(cfg):
        return {**env, "NCCL_IB_DISABLE": "0", "NCCL_NET_GDR_LEVEL": "5", "UCX_TLS": "rc"}
    return {**env, "NCCL_IB_DISABLE": "1"}


def check_world(pool: AzureMLPoolConfig, workers: int) -> None:
    """Refuse a world size other than nodes x processes per node (Azure ML starts exactly that many)."""
    slots = pool.nodes * pool.slots_per_node
    if slots != workers:
        raise ValueError(
            f"training.workers is {workers} but the azureml pool starts pool.nodes {pool.nodes} x "
            f"pool.slots_per_node {pool.slots_per_node} (GPUs per node) = {slots} processes; "
            "make them equal"
        )


def compute_spec(cfg: AzureMLPoolConfig, nodes: int, min_nodes: int | None = None):
    """The whole AmlCompute cluster, grown to at least `nodes` nodes: a PUT replaces a cluster, so nothing is
    left out (the system identity holds AcrPull; the subnet goes by its full id)."""
    from azure.ai.ml.entities import AmlCompute, IdentityConfiguration, NetworkSettings

    return AmlCompute(
        name=cfg.compute,
        size=cfg.vm_size,
        min_instances=cfg.min_nodes if min_nodes is None else min_nodes,
        max_instances=max(cfg.max_nodes, nodes),
        idle_time_before_scale_down=cfg.idle_seconds,
        tier="low_priority" if cfg.low_priority else "dedicated",  # the SDK's names for vm_priority
        network_settings=NetworkSettings(subnet=cfg.subnet) if cfg.subnet else None,
        enable_node_public_ip=cfg.node_public_ip,
        ssh_public_access_enabled=False,
        identity=IdentityConfiguration(type="system_assigned"),
        tags={"trainflow": "pool"},
    )


def fixed_settings_differ(spec, found) -> list[str]:
    """The settings an existing cluster cannot change in place that the spec asks to change."""
    wanted = {
        "pool.vm_size": (spec.size.lower(), (found.size or "").lower()),
        "pool.low_priority": (spec.tier, found.tier),
    }
    return [f"{name} ({old!r} there, {new!r} asked)" for name, (new, old) in wanted.items() if new != old]


def needs_update(spec, found) -> bool:
    """Whether the existing cluster's changeable settings differ from the spec's."""
    scale = ("min_instances", "max_instances")
    return (
        [getattr(found, key) for key in scale] != [getattr(spec, key) for key in scale]
        or int(found.idle_time_before_scale_down or 0) != spec.idle_time_before_scale_down
        or found.identity is None
    )


def environment_spec(image: str):
    """The job's environment: the pushed training image, by digest."""
    from azure.ai.ml.entities import Environment

    return Environment(image=image, description="trainflow training image (pushed by build-image)")


def registry_connection_spec(image_cfg: ImageConfig, password: str):
    """The workspace connection through which Azure ML pulls from a registry that is not the workspace's, as
    image.username (check_registry refuses a connection without a registry or a user)."""
    from azure.ai.ml.entities import UsernamePasswordConfiguration, WorkspaceConnection

    registry, username = image_cfg.registry or "", image_cfg.username or ""
    return WorkspaceConnection(
        name=f"trainflow-{registry.split('.')[0].split(':')[0]}",
        type="container_registry",
        target=registry,
        credentials=UsernamePasswordConfiguration(username=username, password=password),
    )


def launch_command(training: TrainingSettings, pool: AzureMLPoolConfig, data: str) -> str:
    """The command each node runs: the trainer under MPI (Horovod) or under torchrun (one per node)."""
    trainer = " ".join(trainer_argv(training, data, RESULTS_OUTPUT, SCRIPTS_INPUT))
    if training.launcher == "horovodrun":  # Azure ML's mpirun starts gpus_per_node of these per node
        return f"python {trainer}"
    # Azure ML's PyTorch distribution sets MASTER_ADDR, MASTER_PORT and NODE_RANK on every node
    options = torchrun_options(pool.nodes, pool.slots_per_node, "$NODE_RANK", "$MASTER_ADDR", "$MASTER_PORT")
    return f"torchrun {' '.join(options)} {trainer}"


def nfs_mount(cfg: AzureMLPoolConfig, options: str) -> str:
    """Shell that mounts the NFS file server once per node: the first rank mounts under a node-wide lock, the
    others wait for the lock and find it mounted (`mountpoint -q`). Needs nfs-common (mount.nfs) in the image and
    a job container allowed to mount (root, as Azure ML runs it; not documented either way)."""
    mount = (
        f"mountpoint -q {NFS_MOUNT} || {{ mkdir -p {NFS_MOUNT} && "
        f"mount -t nfs -o {options},vers=4,minorversion=1,sec=sys {cfg.nfs_export} {NFS_MOUNT}; }}"
    )
    return f"flock /tmp/trainflow-nfs.lock sh -c '{mount}' && "


def fetch_command(source: str, export: str, dataset: str) -> str:
    """Shell that brings `export` to the data set staged in `source` (trainer/staged/fetch.py; ranks of a node wait
    for the first one's fetch)."""
    return f"python {SCRIPTS_INPUT}/trainer/staged/fetch.py --source {source} --export {export} --dataset {dataset} && "


def data_input(cfg: AzureMLPoolConfig, run: RunPaths) -> tuple[str, dict, str]:
    """(shell prefix, inputs, --data path): the NFS file server mounted once per node, or the staged shards from
    the Blob datastore unpacked to each node's local disk."""
    from azure.ai.ml import Input

    dataset = run.dataset
    if run.synthetic:
        return "", {}, SYNTHETIC
    if cfg.data_source == "nfs":
        return nfs_mount(cfg, "ro"), {}, f"{NFS_MOUNT}/datasets/{dataset}/current"
    shards = Input(
        type="uri_folder", path=datastore_path(cfg.blob_datastore, dataset_prefix(dataset)), mode=cfg.blob_mode
    )
    return (
        fetch_command(SHARDS_INPUT, cfg.local_disk, dataset),
        {"shards": shards},
        f"{cfg.local_disk}/datasets/{dataset}/current",
    )


def datastore_path(datastore: str, path: str) -> str:
    """The azureml:// URI of a path in a datastore."""
    return f"azureml://datastores/{datastore}/paths/{path.strip('/')}/"


def attempt_name(run_id: str, attempt: int, kind: str = "train") -> str:
    """The job name of one attempt (job names are unique in a workspace, so every attempt needs its own)."""
    return f"trainflow-{run_id}-{kind}-{attempt}"


def job_spec(
    training: TrainingSettings, pool: AzureMLPoolConfig, run: RunPaths, image: str, timeout_s: float, attempt: int = 1
):
    """The Azure ML command job of one attempt; every attempt of a run shares runs/<run id>/ in the Blob
    datastore, so a new attempt resumes from the newest checkpoint there."""
    from azure.ai.ml import MpiDistribution, Output, PyTorchDistribution, command

    check_world(pool, training.workers)
    prefix, inputs, data = data_input(pool, run)
    distribution = (
        MpiDistribution(process_count_per_instance=pool.slots_per_node)
        if training.launcher == "horovodrun"
        else PyTorchDistribution(process_count_per_instance=1)
    )
    return command(
        name=attempt_name(run.run_id, attempt),
        display_name=f"trainflow {run.run_id} attempt {attempt}",
        experiment_name=pool.experiment,
        command=prefix + launch_command(training, pool, data),
        environment=environment_spec(image),
        compute=pool.compute,
        instance_count=pool.nodes,
        distribution=distribution,
        shm_size=pool.shm_size,
        environment_variables=nccl_environment(pool),
        inputs={"scripts": scripts_input(pool, run), **inputs},
        outputs={"results": Output(type="uri_folder", path=results_path(pool, run.run_id), mode="rw_mount")},
        timeout=int(timeout_s) or None,
        tags={"trainflow.run": run.run_id, "trainflow.attempt": str(attempt)},
    )


def scripts_input(cfg: AzureMLPoolConfig, run: RunPaths):
    """The scripts version on the file share's datastore, mounted read-only."""
    from azure.ai.ml import Input

    return Input(type="uri_folder", path=datastore_path(cfg.datastore, run.scripts.as_posix()), mode="ro_mount")


def results_path(cfg: AzureMLPoolConfig, run_id: str) -> str:
    """Where every attempt of a run writes checkpoints and results: one stable Blob datastore path."""
    return datastore_path(cfg.blob_datastore, f"runs/{run_id}")


def sync_spec(cfg: AzureMLPoolConfig, run: RunPaths, image: str, attempt: int = 1):
    """The job that syncs the staged data set from the Blob datastore to the NFS file server, on one node of the
    cluster (inside the VNet, where the file server is), so the flow itself may run anywhere."""
    from azure.ai.ml import Input, command

    shards = Input(
        type="uri_folder", path=datastore_path(cfg.blob_datastore, dataset_prefix(run.dataset)), mode="ro_mount"
    )
    fetch = fetch_command(SHARDS_INPUT, NFS_MOUNT, run.dataset).removesuffix(" && ")
    return command(
        name=attempt_name(run.run_id, attempt, "sync"),
        display_name=f"trainflow {run.run_id} sync {attempt}",
        experiment_name=cfg.experiment,
        command=nfs_mount(cfg, "rw") + fetch,
        environment=environment_spec(image),
        compute=cfg.compute,
        instance_count=1,
        inputs={"scripts": scripts_input(cfg, run), "shards": shards},
        tags={"trainflow.run": run.run_id, "trainflow.step": "sync"},
    )


def yaml_text(entity) -> str:
    """The YAML that `az ml ... create --file` takes for an entity (a command builder becomes its job)."""
    import io
    import logging

    logging.getLogger("azure.ai.ml._utils._experimental").setLevel(logging.ERROR)  # "experimental class" notes
    entity = entity._to_job() if hasattr(entity, "_to_job") else entity  # the job `az ml job create` takes
    buffer = io.StringIO()
    entity.dump(buffer)
    return buffer.getvalue()


def ml_client(cfg: AzureMLPoolConfig):
    """An MLClient for the workspace, authenticated with DefaultAzureCredential (az login, managed identity, ...)."""
    from azure.ai.ml import MLClient
    from azure.identity import DefaultAzureCredential

    check_complete(cfg, reads_nfs=False)
    return MLClient(DefaultAzureCredential(), cfg.subscription_id, cfg.resource_group, cfg.workspace)


@dataclass
class AzureMLPool:
    """An AmlCompute cluster as the pool: created if missing, else reused as it is (updated only where its
    changeable settings differ from the config, refused where its fixed ones do); scaled to zero or deleted."""

    pool: AzureMLPoolConfig
    run: RunPaths
    image: str
    image_cfg: ImageConfig  # the registry connection's user and password
    _client: Any = field(default=None, repr=False)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def client(self):
        """The workspace's MLClient, made on first use (the dry run makes a pool without one)."""
        if self._client is None:
            self._client = ml_client(self.pool)
        return self._client

    def create(self) -> None:
        if self.pool.registry_access == "connection":
            password = registry_password(self.image_cfg) or ""  # None only without a user, which check_registry refuses
            self.client.connections.create_or_update(registry_connection_spec(self.image_cfg, password))
        spec, found = compute_spec(self.pool, self.pool.nodes), self.find()
        if found is None:
            self.put(spec)
            return
        differ = fixed_settings_differ(spec, found)
        if differ:
            raise PoolError(
                f"Azure ML compute {self.pool.compute} exists with other fixed settings: "
                f"{'; '.join(differ)}. Azure ML cannot change them in place: set them as they are, name "
                "another pool.compute, or delete the cluster",
                permanent=True,
            )
        if needs_update(spec, found):
            self.put(spec)

    def find(self):
        """The cluster as the workspace has it, or None."""
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return self.client.compute.get(self.pool.compute)
        except ResourceNotFoundError:
            return None

    def put(self, spec) -> None:
        """Create or replace the cluster with a whole spec (a PUT: what the spec leaves out is gone)."""
        self.client.compute.begin_create_or_update(spec).result()

    def wait_until_ready(self) -> None:
        state = self.client.compute.get(self.pool.compute).provisioning_state
        if state != "Succeeded":
            raise PoolError(
                f"Azure ML compute {self.pool.compute} is {state}, not Succeeded; see its provisioning "
                "errors in Azure ML studio (quota for pool.vm_size is the usual cause)",
                permanent=True,
            )

    def describe(self) -> dict:
        found = self.client.compute.get(self.pool.compute)
        return {
            "backend": "azureml",
            "run_id": self.run_id,
            "compute": found.name,
            "vm_size": found.size,
            "tier": found.tier,
            "max_nodes": found.max_instances,
            "state": found.provisioning_state,
        }

    def delete(self) -> None:
        """at_end delete: delete the cluster; scale_to_zero: nothing while min nodes is 0 (idle nodes go after
        idle_seconds), else the whole spec again with min nodes 0 (never the fetched one: see compute_spec)."""
        if self.pool.at_end == "delete":
            self.client.compute.begin_delete(self.pool.compute).result()
            return
        found = self.find()
        if found is not None and found.min_instances:
            self.put(compute_spec(self.pool, self.pool.nodes, min_nodes=0))

    def delete_leftovers(self, keep: set[str]) -> list[str]:
        """Nothing: the cluster is shared by every run and scales down by itself."""
        return []

    def job(self, training: TrainingSettings, timeout_s: float = 0) -> "AzureMLJob":
        """The run's training job: attempt after attempt, each resuming from the checkpoints of the one before."""
        return AzureMLJob(
            self,
            lambda n: job_spec(training, self.pool, self.run, self.image, timeout_s, n),
            gpus=self.pool.nodes * self.pool.slots_per_node,
            on_complete=self.download_results,
        )

    def sync_job(self) -> "AzureMLJob":
        """The job that syncs Blob to the NFS file server on one node of the cluster (one GPU-node's worth of time)."""
        return AzureMLJob(self, lambda n: sync_spec(self.pool, self.run, self.image, n), gpus=self.pool.slots_per_node)

    def synced_folder(self) -> str:
        """Where the nodes read the data set the sync job wrote: the NFS file server's current version."""
        return f"{NFS_MOUNT}/datasets/{self.run.dataset}/current"

    def download_results(self, name: str) -> None:
        """The job's results output (checkpoints, metrics.json, model.pt) into the run's folder."""
        out = self.run.out
        staging = out / ".azureml-download"
        self.client.jobs.download(name, download_path=staging, output_name="results")
        shutil.copytree(staging / "named-outputs" / "results", out, dirs_exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)


@dataclass
class Attempt:
    """One Azure ML job of a run: how it ended, why, what it cost, and the work it lost."""

    name: str
    gpus: int
    status: str = "Queued"
    why: str = ""
    running_since: float | None = None
    seconds: float = 0.0  # while Running, as the polls saw it
    last_step: int | None = None  # the newest step its log shows
    last_checkpoint: int | None = None  # the newest checkpoint it saved or resumed from
    bad_input: bool = False  # the trainer refused its input: another attempt would too
    error: str = ""  # what the job's stream raised (Azure ML's error, e.g. a PreemptionError)

    def read(self, line: str) -> None:
        """Note the progress, checkpoints and input errors a log line shows."""
        if step := STEP_LINE.search(line):
            self.last_step = int(step.group(1))
        if saved := CHECKPOINT_LINE.search(line):
            self.last_checkpoint = int(saved.group(1) or saved.group(2))
        self.bad_input = self.bad_input or bool(ERROR_LINE.search(line)) or line.startswith(BAD_INPUT)

    def clock(self, status: str, now: float) -> None:
        """Count the time the job spends Running (GPU time) from what each poll sees."""
        if status == "Running" and self.running_since is None:
            self.running_since = now
        elif status != "Running" and self.running_since is not None:
            self.seconds += now - self.running_since
            self.running_since = None

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.gpus / 3600

    @property
    def lost_steps(self) -> int:
        """Steps trained since the attempt's newest checkpoint (none lost when it completed)."""
        if self.status == "Completed" or self.last_step is None:
            return 0
        return max(self.last_step - (self.last_checkpoint or 0), 0)

    def row(self, number: int) -> dict:
        """The attempt in the run summary."""
        return {
            "attempt": number,
            "job": self.name,
            "ended": self.status,
            "why": self.why,
            "minutes": round(self.seconds / 60, 2),
            "gpu_hours": round(self.gpu_hours, 3),
            "last_step": self.last_step,
            "last_checkpoint": self.last_checkpoint,
            "lost_steps": self.lost_steps,
        }


def why_ended(attempt: Attempt) -> str:
    """Why an attempt ended, in words."""
    if attempt.status == "Completed":
        return "completed"
    if PREEMPTED.search(attempt.error):
        return "pre-empted (low-priority nodes taken back)"
    if attempt.bad_input:
        return "the trainer refused its input"
    message = ERROR_MESSAGE.search(attempt.error)
    return attempt.status.lower() + (f": {message.group(1)[:200]}" if message else "")


@dataclass
class AzureMLJob:
    """A run's job on Azure ML, as attempts: each a command job with its own name; a pre-empted or failed one
    (not bad input, not cancelled) is followed by the next while attempts and GPU-hours last."""

    pool: AzureMLPool
    make_spec: Callable[[int], Any]  # attempt number -> command job
    gpus: int
    on_complete: Callable[[str], None] = lambda name: None
    poll_seconds: float = 10.0
    history: list[Attempt] = field(default_factory=list)
    number: int = 0  # the current attempt's number (counting those of earlier tries of the step)
    code: int | None = None
    failure: str = ""
    _lines: queue.Queue = field(default_factory=queue.Queue, repr=False)
    _cancelled: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def client(self):
        return self.pool.client

    @property
    def spec(self):
        """The first attempt's command job (the dry run shows it)."""
        return self.make_spec(1)

    @property
    def name(self) -> str:
        return self.history[-1].name if self.history else ""

    def describe(self) -> str:
        cfg, spec = self.pool.pool, self.spec
        later = (
            (
                f" (then {spec.name.rsplit('-', 1)[0]}-2 ... -{cfg.max_attempts} if pre-empted or failed, each "
                "resuming from the newest checkpoint)"
            )
            if cfg.max_attempts > 1
            else ""
        )
        return f"Azure ML command job {spec.name} on {spec.resources.instance_count} node(s){later}: {spec.command}"

    def check(self) -> None:
        """Nothing to check here: the trainer checks its input on the nodes, where the data is."""

    def submit(self) -> None:
        self.number = self.attempts_before()
        self.submit_attempt()
        threading.Thread(target=self.supervise, daemon=True).start()

    def attempts_before(self) -> int:
        """Attempts of this run already in the workspace (a retry of the Prefect step continues their count)."""
        from azure.core.exceptions import ResourceNotFoundError

        number = 0
        while True:
            try:
                self.client.jobs.get(self.make_spec(number + 1).name)
            except ResourceNotFoundError:
                return number
            number += 1

    def submit_attempt(self) -> None:
        """Submit the next attempt under its own name."""
        self.number += 1
        number = self.number
        name = self.client.jobs.create_or_update(self.make_spec(number)).name
        self.history.append(Attempt(name, self.gpus))
        if number > 1:
            self._lines.put(f"[azureml] attempt {number} submitted as {name}; it resumes from the newest checkpoint\n")

    def supervise(self) -> None:
        """Run attempts until one completes or no new one may start; then end the lines."""
        try:
            while self.code is None:
                attempt = self.history[-1]
                self.follow(attempt)
                self.code = self.after(attempt)
        except Exception as exc:  # the service refused a call: the run fails, saying why
            self._lines.put(f"[azureml] {type(exc).__name__}: {first_line(exc)}\n")
            self.code = 1
        finally:
            self._lines.put(None)

    def follow(self, attempt: Attempt) -> None:
        """Stream an attempt's log and poll its status until it ends."""
        streamer = threading.Thread(target=self.stream, args=(attempt,), daemon=True)
        streamer.start()
        while (status := self.client.jobs.get(attempt.name).status) not in FINAL:
            attempt.clock(status, time.monotonic())
            self._cancelled.wait(self.poll_seconds)
        attempt.clock(status, time.monotonic())
        streamer.join(60)  # its stream ends with the job; what it raised says why the job ended
        attempt.status = status
        attempt.why = why_ended(attempt)

    def stream(self, attempt: Attempt) -> None:
        """The attempt's log lines as Azure ML streams them (jobs.stream prints them; they are caught here)."""

        def emit(line: str) -> None:
            attempt.read(line)
            self._lines.put(line)

        with printed_lines(emit):
            try:
                self.client.jobs.stream(attempt.name)
            except Exception as exc:  # a failed job ends its stream with an exception holding the service's error
                attempt.error = str(exc)

    def after(self, attempt: Attempt) -> int | None:
        """0 when the attempt completed, 1 when the run ends with it, None when a new attempt was submitted."""
        if attempt.status == "Completed":
            self.on_complete(attempt.name)
            return 0
        refused = self.refusal(attempt)
        ended = (
            f"{attempt.name} ended: {attempt.why} after {attempt.last_step or 0} steps, {attempt.lost_steps} "
            "since its last checkpoint" + (f"; {refused}" if refused else "")
        )
        self._lines.put(f"[azureml] {ended}\n")
        if refused:
            self.failure = ended
            return 1
        self.submit_attempt()
        return None

    def refusal(self, attempt: Attempt) -> str | None:
        """Why no new attempt may follow this one, or None."""
        cfg, spent = self.pool.pool, sum(a.gpu_hours for a in self.history)
        if attempt.status == "Canceled" or self._cancelled.is_set():
            return "cancelled: not retried"
        if attempt.bad_input:
            return "bad input: not retried"
        if self.number >= cfg.max_attempts:
            return f"no attempts left (pool.max_attempts {cfg.max_attempts})"
        if cfg.max_gpu_hours and spent >= cfg.max_gpu_hours:
            return f"GPU-hours spent: {spent:.2f} of pool.max_gpu_hours {cfg.max_gpu_hours:g}"
        return None

    def lines(self) -> Iterator[str]:
        return iter(self._lines.get, None)

    def poll(self) -> int | None:
        """None while attempts run; 0 when one completed; a failed run raises, saying why its last attempt ended
        (permanent: a retry of the step would only start more attempts than allowed)."""
        if self.code == 1:
            raise LaunchError(
                f"Azure ML job {self.failure or 'failed'}; its log is in the run's logs/launcher.log", permanent=True
            )
        return self.code

    def cancel(self) -> None:
        self._cancelled.set()
        if self.history:
            self.client.jobs.begin_cancel(self.name)

    def attempts(self) -> list[dict]:
        """Each attempt: its job, how and why it ended, its GPU-hours, and the steps it lost."""
        return [attempt.row(number) for number, attempt in enumerate(self.history, 1)]


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
    """An Azure ML compute cluster, a sync job on it, and the run's training job as attempts."""

    name = "azureml"
    needs_image = True
    settings = AzureMLPoolConfig

    def check(self, cfg: RunConfig[AzureMLPoolConfig]) -> None:
        pool = cfg.pool
        check_world(pool, cfg.training.workers)
        check_complete(pool, reads_nfs=pool.data_source == "nfs" and cfg.data != SYNTHETIC)
        check_registry(pool, cfg.image)
        if cfg.fileshare.backend != "azure":
            raise ValueError(
                "the azureml pool reads the scripts from the Azure Files share; set fileshare.backend: "
                "azure (and pool.datastore to the datastore registered for that share)"
            )

    def nodes(self, pool: AzureMLPoolConfig) -> int:
        return pool.nodes

    def billing(self, pool: AzureMLPoolConfig) -> Billing:
        """The cluster's VM size and priority, and the attempts a training job may make."""
        return pool.vm_size, pool.low_priority, pool.max_attempts

    def scripts_root(self, workdir: Path) -> Path:
        """The root of the Azure Files datastore: scripts/<version> is a path relative to it."""
        return Path()

    def sync_where(self, pool: AzureMLPoolConfig) -> SyncWhere:
        """pool: the NFS file server is only reachable inside the VNet, so a job on the cluster syncs it;
        nodes: every node fetches the shards from the Blob datastore itself when the job starts."""
        return "pool" if pool.data_source == "nfs" else "nodes"

    def pool(self, cfg: RunConfig[AzureMLPoolConfig], run: RunPaths, image: str | None) -> AzureMLPool:
        return AzureMLPool(cfg.pool, run, image or "<image>", cfg.image)

    def specs(self, cfg: RunConfig[AzureMLPoolConfig], run: RunPaths, image: str | None) -> dict[str, str]:
        """The exact specs the pool and jobs would send, as YAML (`az ml compute/environment/job create --file`)."""
        pool, settings = self.pool(cfg, run, image), cfg.pool
        specs = {
            "compute": yaml_text(compute_spec(settings, settings.nodes)),
            "environment": yaml_text(environment_spec(pool.image)),
        }
        if self.sync_where(settings) == "pool" and not run.synthetic:
            specs["sync job"] = yaml_text(pool.sync_job().spec)
        specs["job"] = yaml_text(pool.job(cfg.training, cfg.job.timeout_s).spec)
        specs["later attempts"] = later_attempts(settings, run.run_id)
        if settings.registry_access == "connection":  # the password is read at run time, never shown
            placeholder = f"<the value of ${cfg.image.password_env}>"
            specs["registry connection"] = yaml_text(registry_connection_spec(cfg.image, placeholder))
        return specs


def later_attempts(pool: AzureMLPoolConfig, run_id: str) -> str:
    """The dry run's note on the attempts that may follow the first one."""
    names = ", ".join(attempt_name(run_id, n) for n in range(2, pool.max_attempts + 1))
    return (
        f"# after a pre-emption or failure: {names or 'none (max_attempts 1)'}; the same spec "
        f"under the new name, resuming from {results_path(pool, run_id)}"
        f"checkpoints/ (bounded by max_attempts and max_gpu_hours)\n"
    )
