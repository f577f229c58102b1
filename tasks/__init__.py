"""One module per pipeline step: Prefect tasks (retries, caching, timeouts) around calls into infra/."""
