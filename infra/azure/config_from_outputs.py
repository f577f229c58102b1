"""Print the trainflow config (YAML) for a deployment of main.bicep, from `az deployment` outputs (JSON).

Used by deploy.sh; nothing secret is in the outputs or the config (keys stay in Azure, passwords in the
environment)."""

import json
import sys


def config(outputs: dict, subscription: str, group: str) -> str:
    """The config file text for the deployed resources."""
    out = {name: value["value"] for name, value in outputs.items()}
    return f"""# Made by infra/azure/deploy.sh for resource group {group}
dataset: imagenet
storage:
  backend: azure
  account_url: {out['blobAccountUrl'].rstrip('/')}
  auth: key                  # export AZURE_STORAGE_KEY=$(az storage account keys list ...); trainflow signs short SAS tokens
  container: {out['container']}
fileshare:
  backend: azure
  account_url: {out['fileAccountUrl'].rstrip('/')}
  share: {out['share']}
  auth: key
fileserver_export: /mnt/trainflow-nfs   # mount {out['nfsExport']} here (from inside the virtual network)
image:
  flavour: gpu
  registry: {out['registry']}
  repository: trainflow-gpu
  # an Entra ID token: export REGISTRY_PASSWORD=$(az acr login -n {out['registry'].split('.')[0]} --expose-token --query accessToken -o tsv)
  username: 00000000-0000-0000-0000-000000000000
pool:
  backend: azureml
  nodes: 1
  slots_per_node: 1          # GPUs per node of the VM size
training:
  launcher: horovodrun
  workers: 1
azureml:
  subscription_id: {subscription}
  resource_group: {group}
  workspace: {out['workspace']}
  compute: {out['compute']}
  subnet: {out['subnetId']}
  datastore: {out['datastore']}
  data_source: nfs
  nfs_export: {out['nfsExport']}
"""


if __name__ == "__main__":
    print(config(json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]), end="")
