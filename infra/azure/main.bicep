// trainflow on Azure: everything one pipeline run needs, inside one virtual network.
//   storage account (HTTPS only): the blob container for the data set, the file share for scripts and results
//   NFS file server: a premium Azure Files NFS share, reachable only from the virtual network
//   container registry: the training images (the workspace pulls with its identity)
//   Azure ML workspace and its GPU cluster (the pool), the file share registered as a datastore
// Deploy with infra/azure/deploy.sh (one command); it prints the trainflow config for what it made.

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
var storageName = take('${prefix}st${suffix}', 24)
var nfsName = take('${prefix}nfs${suffix}', 24)
var registryName = take('${prefix}acr${suffix}', 50)
var vaultName = take('${prefix}kv${suffix}', 24)

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
          serviceEndpoints: [
            { service: 'Microsoft.Storage' }
            { service: 'Microsoft.ContainerRegistry' }
            { service: 'Microsoft.KeyVault' }
          ]
        }
      }
    ]
  }
}

var computeSubnetId = vnet.properties.subnets[0].id

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: storageName
  location: location
  sku: { name: 'Standard_LRS' }
  kind: 'StorageV2'
  properties: {
    supportsHttpsTrafficOnly: true
    minimumTlsVersion: 'TLS1_2'
    allowBlobPublicAccess: false
    allowSharedKeyAccess: true // the datastore of the file share and trainflow's signed SAS tokens use the key
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

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' = {
  name: registryName
  location: location
  sku: { name: 'Premium' } // network rules need Premium
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

resource vault 'Microsoft.KeyVault/vaults@2023-07-01' = {
  name: vaultName
  location: location
  properties: {
    tenantId: subscription().tenantId
    sku: { family: 'A', name: 'standard' }
    enableRbacAuthorization: true
    enableSoftDelete: true
    enablePurgeProtection: true
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

resource workspace 'Microsoft.MachineLearningServices/workspaces@2024-10-01' = {
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

resource cluster 'Microsoft.MachineLearningServices/workspaces/computes@2024-10-01' = {
  parent: workspace
  name: 'trainflow-gpu'
  location: location
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
