"""The distributed backend seam: one small interface, three implementations.

- `Backend` itself (name "single"): one process, no communication.
- `DDP`: torch.distributed (gloo on CPU, NCCL on GPU), started by torchrun or any launcher that sets
  RANK / WORLD_SIZE / MASTER_ADDR (Azure ML's PyTorchDistribution does).
- `Horovod`: hvd.DistributedOptimizer, started by horovodrun or mpirun (Azure ML's MpiDistribution).

The training loop only calls the methods of `Backend`; every framework-specific line lives here.
"""

import contextlib
import datetime
import os
import time

import torch

from nodelib.errors import UsageError


class Backend:
    """One process, nothing to synchronise; the base of the other backends."""

    name = "single"

    def __init__(self):
        self.rank, self.world_size, self.local_rank, self.local_world_size = 0, 1, 0, 1

    def setup(self, device: torch.device) -> None:
        """Join the process group."""

    def wrap(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        backward_passes: int = 1,
        compression: str = "none",
    ):
        """Make the model and optimizer average gradients across workers (once per `backward_passes` backward
        passes: gradient accumulation), sent as `compression` (none: float32; fp16; bf16) in the all-reduce."""
        return model, optimizer

    def no_sync(self, model: torch.nn.Module):
        """A context for a backward pass whose gradients are accumulated, not yet averaged."""
        return contextlib.nullcontext()

    def broadcast_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Make every worker start from rank 0's parameters and optimizer state."""

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a tensor over all workers (returns the sum; CPU or device tensors)."""
        return tensor

    def gather(self, value):
        """`value` (any picklable object) of every worker, in rank order."""
        return [value]

    def shutdown(self) -> None:
        """Leave the process group."""


class DDP(Backend):
    """torch.distributed DistributedDataParallel."""

    name = "ddp"

    def __init__(self):
        super().__init__()
        self.rank, self.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))

    def setup(self, device):
        # torch.distributed: NCCL between GPUs, gloo between CPU processes.
        backend = "nccl" if device.type == "cuda" else "gloo"
        self.device = device
        torch.distributed.init_process_group(backend, timeout=datetime.timedelta(minutes=10))

    def wrap(self, model, optimizer, backward_passes=1, compression="none"):
        # torch.distributed: DDP broadcasts rank 0's parameters and buffers when it wraps the model.
        ids = [self.device.index] if self.device.type == "cuda" else None
        # gradient_as_bucket_view: the gradients are views into the all-reduce buckets, so no copy into the buckets
        # and back, and one model's worth of gradient memory less; optimizer.zero_grad() handles such views (PyTorch
        # PR 41954). On 2 CPU workers (ResNet-18) the step time did not change measurably (README "Scaling").
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)
        if compression != "none":  # each bucket cast down for the all-reduce, averaged, cast back into the gradients
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(None, getattr(default_hooks, f"{compression}_compress_hook"))
        return ddp, optimizer

    def no_sync(self, model):
        return model.no_sync()  # torch.distributed: skip the all-reduce of this backward pass

    def all_reduce_sum(self, tensor):
        # NCCL reduces device tensors only; gloo reduces CPU tensors.
        moved = tensor.to(self.device)
        torch.distributed.all_reduce(moved)
        return moved.to(tensor.device)

    def gather(self, value):
        values = [None] * self.world_size
        torch.distributed.all_gather_object(values, value)  # torch.distributed: pickled, on the group's device
        return values

    def shutdown(self):
        # Every rank reaches the end before any leaves: a rank that tears its group down while a peer is still on its
        # way out closes the peer's Gloo connections under it, and the peer aborts ("terminate called without an
        # active exception", SIGABRT: seen on rank 1 of a 2-rank run on a loaded machine, its work all done).
        torch.distributed.barrier()
        leave_process_group()


POLL_S = 0.001  # Horovod: between polls of an all-reduce in flight; a step takes hundreds of ms on a CPU
# Horovod, as patched by containers/build/horovod-idle-cycle.patch: while no tensor is pending, the background thread
# waits up to this many ms for one (an enqueued request wakes it at once) instead of negotiating with every peer each
# cycle. Stock Horovod ignores the variable. Measured on 2 cores (README "Scaling"): the idle negotiation took 20-40 ms
# of CPU per ResNet-18 step at the 5 ms cycle. HOROVOD_IDLE_CYCLE_TIME in the environment overrides it.
IDLE_CYCLE_MS = 100


class Horovod(Backend):
    """Horovod: ring-allreduce of gradients inside DistributedOptimizer."""

    name = "horovod"

    def __init__(self):
        super().__init__()
        import horovod.torch as hvd  # Horovod: imported only when asked for

        self.hvd = hvd

    def setup(self, device):
        os.environ.setdefault("HOROVOD_IDLE_CYCLE_TIME", str(IDLE_CYCLE_MS))  # Horovod: read by init
        self.hvd.init()  # Horovod: join the ring
        self.rank, self.world_size = self.hvd.rank(), self.hvd.size()
        self.local_rank, self.local_world_size = self.hvd.local_rank(), self.hvd.local_size()

    def wrap(self, model, optimizer, backward_passes=1, compression="none"):
        # Horovod: average gradients across workers during backward, once per `backward_passes` passes.
        if compression == "bf16":
            raise UsageError(
                "--grad-compression bf16 needs DDP (torchrun): Horovod compresses gradients to fp16 "
                "only; pass --grad-compression fp16 or none"
            )
        optimizer = self.hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            op=self.hvd.Average,
            backward_passes_per_step=backward_passes,
            compression=getattr(self.hvd.Compression, compression),
        )
        optimizer.synchronize = self.waiting_quietly(optimizer)
        return model, optimizer

    def waiting_quietly(self, optimizer):
        """The optimizer's synchronize, after waiting for its gradients' all-reduces in sleeps of POLL_S: Horovod's
        own wait spins (0.7 CPU s per s here while a peer is late), taking the CPU that the peer, on the same
        cores, needs to finish its backward pass."""
        spinning = optimizer.synchronize

        def synchronize():
            for handle, _ in list(optimizer._handles.values()):  # Horovod: (handle, context) per gradient in flight
                while isinstance(handle, int) and not self.hvd.poll(handle):
                    time.sleep(POLL_S)
            spinning()

        return synchronize

    def broadcast_state(self, model, optimizer):
        # Horovod: start every worker from rank 0's parameters and optimizer state.
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self.hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def all_reduce_sum(self, tensor):
        return self.hvd.allreduce(tensor, op=self.hvd.Sum)

    def gather(self, value):
        return self.hvd.allgather_object(value)  # Horovod: pickled, in rank order

    def shutdown(self):
        self.hvd.shutdown()


def detect_backend(env: dict[str, str]) -> str:
    """The backend that the launcher in `env` expects: horovod, ddp or single."""
    if "HOROVOD_RANK" in env or "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        return "horovod"
    if "RANK" in env and "WORLD_SIZE" in env:
        return "ddp"
    return "single"


def make_backend(name: str) -> Backend:
    """Backend by name ("auto" looks at the launcher's environment variables)."""
    name = detect_backend(dict(os.environ)) if name == "auto" else name
    return {"single": Backend, "ddp": DDP, "horovod": Horovod}[name]()


def pick_device(requested: str, local_rank: int) -> torch.device:
    """cuda:<local rank> when a GPU is there (or asked for), else the CPU."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    device = torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    torch.cuda.set_device(device)
    return device


def leave_process_group() -> None:
    """Leave torch.distributed's process group, if this process joined one. Called on the way out after bad input
    too: a group left for the interpreter's exit to tear down can abort the process ("terminate called without an
    active exception", SIGABRT) and turn a clean exit 2 into a crash."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
