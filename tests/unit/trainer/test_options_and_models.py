"""Options, models and metrics of the trainer."""

import argparse
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from infra.compute.base import first_missing, remove_if_empty
from nodelib.errors import UsageError
from tests.fakes.image_files import write_image
from trainer import metrics
from trainer.distributed import detect_backend
from trainer.models import build_model, check_model_name
from trainer.options import build_parser, check_args, check_output_folder
from trainer.train import main as engine_main


def parse(*extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["--data", "synthetic", "--out", "/tmp/x", *extra])


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--batch-size", "0", "--batch-size must be at least 1"),
        ("--epochs", "0", "--epochs must be at least 1"),
        ("--lr", "-1", "--lr must be positive"),
        ("--min-crop-scale", "1.5", "--min-crop-scale must be in"),
        ("--lr-decay-epochs", "30,x", "comma-separated numbers"),
        ("--loader-workers", "-2", "must not be negative"),
    ],
)
def test_bad_options_are_named(flag, value, message):
    with pytest.raises(UsageError, match=message):
        check_args(parse(flag, value))


def test_defaults_pass_the_checks():
    check_args(parse())


def test_loader_workers_take_a_count_or_auto(capsys):
    assert parse().loader_workers == "auto"
    assert parse("--loader-workers", "3").loader_workers == 3
    check_args(parse("--loader-workers", "0"))
    with pytest.raises(SystemExit):
        parse("--loader-workers", "many")
    assert "--loader-workers: takes a whole number or auto, not 'many'" in capsys.readouterr().err


def test_output_folder_under_a_file_is_not_writable(tmp_path):
    (tmp_path / "file").write_text("")
    for out in (tmp_path / "file" / "out", tmp_path / "file"):
        with pytest.raises(UsageError, match=f"output folder {out} is not writable \\({tmp_path}/file is a file, not"):
            check_output_folder(out)


def test_a_read_only_output_folder_is_not_writable(tmp_path):
    (tmp_path / "ro").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(tmp_path / "ro")], check=True)
    try:
        for out in (tmp_path / "ro", tmp_path / "ro" / "new" / "out"):
            with pytest.raises(UsageError, match="is not writable \\(Read-only file system\\)"):
                check_output_folder(out)
    finally:
        subprocess.run(["umount", str(tmp_path / "ro")], check=True)


@pytest.mark.parametrize("out", ["results/train-1", "a/b/c/d", "."])
def test_checking_the_output_folder_creates_nothing(tmp_path, out):
    check_output_folder(tmp_path / out)
    assert sorted(tmp_path.rglob("*")) == []


def one_class(root: Path) -> Path:
    write_image(root / "train" / "only" / "x.png")
    return root


def data_file(root: Path) -> Path:
    return write_image(root.with_suffix(".png"))


def symlink_loop(root: Path) -> Path:
    write_image(root / "train" / "a" / "x.png")
    write_image(root / "train" / "b" / "y.png")
    os.symlink("../..", root / "train" / "b" / "up")
    return root


@pytest.mark.parametrize(
    "make, message",
    [
        (one_class, "has 1 class \\(only\\) under train/"),
        (data_file, "is a file, not a folder"),
        (symlink_loop, "train/b/up is a symlink loop"),
    ],
)
def test_a_refused_check_leaves_no_output_folder(tmp_path, capsys, make, message):
    data, out = make(tmp_path / "data"), tmp_path / "results" / "run"
    assert engine_main(["--data", str(data), "--out", str(out), "--model", "resnet18", "--check"]) == 2
    errors = [line for line in capsys.readouterr().out.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and re.search(message, errors[0]), errors
    assert not (tmp_path / "results").exists()


def test_a_failed_run_removes_only_the_empty_folders_it_made(tmp_path):
    out = tmp_path / "work" / "results" / "train-1"
    assert first_missing(out) == tmp_path / "work" and first_missing(tmp_path) is None
    (out / "logs").mkdir(parents=True)
    remove_if_empty(tmp_path / "work")
    assert not (tmp_path / "work").exists()
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "launcher.log").write_text("what went wrong")
    remove_if_empty(tmp_path / "work")
    assert (out / "logs" / "launcher.log").exists()


def test_unknown_model_suggests_real_names():
    with pytest.raises(UsageError, match="unknown model 'resnet51'.*resnet50"):
        check_model_name("resnet51")


def test_model_has_the_classes_of_the_data():
    model = build_model("resnet18", num_classes=7)
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 7)


def test_topk_correct_counts_hits():
    logits = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.05], [0.2, 0.3, 0.5]])
    assert metrics.topk_correct(logits, torch.tensor([1, 1, 0]), ks=(1, 2)) == [1, 2]
    assert metrics.topk_correct(logits, torch.tensor([1, 1, 0]), ks=(1, 5)) == [1, 3]  # k capped at 3 classes


def test_parameter_digest_sees_any_change():
    torch.manual_seed(0)
    a = build_model("resnet18", 3)
    torch.manual_seed(0)
    b = build_model("resnet18", 3)
    assert metrics.parameter_digest(a.named_parameters()) == metrics.parameter_digest(b.named_parameters())
    with torch.no_grad():
        b.fc.bias[0] += 1e-6
    assert metrics.parameter_digest(a.named_parameters()) != metrics.parameter_digest(b.named_parameters())
    assert all(0 <= c < 2**20 for c in metrics.digest_chunks(metrics.parameter_digest(a.named_parameters())))


@pytest.mark.parametrize(
    "env, backend",
    [
        ({}, "single"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "ddp"),
        ({"HOROVOD_RANK": "1"}, "horovod"),
        ({"OMPI_COMM_WORLD_RANK": "0"}, "horovod"),
    ],
)
def test_backend_follows_the_launcher(env, backend):
    assert detect_backend(env) == backend


def test_compile_is_on_by_default_for_a_gpu_and_off_for_the_cpu():
    # measured: 1.26x to 1.38x ResNet-50's images/s on one H100 (docs/benchmarks/earlier-training.md); minutes of
    # compiling on this CPU
    from trainer.train import resolve

    default = parse().compile
    assert default == "auto"
    assert resolve(default, torch.device("cuda")) and not resolve(default, torch.device("cpu"))
    assert not resolve("off", torch.device("cuda")) and resolve("on", torch.device("cpu"))
