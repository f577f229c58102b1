"""Deployments of the train-flow: a cron schedule and parameters from a config file, served by a process.

`trainflow deploy` registers the deployment (visible in the UI, startable there or with
`prefect deployment run 'train-flow/<name>'`); `--serve` also keeps this process serving it, so
scheduled and manual runs execute here. Scheduled runs are created by a Prefect server's scheduler:
run `trainflow ui` (or any Prefect server) and set PREFECT_API_URL to it.
"""

from prefect import serve

from flows.config import FlowConfig
from flows.train_flow import train_flow


def flow_deployment(cfg: FlowConfig, name: str, cron: str | None):
    """The train-flow as a deployment with `cfg` as its parameter and an optional cron schedule."""
    return train_flow.to_deployment(
        name=name,
        cron=cron,
        parameters={"cfg": cfg.model_dump(mode="json")},
        tags=["trainflow"],
        description=f"trainflow train-flow on {cfg.dataset_name()}",
    )


def deploy_flow(cfg: FlowConfig, name: str, cron: str | None, serve_runs: bool) -> str:
    """Register the deployment and return its id; with `serve_runs`, serve it until interrupted, one run at a time
    (a run that comes due while another runs waits for it, instead of being refused the busy workdir)."""
    deployment = flow_deployment(cfg, name, cron)
    deployment_id = str(deployment.apply())
    if serve_runs:  # one run at a time: every run of this deployment takes the same workdir's lock
        serve(deployment, print_starting_message=True, limit=1)
    return deployment_id
