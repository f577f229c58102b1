#!/usr/bin/env bash
# Deploy everything trainflow needs on Azure with one command, then print the trainflow config for it.
#   infra/compute/azure/deploy.sh <resource group> <region> <prefix> [az deployment parameters...]
#   e.g. infra/compute/azure/deploy.sh trainflow westeurope tflow vmSize=Standard_ND96asr_v4 maxNodes=2 > flows/configs/mine.yaml
# Needs the Azure CLI, logged in (`az login`) as Owner (or Contributor + User Access Administrator) of the group.
# Tear everything down: az group delete --name <resource group>
#   The key vault is then soft-deleted for 7 days and its name (fixed per resource group) stays taken:
#   before redeploying into a group of the same name, az keyvault purge --name <vault> (main.bicep leaves
#   purge protection off so that this works).
# The printed config uses storage auth: default (your az login identity signs user-delegation SAS tokens);
# that identity needs a blob data role on the storage account (e.g. Storage Blob Data Contributor), which
# this script does not grant; or use auth: key with AZURE_STORAGE_KEY.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 <resource group> <region> <prefix> [name=value ...]" >&2
  exit 2
fi
group=$1 region=$2 prefix=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
client_ip=$(curl -fsS https://api.ipify.org)
az group create --name "$group" --location "$region" --output none
outputs=$(az deployment group create --resource-group "$group" --name trainflow \
  --template-file "$here/main.bicep" --parameters prefix="$prefix" clientIp="$client_ip" "$@" \
  --query properties.outputs --output json)
python3 "$here/config_from_outputs.py" "$outputs" "$(az account show --query id --output tsv)" "$group"
