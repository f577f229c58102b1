"""Pipeline parallelism: the model split into S stages over S processes, micro-batches through a schedule.

A world of S x D processes (torchrun; gloo on CPU, NCCL on GPU) forms D pipeline replicas: rank r is
stage r % S of replica r // S, so a replica's stages sit on neighbouring ranks (one node's GPUs).
Each replica trains on its own shard of the data; torch.distributed.pipelining runs the M
micro-batches of a step through the stages (GPipe or 1F1B), and the gradients of each stage are
then averaged over the D replicas. The stages are the torchvision model's own modules, so the full
model is put together again (every rank gathers its replica's stages) for evaluation, checkpoints
and the exported model: a checkpoint written with S stages loads into the single-device model.

Horovod has no pipeline parallelism: this mode runs on torch.distributed only.
"""

import copy
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torchvision
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from trainer.errors import UsageError
from trainer.options import check_layout  # noqa: F401 - part of the split API (tests, train.py)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
# Models whose forward is features -> avgpool -> flatten -> classifier.
FEATURE_MODELS = (torchvision.models.VGG, torchvision.models.AlexNet, torchvision.models.MobileNetV2,
                  torchvision.models.MobileNetV3, torchvision.models.EfficientNet)


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
    raise UsageError(f"pipeline mode splits ResNet-style models and features/classifier models (VGG, AlexNet, "
                     f"MobileNet, EfficientNet), not {type(model).__name__}; pick one of those with --model")


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


def timed_costs(blocks: list[tuple[str, torch.nn.Module]], sample: torch.Tensor, repeats: int = 3) -> list[float]:
    """Measured seconds of forward plus backward per block on `sample` (the median of `repeats`), on a copy:
    the model's batch-norm statistics and gradients stay as they are."""
    blocks = copy.deepcopy(blocks)
    times = [[] for _ in blocks]
    for _ in range(repeats):
        x = sample
        for i, (_, block) in enumerate(blocks):
            x = x.detach().requires_grad_(i > 0)
            started = time.perf_counter()
            y = block(x)
            y.float().sum().backward()
            times[i].append(time.perf_counter() - started)
            x = y
    return [sorted(t)[len(t) // 2] for t in times]


@dataclass
class Split:
    """Which blocks each stage holds."""

    names: list[list[str]]
    costs: list[float]  # per stage, in the unit of the balance
    params: list[int]

    def describe(self, balance: str) -> str:
        unit = "s" if balance == "time" else "params"
        return "; ".join(f"stage {s}: {v[0]}..{v[-1]} ({len(v)} blocks, {self.params[s]:,} params, "
                         f"{self.costs[s]:.4g} {unit})" for s, v in enumerate(self.names))


def split_model(model, stages: int, costs: list[float]) -> tuple[Split, list[torch.nn.Module]]:
    """Split `model` into `stages` with the most even `costs` per stage; the split and the stage modules."""
    blocks = blocks_of(model)
    starts = partition(costs, stages) + [len(blocks)]
    parts = [blocks[starts[s]:starts[s + 1]] for s in range(stages)]
    split = Split([[n for n, _ in part] for part in parts],
                  [sum(costs[starts[s]:starts[s + 1]]) for s in range(stages)],
                  [int(sum(parameter_costs(part))) for part in parts])
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
    """This rank's stage of one pipeline replica: its module, its schedule, and the groups it talks to."""

    def __init__(self, model: torch.nn.Module, args, rank: int, world: int, device: torch.device):
        self.stages, self.microbatches = args.stages, args.microbatches
        self.stage, self.replicas = rank % self.stages, world // self.stages
        self.pipeline_group, self.replica_group = make_groups(world, self.stages, rank)
        self.split, modules = split_model(model, self.stages, agreed_costs(model, args, device))
        self.module = modules[self.stage]
        self.names = state_names(model, self.module)
        stage = PipelineStage(self.module, self.stage, self.stages, device, group=self.pipeline_group)
        self.schedule = SCHEDULES[args.pipeline_schedule](stage, self.microbatches, loss_fn=cross_entropy)
        self.step_seconds: list[float] = []
        self.clock = ComputeClock(self.module)

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    def step(self, images: torch.Tensor, targets: torch.Tensor) -> float | None:
        """One optimizer step's forward and backward through the pipeline, then gradients averaged over the
        replicas; the mean loss on the last stage (None elsewhere)."""
        started, losses = time.perf_counter(), []
        inputs = (images,) if self.stage == 0 else ()
        extra = {"target": targets, "losses": losses} if self.is_last else {}
        if len(self.step_seconds) == 1:
            self.clock.busy = 0.0  # the first step also infers the shapes: leave it out (see steady_steps)
        self.schedule.step(*inputs, **extra)
        self.clock.close()
        self.average_gradients()
        self.step_seconds.append(time.perf_counter() - started)
        return torch.stack(losses).mean().item() if self.is_last else None

    def average_gradients(self) -> None:
        """Each stage's gradients averaged over the D replicas (what DDP does in data-parallel mode)."""
        if self.replicas == 1:
            return
        for param in self.module.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad, group=self.replica_group)
                param.grad /= self.replicas

    def gather_model(self, model: torch.nn.Module) -> None:
        """Every rank of the replica gets every stage's parameters and buffers: `model` is whole again."""
        local = {k: v.detach().cpu() for k, v in model.state_dict().items() if k in self.names}
        model.load_state_dict(merged(self.gather(local)))

    def gather_optimizer(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer state of every stage (each rank holds momentum only for its own parameters)."""
        state = optimizer.state_dict()
        return {**state, "state": merged(self.gather(state["state"]))}

    def gather(self, obj) -> list:
        parts = [None] * self.stages
        dist.all_gather_object(parts, obj, group=self.pipeline_group)
        return parts

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
        self.busy, self.started, self.backward_from, self.last_grad = 0.0, 0.0, None, 0.0
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


def merged(parts: list[dict]) -> dict:
    out = {}
    for part in parts:
        out.update(part)
    return out


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The loss of one micro-batch (the schedule divides the gradients by the number of micro-batches)."""
    return torch.nn.functional.cross_entropy(output.float(), target)


def agreed_costs(model: torch.nn.Module, args, device: torch.device) -> list[float]:
    """Per-block costs every rank agrees on: parameter counts, or times measured on rank 0 and broadcast."""
    blocks = blocks_of(model)
    if args.balance != "time":
        return parameter_costs(blocks)
    costs = [timed_costs(blocks, microbatch_sample(args, device))]
    dist.broadcast_object_list(costs, src=0)
    return costs[0]


def microbatch_sample(args, device: torch.device) -> torch.Tensor:
    """A zero batch of one micro-batch's shape (for timing blocks)."""
    return torch.zeros(args.batch_size // args.microbatches, 3, args.image_size, args.image_size, device=device)


def theoretical_bubble(stages: int, microbatches: int) -> float:
    """GPipe's idle fraction with equal stages: (S - 1) / (M + S - 1)."""
    return (stages - 1) / (microbatches + stages - 1)
