"""infra/azure: the Bicep template linted with what runs here (no Bicep compiler can be installed on this
machine: `az bicep install` downloads from GitHub), and the config that deploy.sh prints validated."""

import json
import re
import subprocess
import sys

import pytest

from flows.config import load_config
from infra.trainer import REPO

AZURE = REPO / "infra" / "azure"
TEMPLATE = (AZURE / "main.bicep").read_text()
RESOURCE = re.compile(r"^resource (\w+) '([\w./]+)@(\d{4}-\d{2}-\d{2}(?:-preview)?)' = \{", re.M)
# strings (one line each in this template) blanked, then comments dropped
CODE = "\n".join(re.sub(r"//.*", "", re.sub(r"'(?:[^'\\\n]|\\.)*'", "''", line)) for line in TEMPLATE.splitlines())


def body(name: str) -> str:
    """The text of resource `name`, up to its closing brace."""
    start = re.search(rf"^resource {name} ", TEMPLATE, re.M).start()
    depth, i = 0, TEMPLATE.index("{", start)
    for i in range(i, len(TEMPLATE)):
        depth += {"{": 1, "}": -1}.get(TEMPLATE[i], 0)
        if depth == 0:
            return TEMPLATE[start:i + 1]
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
    for needed in ("Microsoft.Network/virtualNetworks", "Microsoft.Storage/storageAccounts",
                   "Microsoft.Storage/storageAccounts/blobServices/containers",
                   "Microsoft.Storage/storageAccounts/fileServices/shares", "Microsoft.ContainerRegistry/registries",
                   "Microsoft.MachineLearningServices/workspaces", "Microsoft.MachineLearningServices/workspaces/computes",
                   "Microsoft.MachineLearningServices/workspaces/datastores"):
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
    for service in ("Microsoft.Storage", "Microsoft.ContainerRegistry"):
        assert f"service: '{service}'" in vnet
    cluster = body("cluster")
    assert "subnet: { id: computeSubnetId }" in cluster and "enableNodePublicIp: false" in cluster
    assert "remoteLoginPortPublicAccess: 'Disabled'" in cluster and "minNodeCount: 0" in cluster
    assert "adminUserEnabled: false" in body("registry") and "defaultAction: 'Deny'" in body("registry")


def test_no_secret_leaves_the_template():
    outputs = "\n".join(line for line in TEMPLATE.splitlines() if line.startswith("output "))
    assert "listKeys" not in outputs and "secret" not in outputs.lower()
    assert all("@secure()" not in line for line in TEMPLATE.splitlines())  # no secret parameters either


def test_the_config_deploy_prints_is_valid(tmp_path):
    names = re.findall(r"^output (\w+) string", TEMPLATE, re.M)
    outputs = {name: {"type": "String", "value": f"https://x{name.lower()}.example/"} for name in names}
    outputs["nfsExport"]["value"] = "tfnfs.file.core.windows.net:/tfnfs/fileserver"
    outputs["registry"]["value"] = "tfacr.azurecr.io"
    outputs["subnetId"]["value"] = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Network/virtualNetworks/v/subnets/compute"
    for name in ("container", "share", "workspace", "compute", "datastore"):
        outputs[name]["value"] = "trainflow"
    printed = subprocess.run([sys.executable, str(AZURE / "config_from_outputs.py"), json.dumps(outputs), "sub-id", "rg"],
                             capture_output=True, text=True, check=True).stdout
    (tmp_path / "mine.yaml").write_text(printed)
    cfg = load_config(tmp_path / "mine.yaml", {}, environ={})
    assert cfg.pool.backend == "azureml" and cfg.azureml.nfs_export.endswith(":/tfnfs/fileserver")
    assert cfg.image.registry == "tfacr.azurecr.io" and cfg.storage.auth == "key"


@pytest.mark.parametrize("script", ["deploy.sh"])
def test_the_deploy_script_parses_and_refuses_missing_arguments(script):
    assert subprocess.run(["bash", "-n", str(AZURE / script)]).returncode == 0
    proc = subprocess.run(["bash", str(AZURE / script)], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr
