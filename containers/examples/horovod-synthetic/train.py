"""A synthetic benchmark under horovodrun (Horovod's PyTorch API), as Horovod's own examples are written, with nothing
of trainflow in it: an example of your own training script (docs/guides/own-script.md). Each step trains a small
convolutional network on random images; it prints its throughput and, as a JSON line, its metrics:

    Iter #3: 101.2 img/sec per CPU
    {"metrics": {"loss": 2.31, "img_per_sec": 202.4}, "step": 3}
    Total img/sec on 2 CPU(s): 202.4 +-3.1

    horovodrun -np 2 -H localhost:2 --gloo python train.py --iterations 5
    trainflow run --script containers/examples/horovod-synthetic --launcher horovodrun -- train.py --iterations 5
"""

import argparse
import json
import statistics
import time

import horovod.torch as hvd
import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1, help="iterations before timing")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--batches-per-iter", type=int, default=4)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 10),
    )
    # Horovod: scale the learning rate by the workers, average the gradients, start from rank 0's weights.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
    labels = torch.randint(0, 10, (args.batch_size,))

    def step() -> float:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    rates = []
    for iteration in range(args.iterations):
        started = time.perf_counter()
        for _ in range(args.batches_per_iter):
            loss = step()
        rate = args.batch_size * args.batches_per_iter / (time.perf_counter() - started)
        rates.append(rate)
        if hvd.rank() == 0:
            print(f"Iter #{iteration}: {rate:.1f} img/sec per CPU")
            metrics = {"loss": round(loss, 4), "img_per_sec": round(rate * hvd.size(), 1)}
            print(json.dumps({"metrics": metrics, "step": iteration}), flush=True)
    if hvd.rank() == 0:
        total, spread = statistics.mean(rates) * hvd.size(), statistics.pstdev(rates) * hvd.size()
        print(f"Total img/sec on {hvd.size()} CPU(s): {total:.1f} +-{spread:.1f}")


if __name__ == "__main__":
    main()
