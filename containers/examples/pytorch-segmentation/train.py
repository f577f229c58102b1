"""A tiny segmentation model under torchrun (DDP), written as any PyTorch script is, with nothing of trainflow in it:
an example of your own training script (docs/guides/own-script.md). It learns to mark the bright squares of
synthetic images, or of --data's images/ and masks/ (PNG pairs of the same name), and

- resumes from the newest checkpoint in --checkpoint-dir (a re-run of an interrupted run continues it),
- logs loss and IoU to TensorBoard under --log-dir, and prints them: `epoch 2 loss=0.4312 iou=0.6120`,
- saves the model to --output/model.pt (rank 0 alone writes).

    torchrun --nproc_per_node 2 train.py --epochs 3
    trainflow run --script containers/examples/pytorch-segmentation -- train.py --epochs 3 \
        --checkpoint-dir '${{checkpoints}}' --log-dir '${{logs}}/tb' --output '${{output}}'
"""

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="steps per epoch")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2.0)
    parser.add_argument("--size", type=int, default=16, help="image side in pixels")
    parser.add_argument("--data", type=Path, help="a folder with images/ and masks/; none: synthetic")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--log-dir", type=Path, default=Path("logs"))
    parser.add_argument("--output", type=Path, default=Path("output"))
    return parser.parse_args()


def synthetic_batch(batch: int, size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Images with a bright square each, and the square as the mask."""
    images = torch.rand(batch, 1, size, size, generator=generator) * 0.5
    masks = torch.zeros(batch, 1, size, size)
    for i in range(batch):
        x, y = torch.randint(0, size // 2, (2,), generator=generator).tolist()
        images[i, :, y : y + size // 2, x : x + size // 2] += 0.5
        masks[i, :, y : y + size // 2, x : x + size // 2] = 1.0
    return images, masks


def folder_batches(data: Path, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every images/NAME.png with masks/NAME.png, resized to `size`."""
    from torchvision.io import ImageReadMode, read_image
    from torchvision.transforms.v2.functional import resize

    names = sorted(p.name for p in (data / "images").glob("*.png"))
    read = lambda folder, name: resize(read_image(str(data / folder / name), ImageReadMode.GRAY), [size, size])  # noqa: E731
    images = torch.stack([read("images", n) for n in names]).float() / 255
    masks = (torch.stack([read("masks", n) for n in names]) > 127).float()
    return images, masks


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 1, 3, padding=1)
    )


def iou(logits: torch.Tensor, masks: torch.Tensor) -> float:
    predicted = logits > 0
    union = (predicted | (masks > 0)).sum().item()
    return (predicted & (masks > 0)).sum().item() / union if union else 1.0


def newest_checkpoint(folder: Path) -> Path | None:
    found = sorted(folder.glob("checkpoint-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")  # torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} starts", flush=True)
    torch.manual_seed(0)
    net = DistributedDataParallel(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    if checkpoint := newest_checkpoint(args.checkpoint_dir):
        state = torch.load(checkpoint, weights_only=True)
        net.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"]
        if rank == 0:
            print(f"resumed from {checkpoint.name} (epoch {start})")
    data = folder_batches(args.data, args.size) if args.data else None
    writer = SummaryWriter(str(args.log_dir)) if rank == 0 else None
    generator = torch.Generator().manual_seed(rank + 1000 * start)
    for epoch in range(start + 1, args.epochs + 1):
        losses, scores = [], []
        for _ in range(args.steps):
            if data is None:
                images, masks = synthetic_batch(args.batch_size, args.size, generator)
            else:
                picked = torch.randint(0, len(data[0]), (args.batch_size,), generator=generator)
                images, masks = data[0][picked], data[1][picked]
            logits = net(images)
            loss = torchvision.ops.sigmoid_focal_loss(logits, masks, reduction="mean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            scores.append(iou(logits.detach(), masks))
        mean_loss, mean_iou = sum(losses) / len(losses), sum(scores) / len(scores)
        if rank == 0:
            print(f"epoch {epoch} loss={mean_loss:.4f} iou={mean_iou:.4f}", flush=True)
            assert writer is not None
            writer.add_scalar("train/loss", mean_loss, epoch)
            writer.add_scalar("train/iou", mean_iou, epoch)
            writer.flush()
            args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            state = {"model": net.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, args.checkpoint_dir / f"checkpoint-{epoch}.pt")
        dist.barrier()
    if rank == 0:
        args.output.mkdir(parents=True, exist_ok=True)
        torch.save(net.module.state_dict(), args.output / "model.pt")
        print(f"saved {args.output / 'model.pt'} after {args.epochs} epochs on {world} workers")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
