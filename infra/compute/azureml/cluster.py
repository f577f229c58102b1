"""The cluster client: create the AmlCompute cluster or reuse it as it is, the registry connection, the sync and
training jobs on it, the results, scale to zero or delete. Thin: every spec comes from specs.py.
"""

import shutil
from dataclasses import dataclass, field
from typing import Any

from infra.compute.azureml.attempts import AzureMLJob
from infra.compute.azureml.settings import AzureMLPoolConfig, check_complete
from infra.compute.azureml.specs import (
    NFS_MOUNT,
    compute_spec,
    fixed_settings_differ,
    job_spec,
    needs_update,
    registry_connection_spec,
    sync_spec,
)
from infra.compute.base import PoolError, RunPaths
from infra.engines.program import IMAGE_RUNTIME, Program
from infra.images.registry import ImageConfig, registry_password


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
    runtime: str = IMAGE_RUNTIME  # where the image holds trainflow's node-side code (a script's rank shim)
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

    def job(self, program: Program, timeout_s: float = 0) -> "AzureMLJob":
        """The run's training job: attempt after attempt, each resuming from the checkpoints of the one before."""
        return AzureMLJob(
            self,
            lambda n: job_spec(program, self.pool, self.run, self.image, timeout_s, n, self.runtime),
            gpus=self.pool.nodes * self.pool.slots_per_node,
            on_complete=self.download_results,
        )

    def sync_job(self) -> "AzureMLJob":
        """The job that syncs Blob to the NFS file server on one node of the cluster (one GPU-node's worth of time)."""
        spec = lambda n: sync_spec(self.pool, self.run, self.image, n, self.runtime)  # noqa: E731
        return AzureMLJob(self, spec, gpus=self.pool.slots_per_node)

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
