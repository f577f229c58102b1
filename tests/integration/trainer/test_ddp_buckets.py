"""The DDP backend's gradients are views into its all-reduce buckets (gradient_as_bucket_view): no copy of every
gradient into a bucket and back each step, and no second gradient-sized buffer; they stay so after zero_grad."""

import os
import subprocess
import sys

import pytest

from infra.engines.launchers import local_command
from tests.fakes.paths import REPO

pytestmark = pytest.mark.integration
CONTAINERS = REPO / "containers"
# Each of 2 gloo ranks wraps a model of 8 parameters (far under one 25 MB bucket) with the DDP backend, trains 2
# steps, and writes (to rank<N>.txt beside the script) how many storages its gradients live in after each backward
# pass, and their sum.
TWO_STEPS = f"""
import sys, torch
sys.path.insert(0, {str(CONTAINERS)!r})
from trainer.distributed import DDP
torch.set_num_threads(1)
torch.manual_seed(0)
backend = DDP(); backend.setup(torch.device("cpu"))
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
model, optimizer = backend.wrap(model, torch.optim.SGD(model.parameters(), lr=0.1))
for step in range(2):
    optimizer.zero_grad()
    model(torch.randn(8, 64) * (backend.rank + 1)).sum().backward()
    grads = [p.grad for p in model.parameters()]
    storages = {{g.untyped_storage().data_ptr() for g in grads}}
    total = sum(float(g.sum()) for g in grads)
    with open(f"{{sys.argv[1]}}/rank{{backend.rank}}.txt", "a") as out:
        out.write(f"{{len(grads)}} gradients in {{len(storages)}} storage(s), sum {{total:.6f}}\\n")
    optimizer.step()
backend.shutdown()
"""


def test_ddp_gradients_are_views_into_its_buckets_and_averaged(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(TWO_STEPS)
    done = subprocess.run(
        local_command("torchrun", 2, [str(script), str(tmp_path)], python=sys.executable),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = [(tmp_path / f"rank{rank}.txt").read_text().splitlines() for rank in (0, 1)]
    assert len(ranks[0]) == 2 and ranks[0] == ranks[1], ranks  # the ranks' inputs differ, their averages do not
    # one bucket: all 8 gradients in one storage, the bucket's, after the first step and after zero_grad
    assert all(line.startswith("8 gradients in 1 storage(s), sum ") for line in ranks[0]), ranks
