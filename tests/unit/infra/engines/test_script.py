"""A user's script as a program: its placeholders, what its folder ships, the checks before anything starts, what
each rank is given, and the metrics read from its lines and TensorBoard files."""

import json
from pathlib import Path

import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from infra.core.errors import BadInput
from infra.engines.program import NodePaths
from infra.engines.pytorch import PyTorchTraining
from infra.engines.script import RANK_SHIM, ScriptConfig, ScriptProgram, check_script, folders, substitute
from infra.engines.script_files import check_size, script_files
from infra.engines.script_metrics import json_metrics, read_metrics_of, regex_metrics, tensorboard_metrics
from infra.engines.script_requirements import check_requirements, requirements_env, unmet

KNOWN = folders("/runs/r1", "/data/v1")


def test_placeholders_become_the_run_folders_and_the_rest_passes_through():
    assert substitute("${{data}}/train", KNOWN) == "/data/v1/train"
    assert substitute("--out=${{ output }}", KNOWN) == "--out=/runs/r1/outputs"
    assert (
        substitute("${{checkpoints}}/checkpoint-{epoch}.pth.tar", KNOWN)
        == "/runs/r1/checkpoints/checkpoint-{epoch}.pth.tar"
    )
    assert substitute("${{logs}} $HOME ${USER} {x}", KNOWN) == "/runs/r1/logs $HOME ${USER} {x}"


def test_an_unknown_placeholder_names_the_known_ones():
    with pytest.raises(
        BadInput,
        match=r"^\$\{\{outputs\}\} is not a placeholder trainflow knows; the known ones are "
        r"\$\{\{data\}\}, \$\{\{output\}\}, \$\{\{checkpoints\}\}, \$\{\{logs\}\}$",
    ):
        substitute("${{outputs}}", KNOWN)


def test_data_without_data_is_refused_naming_the_option():
    with pytest.raises(BadInput, match=r"pass --data FOLDER"):
        substitute("${{data}}", folders("/runs/r1", "synthetic"))


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_folder_ships_all_but_git_caches_and_what_its_ignore_files_leave_out(tmp_path):
    source = tree(
        tmp_path / "s",
        {
            "train.py": "print(1)\n",
            "src/model.py": "x = 1\n",
            "src/__pycache__/model.cpython-311.pyc": "",
            ".git/HEAD": "ref\n",
            ".gitignore": "# comment\n*.ckpt\nruns/\n/top.txt\n!keep.ckpt\n",
            "weights.ckpt": "big",
            "keep.ckpt": "small",
            "runs/a.txt": "",
            "top.txt": "",
            "src/top.txt": "",
            "src/.trainflowignore": "notes.md\n",
            "src/notes.md": "",
            "notes.md": "",
        },
    )
    assert sorted(script_files(source)) == [
        ".gitignore",
        "keep.ckpt",
        "notes.md",
        "src/.trainflowignore",
        "src/model.py",
        "src/top.txt",
        "train.py",
    ]


def test_a_folder_over_its_limit_is_refused_naming_its_largest_files(tmp_path):
    source = tree(tmp_path / "s", {"train.py": "", "data/big.bin": "x" * 3000, "data/mid.bin": "x" * 2000})
    with pytest.raises(
        BadInput,
        match=r"holds 0 MB, over script.max_mb 0.001: its largest files are data/big.bin "
        r"\(0 MB\), data/mid.bin \(0 MB\), train.py \(0 MB\). Data belongs in --data",
    ):
        check_size(script_files(source), source, 0.001)


def unchecked(**values) -> ScriptConfig:
    """A script section as given, not yet checked (its own validation runs check_script)."""
    return ScriptConfig.model_construct(**{**ScriptConfig.model_construct().__dict__, **values})


def test_the_checks_before_anything_starts(tmp_path):
    source = tree(
        tmp_path / "s",
        {"train.py": "print(1)\n", "pkg/__main__.py": "", "ignored.py": "", ".gitignore": "ignored.py\n"},
    )
    check_script(unchecked(source=source, entry="train.py"), None)
    check_script(unchecked(source=source, entry="-m pkg"), None)
    with pytest.raises(BadInput, match=r"^the entry main.py does not exist in .*; give a file of the folder"):
        check_script(unchecked(source=source, entry="main.py"), None)
    with pytest.raises(BadInput, match=r"^the entry ignored.py is left out by an ignore file"):
        check_script(unchecked(source=source, entry="ignored.py"), None)
    with pytest.raises(BadInput, match=r"^-m other: .* has no other.py or other/__main__.py$"):
        check_script(unchecked(source=source, entry="-m other"), None)
    with pytest.raises(BadInput, match=r"pass --data FOLDER"):
        check_script(unchecked(source=source, entry="train.py", args=["--data", "${{data}}"]), None)
    (source / "bad.py").write_text("def f(:\n")
    with pytest.raises(BadInput, match=r"^bad.py, line 1: SyntaxError: "):
        check_script(unchecked(source=source, entry="train.py"), None)
    with pytest.raises(BadInput, match=r"^--script .*nowhere: no such folder"):
        check_script(unchecked(source=tmp_path / "nowhere", entry="train.py"), None)


def test_a_metric_regex_needs_exactly_one_group(tmp_path):
    with pytest.raises(ValueError, match=r"--metric loss=loss has 0 groups; give it exactly one"):
        ScriptConfig(source=tmp_path, entry="t.py", metrics={"loss": "loss"})
    with pytest.raises(ValueError, match=r"not a regular expression"):
        ScriptConfig(source=tmp_path, entry="t.py", metrics={"loss": "loss=(["})


def test_each_rank_gets_the_shim_the_substituted_arguments_and_the_run_variables(tmp_path):
    tree(tmp_path, {"pkg/train.py": ""})
    script = ScriptConfig(
        source=tmp_path,
        entry="-m pkg.train",
        args=["--out", "${{output}}", "--fmt", "ckpt-{epoch}"],
        env={"OMP_NUM_THREADS": "3", "WHERE": "${{logs}}/tb"},
        retry_exit_codes=[75],
    )
    training = PyTorchTraining(workers=2)
    program = ScriptProgram(script, training, "run-1", {"engine_uri": "sqlite:///m.db", "run_id": "abc"}).at_attempt(2)
    assert program.rank_argv(NodePaths("/s", "/d", "/r")) == [
        str(RANK_SHIM),
        "-m",
        "pkg.train",
        "--out",
        "/r/outputs",
        "--fmt",
        "ckpt-{epoch}",
    ]
    env = program.environment(NodePaths("/s", "/d", "/r"))
    assert env["OMP_NUM_THREADS"] == "3" and env["WHERE"] == "/r/logs/tb" and env["PYTHONUNBUFFERED"] == "1"
    assert {k: env[k] for k in env if k.startswith(("TRAINFLOW_", "MLFLOW_"))} == {
        "TRAINFLOW_DATA_DIR": "/d",
        "TRAINFLOW_OUTPUT_DIR": "/r/outputs",
        "TRAINFLOW_CHECKPOINT_DIR": "/r/checkpoints",
        "TRAINFLOW_LOG_DIR": "/r/logs",
        "TRAINFLOW_WORK_DIR": "/r/work",
        "TRAINFLOW_RUN_ID": "run-1",
        "TRAINFLOW_ATTEMPT": "2",
        "TRAINFLOW_FRAMEWORK": "pytorch",
        "TRAINFLOW_WORKERS": "2",
        "TRAINFLOW_NODES": "1",
        "TRAINFLOW_RETRY_EXIT_CODES": "75",
        "MLFLOW_TRACKING_URI": "sqlite:///m.db",
        "MLFLOW_RUN_ID": "abc",
    }
    assert "TF_USE_LEGACY_KERAS" not in env
    keras = ScriptProgram(script, training.model_copy(update={}), "r", None)
    keras.framework = "keras"
    assert keras.environment(NodePaths("/s", "synthetic", "/r"))["TF_USE_LEGACY_KERAS"] == "1"
    assert "TRAINFLOW_DATA_DIR" not in keras.environment(NodePaths("/s", "synthetic", "/r"))
    on_a_node = NodePaths("/scripts/v1", "/data", "/results", "/opt/trainflow", nodes=2, checked=False)
    assert program.rank_argv(on_a_node)[0] == "/opt/trainflow/scriptrun/rank.py"  # the image's shim
    assert program.environment(on_a_node)["TRAINFLOW_NODES"] == "2"


LINES = [
    "epoch 1 loss=0.9 acc=0.5",
    '{"metrics": {"lr": 0.1, "acc_json": 0.51}, "step": 10}',
    "epoch 2 loss=0.5 acc=0.75",
    '{"metrics": {"lr": "nan?", "acc_json": 0.8}}',
    "{not json",
]


def test_regex_metrics_take_each_match_and_name_the_ones_that_never_matched():
    found, unmatched = regex_metrics(LINES, {"loss": r"loss=([0-9.]+)", "top5": r"top5=([0-9.]+)"})
    assert found == {"loss": [(0, 0.9), (1, 0.5)]} and unmatched == ["top5"]


def test_json_lines_give_metrics_at_their_step():
    assert json_metrics(LINES) == {"lr": [(10, 0.1)], "acc_json": [(10, 0.51), (1, 0.8)]}


def write_events(folder: Path, scalars: list[tuple[str, int, float]]) -> None:
    """An event file as TensorBoard's own writer makes it."""
    writer = EventFileWriter(str(folder))
    for tag, step, value in scalars:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        writer.add_event(event_pb2.Event(step=step, wall_time=1.0, summary=summary))
    writer.close()


def test_tensorboard_scalars_are_read_by_tag_in_step_order(tmp_path):
    write_events(
        tmp_path / "logs" / "tb", [("val/accuracy", 2, 0.75), ("val/accuracy", 1, 0.5), ("train/loss", 1, 1.5)]
    )
    assert tensorboard_metrics([tmp_path / "logs", tmp_path / "missing"]) == {
        "val/accuracy": [(1, 0.5), (2, 0.75)],
        "train/loss": [(1, 1.5)],
    }


def test_the_summary_names_where_each_metric_came_from(tmp_path):
    write_events(tmp_path, [("train/loss", 3, 0.25)])
    read = read_metrics_of(LINES, {"loss": r"loss=([0-9.]+)", "never": r"x=(\d)"}, [tmp_path])
    assert read["from"] == {"loss": "regex", "lr": "json", "acc_json": "json", "train/loss": "tensorboard"}
    assert read["final"] == {"loss": 0.5, "lr": 0.1, "acc_json": 0.8, "train/loss": 0.25}
    assert read["unmatched"] == ["never"]
    assert json.loads(json.dumps(read))["series"]["loss"] == [[0, 0.9], [1, 0.5]]


def requirements(tmp_path: Path, text: str) -> Path:
    (tmp_path / "requirements.txt").write_text(text)
    return tmp_path


def test_requirements_met_here_and_by_the_lock_pass_and_nothing_is_installed(tmp_path):
    assert check_requirements(requirements(tmp_path, "# pins\nnumpy>=1.20\ntorch\n\n")) == ["numpy>=1.20", "torch"]
    assert check_requirements(tmp_path / "none") == []
    assert requirements_env(tmp_path, tmp_path / "envs") is None and not (tmp_path / "envs").exists()


def test_a_requirement_the_lock_contradicts_names_the_package_and_its_locked_version(tmp_path):
    with pytest.raises(BadInput, match=r"asks for torch==2.0.0, but trainflow's environments lock torch at 2.14.1; "):
        check_requirements(requirements(tmp_path, "torch==2.0.0\n"))


def test_a_pip_option_is_refused_and_one_pip_cannot_install_names_pips_error(tmp_path):
    with pytest.raises(BadInput, match=r"line 1: '--index-url http://x': give packages only"):
        check_requirements(requirements(tmp_path, "--index-url http://x\n"))
    assert unmet(requirements(tmp_path, "numpy\nno-such-package-xyz==9.9\n")) == ["no-such-package-xyz==9.9"]
    with pytest.raises(
        BadInput, match=r"^cannot install no-such-package-xyz==9.9 of .*requirements.txt for the script: "
    ):
        requirements_env(tmp_path, tmp_path / "envs")
    assert list((tmp_path / "envs").iterdir()) == []  # nothing half-made left looking complete


def test_the_live_metrics_of_a_line_are_rank_zeros_by_regex_and_json(tmp_path):
    script = ScriptConfig(source=tree(tmp_path, {"t.py": ""}), entry="t.py", metrics={"iou": r"iou=([0-9.]+)"})
    program = ScriptProgram(script, PyTorchTraining(), "r")
    assert program.metrics_in("[rank 0] epoch 2 loss=0.4 iou=0.61") == {"iou": 0.61}
    assert program.metrics_in('[rank 0] {"metrics": {"loss": 0.4}, "step": 3}') == {"loss": 0.4}
    assert program.metrics_in("[rank 1] epoch 2 iou=0.7") == {}
    assert PyTorchTraining().metrics_in("[rank 0] iou=0.7") == {}
