#!/usr/bin/env bash
# Deploy everything trainflow needs on Azure with one command, then print the trainflow config for it.
#   infra/azure/deploy.sh <resource group> <region> <prefix> [az deployment parameters...]
#   e.g. infra/azure/deploy.sh trainflow westeurope tflow vmSize=Standard_ND96asr_v4 maxNodes=2 > flows/configs/mine.yaml
# Needs the Azure CLI, logged in (`az login`) as Owner (or Contributor + User Access Administrator) of the group.
# Tear everything down: az group delete --name <resource group>
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
