"""training.init_from on the orchestrator's side: a run id becomes its model file, a file an absolute path; what
the pool's workers cannot read is refused before anything starts."""

import re
import zipfile
from pathlib import Path

import pytest

from flows.config import ConfigError, load_config
from infra.core.errors import BadInput
from infra.runs.lineage import weights_file
from infra.runs.record import RECORD


def finished_run(runs: Path, run_id: str, model_file: str | None = "model.pt") -> Path:
    """A run folder as the flow leaves it: its record, and its model file unless it did not finish."""
    folder = runs / run_id
    folder.mkdir(parents=True)
    (folder / RECORD).write_text("{}")
    if model_file:
        (folder / model_file).write_bytes(b"weights")
    return folder


def test_a_run_id_or_its_prefix_names_that_runs_model_file(tmp_path):
    runs = tmp_path / "runs"
    finished_run(runs, "3f2a9c01-aaaa")
    keras = finished_run(runs, "77bb0000-cccc", "model.keras")
    assert weights_file("3f2a9c01-aaaa", runs) == str(runs / "3f2a9c01-aaaa" / "model.pt")
    assert weights_file("77bb", runs) == str(keras / "model.keras")


def test_a_runs_folder_names_its_model_file(tmp_path):
    folder = finished_run(tmp_path / "runs", "3f2a9c01-aaaa")
    assert weights_file(str(folder), tmp_path / "elsewhere") == str(folder / "model.pt")


def test_a_file_becomes_absolute_and_imagenet_and_empty_pass_as_they_are(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.pth").write_bytes(b"weights")
    assert weights_file("w.pth", tmp_path / "runs") == str(tmp_path / "w.pth")
    assert weights_file("missing/model.pt", tmp_path / "runs") == str(
        tmp_path / "missing" / "model.pt"
    )  # the trainer names it
    assert weights_file("imagenet", tmp_path / "runs") == "imagenet"
    assert weights_file("", tmp_path / "runs") == ""


@pytest.mark.parametrize(
    "given, words",
    [
        ("nosuchrun", ["'nosuchrun' is neither a file nor a run", "`trainflow runs`"]),
        ("unfinished", ["unfinished-1 has no model file (model.keras, model.pt): it is not a finished run's folder"]),
        ("ab", ["training.init_from: run 'ab' is ambiguous: it begins ab12-x, ab34-y; give more of the id"]),
        ("https://example.com/w.pt", ["is a URL; trainflow reads local files: download it first"]),
    ],
)
def test_a_run_id_that_names_no_model_is_one_line(tmp_path, given, words):
    finished_run(tmp_path / "runs", "unfinished-1", None)
    finished_run(tmp_path / "runs", "ab12-x")
    finished_run(tmp_path / "runs", "ab34-y")
    with pytest.raises(BadInput) as caught:
        weights_file(given, tmp_path / "runs")
    assert all(w in str(caught.value) for w in words) and "\n" not in str(caught.value)


def test_the_config_resolves_a_run_id_and_refuses_a_file_the_docker_nodes_cannot_read(tmp_path):
    finished_run(tmp_path / "runs", "abc123")
    cfg = load_config(None, {"workdir": tmp_path, "training": {"init_from": "abc123"}})
    assert cfg.training.namespace().init_from == str(tmp_path / "runs" / "abc123" / "model.pt")
    assert "--init-from" in cfg.training.trainer_args()

    docker = {"backend": "docker", "nodes": 1, "slots_per_node": 2}
    with pytest.raises(ConfigError, match="the docker pool's workers cannot read this machine's files"):
        load_config(None, {"workdir": tmp_path, "pool": docker, "training": {"init_from": "abc123"}})
    assert load_config(None, {"workdir": tmp_path, "pool": docker, "training": {"init_from": "imagenet"}})


def test_weights_of_another_framework_or_a_missing_file_are_refused_before_anything_starts(tmp_path):
    keras = tmp_path / "model.keras"
    with zipfile.ZipFile(keras, "w") as archive:
        for name in ("metadata.json", "config.json", "model.weights.h5"):
            archive.writestr(name, "{}")
    cases = [
        ({"init_from": str(keras)}, "is a keras model file (model.keras); a pytorch run starts from a model.pt"),
        ({"init_from": str(tmp_path / "gone.pt")}, "gone.pt: no such file"),
    ]
    for training, words in cases:
        with pytest.raises(BadInput, match=re.escape(words)):
            load_config(None, {"workdir": tmp_path, "training": training})
    assert load_config(None, {"workdir": tmp_path, "training": {"init_from": str(keras), "framework": "keras"}})
    assert load_config(None, {"workdir": tmp_path, "training": {"init_from": "imagenet", "framework": "keras"}})
