"""The azureml pool's settings (`pool:` with backend azureml) and the rules on them, checked when a config loads."""

import re
from typing import Literal

from pydantic import Field

from infra.compute.base import PoolSection
from infra.images.registry import ImageConfig

# VM sizes with InfiniBand carry an "r" among their feature letters (ND96asr_v4, ND96isr_H100_v5, NC24rs_v3).
ENTRA_TOKEN_USER = "00000000-0000-0000-0000-000000000000"  # `az acr login --expose-token`'s user name
VM_FEATURES = re.compile(r"^Standard_[A-Z]+\d+([a-z]*)")


class AzureMLPoolConfig(PoolSection):
    """The azureml pool: the Azure ML workspace, the cluster, how jobs reach data, scripts and results, and retries;
    the job starts nodes x slots_per_node (GPUs per node) processes."""

    backend: Literal["azureml"] = "azureml"

    @classmethod
    def auto_slots(cls, value: object) -> object:
        """No `auto`: this machine's GPUs say nothing of the cluster's VMs."""
        if value == "auto":
            raise ValueError(
                "pool.slots_per_node auto counts this machine's GPUs, not the cluster's: give the GPUs per node of "
                "pool.vm_size (e.g. 8 for Standard_ND96asr_v4)"
            )
        return value

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
