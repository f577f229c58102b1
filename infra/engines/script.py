"""A user's own training script as the program a run executes: the `script:` section (which folder ships, how it is
called, which metrics are read from it) and what every rank of it is given.

    trainflow run --script DIR [--framework F] [--launcher L] [--workers N] [--data FOLDER] -- ENTRY [ARG...]

`ENTRY` is a file of the folder (train.py, src/train.py) or `-m package.module`. In the arguments and in the
values of `env`, `${{data}}`, `${{output}}`, `${{checkpoints}}` and `${{logs}}` (Azure ML's syntax) become the run's
folders; Python format strings (`checkpoint-{epoch}.pth.tar`) and shell `$VARS` pass through. Each rank runs in
`work/` of the run's folder, a writable copy of the scripts version that every attempt of the run shares, through
scriptrun/rank.py, which prefixes its lines with its rank and says how it failed. What the script promises back is
an exit status and files; its metrics are read from its lines (infra/engines/script_metrics.py).
"""

import os
import py_compile
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from infra.core.errors import BadInput
from infra.core.jsonfiles import write_json
from infra.engines.contract import SYNTHETIC, TrainingSettings
from infra.engines.program import RUNTIME, NodePaths
from infra.engines.script_files import check_size, script_files
from infra.engines.script_metrics import json_metrics, read_metrics_of, regex_metrics
from infra.engines.script_requirements import check_requirements, requirements_env, requirements_of, unmet
from nodelib.records import rank_prefix
from nodelib.scripts import version_problem
from scriptrun.prepare import FOLDERS, LOGS, OUTPUTS, WORK, make_folders

SHIM = "scriptrun/rank.py"  # what each rank runs, under trainflow's node-side code: the script, its lines prefixed
RANK_SHIM = Path(RUNTIME) / SHIM  # where it is on this machine
PLACEHOLDER = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")
FOLDER_VARIABLES = {  # placeholder -> the variable every rank finds that folder in
    "data": "TRAINFLOW_DATA_DIR",
    "output": "TRAINFLOW_OUTPUT_DIR",
    "checkpoints": "TRAINFLOW_CHECKPOINT_DIR",
    "logs": "TRAINFLOW_LOG_DIR",
}
SUMMARY = "script.json"  # what the script run did, in its results folder
SCRIPT_REFUSED = "script_refused"  # a config error that is the script's own line (flows/config.py shows it alone)
DATA_UNKNOWN = "<data>"  # the data of a script checked before the run's data is known: ${{data}} is allowed


class ScriptConfig(BaseModel):
    """A user's own training script, run instead of trainflow's trainer (`trainflow run --script DIR -- ENTRY ...`).
    The launcher, the workers and the framework (its image, its environment) are training's settings."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    source: Path
    """The scripts folder: shipped whole as a scripts version (.git, .gitignore's and .trainflowignore's files left
    out); its requirements.txt, when present, must agree with trainflow's locked versions (on the process pool, what
    trainflow's environment lacks of it is installed once under the workdir's envs/)."""
    entry: str
    """The file of the folder each rank runs (train.py, src/train.py), or `-m package.module`."""
    args: list[str] = []
    """The entry's arguments; ${{data}}, ${{output}}, ${{checkpoints}} and ${{logs}} become the run's folders."""
    env: dict[str, str] = {}
    """Variables every rank gets (placeholders substituted), over the defaults PYTHONUNBUFFERED, OMP_NUM_THREADS and
    (tensorflow, keras) TF_USE_LEGACY_KERAS; the TRAINFLOW_* and MLFLOW_* ones are trainflow's."""
    metrics: dict[str, str] = {}
    """Metric name -> a regular expression with one group, searched in rank 0's lines: each match is a value."""
    retry_exit_codes: list[int] = []
    """Exit statuses of the script worth another attempt; any other failure of the script is not retried."""
    max_mb: float = Field(200, gt=0)
    """The most the scripts folder may hold, in MB: data belongs in --data."""

    @field_validator("metrics")
    @classmethod
    def _one_group_each(cls, metrics: dict[str, str]) -> dict[str, str]:
        for name, pattern in metrics.items():
            try:
                groups = re.compile(pattern).groups
            except re.error as exc:
                raise ValueError(f"--metric {name}={pattern}: not a regular expression ({exc})") from None
            if groups != 1:
                raise ValueError(
                    f"--metric {name}={pattern} has {groups} groups; give it exactly one, the number, "
                    r"e.g. --metric loss='loss=([0-9.]+)'"
                )
        return metrics

    @model_validator(mode="after")
    def _can_run(self) -> "ScriptConfig":
        # before any pool exists: the folder, the entry, every .py compiling, the placeholders known
        self.source = self.source.expanduser().resolve()
        try:
            check_script(self, DATA_UNKNOWN)
        except BadInput as exc:
            raise PydanticCustomError(SCRIPT_REFUSED, "{line}", {"line": str(exc)}) from None
        return self

    def entry_argv(self) -> list[str]:
        """The entry as the interpreter takes it: [file] or ["-m", module]."""
        if self.entry.startswith("-m"):
            return ["-m", self.entry[2:].strip()]
        return [self.entry]


def folders(out: Path | str, data: str) -> dict[str, str]:
    """Placeholder -> the folder it stands for, for a run whose results folder is `out` (data: none for synthetic)."""
    named = {name: f"{out}/{part}" for name, part in FOLDERS.items()}
    return named if data == SYNTHETIC else {"data": data, **named}


def substitute(text: str, known: dict[str, str]) -> str:
    """`text` with each ${{name}} replaced; an unknown one is refused naming the known ones."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name in known:
            return known[name]
        if name == "data":
            raise BadInput(
                "${{data}} names the run's data, but there is none: pass --data FOLDER (or data: in --config)"
            )
        names = ", ".join(f"${{{{{n}}}}}" for n in ["data", *FOLDERS])
        raise BadInput(f"${{{{{name}}}}} is not a placeholder trainflow knows; the known ones are {names}")

    return PLACEHOLDER.sub(value, text)


def check_script(script: "ScriptConfig", data: str | None) -> None:
    """Refuse, before anything starts, a script that cannot run: the folder or the entry missing, a .py file that
    does not compile, an unknown placeholder (or ${{data}} with no data), a folder over its size limit."""
    source = script.source
    if not source.is_dir():
        raise BadInput(f"--script {source}: no such folder; give the folder that holds your training script")
    check_placeholders(script, data)
    files = script_files(source)
    check_size(files, source, script.max_mb)
    check_entry(script, files)
    check_compiles(files)
    check_requirements(source)


def check_placeholders(script: "ScriptConfig", data: str | None) -> None:
    """Refuse an unknown placeholder in the arguments or variables, and ${{data}} where the run has no data."""
    known = folders("out", data or SYNTHETIC)
    for text in [*script.args, *script.env.values()]:
        substitute(text, known)


def check_entry(script: ScriptConfig, files: dict[str, Path]) -> None:
    """Refuse an entry the folder does not ship."""
    argv = script.entry_argv()
    if argv[0] == "-m":
        module = argv[1].replace(".", "/")
        if f"{module}.py" not in files and f"{module}/__main__.py" not in files:
            raise BadInput(f"-m {argv[1]}: {script.source} has no {module}.py or {module}/__main__.py")
        return
    if argv[0] not in files:
        why = "is left out by an ignore file" if (script.source / argv[0]).is_file() else "does not exist"
        raise BadInput(f"the entry {argv[0]} {why} in {script.source}; give a file of the folder, e.g. -- train.py")


def check_compiles(files: dict[str, Path]) -> None:
    """Refuse a folder with a Python file that does not compile, with the compiler's own line."""
    with tempfile.TemporaryDirectory() as scratch:
        for rel, path in files.items():
            if rel.endswith(".py"):
                try:
                    py_compile.compile(str(path), cfile=os.path.join(scratch, "c.pyc"), doraise=True)
                except py_compile.PyCompileError as exc:
                    error = exc.exc_value
                    line = getattr(error, "lineno", "?")
                    raise BadInput(
                        f"{rel}, line {line}: {type(error).__name__}: {getattr(error, 'msg', error)}"
                    ) from None


class ScriptProgram:
    """The script of a run as its ranks run it: the section, with training's launcher, workers and framework, the
    run's id, its attempt and its MLflow run."""

    MODEL_FILE = None  # a script promises no model file of a known name
    epochs = 1  # nor epochs: its progress is the run as a whole

    def __init__(
        self,
        script: ScriptConfig,
        training: TrainingSettings,
        run_id: str,
        tracked: dict | None = None,
        envs: Path | None = None,
    ):
        self.script, self.training, self.run_id, self.tracked = script, training, run_id, tracked
        self.envs = envs  # where the requirements this environment lacks are installed (None: nowhere: refused)
        self.attempt, self.started = 1, 0.0
        self.installed: Path | None = None  # that folder, once the preflight made or found it
        self.framework, self.launcher, self.workers = training.framework, training.launcher, training.workers

    def at_attempt(self, attempt: int) -> "ScriptProgram":
        """The program for attempt `attempt` of its run (TRAINFLOW_ATTEMPT)."""
        self.attempt = attempt
        return self

    def rank_argv(self, at: NodePaths) -> list[str]:
        """What each rank runs after the interpreter: the rank shim, the entry and its arguments, substituted."""
        known = folders(at.out, at.data)
        shim = f"{at.runtime}/{SHIM}"
        return [shim, *self.script.entry_argv(), *(substitute(arg, known) for arg in self.script.args)]

    def environment(self, at: NodePaths) -> dict[str, str]:
        """Every rank's variables: the defaults, the user's over them, then trainflow's own."""
        known = folders(at.out, at.data)
        defaults = {"PYTHONUNBUFFERED": "1"}
        if at.cores:  # else the pool's default (Azure ML: one thread a rank)
            defaults["OMP_NUM_THREADS"] = str(max(1, at.cores // self.workers))
        if self.framework in ("tensorflow", "keras"):
            defaults["TF_USE_LEGACY_KERAS"] = "1"  # Horovod's Keras support needs tf_keras (../shared/NOTES.md)
        user = {name: substitute(value, known) for name, value in self.script.env.items()}
        installed = {"PYTHONPATH": os.pathsep.join(filter(None, [str(self.installed), os.environ.get("PYTHONPATH")]))}
        return {**defaults, **user, **self.own_variables(at), **(installed if self.installed else {})}

    def own_variables(self, at: NodePaths) -> dict[str, str]:
        """TRAINFLOW_* and MLFLOW_*: the run's folders, id, attempt, layout and tracked run."""
        own = {FOLDER_VARIABLES[name]: path for name, path in folders(at.out, at.data).items()}
        own |= {
            "TRAINFLOW_WORK_DIR": f"{at.out}/{WORK}",
            "TRAINFLOW_RUN_ID": self.run_id,
            "TRAINFLOW_ATTEMPT": str(self.attempt),
            "TRAINFLOW_FRAMEWORK": self.framework,
            "TRAINFLOW_WORKERS": str(self.workers),
            "TRAINFLOW_NODES": str(at.nodes),
            "TRAINFLOW_RETRY_EXIT_CODES": ",".join(map(str, self.script.retry_exit_codes)),
        }
        if not at.prepared:  # the first rank of each node makes the run's folders (scriptrun/prepare.py)
            own["TRAINFLOW_PREPARE_FROM"] = at.scripts
        if self.tracked and self.tracked.get("engine_uri"):
            own |= {"MLFLOW_TRACKING_URI": self.tracked["engine_uri"], "MLFLOW_RUN_ID": self.tracked["run_id"]}
        return own

    @property
    def secret_variables(self) -> set[str]:
        """The user's own variables (`env`, `--env`): their values are never shown."""
        return set(self.script.env)

    def preflight(self, here: NodePaths) -> None:
        """Before a launch on this machine: the run's folders prepared, and what this environment lacks of the
        script's requirements installed (once)."""
        self.prepare(here)
        self.installed = self.requirements(Path(here.scripts))

    def prepare(self, here: NodePaths) -> list[str]:
        """Before the launch: the scripts version checked against its digests, copied over the run's working folder
        (what the script wrote there stays), and the output, checkpoint and log folders made; the requirements of
        the version (what the ranks' environment must meet)."""
        version, out = Path(here.scripts), Path(here.out)
        if problem := version_problem(version, version.name):
            raise BadInput(
                f"scripts version {version} cannot be run: {problem}; delete the file share's scripts/ folder (the "
                "next run uploads the scripts afresh) and check who can write to the share"
            )
        self.started = time.monotonic()
        make_folders(version, out)
        return [str(r) for r in requirements_of(version)]

    def requirements(self, version: Path) -> Path | None:
        """The folder of what this environment lacks of the version's requirements (installed now, once), if any."""
        if self.envs is None:
            if missing := unmet(version):
                raise BadInput(f"the script's requirements {', '.join(missing)} are not installed, and nowhere to")
            return None
        return requirements_env(version, self.envs)

    def describe(self) -> dict[str, Any]:
        """What the run executes, for the dry run, the receipt and `trainflow runs`."""
        requirements = [str(r) for r in requirements_of(self.script.source)]
        return {
            "entry": self.script.entry,
            "args": self.script.args,
            "source": str(self.script.source),
            "requirements": requirements,
        }

    def metrics_in(self, line: str) -> dict[str, float]:
        """The metrics of one of rank 0's lines (its regexes, the JSON line protocol), the last value of each."""
        prefix = rank_prefix(0)
        if not line.startswith(prefix):
            return {}
        text = [line.removeprefix(prefix)]
        found = {**json_metrics(text), **regex_metrics(text, self.script.metrics)[0]}
        return {name: values[-1][1] for name, values in found.items()}

    def to_blob(self, out: Path) -> list[str]:
        """What the script wrote to its output folder goes to Blob too."""
        outputs = out / OUTPUTS
        return [p.relative_to(out).as_posix() for p in sorted(outputs.rglob("*")) if p.is_file()]

    def outcome(self, out: Path) -> dict[str, Any]:
        """What the finished script gave back: its metrics (infra/engines/script_metrics.py) and how it ran, written
        to script.json in the results folder."""
        for rank in range(self.workers):  # every rank's log, one that printed nothing too
            (out / LOGS / f"rank{rank}.log").touch()
        lines = rank_lines(out / LOGS / "rank0.log", 0)
        read = read_metrics_of(lines, self.script.metrics, [out / LOGS, out / WORK])
        summary = {
            "kind": "script",
            "status": "complete",
            **self.describe(),
            "framework": self.framework,
            "launcher": self.launcher,
            "world_size": self.workers,
            "wall_seconds": round(time.monotonic() - self.started, 2) if self.started else None,
            "device": "cpu",
            **read,
        }
        write_json(out / SUMMARY, summary)
        return summary


def rank_lines(log: Path, rank: int) -> list[str]:
    """A rank's lines as the script printed them (its log, the rank prefix removed); none when it wrote no log."""
    prefix = rank_prefix(rank)
    text = log.read_text(errors="replace") if log.exists() else ""
    return [line.removeprefix(prefix) for line in text.splitlines()]
