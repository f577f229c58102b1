"""Pipeline parallelism: the model split into S stages over S processes, micro-batches through a schedule.

A world of S x D processes (torchrun; gloo on CPU, NCCL on GPU) forms D pipeline replicas: rank r is
stage r % S of replica r // S, so a replica's stages sit on neighbouring ranks (one node's GPUs).
Each replica trains on its own shard of the data; torch.distributed.pipelining runs the M
micro-batches of a step through the stages (GPipe or 1F1B), and the gradients of each stage are
then averaged over the D replicas.

Each rank builds the model on the meta device (no memory), splits it, and materialises only its own
stage's parameters and buffers, with the values a one-device build gives them (models.materialise);
the rest of the model stays on the meta device. Its optimizer holds only the stage's parameters.
Evaluation passes batches down the stages, forward only. A checkpoint is one file per stage, each
under the single-device model's names and optimizer indices, so the files merged
(checkpoint.load_checkpoint) load into the single-device model; model.pt is put together on rank 0's
CPU at the end of training.

Horovod has no pipeline parallelism: this mode runs on torch.distributed only.
"""

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torchvision
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from nodelib.errors import UsageError
from trainer.models import forget, materialise
from trainer.options import check_layout  # noqa: F401 - part of the split API (tests, train.py)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
# Models whose forward is features -> avgpool -> flatten -> classifier.
FEATURE_MODELS = (
    torchvision.models.VGG,
    torchvision.models.AlexNet,
    torchvision.models.MobileNetV2,
    torchvision.models.MobileNetV3,
    torchvision.models.EfficientNet,
)


def blocks_of(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model as named blocks that run one after another (ResNets: stem, each residual block, head)."""
    if isinstance(model, torchvision.models.ResNet):
        stem = torch.nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
        layers = [(f"layer{i}.{j}", block) for i in range(1, 5) for j, block in enumerate(getattr(model, f"layer{i}"))]
        head = torch.nn.Sequential(model.avgpool, torch.nn.Flatten(1), model.fc)
        return [("stem", stem), *layers, ("head", head)]
    if isinstance(model, FEATURE_MODELS):
        features = [(f"features.{i}", m) for i, m in enumerate(model.features)]
        pool = getattr(model, "avgpool", torch.nn.Identity())
        return [*features, ("head", torch.nn.Sequential(pool, torch.nn.Flatten(1), model.classifier))]
    raise UsageError(
        f"pipeline mode splits ResNet-style models and features/classifier models (VGG, AlexNet, "
        f"MobileNet, EfficientNet), not {type(model).__name__}; pick one of those with --model"
    )


def partition(costs: list[float], stages: int, model: str = "the model") -> list[int]:
    """Stage boundaries (start index of each stage) that split `costs` (one per block of `model`) into contiguous
    parts with the smallest largest part (linear partition by dynamic programming)."""
    n = len(costs)
    if stages > n:
        raise UsageError(f"--stages {stages} is more than the {n} blocks {model} splits into; use at most {n}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    best = [[float("inf")] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for end in range(s, n + 1):
            for start in range(s - 1, end):
                cost = max(best[s - 1][start], prefix[end] - prefix[start])
                if cost < best[s][end]:
                    best[s][end], cut[s][end] = cost, start
    starts, end = [], n
    for s in range(stages, 0, -1):
        end = cut[s][end]
        starts.append(end)
    return starts[::-1]


def parameter_costs(blocks: list[tuple[str, torch.nn.Module]]) -> list[float]:
    """Parameters per block."""
    return [float(sum(p.numel() for p in m.parameters())) for _, m in blocks]


def timed_costs(model: torch.nn.Module, recipe: dict, sample: torch.Tensor, repeats: int = 3) -> list[float]:
    """Measured seconds of forward plus backward per block on `sample` (the median of `repeats`), each block
    materialised alone on a copy of the meta model and dropped after: never more than one block held."""
    work, costs, x = copy.deepcopy(model), [], sample
    for i, (_, block) in enumerate(blocks_of(work)):
        names = state_names(work, block)
        materialise(work, names, recipe, sample.device)
        seconds, x = time_block(block, x, repeats, needs_grad=i > 0)
        forget(work, names)
        costs.append(seconds)
    return costs


def time_block(block: torch.nn.Module, x: torch.Tensor, repeats: int, needs_grad: bool) -> tuple[float, torch.Tensor]:
    """The median seconds of `block`'s forward and backward on `x`, and its output (the next block's input)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        y = block(x.detach().requires_grad_(needs_grad))
        y.float().sum().backward()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2], y.detach()


@dataclass
class Split:
    """Which blocks each stage holds."""

    names: list[list[str]]
    costs: list[float]  # per stage, in the unit of the balance
    params: list[int]

    def describe(self, balance: str) -> str:
        """Each stage's blocks, parameters and, balanced by time, its seconds per step."""
        return "; ".join(
            f"stage {s}: {v[0]}..{v[-1]} ({len(v)} blocks, {self.params[s]:,} params"
            + (f", {self.costs[s]:.4g} s)" if balance == "time" else ")")
            for s, v in enumerate(self.names)
        )


def split_model(model, stages: int, costs: list[float]) -> tuple[Split, list[torch.nn.Module]]:
    """Split `model` into `stages` with the most even `costs` per stage; the split and the stage modules."""
    blocks = blocks_of(model)
    starts = partition(costs, stages) + [len(blocks)]
    parts = [blocks[starts[s] : starts[s + 1]] for s in range(stages)]
    split = Split(
        [[n for n, _ in part] for part in parts],
        [sum(costs[starts[s] : starts[s + 1]]) for s in range(stages)],
        [int(sum(parameter_costs(part))) for part in parts],
    )
    return split, [torch.nn.Sequential(*(m for _, m in part)) for part in parts]


def state_names(model: torch.nn.Module, part: torch.nn.Module) -> set[str]:
    """The keys of model.state_dict() whose tensors belong to `part` (a stage built of the model's modules)."""
    mine = {id(t) for t in part.state_dict(keep_vars=True).values()}
    return {k for k, t in model.state_dict(keep_vars=True).items() if id(t) in mine}


def make_groups(world: int, stages: int, rank: int):
    """(this rank's pipeline group, this rank's replica group); every rank creates every group, in order."""
    replicas = world // stages
    mine = {}
    for d in range(replicas):
        group = dist.new_group([d * stages + s for s in range(stages)])
        if rank // stages == d:
            mine["pipeline"] = group
    for s in range(stages):
        group = dist.new_group([d * stages + s for d in range(replicas)])
        if rank % stages == s:
            mine["replicas"] = group
    return mine["pipeline"], mine["replicas"]


class Pipeline:
    """This rank's stage of one pipeline replica: its module (the only part of the model this rank materialises),
    its schedule, and the groups it talks to."""

    def __init__(
        self,
        model: torch.nn.Module,
        recipe: dict,
        args,
        rank: int,
        world: int,
        device: torch.device,
        memory_format: torch.memory_format = torch.contiguous_format,
    ):
        self.stages, self.microbatches, self.rank, self.device = args.stages, args.microbatches, rank, device
        self.stage, self.replicas = rank % self.stages, world // self.stages
        self.pipeline_group, self.replica_group = make_groups(world, self.stages, rank)
        self.split, modules = split_model(model, self.stages, agreed_costs(model, recipe, args, device))
        self.whole, self.module = model, modules[self.stage]
        self.names = state_names(model, self.module)
        materialise(model, sorted(self.names), recipe, device)
        self.module.to(memory_format=memory_format)
        self.full_index = parameter_indices(model, self.module)
        stage = PipelineStage(self.module, self.stage, self.stages, device, group=self.pipeline_group)
        self.schedule = SCHEDULES[args.pipeline_schedule](stage, self.microbatches, loss_fn=cross_entropy)
        self.step_seconds: list[float] = []
        self.clock = ComputeClock(self.module)

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    def step(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """One optimizer step's forward and backward through the pipeline, then gradients averaged over the
        replicas; the mean loss on the last stage, a tensor (None elsewhere)."""
        started = time.perf_counter()
        losses: list[torch.Tensor] = []  # the last stage's schedule appends each micro-batch's loss
        inputs = (images,) if self.stage == 0 else ()
        last = self.is_last  # only the last stage takes the targets and fills losses (step defaults both to None)
        if len(self.step_seconds) == 1:
            self.clock.busy = 0.0  # the first step also infers the shapes: leave it out (see steady_steps)
        self.schedule.step(*inputs, target=targets if last else None, losses=losses if last else None)
        self.clock.close()
        self.average_gradients()
        self.step_seconds.append(time.perf_counter() - started)
        return torch.stack(losses).mean().detach() if self.is_last else None

    def average_gradients(self) -> None:
        """Each stage's gradients averaged over the D replicas (what DDP does in data-parallel mode)."""
        if self.replicas == 1:
            return
        for param in self.module.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, group=self.replica_group)
                param.grad /= self.replicas

    def sum_over_replicas(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over this stage's replicas (returns the sum)."""
        moved = tensor.to(self.device)
        dist.all_reduce(moved, group=self.replica_group)
        return moved.to(tensor.device)

    @torch.no_grad()
    def forward_only(self, images: torch.Tensor) -> torch.Tensor | None:
        """One batch down the pipeline without gradients (evaluation): stage 0 reads the images, each later stage
        receives its input from the one before; the logits on the last stage, None on the others."""
        x = images if self.stage == 0 else self.receive()
        y = self.module(x)
        if self.is_last:
            return y
        dist.send_object_list([y.shape, y.dtype], dst=self.rank + 1, device=self.device)
        dist.send(y.contiguous(), dst=self.rank + 1)
        return None

    def receive(self) -> torch.Tensor:
        """The activations the stage before sends (their shape and type first)."""
        header: list[Any] = [None, None]  # (shape, dtype), as forward_only sends them
        dist.recv_object_list(header, src=self.rank - 1, device=self.device)
        x = torch.empty(header[0], dtype=header[1], device=self.device)
        dist.recv(x, src=self.rank - 1)
        return x

    def stage_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """This stage's part of a checkpoint: its tensors under the single-device model's names, its optimizer
        state under the single-device optimizer's parameter indices."""
        model = {k: v for k, v in self.whole.state_dict().items() if k in self.names}
        state, index = optimizer.state_dict(), self.full_index
        groups = [{**g, "params": [index[i] for i in g["params"]]} for g in state["param_groups"]]
        return {
            "model": model,
            "optimizer": {"state": {index[i]: v for i, v in state["state"].items()}, "param_groups": groups},
        }

    def load_stage(self, model_state: dict, optimizer_state: dict | None, optimizer: torch.optim.Optimizer) -> None:
        """Load this stage's tensors (and optimizer state) from the single-device model's checkpoint state."""
        self.whole.load_state_dict({k: model_state[k] for k in self.names}, strict=False)
        if optimizer_state is None:
            return
        local = {full: i for i, full in enumerate(self.full_index)}
        groups = [
            {**g, "params": [local[k] for k in g["params"] if k in local]} for g in optimizer_state["param_groups"]
        ]
        optimizer.load_state_dict(
            {"state": {local[k]: v for k, v in optimizer_state["state"].items() if k in local}, "param_groups": groups}
        )

    def whole_state(self) -> dict | None:
        """Rank 0: the single-device model's state dict, put together on the CPU from replica 0's stages (None on
        the other ranks; replica 0's ranks take part)."""
        if self.rank >= self.stages:
            return None
        mine = {k: v.detach().cpu() for k, v in self.whole.state_dict().items() if k in self.names}
        parts: list[Any] | None = [None] * self.stages if self.rank == 0 else None  # gather_object fills each slot
        dist.gather_object(mine, parts, dst=0, group=self.pipeline_group)
        return None if parts is None else {k: merged(parts)[k] for k in self.whole.state_dict()}

    def idle_fraction(self) -> float:
        """Measured share of the steps this stage was not computing: 1 - (time in its forward and backward
        passes) / (time in the steps), the first step left out; waiting on the other stages is the bubble."""
        return max(0.0, 1.0 - self.clock.busy / sum(self.steady_steps()))

    def steady_steps(self) -> list[float]:
        """Seconds of each step after the first (which also infers the shapes between the stages)."""
        return self.step_seconds[1:] or self.step_seconds


class ComputeClock:
    """Time a stage spends computing inside the schedule: its forward passes (module hooks) and its backward
    passes (from the gradient reaching its output to the last gradient accumulated into its parameters)."""

    def __init__(self, module: torch.nn.Module):
        self.busy, self.started, self.last_grad = 0.0, 0.0, 0.0
        self.backward_from: float | None = None  # when the backward pass in progress began
        module.register_forward_pre_hook(self.forward_begins)
        module.register_forward_hook(self.forward_ends)
        for param in module.parameters():
            param.register_post_accumulate_grad_hook(self.gradient_done)

    def forward_begins(self, module, args) -> None:
        self.close()
        self.started = time.perf_counter()

    def forward_ends(self, module, args, output) -> None:
        self.busy += time.perf_counter() - self.started
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(self.backward_begins)

    def backward_begins(self, grad):
        self.close()
        self.backward_from = self.last_grad = time.perf_counter()

    def gradient_done(self, param) -> None:
        self.last_grad = time.perf_counter()

    def close(self) -> None:
        """Count the backward pass in progress, if any (it ended at its last accumulated gradient)."""
        if self.backward_from is not None:
            self.busy += self.last_grad - self.backward_from
            self.backward_from = None


def parameter_indices(model: torch.nn.Module, part: torch.nn.Module) -> list[int]:
    """For each parameter of `part`, in order, its index among the model's parameters (the optimizer's numbering)."""
    index = {id(p): i for i, p in enumerate(model.parameters())}
    return [index[id(p)] for p in part.parameters()]


def merged(parts: list[dict]) -> dict:
    out = {}
    for part in parts:
        out.update(part)
    return out


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The loss of one micro-batch (the schedule divides the gradients by the number of micro-batches)."""
    return torch.nn.functional.cross_entropy(output.float(), target)


def agreed_costs(model: torch.nn.Module, recipe: dict, args, device: torch.device) -> list[float]:
    """Per-block costs every rank agrees on: parameter counts, or times measured on rank 0 and broadcast."""
    if args.balance != "time":
        return parameter_costs(blocks_of(model))
    costs: list[list[float] | None] = [
        timed_costs(model, recipe, microbatch_sample(args, device)) if dist.get_rank() == 0 else None
    ]
    dist.broadcast_object_list(costs, src=0)
    if costs[0] is None:  # rank 0 always sends a list
        raise RuntimeError("rank 0 broadcast no block costs")
    return costs[0]


def microbatch_sample(args, device: torch.device) -> torch.Tensor:
    """A zero batch of one micro-batch's shape (for timing blocks)."""
    return torch.zeros(args.batch_size // args.microbatches, 3, args.image_size, args.image_size, device=device)


def theoretical_bubble(stages: int, microbatches: int) -> float:
    """GPipe's idle fraction with equal stages: (S - 1) / (M + S - 1)."""
    return (stages - 1) / (microbatches + stages - 1)
