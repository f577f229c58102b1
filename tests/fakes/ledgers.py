"""What the ledger's tests multiply: one CPU node priced at 0.75 an hour (7200 s of training is 2 node-hours and
1.5 USD), and attempts at training as infra/runs/attempts.py reads them."""

CPU_NODE = {
    "nodes": 1,
    "gpus_per_node": 0,
    "price_per_node_hour": 0.75,
    "priced_nodes": 1,
    "orchestrator_price": 0.0,
    "currency": "USD",
    "pool_steps": ["run-training"],
}


def attempt(number: int, ended: str, seconds: float) -> dict:
    """An attempt at training as infra/runs/attempts.py reads it."""
    return {"attempt": number, "flow_run": f"flow-{number}", "ended": ended, "seconds": seconds}
