"""Where the data set and the scripts are kept: Blob storage (Azurite locally, Azure Storage), SAS tokens, the file
share (a local folder or Azure Files), the file server every node mounts, and transfers with progress.
May import: infra.services (Azurite), infra.core, and the trainer's contract package nodelib.staged."""
