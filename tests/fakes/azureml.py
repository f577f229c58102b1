"""A stand-in for Azure Machine Learning at the MLClient operations level, for the runtime tests of the azureml
backend (nothing here reaches Azure). It keeps the workspace's computes, jobs, datastores and connections, runs a
job's command for real on this machine (one process per node, or per rank for MPI, with the variables Azure ML
sets), moves jobs through Azure ML's statuses, streams rank 0's log as `jobs.stream` does, and enforces the
service's rules below, each citing where it is documented. Compute specs go through the SDK's own serialisation
(`_to_rest_object`, the body `begin_create_or_update` PUTs), so what is checked is what would be sent.

What it does not do: run the image (commands run in this machine's Python), run MPI with more than one rank
(no mpirun here), mount anything (datastores are folders; NFS cannot run here).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import psutil
from azure.ai.ml.entities import Compute
from azure.ai.ml.exceptions import JobException, MlException
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

SUBSCRIPTION, GROUP = "00000000-0000-0000-0000-000000000001", "trainflow-tests"
FINAL = {"Completed", "Failed", "Canceled", "NotResponding"}
URI = re.compile(r"^azureml://datastores/([^/]+)/paths/(.*)$")
PLACEHOLDER = re.compile(r"\$\{\{(inputs|outputs)\.(\w+)\}\}")
# The service's error when low-priority nodes are taken back (quoted in Azure/azure-sdk-for-python#22426 and
# microsoft/MLOpsPython#346); the docs: "You have to restart a preempted job" (how-to-create-attach-compute-cluster).
PREEMPTION = (
    "AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted. Check if the run has "
    "failed or restarted. Reason: Received pre-emption warning signal"
)


def refused(message: str, status: int = 400) -> HttpResponseError:
    """An error as the service answers a refused request."""
    error = HttpResponseError(message=message)
    error.status_code = status
    return error


class Poller:
    """What the SDK's long-running operations return: `.result()`."""

    def __init__(self, value=None):
        self.value = value

    def result(self, timeout=None):
        return self.value


@dataclass
class Workspace:
    """One Azure ML workspace's state."""

    root: Path
    private_endpoint: bool = True  # infra/compute/azure/main.bicep makes one
    computes: dict = field(default_factory=dict)  # name -> the REST body last PUT
    jobs: dict = field(default_factory=dict)
    connections: dict = field(default_factory=dict)
    calls: list = field(default_factory=list)  # (operation, name): what the client asked, in order
    preempt: object = None  # (job name, a line of rank 0's log) -> bool: take the nodes back once the log shows it

    def __post_init__(self):
        self.datastores = {
            "trainflow_files": "AzureFile",
            "trainflow_blob": "AzureBlob",
            "workspaceblobstore": "AzureBlob",
        }
        for name in self.datastores:
            self.datastore(name).mkdir(parents=True, exist_ok=True)

    def datastore(self, name: str) -> Path:
        """The folder that stands for a datastore."""
        return self.root / "datastores" / name

    def local(self, uri: str) -> tuple[str, Path]:
        """(datastore type, folder) of an azureml://datastores/<name>/paths/<path> URI."""
        match = URI.match(uri)
        if not match or match.group(1) not in self.datastores:
            raise refused(f"UserError: datastore of {uri} not found in workspace", 404)
        return self.datastores[match.group(1)], self.datastore(match.group(1)) / match.group(2).strip("/")

    def client(self) -> SimpleNamespace:
        """What trainflow uses of MLClient: compute, jobs and connections operations."""
        return SimpleNamespace(
            compute=ComputeOperations(self),
            jobs=JobOperations(self),
            connections=SimpleNamespace(create_or_update=self.create_connection),
        )

    def create_connection(self, connection):
        self.calls.append(("connections.create_or_update", connection.name))
        self.connections[connection.name] = connection
        return connection


class ComputeOperations:
    """ml_client.compute: get, begin_create_or_update, begin_update, begin_delete."""

    def __init__(self, ws: Workspace):
        self.ws = ws

    def get(self, name: str):
        self.ws.calls.append(("compute.get", name))
        if name not in self.ws.computes:
            raise ResourceNotFoundError(f"Compute {name} not found")
        return Compute._from_rest_object(self.ws.computes[name])

    def begin_create_or_update(self, compute) -> Poller:
        self.ws.calls.append(("compute.begin_create_or_update", compute.name))
        compute._set_full_subnet_name(SUBSCRIPTION, GROUP)  # as ComputeOperations.begin_create_or_update does
        return self.put(compute)

    def begin_update(self, compute) -> Poller:
        # ComputeOperations.begin_update PUTs compute._to_rest_object() without _set_full_subnet_name: a cluster
        # fetched with get() goes back with "subnet": {} (azure/ai/ml/operations/_compute_operations.py)
        self.ws.calls.append(("compute.begin_update", compute.name))
        return self.put(compute)

    def put(self, compute) -> Poller:
        body = compute._to_rest_object()
        check_compute(self.ws, compute.name, body)
        body.name, body.properties.provisioning_state = compute.name, "Succeeded"
        self.ws.computes[compute.name] = body  # a PUT replaces: what the body leaves out (identity) is gone
        return Poller(Compute._from_rest_object(body))

    def begin_delete(self, name: str, **kwargs) -> Poller:
        self.ws.calls.append(("compute.begin_delete", name))
        self.ws.computes.pop(name, None)
        return Poller()


def check_compute(ws: Workspace, name: str, body) -> None:
    """The service's rules for an AmlCompute PUT."""
    props = body.properties.properties
    # ResourceId.id is required (azure-rest-api-specs, machineLearningServices.json, "ResourceId": required ["id"])
    if props.subnet is not None and not props.subnet.get("id"):
        raise refused('BadRequest: subnet: the field id is required (a ResourceId without an id: "subnet": {})')
    # "You must use a workspace private endpoint for the compute resource to communicate with Azure Machine
    # Learning services from the VNet" (how-to-secure-training-vnet, compute cluster without public IP)
    if props.enable_node_public_ip is False and not ws.private_endpoint:
        raise refused("Provided EnableNodePublicIp 'False' requires workspace private endpoint")
    if props.enable_node_public_ip is False and props.subnet is None:
        raise refused("BadRequest: a compute without node public IP needs a subnet (how-to-secure-training-vnet)")
    # The VM size and priority are fixed at creation: `az ml compute update` changes only the scale settings,
    # identity and tags (reference-yaml-compute-aml, "az ml compute update"; how-to-create-attach-compute-cluster)
    old = ws.computes.get(name)
    if old is not None:
        for key in ("vm_size", "vm_priority"):
            before, after = getattr(old.properties.properties, key), getattr(props, key)
            if before != after:
                raise refused(f"BadRequest: {key} cannot be updated on an existing AmlCompute ({before} -> {after})")


class JobOperations:
    """ml_client.jobs: create_or_update, get, stream, begin_cancel, download."""

    def __init__(self, ws: Workspace):
        self.ws = ws

    def create_or_update(self, job):
        job = job._to_job() if hasattr(job, "_to_job") else job
        self.ws.calls.append(("jobs.create_or_update", job.name))
        # the body the SDK sends: CommandJob._to_rest_object validates first (azure/ai/ml/entities/_job/
        # command_job.py, _validate: a compute, an environment, every ${{inputs.X}} of the command an input)
        job._to_rest_object()
        check_expressions(job)
        if job.name in self.ws.jobs:
            # "name: Must be unique across all jobs in the workspace" (reference-yaml-job-command); the service:
            raise refused(
                "(UserError) A job with this name already exists. If you are trying to create a new job, "
                "use a different name."
            )
        compute = job.compute.removeprefix("azureml:")
        if compute not in self.ws.computes:
            raise refused(f"UserError: compute {compute} not found in workspace", 404)
        run = JobRun(self.ws, job)
        self.ws.jobs[job.name] = run
        threading.Thread(target=run.execute, daemon=True).start()
        return SimpleNamespace(name=job.name, status=run.status)

    def get(self, name: str):
        if name not in self.ws.jobs:
            raise ResourceNotFoundError(f"Job {name} not found")
        run = self.ws.jobs[name]
        return SimpleNamespace(name=name, status=run.status, tags=run.job.tags)

    def stream(self, name: str) -> None:
        """Rank 0's log printed to stdout until the job ends; a failed job raises JobException with the service's
        error (azure/ai/ml/operations/_job_ops_helper.py, stream_logs_until_completion)."""
        run = self.ws.jobs[name]
        print(
            f"RunId: {name}\nWeb View: https://ml.azure.com/runs/{name}\n\nStreaming user_logs/std_log.txt\n"
            "===============================",
            flush=True,
        )
        sent = 0
        while True:
            ended = run.status in FINAL
            lines = run.log[sent:]
            for line in lines:
                print(line, end="", flush=True)
            sent += len(lines)
            if ended:
                break
            time.sleep(0.05)
        print(f"\nExecution Summary\n=================\nRunId: {name}\n", flush=True)
        if run.status == "Failed":
            raise JobException(
                message="Exception : \n {} ".format(json.dumps({"error": run.error}, indent=4)),
                no_personal_data_message="Exception raised on executing job",
            )

    def begin_cancel(self, name: str) -> Poller:
        self.ws.calls.append(("jobs.begin_cancel", name))
        self.ws.jobs[name].stop("Canceled", None)
        return Poller()

    def download(self, name: str, download_path, output_name: str | None = None, all: bool = False) -> None:
        run = self.ws.jobs[name]
        # "Download is allowed only in states ..." (azure/ai/ml/operations/_job_operations.py, download)
        if run.status not in FINAL:
            raise JobException(
                message=f"This job is in state {run.status}. Download is allowed only in states {sorted(FINAL)}",
                no_personal_data_message="job not terminal",
            )
        kind, folder = self.ws.local(run.job.outputs[output_name].path)
        # get_datastore_info (azure/ai/ml/_artifacts/_artifact_utilities.py) accepts only these two
        if kind not in ("AzureBlob", "AzureDataLakeGen2"):
            raise MlException(
                message=f"Datastore type {kind} is not supported for uploads. Supported types are "
                "AzureBlob and AzureDataLakeGen2.",
                no_personal_data_message="datastore type",
            )
        shutil.copytree(folder, Path(download_path) / "named-outputs" / output_name, dirs_exist_ok=True)


def check_expressions(job) -> None:
    """Every ${{...}} of the command names an input or an output of the job: the expressions a command job has
    (concept-expressions: ${{inputs.<name>}}, ${{outputs.<name>}}); the SDK checks the inputs, the service the
    outputs, and anything else would reach the command unresolved."""
    declared = {"inputs": job.inputs or {}, "outputs": job.outputs or {}}
    for expression in re.findall(r"\$\{\{\s*([^}]*?)\s*\}\}", job.command):
        kind, _, name = expression.partition(".")
        if kind not in declared or name not in declared[kind]:
            raise refused(f"UserError: the command's ${{{{{expression}}}}} names no input or output of the job")


class JobRun:
    """One job's life: Queued, Running (its processes), then Completed, Failed or Canceled."""

    def __init__(self, ws: Workspace, job):
        self.ws, self.job = ws, job
        self.status, self.error, self.log = "Queued", None, []
        self.procs: list[subprocess.Popen] = []
        self.lock = threading.Lock()

    def execute(self) -> None:
        time.sleep(0.2)  # queued while the nodes come up
        with self.lock:
            if self.status in FINAL:  # cancelled while queued
                return
            self.status = "Running"
            self.procs = [self.start(env) for env in self.processes()]
        readers = [threading.Thread(target=self.read, args=(p, i == 0), daemon=True) for i, p in enumerate(self.procs)]
        for reader in readers:
            reader.start()
        codes = [p.wait() for p in self.procs]
        for reader in readers:
            reader.join()
        failed = next((c for c in codes if c), 0)
        self.stop(
            "Completed" if not failed else "Failed",
            None if not failed else {"code": "UserError", "message": f"Execution failed: exit code {failed}"},
        )

    def processes(self) -> list[dict]:
        """The environment of each process Azure ML starts (how-to-train-distributed-gpu)."""
        nodes, dist = self.job.resources.instance_count or 1, self.job.distribution
        if dist is None:
            return [{}]
        if dist.type == "pytorch":  # one command per node; MASTER_ADDR, MASTER_PORT, NODE_RANK, WORLD_SIZE set
            port = free_port()
            return [
                {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(n), "WORLD_SIZE": str(nodes)}
                for n in range(nodes)
            ]
        ranks = nodes * dist.process_count_per_instance  # mpi: the command once per rank, under mpirun
        if ranks > 1:
            raise RuntimeError("the stand-in has no mpirun: MPI jobs of one rank only")
        return [{}]

    def start(self, env: dict) -> subprocess.Popen:
        command = PLACEHOLDER.sub(lambda m: str(self.resolve(m.group(1), m.group(2))), self.job.command)
        environ = {  # environment_variables as given: Azure ML resolves ${{...}} in the command only
            **os.environ,  # (concept-expressions; seen: microsoft/physical-ai-toolchain#855)
            **(self.job.environment_variables or {}),
            **env,
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "PYTHONUNBUFFERED": "1",
        }
        return subprocess.Popen(
            ["bash", "-c", command],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environ,
            start_new_session=True,
        )

    def resolve(self, kind: str, name: str) -> Path:
        """The folder a job input or output stands for (a datastore folder; `download` gets a copy)."""
        spec = (self.job.inputs if kind == "inputs" else self.job.outputs)[name]
        _, folder = self.ws.local(spec.path)
        if kind == "outputs":
            folder.mkdir(parents=True, exist_ok=True)
        elif spec.mode == "download":
            copy = self.ws.root / "downloads" / self.job.name / name
            shutil.copytree(folder, copy, dirs_exist_ok=True)
            return copy
        return folder

    def read(self, proc: subprocess.Popen, rank0: bool) -> None:
        """Keep rank 0's lines (jobs.stream shows its std_log); take the nodes back when the rule says so."""
        for line in proc.stdout:
            if not rank0:
                continue
            self.log.append(line)  # the rule reads the log the client streams: another node's line may come first
            if self.ws.preempt and self.ws.preempt(self.job.name, line):
                self.stop("Failed", {"code": "ServiceError", "message": PREEMPTION})

    def stop(self, status: str, error: dict | None) -> None:
        """End the job with `status` (its processes killed if still running)."""
        with self.lock:
            if self.status in FINAL:
                return
            for proc in self.procs:  # the node goes: every process on it (torchrun's workers have their own sessions)
                kill_tree(proc.pid)
            self.status, self.error = status, error


def kill_tree(pid: int) -> None:
    """Kill a process and everything it started."""
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            proc.kill()
    except psutil.NoSuchProcess:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
