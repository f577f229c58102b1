// trainflow on Azure: everything one pipeline run needs, inside one virtual network.
//   storage account (HTTPS only): the blob container for the data set, the file share for scripts and results
//   NFS file server: a premium Azure Files NFS share, reachable only from the virtual network
//   container registry: the training images (the workspace pulls with its identity), reached from the
//     network through a private endpoint
//   Azure ML workspace (with a private endpoint in the network) and its GPU cluster (the pool: nodes without
//     public IPs, outbound through a NAT gateway), the file share and the blob container registered as datastores
// Deploy with infra/compute/azure/deploy.sh (one command); it prints the trainflow config for what it made.

@description('Prefix of every resource name (3-11 lowercase letters and digits).')
@minLength(3)
@maxLength(11)
param prefix string

@description('Region of every resource.')
param location string = resourceGroup().location

@description('Public IP of the machine that runs trainflow (uploads data, pushes images); the only address let in from outside the network.')
param clientIp string

@description('GPU VM size of the cluster nodes.')
param vmSize string = 'Standard_NC24ads_A100_v4'

@description('Most nodes the cluster may grow to.')
@minValue(1)
param maxNodes int = 4

@description('Low-priority (spot) nodes for the cluster.')
param lowPriority bool = false

@description('Size of the NFS share in GiB (premium shares bill by provisioned size; 100 is the minimum).')
@minValue(100)
param nfsShareGiB int = 1024

var suffix = uniqueString(resourceGroup().id)
// Storage account names: 3-24 lowercase letters and digits. uniqueString gives 13 of them, the prefix 3-11.
var storageName = toLower(take('${prefix}st${suffix}', 24))
var nfsName = toLower(take('${prefix}nfs${suffix}', 24))
var registryName = take('${prefix}acr${suffix}', 50)
var vaultName = take('${prefix}kv${suffix}', 24)

// GPUs per node of the GPU sizes trainflow is used with (0: a size not listed; the config then says so).
// Sources: https://learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/nca100v4-series,
// .../ndasra100v4-series, .../ndma100v4-series, .../ndh100v5-series, .../ncadsh100v5-series, .../ncv3-series
var gpusBySize = {
  Standard_NC24ads_A100_v4: 1
  Standard_NC48ads_A100_v4: 2
  Standard_NC96ads_A100_v4: 4
  Standard_ND96asr_v4: 8
  Standard_ND96amsr_A100_v4: 8
  Standard_ND96isr_H100_v5: 8
  Standard_NC40ads_H100_v5: 1
  Standard_NC80adis_H100_v5: 2
  Standard_NC6s_v3: 1
  Standard_NC12s_v3: 2
  Standard_NC24s_v3: 4
  Standard_NC24rs_v3: 4
}

// Nodes without public IPs have no outbound internet access of their own ("By default, a compute
// instance/cluster configured for no public IP doesn't have outbound access to the internet ... we recommend
// using either a firewall and outbound rules or a NAT gateway"); what they have otherwise is Azure's default
// outbound access, which the docs advise against and which new virtual networks no longer get (private
// subnets by default from Microsoft.Network API 2025-07-01). The NAT gateway gives the compute subnet its
// outbound connectivity (Azure Batch node management, Entra ID, Azure ML's service tags) through one static
// public IP.
// Sources: https://learn.microsoft.com/azure/machine-learning/how-to-secure-training-vnet
//   (section "Compute instance/cluster or serverless with no public IP"),
//   https://learn.microsoft.com/azure/virtual-network/ip-services/default-outbound-access,
//   https://techcommunity.microsoft.com/t5/azure-networking-blog/private-subnets-by-default-in-azure-virtual-networks-what/ba-p/4513778
resource natIp 'Microsoft.Network/publicIPAddresses@2024-05-01' = {
  name: '${prefix}-nat-ip'
  location: location
  sku: { name: 'Standard' } // a NAT gateway takes Standard static addresses only
  properties: { publicIPAllocationMethod: 'Static', publicIPAddressVersion: 'IPv4' }
}

resource nat 'Microsoft.Network/natGateways@2024-05-01' = {
  name: '${prefix}-nat'
  location: location
  sku: { name: 'Standard' }
  properties: { publicIpAddresses: [ { id: natIp.id } ], idleTimeoutInMinutes: 4 }
}

// One subnet, compute: the cluster's nodes and the private endpoints of the workspace and the registry (with
// a storage service endpoint, "the workspace private endpoint and storage service endpoint must be in the same
// subnet": https://learn.microsoft.com/azure/machine-learning/how-to-secure-workspace-vnet, Limitations).
// It keeps service endpoints for Storage and Key Vault, whose firewalls let the subnet in by a virtual network
// rule. It has none for Microsoft.ContainerRegistry: with one, "the source IP addresses of the virtual
// machines in the subnet ... switches from using public IPv4 addresses to using private IPv4 addresses"
// (https://learn.microsoft.com/azure/virtual-network/virtual-network-service-endpoints-overview), which the
// registry's only rule (the client's public IP) refuses, so the nodes could not pull. ACR: "Future development
// of service endpoints for Azure Container Registry isn't currently planned. We recommend using private
// endpoints instead", and a registry does not support both from one network
// (https://learn.microsoft.com/azure/container-registry/container-registry-vnet). The nodes reach it through
// its private endpoint: https://learn.microsoft.com/azure/container-registry/container-registry-private-link
resource vnet 'Microsoft.Network/virtualNetworks@2024-05-01' = {
  name: '${prefix}-vnet'
  location: location
  properties: {
    addressSpace: { addressPrefixes: [ '10.40.0.0/16' ] }
    subnets: [
      {
        name: 'compute'
        properties: {
          addressPrefix: '10.40.0.0/20'
          natGateway: { id: nat.id }
          privateEndpointNetworkPolicies: 'Disabled' // "Disable network policies for private endpoints" (how-to-configure-private-link)
          serviceEndpoints: [
            { service: 'Microsoft.Storage' }
            { service: 'Microsoft.KeyVault' }
          ]
        }
      }
    ]
  }
}

var computeSubnetId = vnet.properties.subnets[0].id

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_43: storageName is toLower(take(prefix + 'st' + uniqueString(...), 24)): 3-24 lowercase letters and digits; checkov cannot evaluate Bicep functions
  // checkov:skip=CKV_AZURE_206: LRS on purpose: the container holds a staged copy of a data set that trainflow re-uploads from its source, and run outputs are downloaded after each run; geo/zone replication would double the bill (ZRS is not offered in every region)
  name: storageName
  location: location
  sku: { name: 'Standard_LRS' }
  kind: 'StorageV2'
  properties: {
    supportsHttpsTrafficOnly: true
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: true // the file share's datastore and trainflow's fallback (storage auth: key) use the key
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: {
        blob: { enabled: true, keyType: 'Account' }
        file: { enabled: true, keyType: 'Account' }
      }
    }
    networkAcls: {
      defaultAction: 'Deny'
      bypass: 'AzureServices'
      ipRules: [ { value: clientIp, action: 'Allow' } ]
      virtualNetworkRules: [ { id: computeSubnetId, action: 'Allow' } ]
    }
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource dataContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: 'trainflow'
  properties: { publicAccess: 'None' }
}

resource fileService 'Microsoft.Storage/storageAccounts/fileServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource scriptsShare 'Microsoft.Storage/storageAccounts/fileServices/shares@2023-05-01' = {
  parent: fileService
  name: 'trainflow'
  properties: { shareQuota: 100, enabledProtocols: 'SMB' }
}

// NFS 4.1 carries no TLS, so Azure requires secure transfer off on an account with NFS shares: this
// account takes no traffic from outside the virtual network (no IP rules, no public bypass), and its
// data is encrypted at rest like the rest.
resource nfsStorage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_3: NFS shares need secure transfer off: "NFS file shares don't support an encryption mechanism" (https://learn.microsoft.com/azure/storage/files/storage-files-networking-overview); only the virtual network reaches this account
  // checkov:skip=CKV_AZURE_36: bypass None on purpose: no Azure service needs this account, only the compute subnet's nodes (virtual network rule)
  // checkov:skip=CKV_AZURE_43: nfsName is toLower(take(prefix + 'nfs' + uniqueString(...), 24)): 3-24 lowercase letters and digits; checkov cannot evaluate Bicep functions
  // checkov:skip=CKV_AZURE_206: NFS shares support neither GRS nor GZRS (https://learn.microsoft.com/azure/storage/files/files-nfs-protocol); the share holds a re-creatable copy of the data set staged from Blob
  name: nfsName
  location: location
  sku: { name: 'Premium_LRS' }
  kind: 'FileStorage'
  properties: {
    supportsHttpsTrafficOnly: false
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: false
    encryption: {
      keySource: 'Microsoft.Storage'
      requireInfrastructureEncryption: true
      services: { file: { enabled: true, keyType: 'Account' } }
    }
    networkAcls: {
      defaultAction: 'Deny'
      bypass: 'None'
      virtualNetworkRules: [ { id: computeSubnetId, action: 'Allow' } ]
    }
  }
}

resource nfsFileService 'Microsoft.Storage/storageAccounts/fileServices@2023-05-01' = {
  parent: nfsStorage
  name: 'default'
}

resource nfsShare 'Microsoft.Storage/storageAccounts/fileServices/shares@2023-05-01' = {
  parent: nfsFileService
  name: 'fileserver'
  properties: { shareQuota: nfsShareGiB, enabledProtocols: 'NFS', rootSquash: 'NoRootSquash' }
}

// The client pushes over the internet (its IP is the one rule); the nodes pull through the private endpoint
// below, so the registry stays reachable from both (Premium is needed for network rules and private endpoints).
resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' = {
  // checkov:skip=CKV_AZURE_139: public access stays on for the client's pushes, limited to its IP (defaultAction Deny); the nodes use the private endpoint
  // checkov:skip=CKV_AZURE_166: quarantine holds every pushed image until a scanner marks it verified; trainflow pushes and runs its own image at once and has no scanner in the loop
  name: registryName
  location: location
  sku: { name: 'Premium' } // network rules and private endpoints need Premium
  properties: {
    adminUserEnabled: false
    publicNetworkAccess: 'Enabled'
    networkRuleBypassOptions: 'AzureServices'
    networkRuleSet: {
      defaultAction: 'Deny'
      ipRules: [ { value: clientIp, action: 'Allow' } ]
    }
    // encrypted at rest always (service-managed keys); the encryption property is only for customer keys
  }
}

// The workspace's key vault holds only what the workspace writes there itself (the file-share datastore's
// account key, connection secrets), all re-creatable from the resources in this group. Purge protection is
// left off: with it on, `az keyvault purge` is refused and, the vault name being fixed per resource group,
// a redeploy into the same group after `az group delete` fails until the retention period ends (90 days by
// default): "You cannot reuse the name of a key vault that has been soft-deleted until the retention period
// has passed", and with purge protection it "cannot be purged until the retention period has passed". Soft
// delete cannot be turned off, so the retention is the shortest allowed (7 days) and the README's
// `az keyvault purge` advice frees the name at once. The property is left out, not set to false:
// "Enabling this functionality is irreversible - that is, the property does not accept false as its value."
// Sources: https://learn.microsoft.com/azure/templates/microsoft.keyvault/vaults (enablePurgeProtection,
// softDeleteRetentionInDays 7-90), https://learn.microsoft.com/azure/key-vault/general/soft-delete-overview
// (the quotes above; "Once the retention policy interval is set and saved it cannot be changed for that vault").
// So a vault made by an earlier version of this template keeps purge protection and its 90-day retention
// (Azure may refuse this template's values on it): deploy into a new resource group.
resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  // checkov:skip=CKV_AZURE_110: purge protection off on purpose (see above): it blocks purge and same-name redeploys for the retention period; the vault holds only re-creatable workspace secrets
  // checkov:skip=CKV_AZURE_42: "recoverable" means soft delete plus purge protection; soft delete stays on (7 days), purge protection is off on purpose (see above)
  name: vaultName
  location: location
  properties: {
    tenantId: subscription().tenantId
    sku: { family: 'A', name: 'standard' }
    enableRbacAuthorization: true
    enableSoftDelete: true
    softDeleteRetentionInDays: 7
    networkAcls: {
      defaultAction: 'Deny'
      bypass: 'AzureServices'
      ipRules: [ { value: clientIp } ]
      virtualNetworkRules: [ { id: computeSubnetId } ]
    }
  }
}

resource logs 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: '${prefix}-logs'
  location: location
  properties: { sku: { name: 'PerGB2018' }, retentionInDays: 30 }
}

resource insights 'Microsoft.Insights/components@2020-02-02' = {
  name: '${prefix}-insights'
  location: location
  kind: 'web'
  properties: { Application_Type: 'web', WorkspaceResourceId: logs.id }
}

// The workspace gets a private endpoint in the network (below): a cluster with enableNodePublicIp false
// talks to Azure ML only through it ("You must use a workspace private endpoint for the compute resource to
// communicate with Azure Machine Learning services from the VNet"). Public network access stays Enabled so
// that trainflow, running on the client outside the network, can still submit jobs and read their status:
// "Enabling public access doesn't remove any private endpoints that exist ... It enables public access only
// to the workspace, in addition to the private access through any private endpoints". The nodes resolve the
// workspace to the private endpoint through the linked private DNS zones. (The cluster must be in the
// workspace's region, which it is: both use `location`.)
// Sources: https://learn.microsoft.com/azure/machine-learning/how-to-secure-training-vnet (no public IP),
// https://learn.microsoft.com/azure/machine-learning/how-to-configure-private-link (enable public access).
resource workspace 'Microsoft.MachineLearningServices/workspaces@2024-10-01' = {
  // checkov:skip=CKV_AZURE_243: the workspace has a private endpoint in this template's own network (workspaceEndpoint); the check only recognises a managed network's outbound rules
  name: '${prefix}-ws'
  location: location
  identity: { type: 'SystemAssigned' }
  properties: {
    storageAccount: storage.id
    keyVault: vault.id
    applicationInsights: insights.id
    containerRegistry: registry.id
    publicNetworkAccess: 'Enabled'
  }
}

// Private endpoints in the compute subnet, each with the private DNS zones its service documents, linked to
// the network so that the nodes resolve the public names to the endpoints' private addresses.
//   workspace (groupId amlworkspace): privatelink.api.azureml.ms and privatelink.notebooks.azure.net
//   registry (groupId registry): privatelink.azurecr.io (the login server and its regional data endpoint)
// Sources: https://learn.microsoft.com/azure/private-link/private-endpoint-dns (AI + Machine Learning,
// Containers), https://learn.microsoft.com/azure/machine-learning/how-to-configure-private-link,
// https://learn.microsoft.com/azure/container-registry/container-registry-private-link
var privateZones = {
  workspace: [ 'privatelink.api.azureml.ms', 'privatelink.notebooks.azure.net' ]
  registry: [ 'privatelink.azurecr.io' ]
}

resource zones 'Microsoft.Network/privateDnsZones@2024-06-01' = [for zone in concat(privateZones.workspace, privateZones.registry): {
  name: zone
  location: 'global'
}]

resource zoneLinks 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2024-06-01' = [for (zone, i) in concat(privateZones.workspace, privateZones.registry): {
  parent: zones[i]
  name: '${prefix}-vnet-link'
  location: 'global'
  properties: { registrationEnabled: false, virtualNetwork: { id: vnet.id } }
}]

resource workspaceEndpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = {
  name: '${prefix}-ws-pe'
  location: location
  properties: {
    subnet: { id: computeSubnetId }
    privateLinkServiceConnections: [
      { name: 'workspace', properties: { privateLinkServiceId: workspace.id, groupIds: [ 'amlworkspace' ] } }
    ]
  }
}

resource workspaceZoneGroup 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = {
  parent: workspaceEndpoint
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      { name: 'api', properties: { privateDnsZoneId: zones[0].id } }
      { name: 'notebooks', properties: { privateDnsZoneId: zones[1].id } }
    ]
  }
}

resource registryEndpoint 'Microsoft.Network/privateEndpoints@2024-05-01' = {
  name: '${prefix}-acr-pe'
  location: location
  properties: {
    subnet: { id: computeSubnetId }
    privateLinkServiceConnections: [
      { name: 'registry', properties: { privateLinkServiceId: registry.id, groupIds: [ 'registry' ] } }
    ]
  }
}

resource registryZoneGroup 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-05-01' = {
  parent: registryEndpoint
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [ { name: 'registry', properties: { privateDnsZoneId: zones[2].id } } ]
  }
}

resource cluster 'Microsoft.MachineLearningServices/workspaces/computes@2024-10-01' = {
  parent: workspace
  name: 'trainflow-gpu'
  location: location
  dependsOn: [ workspaceZoneGroup, registryZoneGroup, zoneLinks ] // nodes without public IPs need the endpoints
  identity: { type: 'SystemAssigned' }
  properties: {
    computeType: 'AmlCompute'
    properties: {
      vmSize: vmSize
      vmPriority: lowPriority ? 'LowPriority' : 'Dedicated'
      scaleSettings: { minNodeCount: 0, maxNodeCount: maxNodes, nodeIdleTimeBeforeScaleDown: 'PT10M' }
      subnet: { id: computeSubnetId }
      enableNodePublicIp: false
      remoteLoginPortPublicAccess: 'Disabled'
    }
  }
}

resource filesDatastore 'Microsoft.MachineLearningServices/workspaces/datastores@2024-10-01' = {
  parent: workspace
  name: 'trainflow_files'
  properties: {
    datastoreType: 'AzureFile'
    accountName: storage.name
    fileShareName: scriptsShare.name
    endpoint: environment().suffixes.storage
    protocol: 'https'
    credentials: {
      credentialsType: 'AccountKey'
      secrets: { secretsType: 'AccountKey', key: storage.listKeys().keys[0].value }
    }
  }
}

// The blob container as a datastore: jobs read the staged shards and write results and checkpoints through
// it, and `ml_client.jobs.download` fetches outputs only from Blob or ADLS Gen2 datastores (it raises for
// Azure Files). Identity-based (credentials None): a job mounts it with the compute's identity, which gets
// Storage Blob Data Contributor below; no account key is stored in the workspace for it.
// Sources: https://learn.microsoft.com/azure/templates/microsoft.machinelearningservices/workspaces/datastores
// (AzureBlobDatastore, NoneDatastoreCredentials), https://learn.microsoft.com/azure/machine-learning/how-to-datastore
// (identity-based access), azure-ai-ml 1.35 azure/ai/ml/_artifacts/_artifact_utilities.py get_datastore_info
// (what jobs.download calls: "Supported types are ... AzureBlob and AzureDataLakeGen2"; for an identity-based
// datastore it reads with the caller's own credential, so the az login identity downloading results needs a
// blob data role, as storage auth default does; this template grants it none),
// https://learn.microsoft.com/azure/machine-learning/how-to-identity-based-service-authentication
// (a compute cluster's managed identity accesses identity-based datastores in jobs).
resource blobDatastore 'Microsoft.MachineLearningServices/workspaces/datastores@2024-10-01' = {
  parent: workspace
  name: 'trainflow_blob'
  properties: {
    datastoreType: 'AzureBlob'
    accountName: storage.name
    containerName: dataContainer.name
    endpoint: environment().suffixes.storage
    protocol: 'https'
    credentials: { credentialsType: 'None' }
  }
}

// The cluster's system identity reads and writes the container (jobs mount the blob datastore with it).
// Nothing new is granted to the client.
var blobContributorRole = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', 'ba92f5b4-2d11-453d-a403-e96b0029c9fe')

resource clusterBlobData 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: storage
  name: guid(storage.id, cluster.id, blobContributorRole)
  properties: { roleDefinitionId: blobContributorRole, principalId: cluster.identity.principalId, principalType: 'ServicePrincipal' }
}

// The workspace pulls the training image from the registry with its own identity.
var acrPullRole = subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '7f951dda-4ed3-4680-a7ca-43fe172d538d')

resource workspacePull 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: registry
  name: guid(registry.id, workspace.id, acrPullRole)
  properties: { roleDefinitionId: acrPullRole, principalId: workspace.identity.principalId, principalType: 'ServicePrincipal' }
}

resource clusterPull 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: registry
  name: guid(registry.id, cluster.id, acrPullRole)
  properties: { roleDefinitionId: acrPullRole, principalId: cluster.identity.principalId, principalType: 'ServicePrincipal' }
}

output blobAccountUrl string = storage.properties.primaryEndpoints.blob
output fileAccountUrl string = storage.properties.primaryEndpoints.file
output container string = dataContainer.name
output share string = scriptsShare.name
output nfsExport string = '${nfsStorage.name}.file.${environment().suffixes.storage}:/${nfsStorage.name}/${nfsShare.name}'
output registry string = registry.properties.loginServer
output workspace string = workspace.name
output compute string = cluster.name
output datastore string = filesDatastore.name
output subnetId string = computeSubnetId
output blobDatastore string = blobDatastore.name
// The cluster as deployed: config_from_outputs.py prints these, so trainflow does not PUT its defaults over them.
output vmSize string = vmSize
output maxNodes int = maxNodes
output lowPriority bool = lowPriority
output gpusPerNode int = contains(gpusBySize, vmSize) ? gpusBySize[vmSize] : 0
