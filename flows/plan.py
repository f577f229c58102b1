"""`trainflow run --dry-run`: what each step would do and what it would skip, changing nothing.

Every check reads only: the scripts' content version against the file share, the data folder's
listing against the file server's current copy (paths and sizes; the real run compares SHA-256),
the image's content tag against the local engine, the pool's slots against the workers.
"""

import tempfile
from pathlib import Path

from flows.config import STAGED, SYNTHETIC, PipelineConfig
from infra.azureml import JobPlan, compute_spec, environment_spec, job_spec, registry_connection_spec, yaml_text
from infra.build_context import assemble_context, context_tag, wheel_cache
from infra.container_nodes import ContainerNodes, commands_on_nodes
from infra.fileserver import FileServer
from infra.fileshare import open_share
from infra.images import Engine, ImageError
from infra.launcher import launch_command
from infra.local_docker import local_base_tag
from infra.pools import scripts_root
from tasks.build_image import build_args
from tasks import manifest as mf
from tasks.manifest import check_names, relative_paths, sha256_file
from tasks.train_on_pool import data_on_nodes, engine_on
from tasks.upload_scripts import package_files, scripts_version


def plan_run(cfg: PipelineConfig) -> list[dict]:
    """One row per step: step, action (run or skip), and why."""
    rows = [plan_image(cfg)] if cfg.pool.backend != "process" else []
    rows += [plan_scripts(cfg), *plan_data(cfg)]
    if cfg.pool.backend == "azureml":
        azure = cfg.azureml
        rows.append(row("create-pool", "run", f"AmlCompute {azure.compute} ({azure.vm_size}), created or reused, at "
                        f"least {cfg.pool.nodes} nodes; after the run: {azure.at_end.replace('_', ' ')}"))
        rows.append(row("run-training", "run", f"Azure ML command job on {cfg.pool.nodes} nodes x "
                        f"{cfg.pool.slots_per_node} processes (the job spec below)"))
    else:
        slots = cfg.pool.slots()
        rows.append(row("create-pool", "run", f"{cfg.pool.backend} pool, {slots} slots for {cfg.training.workers} workers"))
        rows.append(row("run-training", "run", " ".join(job_command(cfg))))
    rows.append(row("collect-results", "run", "results/<run id>/ on the file share, the model to Blob"))
    return rows


def row(step: str, action: str, detail: str) -> dict:
    return {"step": step, "action": action, "detail": detail}


def planned_version(cfg: PipelineConfig) -> tuple[dict[str, Path], str]:
    """The scripts' files and the content version they would be uploaded as."""
    files = package_files(cfg.fileshare.extra_files)
    return files, scripts_version({rel: sha256_file(path) for rel, path in files.items()})


def planned_scripts(cfg: PipelineConfig) -> Path:
    """scripts/<version> as the pool would find it on the file share."""
    return scripts_root(cfg.pool, cfg.fileshare, cfg.workdir) / f"scripts/{planned_version(cfg)[1]}"


def plan_scripts(cfg: PipelineConfig) -> dict:
    """Skip when the share already holds this content version of the scripts (an Azure share is not asked)."""
    files, version = planned_version(cfg)
    if cfg.fileshare.backend == "azure":
        return row("upload-scripts", "run", f"upload {len(files)} files as scripts/{version} to "
                   f"{cfg.fileshare.account_url}/{cfg.fileshare.share} unless it holds that version")
    if open_share(cfg.fileshare, cfg.workdir).exists(f"scripts/{version}/.complete"):
        return row("upload-scripts", "skip", f"version {version} is already on the share")
    return row("upload-scripts", "run", f"upload {len(files)} files as version {version}")


def plan_data(cfg: PipelineConfig) -> list[dict]:
    """Skip upload and sync when the file server's copy lists the same paths with the same sizes."""
    data, name = Path(cfg.data), cfg.dataset_name()
    if cfg.data == SYNTHETIC:
        return [row("upload-dataset", "skip", "data: synthetic"), row("sync-to-file-server", "skip", "data: synthetic")]
    if cfg.data == STAGED:
        return [row("upload-dataset", "skip", f"data: staged, {name} is used as Blob storage holds it"),
                row("sync-to-file-server", "run", f"bring the file server's copy of {name} up to Blob's manifest")]
    if not data.exists():  # the digits set, not written yet
        what = f"write the digits set to {data}, then stage it (never staged)"
        return [row("upload-dataset", "run", what), row("sync-to-file-server", "run", what)]
    check_names(relative_paths(data))
    local = {rel: (data / rel).stat().st_size for rel in relative_paths(data)}
    current = FileServer(cfg.export_dir()).current_manifest(name)
    served = {f["path"]: f["size"] for f in current[1]["files"]} if current else {}
    changed = sum(1 for rel, size in local.items() if served.get(rel) != size) + len(served.keys() - local.keys())
    if current and not changed:
        why = f"the file server's copy of {name} has the same {len(local)} files (paths and sizes)"
        return [row("upload-dataset", "skip", why), row("sync-to-file-server", "skip", why)]
    what = f"{changed} of {len(local)} files new, changed or removed" if current else f"{len(local)} files, never staged"
    return [row("upload-dataset", "run", f"{name}: {what}"), row("sync-to-file-server", "run", f"{name}: {what}")]


def plan_image(cfg: PipelineConfig) -> dict:
    """Skip the build when the local engine already holds the content tag (the push is checked at run time)."""
    image = cfg.image
    if image.use:
        return row("build-image", "skip", f"image.use: {image.use} (its registry is checked when the run starts)")
    name = planned_image(cfg)
    try:
        built = Engine(image.engine).has_image(name)
    except ImageError as exc:
        return row("build-image", "run", f"{name}; {exc}")
    push = f", push unless {image.registry} has it" if image.registry else ""
    return row("build-image", "skip" if built and not image.registry else "run",
               f"{name}: {'already built' if built else 'build'}{push}")


def planned_image(cfg: PipelineConfig) -> str:
    """image.use, or name:<content tag> of the image the build step would make (its digest comes at push)."""
    image = cfg.image
    if image.use:
        return image.use
    base = local_base_tag() if image.base_image == "local" else image.base_image
    with tempfile.TemporaryDirectory() as tmp:
        tag = context_tag(assemble_context(image.flavour, Path(tmp) / "ctx", image.python, wheel_cache()),
                          build_args(image, base))
    return f"{image.image_name()}:{tag}"


def azure_specs(cfg: PipelineConfig) -> dict[str, str]:
    """The exact specs the azureml pool would send, as YAML (`az ml compute/environment/job create --file`)."""
    scripts = planned_scripts(cfg)
    plan = JobPlan("<run id>", planned_image(cfg), scripts.as_posix(), cfg.dataset_name())
    job = job_spec(cfg.training, cfg.azureml, cfg.pool, plan, cfg.job.timeout_s)
    specs = {"compute": yaml_text(compute_spec(cfg.azureml, cfg.pool.nodes)),
             "environment": yaml_text(environment_spec(plan.image)), "job": yaml_text(job),
             "storage": "\n".join(storage_operations(cfg, plan.scripts)) + "\n"}
    if cfg.azureml.registry_access == "connection":  # the password is read at run time, never shown
        placeholder = f"<the value of ${cfg.image.password_env}>"
        specs["registry connection"] = yaml_text(registry_connection_spec(cfg.image.registry, cfg.image.username,
                                                                          placeholder))
    return specs


def storage_operations(cfg: PipelineConfig, scripts: str) -> list[str]:
    """The storage operations of a run, in order, with where and how they are authorised (never a secret)."""
    name, share, blob = cfg.dataset_name(), cfg.fileshare, cfg.storage
    container = f"{blob.account_url}/{blob.container}"
    return [
        f"- put scripts: {share.account_url}/{share.share}/{scripts}/ (auth: {share.auth}), .complete written last",
        f"- put blobs: {container}/{mf.dataset_prefix(name)}shards/*.tar, then {mf.manifest_blob(name)} "
        f"(auth: {blob.auth})",
        f"- get blobs: {container}/{mf.dataset_prefix(name)} -> {cfg.export_dir()}/datasets/{name}/<version>, "
        "then `current` switched to it",
        f"- job output: azureml://datastores/{cfg.azureml.datastore}/paths/results/<run id> (written by the job), "
        "downloaded to the run folder",
        f"- put results: {share.account_url}/{share.share}/results/<run id>/ and {container}/results/<run id>/model.pt",
    ]


def job_command(cfg: PipelineConfig) -> list[str]:
    """The launcher command the job would run, with the engine of the scripts version (container paths on
    the docker pool)."""
    script = engine_on(cfg.pool.backend, planned_scripts(cfg))
    if cfg.pool.backend == "docker":
        nodes = ContainerNodes(None, "<run id>", [f"node{i}" for i in range(cfg.pool.nodes)])
        commands = commands_on_nodes(cfg.training, nodes, cfg.pool.slots_per_node, script,
                                     data_on_nodes(cfg.data == SYNTHETIC))
        return [word for i, argv in enumerate(commands) for word in (["|"] if i else []) + [f"node{i}:", *argv]]
    data = SYNTHETIC if cfg.data == SYNTHETIC else str(FileServer(cfg.export_dir()).current(cfg.dataset_name()))
    return launch_command(cfg.training, data, cfg.workdir / "runs" / "<run id>", script=script)
