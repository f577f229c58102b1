"""Checks that take about a second and run before Prefect, Azurite or any upload starts, so a credential or
storage mistake fails at once with the same one-line error a run would meet minutes later.

    check_access(cfg)   the environment variables the config names are set; Blob storage accepts the
                        credentials (one listing, short timeouts); the container exists when the run needs it
                        (data: staged, or a credential that cannot create it); the data set is staged (data:
                        staged); the Azure file share answers.

Nothing is checked for storage.backend azurite (trainflow starts Azurite itself) or a local file share.
"""

import os
from collections.abc import Mapping

from azure.core.credentials import TokenCredential

from flows.config import STAGED, FlowConfig
from infra.core.errors import BadInput
from infra.data.manifest import manifest_blob
from infra.services.azurite import check_databases
from infra.storage import blobstore, credentials, errors, fileshare


def check_access(
    cfg: FlowConfig, environ: Mapping[str, str] | None = None, credential: TokenCredential | None = None
) -> None:
    """Raise the StorageError or BadInput a run of `cfg` would meet on storage, before anything starts;
    `credential` stands in for DefaultAzureCredential (auth default) in tests."""
    env = os.environ if environ is None else environ
    check_variables(cfg, env)
    if cfg.storage.backend == "azure":
        check_blob(cfg, env, credential)
    else:  # Azurite, which the run starts: a database of its cut short is named now, before Prefect's server starts
        check_databases(cfg.workdir / "azurite")
    fileshare.check_share(cfg.fileshare, env)


def check_variables(cfg: FlowConfig, environ: Mapping[str, str]) -> None:
    """Every environment variable a credential is read from is set; all that are not are named at once."""
    wanted: dict[str, list[str]] = {}
    for setting, variable in {
        **credentials.secret_settings(cfg.storage),
        **fileshare.secret_settings(cfg.fileshare),
    }.items():
        wanted.setdefault(variable, []).append(setting)
    missing = [
        f"{variable} (named by {' and '.join(settings)})"
        for variable, settings in wanted.items()
        if not environ.get(variable)
    ]
    if missing:
        plural = len(missing) > 1
        raise errors.MissingSecret(
            f"environment variable{'s' if plural else ''} {', '.join(missing)} "
            f"{'are' if plural else 'is'} not set; export {'them' if plural else 'it'} "
            "before running trainflow (values are never shown or stored)"
        )


def check_blob(cfg: FlowConfig, environ: Mapping[str, str], credential: TokenCredential | None) -> None:
    """One listing of the container: credentials accepted, the container there when needed, the data set staged."""
    store = blobstore.quick_store(cfg.storage, environ, credential)  # auth default: the delegation key is got here
    staged = cfg.data == STAGED
    manifest = manifest_blob(cfg.dataset_name())
    held = store.holds(manifest if staged else "")
    if held is None and (staged or not credentials.may_create_container(cfg.storage, environ)):
        raise errors.storage_error("blob storage", store.where, "list the container", 404, "ContainerNotFound")
    if staged and not held:  # the same words as the sync's own check (tasks/sync_file_server.py)
        raise BadInput(
            f"data set {cfg.dataset_name()!r} was never staged: {store.where} has no {manifest}; "
            "run `trainflow stage` first"
        )
