"""The specs trainflow sends to Azure ML (AmlCompute, Environment, the sync and training command jobs, the registry
connection), built by plain functions that need no network: `trainflow run --dry-run` prints exactly these, and the
tests check them against the documented rules (tests/fakes/azureml.py).
"""

import re
import shlex

from infra.compute.azureml.settings import AzureMLPoolConfig, nccl_environment
from infra.compute.base import RunPaths
from infra.engines.contract import SYNTHETIC
from infra.engines.launchers import torchrun_options
from infra.engines.program import IMAGE_RUNTIME, NodePaths, Program
from infra.images.registry import ImageConfig
from nodelib.staged.names import dataset_prefix

NFS_MOUNT = "/mnt/fileserver"
SCRIPTS_INPUT, SHARDS_INPUT, RESULTS_OUTPUT = "${{inputs.scripts}}", "${{inputs.shards}}", "${{outputs.results}}"
# what Azure ML replaces in a command before a shell reads it
EXPRESSION = re.compile(r"\$\{\{(?:inputs|outputs)\.\w+\}\}")


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


def node_paths(pool: AzureMLPoolConfig, data: str, runtime: str = IMAGE_RUNTIME) -> NodePaths:
    """Where the ranks find the scripts version (the job's scripts input), the data and the results folder (its
    output, which exists only on the nodes: they make a script's folders there), and trainflow's node-side code."""
    nodes = pool.nodes
    return NodePaths(SCRIPTS_INPUT, data, RESULTS_OUTPUT, runtime, nodes, checked=False, cores=None, prepared=False)


def split_environment(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the variables whose values name the job's inputs or outputs, the rest): Azure ML resolves ${{...}} in the
    command only, never in environment_variables (concept-expressions; microsoft/physical-ai-toolchain#855), so the
    first are set in the command (launch_command), the rest in environment_variables (job_spec)."""
    named = {name: value for name, value in env.items() if EXPRESSION.search(value)}
    return named, {name: value for name, value in env.items() if name not in named}


def launch_command(program: Program, pool: AzureMLPoolConfig, at: NodePaths, resolved: dict[str, str]) -> str:
    """The command each node runs: the program's ranks under MPI (Horovod) or under torchrun (one per node), with
    the variables `resolved` (those naming the job's inputs or outputs: split_environment) set first."""
    env = f"env {' '.join(f'{name}={shell_word(value)}' for name, value in resolved.items())} " if resolved else ""
    ranks = " ".join(map(shell_word, program.rank_argv(at)))
    if program.launcher == "horovodrun":  # Azure ML's mpirun starts gpus_per_node of these per node
        return f"{env}python {ranks}"
    # Azure ML's PyTorch distribution sets MASTER_ADDR, MASTER_PORT and NODE_RANK on every node
    options = torchrun_options(pool.nodes, pool.slots_per_node, "$NODE_RANK", "$MASTER_ADDR", "$MASTER_PORT")
    return f"{env}torchrun {' '.join(options)} {ranks}"


def shell_word(text: str) -> str:
    """`text` as one word of the command's shell: quoted where the shell would split or expand it (a script's
    arguments reach it as given, as on every pool); Azure ML's expressions need no quotes, being replaced first."""
    bare = EXPRESSION.sub("x", text)
    return text if shlex.quote(bare) == bare else shlex.quote(text)


def nfs_mount(cfg: AzureMLPoolConfig, options: str) -> str:
    """Shell that mounts the NFS file server once per node: the first rank mounts under a node-wide lock, the
    others wait for the lock and find it mounted (`mountpoint -q`). Needs nfs-common (mount.nfs) in the image and
    a job container allowed to mount (root, as Azure ML runs it; not documented either way)."""
    mount = (
        f"mountpoint -q {NFS_MOUNT} || {{ mkdir -p {NFS_MOUNT} && "
        f"mount -t nfs -o {options},vers=4,minorversion=1,sec=sys {cfg.nfs_export} {NFS_MOUNT}; }}"
    )
    return f"flock /tmp/trainflow-nfs.lock sh -c '{mount}' && "


def fetch_command(runtime: str, source: str, export: str, dataset: str) -> str:
    """Shell that brings `export` to the data set staged in `source` (nodelib/staged/fetch.py of the image's node-side
    code at `runtime`, which a user's scripts version does not hold; ranks of a node wait for the first one's
    fetch)."""
    fetch = f"{runtime}/nodelib/staged/fetch.py"
    return f"python {fetch} --source {source} --export {export} --dataset {dataset} && "


def data_input(cfg: AzureMLPoolConfig, run: RunPaths, runtime: str = IMAGE_RUNTIME) -> tuple[str, dict, str]:
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
        fetch_command(runtime, SHARDS_INPUT, cfg.local_disk, dataset),
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
    program: Program,
    pool: AzureMLPoolConfig,
    run: RunPaths,
    image: str,
    timeout_s: float,
    attempt: int = 1,
    runtime: str = IMAGE_RUNTIME,
):
    """The Azure ML command job of one attempt of `program` (trainflow's trainer or a user's script); every attempt
    of a run shares runs/<run id>/ in the Blob datastore, so a new attempt resumes from the newest checkpoint there
    (a script's from its checkpoint folder and working folder)."""
    from azure.ai.ml import MpiDistribution, Output, PyTorchDistribution, command

    prefix, inputs, data = data_input(pool, run, runtime)
    at, program = node_paths(pool, data, runtime), program.at_attempt(attempt)
    in_command, in_job = split_environment(program.environment(at))
    distribution = (
        MpiDistribution(process_count_per_instance=pool.slots_per_node)
        if program.launcher == "horovodrun"
        else PyTorchDistribution(process_count_per_instance=1)
    )
    return command(
        name=attempt_name(run.run_id, attempt),
        display_name=f"trainflow {run.run_id} attempt {attempt}",
        experiment_name=pool.experiment,
        command=prefix + launch_command(program, pool, at, in_command),
        environment=environment_spec(image),
        compute=pool.compute,
        instance_count=pool.nodes,
        distribution=distribution,
        shm_size=pool.shm_size,
        environment_variables={**nccl_environment(pool), **in_job},
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


def sync_spec(cfg: AzureMLPoolConfig, run: RunPaths, image: str, attempt: int = 1, runtime: str = IMAGE_RUNTIME):
    """The job that syncs the staged data set from the Blob datastore to the NFS file server, on one node of the
    cluster (inside the VNet, where the file server is), so the flow itself may run anywhere."""
    from azure.ai.ml import Input, command

    shards = Input(
        type="uri_folder", path=datastore_path(cfg.blob_datastore, dataset_prefix(run.dataset)), mode="ro_mount"
    )
    fetch = fetch_command(runtime, SHARDS_INPUT, NFS_MOUNT, run.dataset).removesuffix(" && ")
    return command(
        name=attempt_name(run.run_id, attempt, "sync"),
        display_name=f"trainflow {run.run_id} sync {attempt}",
        experiment_name=cfg.experiment,
        command=nfs_mount(cfg, "rw") + fetch,
        environment=environment_spec(image),
        compute=cfg.compute,
        instance_count=1,
        inputs={"shards": shards},
        tags={"trainflow.run": run.run_id, "trainflow.step": "sync"},
    )


HIDDEN = "<hidden: the value of script.env>"


def values_hidden(job, names: set[str]):
    """The command job as the dry run shows it: the values of the variables `names` (the user's own) hidden, in its
    environment_variables and in its command (shell_word's form), what is sent is the job itself."""
    env = dict(job.environment_variables or {})
    for name in names & set(env):
        env[name] = HIDDEN
    job.environment_variables = env
    for name in names:
        job.command = re.sub(rf"(?<![\w]){re.escape(name)}=(\S+)", f"{name}={shlex.quote(HIDDEN)}", job.command)
    return job


def yaml_text(entity) -> str:
    """The YAML that `az ml ... create --file` takes for an entity (a command builder becomes its job)."""
    import io
    import logging

    logging.getLogger("azure.ai.ml._utils._experimental").setLevel(logging.ERROR)  # "experimental class" notes
    entity = entity._to_job() if hasattr(entity, "_to_job") else entity  # the job `az ml job create` takes
    buffer = io.StringIO()
    entity.dump(buffer)
    return buffer.getvalue()
