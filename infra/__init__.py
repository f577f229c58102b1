"""Everything that talks to the world outside the flow, in layers; each subpackage says what it owns and what it
may import (the contracts in pyproject.toml, [tool.importlinter], check it), from the top down:

    runs      run records, the cost ledger, lineage, the workdir lock, experiment tracking
    compute   the compute backends (process, docker, azureml) behind one interface, and the Azure templates
    storage   Blob (Azurite or Azure), SAS, the file share, the file server, transfers with progress
    images    the Docker engine, the registry, the build context of the training image
    engines   the training frameworks and the trainer's contract (its options, command line, output)
    data      the data set's index and manifest, the sample data, restart-marker rewriting
    services  local services trainflow starts itself (Azurite, dockerd, a registry, Prefect), on a leash
    core      errors, redaction of secrets, JSON files
"""
