"""The cost ledger: node-seconds and GPU-hours of each step of a run, money where a price is known, the GPU-hours
lost to failed or pre-empted attempts; and the estimate that the `budget` setting is checked against before
anything starts.

How a step is counted (decided here, written to ledger.json in the run folder):
- `run-training`, and `sync-to-file-server` where the backend syncs by a job on its pool, occupy the pool: the
  backend's nodes (a docker pool's container nodes count as nodes) with the GPUs of each node; every other step
  runs on the orchestrator: one node, no GPU.
- A node's GPUs: the price table's figure for its VM size (a size it lacks: `pool.slots_per_node`); a local
  pool's nodes: its `pool.slots_per_node` when the trainer ran on CUDA, else none.
- Money: node-hours x the VM size's price per node-hour (dedicated or low-priority). The azureml pool's nodes are
  priced at `pool.vm_size`; the orchestrator, and a local pool (priced as one machine, however many container
  nodes it runs), at `cost.this_machine` when it is set, else at nothing.
- `run-training` counts every attempt at the run's training (infra/runs/attempts.py): a run killed outright and
  resumed by a re-run counts the killed attempt's time up to its death, and each of Prefect's retries; each attempt
  gets its own row under `attempts` (seconds, node-seconds, GPU-hours, cost, how it ended). The other steps count
  the steps of every flow run that worked on the run (run.json's `flow_runs`), as Prefect timed them, up to the
  copy of the results: the ledger is written before it, so that the copy holds it (the copy, the report and MLflow's
  last call, seconds on the orchestrator, are not counted).
- Lost GPU-hours: those of every attempt that did not complete: the run's own (killed, interrupted, failed) and
  those the backend reports (pre-empted, failed).

The estimate before a run: the newest complete run in the workdir with the same settings that set its length
(training, pool, job, data set name, VM size) gives its measured training time; without one, the worst case: the
job's timeout (`job.timeout_s`) times the attempts the job may make. A budget with neither (no such run and no
timeout) is refused: the worst case has no bound.
"""

from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from infra.compute import backend_of
from infra.core.errors import BadInput
from infra.core.jsonfiles import read_json, write_json
from infra.runs.attempts import brief
from infra.runs.record import RECORD, RunSettings, settings_fingerprint

LEDGER = "ledger.json"
POOL_STEPS = ("run-training",)  # steps that run on the pool; the pool's sync job adds sync-to-file-server


class NodePrice(BaseModel):
    """One VM size: its GPUs and its price per node-hour."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    gpus: int = Field(ge=0)
    """GPUs in one node of this size."""
    dedicated: float = Field(ge=0)
    """Price of one dedicated node for an hour."""
    low_priority: float = Field(ge=0)
    """Price of one low-priority (spot) node for an hour."""


# Illustrative pay-as-you-go figures (USD per node-hour, Linux); no network is asked: put your region's and your
# agreement's prices in cost.prices.
DEFAULT_PRICES = {
    "Standard_NC6s_v3": NodePrice(gpus=1, dedicated=3.06, low_priority=0.61),
    "Standard_NC24s_v3": NodePrice(gpus=4, dedicated=12.24, low_priority=2.45),
    "Standard_NC24ads_A100_v4": NodePrice(gpus=1, dedicated=3.67, low_priority=0.73),
    "Standard_NC96ads_A100_v4": NodePrice(gpus=4, dedicated=14.69, low_priority=2.94),
    "Standard_ND96asr_v4": NodePrice(gpus=8, dedicated=27.20, low_priority=5.44),
    "Standard_ND96isr_H100_v5": NodePrice(gpus=8, dedicated=98.32, low_priority=19.66),
}


class CostConfig(BaseModel):
    """The price table the ledger and the budget use (no network needed)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    currency: str = "USD"
    """The currency of the prices and of `budget`."""
    prices: dict[str, NodePrice] = DEFAULT_PRICES
    """VM size -> its GPUs and price per node-hour, dedicated and low-priority. The defaults are illustrative list
    prices: sizes given here are added to them or replace them."""
    this_machine: str | None = None
    """The VM size of the machine trainflow runs on (a cloud VM), which prices the orchestrator's steps and the
    process and docker pools; unset: they are not priced."""

    @field_validator("prices")
    @classmethod
    def _over_the_defaults(cls, prices: dict[str, NodePrice]) -> dict[str, NodePrice]:
        return {**DEFAULT_PRICES, **prices}


class LedgerSettings(RunSettings, Protocol):
    """What the ledger reads of a run's config: the run's settings, the price table and the budget."""

    @property
    def cost(self) -> CostConfig: ...

    @property
    def budget(self) -> float | None: ...


def node_price(cost: CostConfig, vm_size: str | None, low_priority: bool = False) -> tuple[float | None, int | None]:
    """(price per node-hour, GPUs per node) of a VM size: (0, None) for no size, (None, None) for one the table
    lacks (its money is unknown)."""
    if vm_size is None:
        return 0.0, None
    found = {size.lower(): price for size, price in cost.prices.items()}.get(vm_size.lower())
    if found is None:
        return None, None
    return (found.low_priority if low_priority else found.dedicated), found.gpus


def cost_basis(cfg: LedgerSettings, device: str = "") -> dict:
    """What the ledger multiplies: the pool's nodes, GPUs per node and price per node-hour, the orchestrator's
    price, the steps on the pool; `device` is where the trainer ran (metrics.json), for local GPUs."""
    backend = backend_of(cfg.pool)
    vm_size, low_priority, _ = backend.billing(cfg.pool)
    price, gpus = node_price(cfg.cost, vm_size or cfg.cost.this_machine, low_priority)
    if not vm_size:  # a local pool: the GPUs its workers used
        gpus = cfg.pool.slots_per_node if device.startswith("cuda") else 0
    elif gpus is None:  # a size the table lacks: one process per GPU
        gpus = cfg.pool.slots_per_node
    on_pool = POOL_STEPS + (("sync-to-file-server",) if backend.sync_where(cfg.pool) == "pool" else ())
    return {
        "nodes": backend.nodes(cfg.pool),
        "gpus_per_node": gpus,
        "vm_size": vm_size or cfg.cost.this_machine,
        "low_priority": low_priority,
        "price_per_node_hour": price,
        "priced_nodes": None if vm_size else 1,
        "orchestrator_price": node_price(cfg.cost, cfg.cost.this_machine)[0],
        "currency": cfg.cost.currency,
        "pool_steps": list(on_pool),
    }


def step_row(basis: dict, step: str, seconds: float) -> dict:
    """One step in the ledger: its nodes, node-seconds, GPU-hours and cost."""
    on_pool = step in basis["pool_steps"]
    nodes = basis["nodes"] if on_pool else 1
    priced = (basis["priced_nodes"] or nodes) if on_pool else 1
    price = basis["price_per_node_hour"] if on_pool else basis["orchestrator_price"]
    return {
        "step": step,
        "seconds": round(seconds, 2),
        "nodes": nodes,
        "node_seconds": round(nodes * seconds, 2),
        "gpu_hours": round(nodes * basis["gpus_per_node"] * seconds / 3600 if on_pool else 0.0, 4),
        "cost": None if price is None else round(priced * price * seconds / 3600, 4),
    }


def make_ledger(
    basis: dict, durations: dict[str, float], attempts: list[dict], tries: list[dict] | None = None
) -> dict:
    """The run's ledger: a row per step, the totals, a row per attempt at training, and the GPU-hours of attempts
    that did not complete. `attempts`: the backend's own (Azure ML's); `tries`: the run's attempts at training
    (infra/runs/attempts.py), whose seconds replace the step's when there are any."""
    if tries:
        durations = {**durations, "run-training": sum(t["seconds"] for t in tries)}
    rows = [step_row(basis, step, seconds) for step, seconds in durations.items()]
    totals = {key: round(sum(r[key] for r in rows), 4) for key in ("seconds", "node_seconds", "gpu_hours")}
    costs = [r["cost"] for r in rows]
    totals["cost"] = None if None in costs else round(sum(costs), 4)
    tried = [try_row(basis, t) for t in tries or []]
    lost = sum(a.get("gpu_hours") or 0 for a in attempts if a.get("ended") != "Completed")
    lost += sum(t["gpu_hours"] for t in tried if t["ended"] != "completed")
    return {
        "steps": rows,
        "total": totals,
        "attempts": tried,
        "lost_gpu_hours": round(lost, 4),
        "currency": basis["currency"],
        "basis": basis,
    }


def try_row(basis: dict, attempt: dict) -> dict:
    """One attempt at training in the ledger: how it ended, its seconds, node-seconds, GPU-hours and cost."""
    counted = {k: v for k, v in step_row(basis, "run-training", attempt["seconds"]).items() if k != "step"}
    return {"attempt": attempt["attempt"], "flow_run": attempt["flow_run"], "ended": attempt["ended"], **counted}


def estimate_key(cfg: LedgerSettings) -> str:
    """The settings that set how long a run trains: runs with the same key are expected to take as long."""
    return settings_fingerprint(cfg, backend_of(cfg.pool).billing(cfg.pool))


def measured_training(runs: Path, key: str) -> tuple[str, float] | None:
    """(run id, seconds of run-training) of the newest complete run with this estimate key, if any."""
    found = []
    for folder in runs.glob("*/") if runs.exists() else []:
        ledger = read_json(folder / LEDGER)
        seconds = {r["step"]: r["seconds"] for r in ledger.get("steps", [])}.get("run-training")
        if ledger.get("estimate_key") == key and seconds and read_json(folder / RECORD).get("status") == "complete":
            found.append(((folder / LEDGER).stat().st_mtime, folder.name, seconds))
    return max(found)[1:] if found else None


def estimate(cfg: LedgerSettings) -> dict:
    """The run's cost before it starts: the training step on the pool, from a measured run or the worst case."""
    basis = cost_basis(cfg)
    measured = measured_training(cfg.workdir / "runs", estimate_key(cfg))
    attempts = backend_of(cfg.pool).billing(cfg.pool)[2]
    if measured:
        seconds, how = measured[1], f"run {measured[0]}'s measured training time, {measured[1]:.0f} s"
    else:
        seconds = cfg.job.timeout_s * attempts
        how = (
            f"the worst case: job.timeout_s {cfg.job.timeout_s:g} s x {attempts} attempt(s)"
            if seconds
            else "the worst case, unbounded: job.timeout_s is 0 (no limit) and no earlier run with these settings"
        )
    row = step_row(basis, "run-training", seconds)
    return {
        "cost": row["cost"],
        "gpu_hours": row["gpu_hours"],
        "how": how,
        "bounded": bool(seconds),
        "currency": basis["currency"],
        "vm_size": basis["vm_size"],
    }


def check_budget(cfg: LedgerSettings) -> dict | None:
    """Refuse a run whose estimate exceeds `budget` (BadInput, one line with the figures and the fixes); the
    estimate, or None without a budget."""
    if cfg.budget is None:
        return None
    found = estimate(cfg)
    if found["cost"] is None:
        size = found["vm_size"]
        raise BadInput(
            f"budget {cfg.budget:g} {found['currency']} cannot be checked: cost.prices has no price for VM "
            f"size {size}; add it (cost: {{prices: {{{size}: {{gpus: G, dedicated: P, low_priority: Q}}}}}}) "
            "or unset budget"
        )
    money = f"{found['cost']:.2f} {found['currency']}"
    if not found["bounded"]:
        raise BadInput(
            f"budget {cfg.budget:g} {found['currency']} cannot be checked: {found['how']}; set "
            "job.timeout_s (TRAINFLOW_JOB__TIMEOUT_S) or unset budget"
        )
    if found["cost"] > cfg.budget:
        raise BadInput(
            f"the run's estimate is {money} ({found['how']}), over budget {cfg.budget:g} "
            f"{found['currency']}: raise budget (TRAINFLOW_BUDGET), lower job.timeout_s, pool.nodes or "
            "the VM size, or use low-priority nodes"
        )
    return found


def record_ledger(
    out: Path, basis: dict, durations: dict[str, float], attempts: list[dict], key: str, tries: list[dict]
) -> dict:
    """The run's ledger (see make_ledger), written to ledger.json in its folder with the key a later run's estimate
    looks for."""
    ledger = make_ledger(basis, durations, attempts, tries)
    write_json(out / LEDGER, {**ledger, "estimate_key": key})
    return ledger


def ledger_summary(ledger: dict) -> dict:
    """The ledger in a few numbers, every attempt counted: what the receipt, the MLflow run and `trainflow runs`
    show ({} for a run with no ledger yet)."""
    if not ledger:
        return {}
    training = {r["step"]: r["seconds"] for r in ledger["steps"]}.get("run-training")
    return {
        "training_seconds": training,
        "attempts": [brief(t) for t in ledger.get("attempts", [])],
        "node_hours": round(ledger["total"]["node_seconds"] / 3600, 4),
        "gpu_hours": ledger["total"]["gpu_hours"],
        "cost": ledger["total"]["cost"],
        "currency": ledger["currency"],
        "lost_gpu_hours": ledger["lost_gpu_hours"],
    }


def ledger_lines(ledger: dict | None) -> list[str]:
    """The ledger as Markdown: each step's nodes, node-seconds, GPU-hours and cost, the totals, the lost GPU-hours."""
    if not ledger:
        return []
    money = lambda value: "n/a (no price)" if value is None else f"{value:.2f} {ledger['currency']}"  # noqa: E731 - a one-line helper, read where it is used
    rows = [*ledger["steps"], {"step": "**total**", "nodes": "", **ledger["total"]}]
    lines = ["", "| step | nodes | node-seconds | GPU-hours | cost |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['step']} | {r['nodes']} | {r['node_seconds']:.1f} | {r['gpu_hours']:.4f} | {money(r['cost'])} |"
        for r in rows
    ]
    lines += try_lines(ledger.get("attempts", []), money)
    return lines + ["", f"- GPU-hours lost to failed or pre-empted attempts: {ledger['lost_gpu_hours']:.4f}"]


def try_lines(tries: list[dict], money) -> list[str]:
    """The attempts at training as Markdown, when there was more than one or one did not complete."""
    if len(tries) < 2 and all(t["ended"] == "completed" for t in tries):
        return []
    lines = [
        "",
        "| attempt at training | ended | seconds | node-seconds | GPU-hours | cost |",
        "|---|---|---|---|---|---|",
    ]
    return lines + [
        f"| {t['attempt']} | {t['ended']} | {t['seconds']:.1f} | {t['node_seconds']:.1f} | {t['gpu_hours']:.4f} "
        f"| {money(t['cost'])} |"
        for t in tries
    ]
