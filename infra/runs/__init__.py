"""The bookkeeping of runs on this machine: run records and resumption (record.py), the cost ledger (ledger.py),
lineage (lineage.py), the workdir lock (workdir.py), experiment tracking in MLflow (tracking.py).
May import: infra.compute and every layer below it."""
