"""The bad inputs trainflow refuses, each with the one line it answers: run for real by
tests/integration/flows/test_bad_inputs.py, and listed in the table of docs/reference/errors.md, which this module
writes:

    .venv/bin/python -m tests.fakes.bad_inputs     # writes the table there and prints it (paths shown as DIR)

Each case runs `trainflow ARGS` in a fresh folder DIR (made by its `setup`), with `env` added.
"""

import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory

from cli.reference import PAGES, cell
from tests.fakes.image_files import write_image, write_png_header

TRAINFLOW = str(Path(sys.executable).parent / "trainflow")
QUICK = ["--model", "resnet18", "--epochs", "1", "--workers", "2", "--batch-size", "1"]
TABLE_START, TABLE_END = "<!-- bad inputs: start -->", "<!-- bad inputs: end -->"


@dataclass
class Case:
    """One bad input: what the user did (the README's words), the command, and the exit status it must give."""

    input: str
    args: list[str]
    setup: Callable[[Path], None] = lambda root: None
    env: dict[str, str] = field(default_factory=dict)
    code: int = 2


def images(root: Path, classes: str = "ab", count: int = 4) -> Path:
    """An ImageNet-layout folder with `count` small PNGs per class."""
    for name in classes:
        for i in range(count):
            write_image(root / "train" / name / f"ok{i}.png")
    return root


def with_file(relative: str, content: bytes = b"", classes: str = "ab") -> Callable[[Path], None]:
    """Setup: a good data folder DIR/data plus one file at `relative` under it."""

    def setup(root: Path) -> None:
        images(root / "data", classes)
        (root / "data" / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / "data" / relative).write_bytes(content)

    return setup


def data_with(change: Callable[[Path], object]) -> Callable[[Path], None]:
    """Setup: a good two-class data folder DIR/data, then `change(DIR/data)`."""

    def setup(root: Path) -> None:
        images(root / "data")
        change(root / "data")

    return setup


def files(**contents: str) -> Callable[[Path], None]:
    """Setup: good data in DIR/data and text files DIR/<name> (a `_` in a name stands for a dot)."""

    def setup(root: Path) -> None:
        images(root / "data")
        for name, text in contents.items():
            (root / name.replace("_", ".")).write_text(text)

    return setup


def held_workdir(root: Path) -> None:
    """Setup: DIR/w locked by another process, as a running `trainflow stage` holds it."""
    (root / "w").mkdir()
    code = (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
        'f.write(\'{"pid": 4242, "host": "h", "since": "09:00:00", "command": "trainflow stage"}\'); '
        "f.flush(); print('held', flush=True); time.sleep(120)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(root / "w" / "trainflow.lock")], stdout=subprocess.PIPE)
    holder.stdout.readline()
    (root / "holder.pid").write_text(str(holder.pid))


def another_runs_checkpoint(root: Path) -> None:
    """Setup: good data in DIR/data and, in DIR/out, the checkpoint of a run of another model and classes."""
    import torch  # only this case needs it

    images(root / "data")
    (root / "out" / "checkpoints").mkdir(parents=True)
    state = {"arch": "resnet50", "classes": ["cat", "dog", "emu"], "model": {}, "optimizer": {}}
    torch.save(state, root / "out" / "checkpoints" / "step-000000010.pt")


def write_text(path: Path, text: str) -> None:
    """`text` at `path`, its folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def keras_file(root: Path) -> None:
    """Setup: good data in DIR/data and DIR/model.keras, a zip of a Keras model file's members."""
    import zipfile

    images(root / "data")
    with zipfile.ZipFile(root / "model.keras", "w") as archive:
        for name in ("metadata.json", "config.json", "model.weights.h5"):
            archive.writestr(name, "{}")


LISTENERS: list[socket.socket] = []  # ports the cases hold busy, open until the process ends


def busy_port(root: Path) -> None:
    """Setup: a port that something listens on, in DIR/port."""
    listener = socket.create_server(("127.0.0.1", 0))
    LISTENERS.append(listener)
    (root / "port").write_text(str(listener.getsockname()[1]))


def small_disk(folder: Path, size: str) -> None:
    """Setup: a tmpfs of `size` mounted at `folder` (run_all unmounts it)."""
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)


def photos_and_model(model: bytes, images: int = 0) -> Callable[[Path], None]:
    """Setup: DIR/photos holding `images` small PNGs, and DIR/model.pt holding `model`."""

    def setup(root: Path) -> None:
        (root / "photos").mkdir()
        for i in range(images):
            write_image(root / "photos" / f"{i}.png")
        (root / "model.pt").write_bytes(model)

    return setup


TRAIN = ["train", *QUICK, "--workdir", "{dir}/w"]
SMALL_BATCH = {"TRAINFLOW_TRAINING__BATCH_SIZE": "1"}  # a run on the 8 images of `images` that fits them
CASES = [
    Case("config file missing", ["run", "--config", "{dir}/nowhere.yaml", "--dry-run"]),
    Case("config file is a list", ["run", "--config", "{dir}/c.yaml", "--dry-run"], files(c_yaml="- epochs: 3\n")),
    Case("unknown setting", ["run", "--config", "{dir}/c.yaml", "--dry-run"], files(c_yaml="training: {epoch: 3}\n")),
    Case(
        "setting of the wrong type",
        ["run", "--config", "{dir}/c.yaml", "--dry-run"],
        files(c_yaml="training: {epochs: many}\n"),
    ),
    Case("unknown section", ["run", "--config", "{dir}/c.yaml", "--dry-run"], files(c_yaml="trainng: {epochs: 3}\n")),
    Case(
        "config file that is not valid YAML",
        ["run", "--config", "{dir}/c.yaml", "--dry-run"],
        files(c_yaml="training:\n  epochs: [1, 2\n"),
    ),
    Case(
        "a section given one value in the file",
        ["run", "--config", "{dir}/c.yaml", "--dry-run"],
        files(c_yaml="training: 3\n"),
    ),
    Case("a section given one value in the environment", ["run", "--dry-run"], env={"TRAINFLOW_TRAINING": "fast"}),
    Case(
        "a section and a setting inside it both in the environment",
        ["run", "--dry-run"],
        env={"TRAINFLOW_TRAINING": "x", "TRAINFLOW_TRAINING__EPOCHS": "3"},
    ),
    Case(
        "a SAS token in the account URL (not shown)",
        ["run", "--dry-run"],
        env={
            "TRAINFLOW_STORAGE__ACCOUNT_URL": "https://acct.blob.core.windows.net/?sv=2024-11-04&ss=b&srt=co&sp=rl"
            "&se=2030-01-01&sig=AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefg%3D"
        },
    ),
    Case(
        "a token pasted where a variable's name belongs (not shown)",
        ["run", "--dry-run"],
        env={"TRAINFLOW_STORAGE__SAS_TOKEN_ENV": "sv=2024-11-04&sp=rl&sig=AbCdEfGhIjKlMnOpQrStUvWxYz0123%3D"},
    ),
    Case(
        "a secret under a mistyped key (not shown)",
        ["run", "--dry-run", "--config", "{dir}/c.yaml"],
        files(
            c_yaml="storage: {account_key: Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
            "KBHBeksoGMGw==}\n"
        ),
    ),
    Case(
        "the storage key's variable is not set",
        ["stage", "--data", "{dir}/data", "--workdir", "{dir}/w", "--config", "{dir}/c.yaml"],
        files(
            c_yaml="storage: {backend: azure, account_url: 'https://acct.blob.core.windows.net', "
            "auth: key, account_key_env: TRAINFLOW_TEST_UNSET_KEY}\n"
        ),
    ),
    Case(
        "the storage key's variable is not set (run)",
        ["run", "--data", "{dir}/data", "--workdir", "{dir}/w", "--config", "{dir}/c.yaml"],
        files(
            c_yaml="storage: {backend: azure, account_url: 'https://acct.blob.core.windows.net', "
            "auth: key, account_key_env: TRAINFLOW_TEST_UNSET_KEY}\n"
        ),
        env=SMALL_BATCH,
    ),
    Case("environment variable of the wrong type", ["run", "--dry-run"], env={"TRAINFLOW_TRAINING__EPOCHS": "abc"}),
    Case("an environment variable that names no setting", ["run", "--dry-run"], env={"TRAINFLOW_EPOCHS": "3"}),
    Case(
        "PREFECT_API_URL naming a port nothing answers on",
        ["run", "--data", "synthetic", "--workdir", "{dir}/w"],
        env={"PREFECT_API_URL": "http://127.0.0.1:9/api"},
    ),
    Case("unknown compute backend", ["run", "--dry-run"], env={"TRAINFLOW_POOL__BACKEND": "slurm"}),
    Case(
        "more workers than the pool has slots",
        ["run", "--dry-run", "--config", "{dir}/c.yaml"],
        files(c_yaml="training: {workers: 4}\npool: {slots_per_node: 2}\n"),
    ),
    Case("data: staged without a data set name", ["run", "--dry-run", "--data", "staged"]),
    Case(
        "a data set name that leaves its folder",
        ["run", "--dry-run"],
        env={"TRAINFLOW_DATASET": "../../../escaped-ds"},
    ),
    Case("nothing to stage", ["stage", "--data", "synthetic", "--workdir", "{dir}/w"]),
    Case("a cron expression that is not one", ["deploy", "--cron", "every day", "--workdir", "{dir}/w"]),
    Case("workdir is a file", ["run", "--dry-run", "--workdir", "{dir}/file"], files(file="")),
    Case("workdir inside a file", ["stage", "--data", "{dir}/data", "--workdir", "{dir}/file/w"], files(file="")),
    Case(
        "workdir held by another command",
        ["stage", "--data", "{dir}/data", "--workdir", "{dir}/w"],
        lambda root: (images(root / "data"), held_workdir(root)),
    ),
    Case(
        "workdir held by another command (run)",
        ["run", "--data", "{dir}/data", "--workdir", "{dir}/w"],
        lambda root: (images(root / "data"), held_workdir(root)),
        env=SMALL_BATCH,
    ),
    Case("workdir held by another command (build)", ["build", "--workdir", "{dir}/w"], held_workdir),
    Case("UI port in use", ["ui", "--workdir", "{dir}/w", "--port", "{port}"], busy_port),
    Case("data folder missing", [*TRAIN, "--data", "{dir}/nowhere"]),
    Case("data folder empty", [*TRAIN, "--data", "{dir}/data"], lambda root: (root / "data").mkdir()),
    Case(
        "a class folder with no images",
        [*TRAIN, "--data", "{dir}/data"],
        lambda root: (images(root / "data"), (root / "data" / "train" / "c").mkdir()),
    ),
    Case(
        "a corrupt image",
        [*TRAIN, "--data", "{dir}/data"],
        with_file("train/a/bad.png", b"\x89PNG\r\n\x1a\n not really"),
    ),
    Case("a file that is not an image", [*TRAIN, "--data", "{dir}/data"], with_file("train/a/labels.csv", b"a,b\n")),
    Case(
        "an image too large to decode (a decompression bomb)",
        [*TRAIN, "--data", "{dir}/data"],
        data_with(lambda d: write_png_header(d / "train" / "a" / "huge.png", 20000, 20000)),
    ),
    Case(
        "a symlink loop in the data",
        [*TRAIN, "--data", "{dir}/data"],
        data_with(lambda d: os.symlink("../..", d / "train" / "a" / "up")),
    ),
    Case(
        "a broken symlink in the data",
        [*TRAIN, "--data", "{dir}/data"],
        data_with(lambda d: os.symlink("nowhere.png", d / "train" / "b" / "gone.png")),
    ),
    Case(
        "a newline in a file name (train)",
        [*TRAIN, "--data", "{dir}/data"],
        data_with(lambda d: write_image(d / "train" / "a" / "two\nlines.png")),
    ),
    Case(
        "a newline in a file name (stage)",
        ["stage", "--data", "{dir}/data", "--workdir", "{dir}/w"],
        data_with(lambda d: write_image(d / "train" / "a" / "two\nlines.png")),
    ),
    Case(
        "a tab in a class name",
        [*TRAIN, "--data", "{dir}/data"],
        data_with(lambda d: write_image(d / "train" / "c\td" / "x.png")),
    ),
    Case("a data set of one class", [*TRAIN, "--data", "{dir}/data"], lambda root: images(root / "data", "a")),
    Case(
        "a named pipe (FIFO) in a class folder (dry run)",
        ["run", "--dry-run", "--data", "{dir}/data", "--workdir", "{dir}/w"],
        data_with(lambda d: os.mkfifo(d / "train" / "a" / "pipe.jpg")),
    ),
    Case(
        "a named pipe (FIFO) in a class folder (train)",
        [*TRAIN, "--data", "{dir}/data"],
        data_with(lambda d: os.mkfifo(d / "train" / "a" / "pipe.jpg")),
    ),
    Case(
        "a class folder whose name starts with a dot (`...dots`)",
        ["stage", "--data", "{dir}/data", "--workdir", "{dir}/w"],
        data_with(lambda d: write_image(d / "train" / "...dots" / "x.png")),
    ),
    Case("an iPhone HEIC photo", [*TRAIN, "--data", "{dir}/data"], with_file("train/a/IMG_0001.HEIC", b"ftypheic")),
    Case(
        "a file given as the data folder",
        [*TRAIN, "--data", "{dir}/data.png"],
        lambda root: write_image(root / "data.png"),
    ),
    Case("batch size 0", [*TRAIN, "--data", "{dir}/data", "--batch-size", "0"], files()),
    Case("unknown model", [*TRAIN, "--data", "{dir}/data", "--model", "resnet5000"], files()),
    Case("pipeline stages without pipeline parallelism", [*TRAIN, "--data", "{dir}/data", "--stages", "2"], files()),
    Case("unknown launcher", [*TRAIN, "--data", "{dir}/data", "--launcher", "mpirun"], files()),
    Case("unknown launcher to benchmark", ["bench", "train", "--launcher", "mpirun", "--workdir", "{dir}/w"]),
    Case("results folder inside a file", [*TRAIN, "--data", "{dir}/data", "--out", "{dir}/file/out"], files(file="")),
    Case(
        "a results folder holding another run's checkpoints",
        [*TRAIN, "--data", "{dir}/data", "--out", "{dir}/out"],
        another_runs_checkpoint,
    ),
    Case("batch larger than the data set", [*TRAIN, "--data", "{dir}/data", "--batch-size", "5"], files()),
    Case("fine-tuning from a missing file", [*TRAIN, "--data", "{dir}/data", "--init-from", "{dir}/model.pt"], files()),
    Case(
        "fine-tuning from a run id that names no run",
        [*TRAIN, "--data", "{dir}/data", "--init-from", "3f2a9c"],
        files(),
    ),
    Case(
        "fine-tuning from a file that is not a model",
        [*TRAIN, "--data", "{dir}/data", "--init-from", "{dir}/notes.pt"],
        files(notes_pt="not weights\n"),
    ),
    Case(
        "fine-tuning PyTorch from a Keras model",
        [*TRAIN, "--data", "{dir}/data", "--init-from", "{dir}/model.keras"],
        keras_file,
    ),
    Case(
        "a model that cannot take the image size",
        [*TRAIN, "--data", "{dir}/data", "--model", "vit_b_16", "--config", "{dir}/c.yaml"],
        files(c_yaml="training: {image_size: 32}\n"),
    ),
    Case(
        "a run whose cost estimate exceeds the budget",
        ["run", "--data", "synthetic", "--workdir", "{dir}/w", "--config", "{dir}/c.yaml"],
        files(c_yaml="budget: 1\ncost: {this_machine: Standard_NC24ads_A100_v4}\njob: {timeout_s: 3600}\n"),
    ),
    Case("runs diff of a run that is not there", ["runs", "diff", "abc", "def", "--workdir", "{dir}/w"]),
    # input checks (issue 36)
    Case(
        "a val/ class that train/ lacks",
        ["stage", "--data", "{dir}/data", "--workdir", "{dir}/w"],
        data_with(lambda d: write_image(d / "val" / "zebra" / "x.png")),
    ),
    Case(
        "a val/ class that train/ lacks (train)",
        [*TRAIN, "--data", "{dir}/data"],
        data_with(lambda d: write_image(d / "val" / "zebra" / "x.png")),
    ),
    Case(
        "a val/ class that train/ lacks (dry run)",
        ["run", "--dry-run", "--data", "{dir}/data", "--workdir", "{dir}/w"],
        data_with(lambda d: write_image(d / "val" / "zebra" / "x.png")),
    ),
    Case(
        "val/ classes named as train/'s in another case",
        ["stage", "--data", "{dir}/data", "--workdir", "{dir}/w"],
        data_with(lambda d: (write_image(d / "val" / "A" / "x.png"), write_image(d / "val" / "B" / "x.png"))),
    ),
    Case("unknown model (dry run)", ["run", "--dry-run"], env={"TRAINFLOW_TRAINING__MODEL": "resnet5000"}),
    Case(
        "unknown model (run)",
        ["run", "--data", "synthetic", "--workdir", "{dir}/w"],
        env={"TRAINFLOW_TRAINING__MODEL": "resnet5000"},
    ),
    Case(
        "a model the Keras trainer lacks (dry run)",
        ["run", "--dry-run", "--framework", "keras"],
        env={"TRAINFLOW_TRAINING__MODEL": "vit_b_16"},
    ),
    Case(
        "a model that cannot take the image size (dry run)",
        ["run", "--dry-run", "--config", "{dir}/c.yaml"],
        files(c_yaml="training: {model: vit_b_16, image_size: 32}\n"),
    ),
    Case("an empty config file", ["run", "--dry-run", "--config", "{dir}/c.yaml"], files(c_yaml="# to do\n")),
    Case(
        "a key set twice in the config file",
        ["run", "--dry-run", "--config", "{dir}/c.yaml"],
        files(c_yaml="training:\n  epochs: 3\n  epochs: 5\n"),
    ),
    Case(
        "batch larger than the data set (dry run)",
        ["run", "--dry-run", "--data", "{dir}/data", "--config", "{dir}/c.yaml"],
        files(c_yaml="training: {batch_size: 5, workers: 2}\n"),
    ),
    Case(
        "batch larger than the data set (run)",
        ["run", "--data", "{dir}/data", "--workdir", "{dir}/w", "--config", "{dir}/c.yaml"],
        files(c_yaml="training: {batch_size: 5, workers: 2}\n"),
    ),
    # disk space (issue 36)
    Case(
        "a workdir on a disk too small for the data set",
        ["stage", "--data", "{dir}/data", "--workdir", "{dir}/w"],
        lambda root: (images(root / "data", count=200), small_disk(root / "w", "8m")),
        code=1,
    ),
    Case(
        "a workdir on a disk too small for Prefect's database",
        ["run", "--data", "synthetic", "--workdir", "{dir}/w"],
        lambda root: small_disk(root / "w", "2m"),
        code=1,
    ),
    # state damaged under the workdir (issue 43)
    Case(
        "Azurite's database cut short (a full disk, a lost machine)",
        ["stage", "--data", "{dir}/data", "--workdir", "{dir}/w"],
        data_with(
            lambda d: write_text(d.parent / "w" / "azurite" / "__azurite_db_blob__.json", '{"collections": [{"na')
        ),
        code=1,
    ),
    # trainflow predict (issue 45): its refusals before any model loads, and a file that is no model
    Case("predict: an empty folder", ["predict", "--model", "{dir}/model.pt", "{dir}/photos"], photos_and_model(b"")),
    Case(
        "predict: a model file that is not a model",
        ["predict", "--model", "{dir}/model.pt", "{dir}/photos"],
        photos_and_model(b"hello", images=1),
    ),
    Case("predict: a model file that is not there", ["predict", "--model", "{dir}/nowhere.pt", "{dir}/photos"]),
    Case("predict: a run id that names no run", ["predict", "--model", "0123abcd", "--workdir", "{dir}/w", "{dir}"]),
    Case(
        "predict: --top-k 0",
        ["predict", "--model", "{dir}/model.pt", "{dir}/photos", "--top-k", "0"],
        photos_and_model(b"", images=1),
    ),
]


def run_case(case: Case, root: Path) -> subprocess.CompletedProcess:
    """Run the case, set up in `root`."""
    port = (root / "port").read_text() if (root / "port").exists() else ""
    args = [a.format(dir=root, port=port) for a in case.args]
    env = {**os.environ, **case.env, "COLUMNS": "400"}
    try:
        return subprocess.run([TRAINFLOW, *args], capture_output=True, text=True, timeout=300, env=env, cwd=root)
    finally:
        if (root / "holder.pid").exists():
            os.kill(int((root / "holder.pid").read_text()), 9)


def answer(result: subprocess.CompletedProcess, root: Path) -> str:
    """The line the user saw, with the case's folder shown as DIR and its busy port as PORT."""
    line = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "(nothing)"
    port = (root / "port").read_text() if (root / "port").exists() else None
    return line.replace(str(root), "DIR").replace(port, "PORT") if port else line.replace(str(root), "DIR")


def heavy_work(workdir: Path) -> list[str]:
    """What a refused command must not have started in its workdir: Prefect's database, Azurite, runs, results (a
    case's setup may have made some: a workdir's damaged state)."""
    return sorted(p.name for p in workdir.glob("*") if p.name in ("prefect", "azurite", "runs", "results", "fileshare"))


def run_all(cases: list[Case]) -> list[tuple[Case, subprocess.CompletedProcess, str, list[str]]]:
    """Every case, two at a time: (case, result, the line it answered, the heavy work it started)."""

    def one(case: Case):
        with TemporaryDirectory() as folder:
            root = Path(folder).resolve()
            try:
                case.setup(root)
                before = heavy_work(root / "w")
                result = run_case(case, root)
                return case, result, answer(result, root), [n for n in heavy_work(root / "w") if n not in before]
            finally:
                if os.path.ismount(root / "w"):  # a case's small disk (small_disk)
                    subprocess.run(["umount", str(root / "w")], check=True)

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, cases))


ERRORS_PAGE = PAGES / "errors.md"  # the table's home; cli/reference.py writes the rest of the page


def table(outcomes) -> str:
    """The table of bad inputs, as markdown (`cell` escapes what it would read as markup: `<stream end>`, `|`)."""
    rows = [f"| {cell(case.input)} | {case.code} | {cell(line)} |" for case, _, line, _ in outcomes]
    return "\n".join(["| Input | Exit | What trainflow says |", "|---|---|---|", *rows])


def page_table(page: str) -> str:
    """The table between a page's markers."""
    found = re.search(f"{re.escape(TABLE_START)}\n(.*?)\n{re.escape(TABLE_END)}", page, re.S)
    return found.group(1) if found else ""


def write_table(page: Path, text: str) -> None:
    """Put `text` between the page's markers, in place of what was there."""
    before, rest = page.read_text().split(TABLE_START, 1)
    after = rest.split(TABLE_END, 1)[1]
    page.write_text(f"{before}{TABLE_START}\n{text}\n{TABLE_END}{after}")


if __name__ == "__main__":
    written = table(run_all(CASES))
    write_table(ERRORS_PAGE, written)
    print(written)
