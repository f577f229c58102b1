"""Print the trainflow config (YAML) for a deployment of main.bicep, from `az deployment` outputs (JSON).

Used by deploy.sh; nothing secret is in the outputs or the config (keys stay in Azure, passwords in the
environment)."""

import json
import sys


def config(outputs: dict, subscription: str, group: str) -> str:
    """The config file text for the deployed resources."""
    out = {name: value["value"] for name, value in outputs.items()}
    gpus = int(out.get("gpusPerNode") or 0)
    slots = (
        f"{gpus}          # GPUs per node of {out['vmSize']}"
        if gpus
        else f"1          # {out['vmSize']}: GPU count unknown to main.bicep, set it to the GPUs per node"
    )
    return f"""# Made by infra/compute/azure/deploy.sh for resource group {group}
dataset: imagenet
storage:
  backend: azure
  account_url: {out["blobAccountUrl"].rstrip("/")}
  # default: your az login identity gets a user delegation key and trainflow signs short SAS tokens with it
  # (no account key on this machine; the identity needs a data role such as Storage Blob Data Contributor
  # on the account, which deploy.sh does not grant). Fallback: auth: key with
  # export AZURE_STORAGE_KEY=$(az storage account keys list ...).
  auth: default
  container: {out["container"]}
fileshare:
  backend: azure
  account_url: {out["fileAccountUrl"].rstrip("/")}
  share: {out["share"]}
  auth: key
image:
  flavour: gpu
  registry: {out["registry"]}  # repository: trainflow-gpu (trainflow-tf-gpu for tensorflow and keras)
  # an Entra ID token:
  #   export REGISTRY_PASSWORD=$(az acr login -n {out["registry"].split(".")[0]} --expose-token \\
  #     --query accessToken -o tsv)
  username: 00000000-0000-0000-0000-000000000000
pool:
  backend: azureml
  nodes: 1
  slots_per_node: {slots}
  subscription_id: {subscription}
  resource_group: {group}
  workspace: {out["workspace"]}
  compute: {out["compute"]}
  vm_size: {out["vmSize"]}     # the cluster as deployed (changing size or priority means a new cluster)
  max_nodes: {out["maxNodes"]}
  low_priority: {str(out["lowPriority"]).lower()}
  subnet: {out["subnetId"]}
  node_public_ip: false      # none: outbound through the NAT gateway, Azure ML through the private endpoint
  datastore: {out["datastore"]}
  blob_datastore: {out["blobDatastore"]}   # the blob container (jobs read shards, write results and checkpoints)
  data_source: nfs
  nfs_export: {out["nfsExport"]}
training:
  launcher: horovodrun
  workers: {gpus or 1}                 # = nodes x slots_per_node
"""


if __name__ == "__main__":
    print(config(json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]), end="")
