"""`trainflow predict`: images classified by a trained model (a run id, or its model file), each as the model's
validation saw it. What it does is the trainer's (trainer/predictions.py, with trainer/predict.py for PyTorch's
models and trainer/tf/predict.py for Keras's); here: the options, the model file, the progress bar and the output."""

import csv
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.common import WorkdirOpt, configure, err, friendly_errors, say
from cli.runs import print_rows
from infra.core.errors import BadInput
from nodelib.errors import UsageError

if TYPE_CHECKING:
    from trainer.predictions import Classifier, Prediction

OPTION = "--model"
ImagesArg = Annotated[
    list[Path],
    typer.Argument(
        help="Image files, or folders of them (searched recursively; hidden files skipped).",
        show_default=False,
        metavar="IMAGES",
    ),
]
ModelOpt = Annotated[
    str,
    typer.Option(
        OPTION,
        help="A run id (or a prefix of one; `trainflow runs` lists them) or a model file: a run's model.pt (PyTorch) "
        "or model.keras (TensorFlow, Keras).",
        show_default=False,
    ),
]
TopKOpt = Annotated[int, typer.Option("--top-k", help="The likeliest classes shown per image.")]
JsonOpt = Annotated[
    bool, typer.Option("--json", help='Print a JSON list of {"file", "top": [{"class", "probability"}]}.')
]
CsvOpt = Annotated[
    Path | None, typer.Option("--csv", help="Write the predictions to FILE: file,class_1,p_1,...", metavar="FILE")
]


@friendly_errors
def predict(
    images: ImagesArg,
    model: ModelOpt,
    top_k: TopKOpt = 5,
    as_json: JsonOpt = False,
    csv_file: CsvOpt = None,
    workdir: WorkdirOpt = None,
) -> None:
    """Classify images with a trained model (PyTorch, TensorFlow or Keras), each resized and centre-cropped as its
    run's validation did, a batch at a time, on the GPU where there is one; an image that cannot be decoded is named
    and skipped. A table of each image's likeliest classes, or --json, or --csv FILE."""
    check_output(top_k, as_json, csv_file)
    from trainer.predictions import classify, image_paths

    with usage_as_bad_input():
        path = model_path(model, workdir)
        paths = image_paths(images)
        classifier = open_classifier(path)
        with progress(len(paths), any(given.is_dir() for given in images)) as advance:
            predictions = classify(classifier, paths, top_k, say, advance)
    if csv_file:
        write_csv(predictions, csv_file)
    elif as_json:
        print(json.dumps([p.record() for p in predictions], indent=2))
    else:
        print_rows(f"predictions of {path}", [table_row(p) for p in predictions])


def check_output(top_k: int, as_json: bool, csv_file: Path | None) -> None:
    """Refuse, before the model loads, options that cannot be honoured."""
    if top_k < 1:
        raise BadInput(f"--top-k {top_k}: give 1 or more, the likeliest classes shown per image")
    if as_json and csv_file:
        raise BadInput("--json prints the predictions and --csv writes them to a file: pass one of them")
    if csv_file and not csv_file.parent.is_dir():
        raise BadInput(f"--csv {csv_file}: there is no folder {csv_file.parent}; pass a file in an existing folder")
    if csv_file and csv_file.is_dir():
        raise BadInput(f"--csv {csv_file} is a folder; pass a file name, e.g. --csv {csv_file / 'predictions.csv'}")
    if csv_file:
        check_writable(csv_file)


def check_writable(dest: Path) -> None:
    """Refuse a file that cannot be written, before any image is classified: opened to append (nothing of it
    changes), and removed again if it was not there."""
    existed = dest.exists()
    try:
        with dest.open("a"):
            pass
    except OSError as exc:
        raise BadInput(f"--csv {dest} cannot be written ({exc.strerror}); pass a file you can write") from None
    if not existed:
        dest.unlink()


@contextmanager
def usage_as_bad_input() -> Iterator[None]:
    """The trainer's UsageError (a model file or image it refuses) as the orchestrator's BadInput: exit 2."""
    try:
        yield
    except UsageError as exc:
        raise BadInput(str(exc)) from None


def model_path(given: str, workdir: Path | None) -> Path:
    """The model file --model names, or the model of the run it names (its id, or a prefix of it), checked to be a
    file."""
    from infra.runs.lineage import model_file
    from trainer.model_files import check_model_file

    runs = configure(None, None, workdir, recipe=False, reads_only=True).workdir / "runs"
    fix = "pass a model file (a run's model.pt or model.keras) or a run id (`trainflow runs` lists them)"
    path = Path(model_file(given, runs, OPTION, fix))
    check_model_file(path, OPTION)
    return path


def open_classifier(path: Path) -> "Classifier":
    """The model in `path` ready to classify, read by its framework's code (TensorFlow only for a Keras model: a
    venv without it says how to install it)."""
    from infra.engines.installed import lacking
    from trainer.model_files import KERAS, framework_of

    if framework_of(path) != KERAS:  # a PyTorch file, or no model: read_torch names what it is
        from trainer.predict import TorchClassifier

        return TorchClassifier(path)
    if problem := lacking("tensorflow", f"{OPTION} {path} is a Keras model: classifying with it"):
        raise BadInput(problem)
    with native_stderr_silenced():
        from trainer.tf.predict import KerasClassifier
    return KerasClassifier(path)


@contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """Nothing written to the process's stderr (file descriptor 2) in the block: TensorFlow's C++ notices at import
    (oneDNN's, printed before its log level applies) would come before the output. Errors are raised, not printed:
    they pass."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextmanager
def progress(total: int, folders: bool) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr while folders of images are classified (a terminal only: a log gets none);
    yields the function that advances it."""
    from infra.data.sample_data import files_bar

    with files_bar(folders and err.is_terminal) as bar:
        task = bar.add_task("classifying", total=total)
        yield lambda n: bar.advance(task, n)


def table_row(prediction: "Prediction") -> dict:
    """One image's row of the table: its likeliest class and probability, and its top k."""
    (name, probability), *_ = prediction.top
    return {
        "file": prediction.file,
        "class": name,
        "probability": f"{probability:.2%}",
        f"top {len(prediction.top)}": ", ".join(f"{c} {p:.2%}" for c, p in prediction.top),
    }


def write_csv(predictions: list["Prediction"], dest: Path) -> None:
    """The predictions as CSV: file, then class_1,p_1 ... class_k,p_k, the likeliest first."""
    k = len(predictions[0].top)
    header = ["file", *(f"{column}_{i}" for i in range(1, k + 1) for column in ("class", "p"))]
    try:
        with open(dest, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows([p.file, *(v for pair in p.top for v in pair)] for p in predictions)
    except OSError as exc:
        raise BadInput(f"--csv {dest}: cannot write it ({exc.strerror}); pass a file you can write") from None
    print(f"wrote {len(predictions)} predictions to {dest}")
