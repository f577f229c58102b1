"""The rank shim of a user's script: its rank from the launcher's variables, its lines, how it says a script failed."""

import json
import os
import subprocess
import sys

from nodelib.scripts import COMPLETE, HASHES, sha256_file
from nodelib.scripts import scripts_version as version_of
from scriptrun import rank
from scriptrun.rank import child_env, failure, rank_of, retried_codes, split_lines


def test_the_rank_comes_from_whichever_launcher_started_it():
    assert rank_of({"RANK": "3"}) == 3
    assert rank_of({"HOROVOD_RANK": "1"}) == 1
    assert rank_of({"OMPI_COMM_WORLD_RANK": "5"}) == 5
    assert rank_of({}) == 0


def test_carriage_returns_end_lines_and_a_part_line_waits_for_the_rest():
    lines, rest = split_lines(b"", b"step 1\rstep 2\r\nepoch 1\n\npart")
    assert lines == [b"step 1", b"step 2", b"epoch 1"] and rest == b"part"
    lines, rest = split_lines(rest, b"ial\n")
    assert lines == [b"partial"] and rest == b""


def test_a_usage_error_or_a_syntax_error_is_the_scripts_input():
    usage = failure(2, ["usage: train.py [-h] [--epochs N]", "train.py: error: unrecognized arguments: --bad"], set())
    assert (usage.message, usage.cause) == ("train.py: error: unrecognized arguments: --bad", "usage")
    syntax = failure(1, ['  File "train.py", line 3', "SyntaxError: invalid syntax"], set())
    assert syntax.cause == "usage"


def test_an_exception_is_the_scripts_own_unless_its_status_is_listed():
    tail = [
        "Traceback (most recent call last):",
        '  File "train.py", line 9, in <module>',
        "ZeroDivisionError: division by zero",
    ]
    assert failure(1, tail, set()).message == "ZeroDivisionError: division by zero"
    assert failure(1, tail, set()).cause == "script"
    assert failure(75, tail, retried_codes({"TRAINFLOW_RETRY_EXIT_CODES": "75, 76"})).cause == "fault"
    assert failure(3, [], set()).message == "it exited with status 3 and printed nothing"


def test_a_pytorch_script_gets_tensorflow_hidden():
    env = child_env({"TRAINFLOW_FRAMEWORK": "pytorch", "PYTHONPATH": "/mine"})
    assert env["PYTHONPATH"].endswith("pytorch_site:/mine")
    assert "PYTHONPATH" not in child_env({"TRAINFLOW_FRAMEWORK": "keras"})


def run_rank(tmp_path, code: str, *args: str, **env: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "s.py").write_text(code)
    environ = {**os.environ, "RANK": "1", "TRAINFLOW_WORK_DIR": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, rank.__file__, "s.py", *args], capture_output=True, text=True, env=environ, timeout=60
    )


def test_the_shim_runs_the_script_in_its_working_folder_and_prefixes_every_line(tmp_path):
    done = run_rank(tmp_path, "import os, sys\nprint('at', os.getcwd())\nprint('50%\\r100%', file=sys.stderr)\n")
    assert done.returncode == 0
    assert done.stdout.splitlines() == [f"[rank 1] at {tmp_path}", "[rank 1] 50%", "[rank 1] 100%"]


def test_the_shim_says_how_the_script_failed_and_exits_as_it_did(tmp_path):
    done = run_rank(tmp_path, "import argparse\nargparse.ArgumentParser().parse_args()\n", "--bad")
    assert done.returncode == 2
    assert done.stdout.splitlines()[-1] == (
        '[rank 1] @trainflow {"message":"s.py: error: unrecognized arguments: --bad","cause":"usage","kind":"failure"}'
    )


def test_a_pytorch_script_cannot_import_tensorflow(tmp_path):
    code = "import importlib.util\nprint(importlib.util.find_spec('tensorflow'))\nimport tensorflow\n"
    done = run_rank(tmp_path, code, TRAINFLOW_FRAMEWORK="pytorch")
    assert done.returncode == 1 and done.stdout.startswith("[rank 1] None\n")
    assert "ModuleNotFoundError: import of tensorflow halted; None in sys.modules" in done.stdout


def scripts_version(folder, files: dict[str, str]):
    """A scripts version as the upload step writes it: the files, their digests, then .complete."""
    folder.mkdir(parents=True)
    for rel, text in files.items():
        (folder / rel).write_text(text)
    hashes = {rel: sha256_file(folder / rel) for rel in files}
    (folder / HASHES).write_text(json.dumps(hashes))
    (folder / COMPLETE).write_text(version_of(hashes))
    return folder


def test_where_the_nodes_make_the_run_folders_the_first_rank_makes_them_once_an_attempt(tmp_path):
    code = "import os\nopen('mine.txt', 'a').write('x')\nprint(sorted(os.listdir('..')))\n"
    version, out = scripts_version(tmp_path / "mounted", {"s.py": code}), tmp_path / "results"
    env = {"TRAINFLOW_PREPARE_FROM": str(version), "TRAINFLOW_WORK_DIR": str(out / "work"), "TRAINFLOW_RUN_ID": "r1"}
    first = run_rank(out / "work", code, TRAINFLOW_ATTEMPT="1", **env)  # run_rank's own copy is replaced whole
    assert first.returncode == 0, first.stdout
    assert first.stdout == "[rank 1] ['.trainflow-prepared', 'checkpoints', 'logs', 'outputs', 'work']\n"
    assert run_rank(out / "work", code, TRAINFLOW_ATTEMPT="2", **env).returncode == 0  # copied again: mine.txt stays
    assert (out / "work" / "mine.txt").read_text() == "xx" and (out / "work" / "s.py").read_text() == code
    (version / "s.py").write_text("print('planted')\n")
    refused = run_rank(out / "work", code, TRAINFLOW_ATTEMPT="3", **env)
    assert refused.returncode == 2 and "planted" not in refused.stdout
    assert f"scripts version {version} cannot be run: s.py was changed; delete" in refused.stdout
    assert '"cause":"usage"' in refused.stdout  # the run's input: never retried
