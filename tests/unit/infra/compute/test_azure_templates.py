"""infra/compute/azure: the Bicep template linted with what runs here (no Bicep compiler can be installed on this
machine: `az bicep install` downloads from GitHub): structural checks and checkov's Bicep checks; and the
config that deploy.sh prints validated."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flows.config import load_config
from tests.fakes.paths import REPO

AZURE = REPO / "infra" / "compute" / "azure"
TEMPLATE = (AZURE / "main.bicep").read_text()
RESOURCE = re.compile(r"^resource (\w+) '([\w./]+)@(\d{4}-\d{2}-\d{2}(?:-preview)?)' = \{", re.M)
# strings (one line each in this template) blanked, then comments dropped
CODE = "\n".join(re.sub(r"//.*", "", re.sub(r"'(?:[^'\\\n]|\\.)*'", "''", line)) for line in TEMPLATE.splitlines())


def body(name: str) -> str:
    """The text of resource `name`, up to its closing brace."""
    start = re.search(rf"^resource {name} ", TEMPLATE, re.M).start()
    depth = 0
    for i in range(TEMPLATE.index("{", start), len(TEMPLATE)):
        depth += {"{": 1, "}": -1}.get(TEMPLATE[i], 0)
        if depth == 0:
            return TEMPLATE[start : i + 1]
    raise AssertionError(f"resource {name} is not closed")


def resources() -> dict[str, str]:
    return {m.group(1): m.group(2) for m in RESOURCE.finditer(TEMPLATE)}


def test_brackets_balance_and_every_parameter_and_variable_is_used():
    for pair in ("{}", "[]", "()"):
        assert CODE.count(pair[0]) == CODE.count(pair[1]), pair
    for kind in ("param", "var"):
        for name in re.findall(rf"^{kind} (\w+)", TEMPLATE, re.M):
            uses = [line for line in TEMPLATE.splitlines() if re.search(rf"\b{name}\b", line.split("//")[0])]
            assert len(uses) > 1, f"{kind} {name} is never used"


def test_the_template_holds_each_part_the_architecture_needs():
    types = set(resources().values())
    for needed in (
        "Microsoft.Network/virtualNetworks",
        "Microsoft.Storage/storageAccounts",
        "Microsoft.Storage/storageAccounts/blobServices/containers",
        "Microsoft.Storage/storageAccounts/fileServices/shares",
        "Microsoft.ContainerRegistry/registries",
        "Microsoft.MachineLearningServices/workspaces",
        "Microsoft.MachineLearningServices/workspaces/computes",
        "Microsoft.MachineLearningServices/workspaces/datastores",
    ):
        assert needed in types, needed
    assert "enabledProtocols: 'NFS'" in body("nfsShare")


def test_storage_is_encrypted_https_only_and_closed_to_the_internet():
    for name, kind in resources().items():
        if kind != "Microsoft.Storage/storageAccounts":
            continue
        text = body(name)
        assert "requireInfrastructureEncryption: true" in text and "keySource: 'Microsoft.Storage'" in text, name
        assert "minimumTlsVersion: 'TLS1_2'" in text and "allowBlobPublicAccess: false" in text, name
        assert "defaultAction: 'Deny'" in text and "virtualNetworkRules" in text, name
        if "kind: 'FileStorage'" in text:  # NFS has no TLS: only the virtual network reaches this account
            assert "bypass: 'None'" in text and "ipRules" not in text and "allowSharedKeyAccess: false" in text
        else:
            assert "supportsHttpsTrafficOnly: true" in text, name


def test_the_cluster_sits_in_the_subnet_with_service_endpoints_and_no_public_ips():
    vnet = body("vnet")
    for service in ("Microsoft.Storage", "Microsoft.KeyVault"):
        assert f"service: '{service}'" in vnet
    # a ContainerRegistry service endpoint sends private source addresses the registry's IP rule refuses
    assert "Microsoft.ContainerRegistry" not in "\n".join(line.split("//")[0] for line in vnet.splitlines())
    # no public IPs on the nodes: outbound through a NAT gateway with a static public IP on the compute subnet
    assert vnet.count("name: '") == 2 and "natGateway: { id: nat.id }" in vnet  # the vnet and its one subnet
    assert "publicIpAddresses: [ { id: natIp.id } ]" in body("nat") and "'Static'" in body("natIp")
    cluster = body("cluster")
    assert "subnet: { id: computeSubnetId }" in cluster and "enableNodePublicIp: false" in cluster
    assert "remoteLoginPortPublicAccess: 'Disabled'" in cluster and "minNodeCount: 0" in cluster
    assert "adminUserEnabled: false" in body("registry") and "defaultAction: 'Deny'" in body("registry")


def test_workspace_and_registry_have_private_endpoints_with_their_dns_zones():
    for endpoint, group, zone_group in (
        ("workspaceEndpoint", "amlworkspace", "workspaceZoneGroup"),
        ("registryEndpoint", "registry", "registryZoneGroup"),
    ):
        text = body(endpoint)
        assert f"groupIds: [ '{group}' ]" in text and "subnet: { id: computeSubnetId }" in text, endpoint
        assert f"parent: {endpoint}" in body(zone_group)
    zones = re.search(r"var privateZones = \{(.*?)\n\}", TEMPLATE, re.S).group(1)
    for zone in ("privatelink.api.azureml.ms", "privatelink.notebooks.azure.net", "privatelink.azurecr.io"):
        assert f"'{zone}'" in zones, zone
    assert "virtualNetwork: { id: vnet.id }" in TEMPLATE and "registrationEnabled: false" in TEMPLATE
    # the client still reaches the workspace (it submits jobs from outside the network) and pushes to the registry
    assert "publicNetworkAccess: 'Enabled'" in body("workspace")
    assert "ipRules: [ { value: clientIp, action: 'Allow' } ]" in body("registry")


def test_the_vault_can_be_purged_and_redeployed():
    vault = body("vault")
    code = "\n".join(line.split("//")[0] for line in vault.splitlines())
    assert "enablePurgeProtection" not in code  # once true it is irreversible, and it refuses `az keyvault purge`
    assert "softDeleteRetentionInDays: 7" in code and "enableSoftDelete: true" in code


def test_the_blob_container_is_an_identity_based_datastore_the_cluster_may_write():
    store = body("blobDatastore")
    assert "name: 'trainflow_blob'" in store and "datastoreType: 'AzureBlob'" in store
    assert "containerName: dataContainer.name" in store and "credentialsType: 'None'" in store
    grant = body("clusterBlobData")
    assert "scope: storage" in grant and "principalId: cluster.identity.principalId" in grant
    assert "'ba92f5b4-2d11-453d-a403-e96b0029c9fe'" in TEMPLATE  # Storage Blob Data Contributor
    # nothing is granted to the client: every role assignment goes to the workspace's or the cluster's identity
    for name, kind in resources().items():
        if kind == "Microsoft.Authorization/roleAssignments":
            assert re.search(r"principalId: (cluster|workspace)\.identity\.principalId", body(name)), name


def test_no_secret_leaves_the_template():
    outputs = "\n".join(line for line in TEMPLATE.splitlines() if line.startswith("output "))
    assert "listKeys" not in outputs and "secret" not in outputs.lower()
    assert all("@secure()" not in line for line in TEMPLATE.splitlines())  # no secret parameters either


def test_the_config_deploy_prints_is_valid(tmp_path):
    names = re.findall(r"^output (\w+) string", TEMPLATE, re.M)
    outputs = {name: {"type": "String", "value": f"https://x{name.lower()}.example/"} for name in names}
    typed = dict(re.findall(r"^output (\w+) (int|bool) ", TEMPLATE, re.M))
    assert typed == {"maxNodes": "int", "lowPriority": "bool", "gpusPerNode": "int"}
    outputs.update(
        maxNodes={"type": "Int", "value": 3},
        lowPriority={"type": "Bool", "value": True},
        gpusPerNode={"type": "Int", "value": 8},
    )
    outputs["vmSize"]["value"] = "Standard_ND96asr_v4"
    outputs["blobDatastore"]["value"] = "trainflow_blob"
    outputs["nfsExport"]["value"] = "tfnfs.file.core.windows.net:/tfnfs/fileserver"
    outputs["registry"]["value"] = "tfacr.azurecr.io"
    outputs["subnetId"]["value"] = (
        "/subscriptions/s/resourceGroups/g/providers/Microsoft.Network/virtualNetworks/v/subnets/compute"
    )
    for name in ("container", "share", "workspace", "compute", "datastore"):
        outputs[name]["value"] = "trainflow"
    printed = subprocess.run(
        [sys.executable, str(AZURE / "config_from_outputs.py"), json.dumps(outputs), "sub-id", "rg"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "mine.yaml").write_text(printed)
    cfg = load_config(tmp_path / "mine.yaml", {}, environ={})
    assert cfg.pool.backend == "azureml" and cfg.pool.nfs_export.endswith(":/tfnfs/fileserver")
    assert cfg.image.registry == "tfacr.azurecr.io" and cfg.storage.auth == "default"
    assert "AZURE_STORAGE_KEY" in printed and "auth: key" in printed  # the fallback is named
    assert (cfg.pool.vm_size, cfg.pool.max_nodes, cfg.pool.low_priority) == ("Standard_ND96asr_v4", 3, True)
    assert cfg.pool.node_public_ip is False and cfg.pool.blob_datastore == "trainflow_blob"
    assert cfg.pool.slots_per_node == 8 and cfg.training.workers == 8


def test_every_gpu_size_default_is_in_the_gpu_table():
    default = re.search(r"^param vmSize string = '(\w+)'", TEMPLATE, re.M).group(1)
    table = re.search(r"var gpusBySize = \{(.*?)\n\}", TEMPLATE, re.S).group(1)
    assert re.search(rf"^\s*{default}: [1-8]$", table, re.M)


def checkov() -> str | None:
    """checkov, from its own venv (`make setup` makes .venv-tools: its pins conflict with the project's) or PATH."""
    for candidate in (REPO / ".venv-tools" / "bin" / "checkov", Path(sys.executable).parent / "checkov"):
        if candidate.exists():
            return str(candidate)
    return shutil.which("checkov")


def test_checkov_bicep_checks_pass_with_every_skip_justified_inline():
    """checkov's Bicep checks on main.bicep: none fails; a skip is an inline `// checkov:skip=ID: reason` inside
    the resource (checkov docs, Suppressions; checkov/bicep/graph_builder/context_definitions.py)."""
    tool = checkov()
    assert tool, "checkov is missing: `make setup` installs it into .venv-tools"
    # no network: no Prisma Cloud guideline download, no external modules; offline, it takes seconds
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE"}
    proc = subprocess.run(
        [
            tool,
            "-f",
            str(AZURE / "main.bicep"),
            "--framework",
            "bicep",
            "-o",
            "json",
            "--skip-download",
            "--download-external-modules",
            "false",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["summary"]["parsing_errors"] == 0 and report["summary"]["passed"] > 0, report["summary"]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for c in report["results"]["failed_checks"]]
    assert not failed, "checkov failed checks:\n" + "\n".join(failed)
    for check in report["results"]["skipped_checks"]:  # every skip carries a reason
        reason = (check["check_result"].get("suppress_comment") or "").strip(" :")
        assert len(reason) >= 20, f"{check['check_id']} {check['resource']} is skipped without a reason"


@pytest.mark.parametrize("script", ["deploy.sh"])
def test_the_deploy_script_parses_and_refuses_missing_arguments(script):
    assert subprocess.run(["bash", "-n", str(AZURE / script)]).returncode == 0
    proc = subprocess.run(["bash", str(AZURE / script)], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_the_gpu_image_has_what_the_azure_nodes_use():
    """The per-node NFS mount (mount.nfs, flock, mountpoint), InfiniBand verbs for NCCL, and Horovod linked
    to the shared NCCL of torch's wheels (the wheel has no static library)."""
    text = (REPO / "containers" / "gpu.Dockerfile").read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    for package in ("nfs-common", "util-linux", "rdma-core", "libibverbs1", "ibverbs-providers"):
        assert re.search(rf"\s{package}\s", code), package
    horovod = next(block for block in code.split("RUN ") if "horovod-wheel.sh" in block and "NCCL" in block)
    assert "HOROVOD_NCCL_LINK=SHARED" in horovod and "HOROVOD_GPU_OPERATIONS=NCCL" in horovod
