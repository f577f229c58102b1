"""The azureml backend: Azure Machine Learning compute as the pool, Azure ML command jobs as the job (azure-ai-ml v2).

The specs (AmlCompute, Environment, the sync and training command jobs) are built by plain functions
that need no network, so `trainflow run --dry-run` prints exactly what would be sent and the tests check
it. The clients around them are thin: create the cluster or reuse it as it is, run the sync job on it
(the NFS file server is only reachable inside the VNet), submit the training job as attempts (each its
own job name; a pre-empted or failed one is followed by the next, which resumes from the checkpoints all
attempts keep in one Blob datastore path), stream logs, map statuses, cancel, download the results,
scale the cluster to zero or delete it. tests/fakes/azureml.py is the service these run against here.

The package: `settings` (the pool's section and its rules), `specs` (the pure spec builders), `cluster` (the client
of the cluster and its jobs), `attempts` (the training job as attempts, the pre-emption policy), and the backend
below, which the registry of infra/compute/__init__.py names.
"""

from pathlib import Path

from infra.compute.azureml.cluster import AzureMLPool
from infra.compute.azureml.settings import AzureMLPoolConfig, check_complete, check_registry, check_world
from infra.compute.azureml.specs import (
    attempt_name,
    compute_spec,
    environment_spec,
    registry_connection_spec,
    results_path,
    values_hidden,
    yaml_text,
)
from infra.compute.base import Billing, RunConfig, RunPaths, SyncWhere
from infra.engines.contract import SYNTHETIC, TrainingSettings
from infra.engines.program import Program


class AzureMLBackend:
    """An Azure ML compute cluster, a sync job on it, and the run's training job as attempts."""

    name = "azureml"
    needs_image = True
    reads_local_files = False
    settings = AzureMLPoolConfig

    def check(self, cfg: RunConfig[AzureMLPoolConfig]) -> None:
        pool = cfg.pool
        self.check_world(pool, cfg.training)
        check_complete(pool, reads_nfs=pool.data_source == "nfs" and cfg.data != SYNTHETIC)
        check_registry(pool, cfg.image)
        if cfg.fileshare.backend != "azure":
            raise ValueError(
                "the azureml pool reads the scripts from the Azure Files share; set fileshare.backend: "
                "azure (and pool.datastore to the datastore registered for that share)"
            )

    def check_world(self, pool: AzureMLPoolConfig, training: TrainingSettings) -> None:
        check_world(pool, training.workers)

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

    def specs(
        self, cfg: RunConfig[AzureMLPoolConfig], run: RunPaths, image: str | None, program: Program
    ) -> dict[str, str]:
        """The exact specs the pool and jobs would send, as YAML (`az ml compute/environment/job create --file`)."""
        pool, settings = self.pool(cfg, run, image), cfg.pool
        specs = {
            "compute": yaml_text(compute_spec(settings, settings.nodes)),
            "environment": yaml_text(environment_spec(pool.image)),
        }
        if self.sync_where(settings) == "pool" and not run.synthetic:
            specs["sync job"] = yaml_text(pool.sync_job().spec)
        specs["job"] = yaml_text(values_hidden(pool.job(program, cfg.job.timeout_s).spec, program.secret_variables))
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
