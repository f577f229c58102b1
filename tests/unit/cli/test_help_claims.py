"""What the command line's help, hints and reference pages claim is true of the code: each command's options are the
ones its page lists, every `--option` a help or a refusal names exists on the command that shows it, every document a
help cites exists, and each command's --data help states the default the command uses without --data."""

import ast
import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from cli import app, reference
from flows.config import FlowConfig, one_of_sections
from nodelib import image_files
from tests.fakes.bad_inputs import CASES, ERRORS_PAGE, page_table
from trainer import options as torch_options
from trainer.tf import options as tf_options

REPO = Path(__file__).resolve().parents[3]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
PARSERS = [torch_options.build_parser(), tf_options.build_parser("loop.py"), tf_options.build_parser("fit.py")]


def section_of(page: str, path: str) -> str:
    """The part of the commands page under `## path`."""
    return page.split(f"\n## {path}\n", 1)[1].split("\n## ", 1)[0]


def test_the_commands_page_lists_exactly_the_options_of_each_command():
    page = reference.commands_page()
    options = reference.command_options()
    assert set(re.findall(r"^## (trainflow.*)$", page, re.M)) == set(options)
    for path, flags in options.items():
        names = [line.split(" | ", 1)[0] for line in section_of(page, path).splitlines() if line.startswith("| `")]
        listed = [flag for name in names for flag in re.findall(r"`(--[a-z0-9-]+)`", name)]
        assert sorted(listed) == sorted(flags), path
    assert "--data" not in options["trainflow build"] and "--config" not in options["trainflow ui"]


def test_a_command_line_is_checked_against_the_command_it_names():
    assert reference.command_line_problems("trainflow run --data DIR --bad-files skip --dry-run") == []
    assert reference.command_line_problems("trainflow bench all --only loader  # a comment") == []
    assert reference.command_line_problems("trainflow runs diff A B --workdir=w") == []
    assert reference.command_line_problems("trainflow build --data DIR") == ["`trainflow build` has no option --data"]
    assert reference.command_line_problems("trainflow launch") == ["trainflow has no command 'launch'"]


def helps(command) -> list[str]:
    """A command's help and its options' helps."""
    return [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]


def commands():
    """(command line, click command) of every visible command."""
    root = typer.main.get_group(app)
    return [(path, command) for path, command, _ in reference.every(root, typer.Context(root))]


def test_every_option_a_help_names_is_an_option_of_its_command():
    for path, command in commands():
        own = reference.command_options()[path]
        for text in helps(command):
            for flag in FLAG.findall(text):
                assert flag in own, f"`{path} --help` names {flag}, which {path} lacks: {text}"
    for parser in PARSERS:
        takes = {flag for action in parser._actions for flag in action.option_strings}
        for action in parser._actions:
            assert set(FLAG.findall(action.help or "")) <= takes, (parser.prog, action.help)


def command_of(args: list[str]) -> str:
    """The command line (`trainflow runs diff`) that `trainflow ARGS` runs."""
    known, path = reference.command_options(), "trainflow"
    for word in args:
        if f"{path} {word}" not in known:
            break
        path = f"{path} {word}"
    return path


def named_options(answer: str, path: str) -> list[tuple[str, str]]:
    """(command, option) for each option a line names: of the command it names before it (`trainflow data
    add-restart-markers --data DIR`), else of `path`, the command that said it."""
    pairs, command = [], path
    for n, part in enumerate(re.split(r"\btrainflow ", answer)):
        named = command_of(part.split()) if n else path
        command = named if named != "trainflow" else command  # "before running trainflow": no command named
        pairs += [(command, flag) for flag in FLAG.findall(part)]
    return pairs


def test_every_option_a_refusal_names_is_an_option_of_the_command_that_says_it():
    cases = {reference.cell(case.input): case for case in CASES}
    rows = [line.strip("|").split(" | ", 2) for line in page_table(ERRORS_PAGE.read_text()).splitlines()[2:]]
    assert len(rows) > 40
    options = reference.command_options()
    checked = 0
    for input_, _, answer in rows:
        path = command_of(cases[input_.strip()].args)
        for command, flag in named_options(answer, path):
            assert flag in options[command], f"{input_.strip()}: `{command}` answers {answer}, but has no {flag}"
            checked += 1
    assert checked > 20


def test_the_bad_files_hint_names_an_option_of_every_command_that_shows_it():
    """The hint is the trainer's (train, run and smoke train; the trainer alone) and staging's (stage, run)."""
    hint = str(image_files.bad_images_error([("train/a/bad.png", "broken")], 8, None, "DATA"))
    flags = FLAG.findall(hint)
    assert flags == ["--bad-files"]
    options = reference.command_options()
    for path in ("trainflow train", "trainflow run", "trainflow stage", "trainflow smoke"):
        assert set(flags) <= set(options[path]), path
    for parser in PARSERS:
        assert set(flags) <= {flag for action in parser._actions for flag in action.option_strings}


class Reached(Exception):
    """Raised where a test stops a command: what it reached, with what."""


@pytest.fixture
def stop_at(monkeypatch):
    """stop_at("module.name", pick): replace that function by one that raises Reached(pick(*args, **kwargs))."""

    def stop(target: str, pick=lambda *a, **k: a[0]):
        def reached(*args, **kwargs):
            raise Reached(pick(*args, **kwargs))

        monkeypatch.setattr(target, reached)

    return stop


def reached(args: list[str]):
    """Run `trainflow ARGS` until the function a test stopped; what it reached it with (None: it ended first)."""
    result = CliRunner().invoke(app, args, catch_exceptions=True)
    return result.exception.args[0] if isinstance(result.exception, Reached) else (None, result.exit_code)


@pytest.mark.parametrize("command", ["train", "run", "stage", "smoke"])
def test_bad_files_sets_training_bad_files(command, stop_at, tmp_path):
    stop_at("cli.training.with_data", lambda cfg, **_: cfg.training.bad_files)
    args = [command, "--bad-files", "skip", "--workdir", str(tmp_path), "--data", str(tmp_path)]
    assert reached(args) == "skip"
    assert reached([command, "--workdir", str(tmp_path), "--data", str(tmp_path)]) == "fail"


def data_help(path: str) -> str:
    """The `default: ...` part of a command's --data help."""
    command = dict(commands())[path]
    text = next(p.help for p in command.params if p.name == "data")
    return text.split("default: ", 1)[1] if "default: " in text else text


DIGITS = "digits set"
# Each command that takes --data, where it is stopped, and what it reached there without --data
RESOLVED = ("cli.training.with_data", lambda cfg, **_: __import__("flows.dataset").dataset.data_folder(cfg))
WITHOUT_DATA = {
    "trainflow train": (*RESOLVED, DIGITS),
    "trainflow run": (*RESOLVED, DIGITS),
    "trainflow stage": (*RESOLVED, DIGITS),
    "trainflow deploy": (*RESOLVED, DIGITS),
    "trainflow smoke": (*RESOLVED, "synthetic"),
    "trainflow bench flow": ("benchmarks.overhead.with_data", RESOLVED[1], DIGITS),
    "trainflow bench train": ("benchmarks.training.one_round", lambda cfg, data, *a, **k: data, "synthetic"),
    "trainflow bench staging": ("benchmarks.staging.write_photo_sized", lambda p, **k: p, "generated"),
    "trainflow bench loader": ("benchmarks.loader.write_photo_sized", lambda p, **k: p, "generated"),
    "trainflow data digits": ("cli.data.digits_at", lambda p: p, "WORKDIR/data/digits"),
    "trainflow data imagenet-shaped": (
        "infra.data.sample_data.write_imagenet_shaped",
        lambda p, *a: p,
        "WORKDIR/data/imagenet-shaped-",
    ),
    "trainflow data add-restart-markers": (None, None, "required"),
}


def test_every_command_that_takes_data_says_what_it_uses_without_it():
    taking = {path for path, flags in reference.command_options().items() if "--data" in flags}
    assert taking == set(WITHOUT_DATA)


@pytest.mark.parametrize("path", sorted(WITHOUT_DATA))
def test_the_data_help_states_the_default_the_command_uses(path, stop_at, monkeypatch, tmp_path):
    target, pick, default = WITHOUT_DATA[path]
    said = data_help(path)
    assert default in said, f"`{path} --help`: --data's default is {said!r}, but without it the command uses {default}"
    assert ("digits" in said) == (default == DIGITS or "digits" in default)  # no other command claims the digits
    monkeypatch.setattr("flows.dataset.digits_at", lambda dest: Path(f"{dest}-the-digits-set"))  # nothing written
    monkeypatch.delenv("TRAINFLOW_DATA", raising=False)
    if target:
        stop_at(target, pick)
    args = [*path.split()[1:], "--workdir", str(tmp_path)]
    got = reached(args)
    if default == DIGITS:
        assert str(got).endswith("data/digits-the-digits-set"), got
    elif default == "synthetic":
        assert got == "synthetic"
    elif default == "generated":
        assert Path(got).is_relative_to(tmp_path / "bench"), got
    elif default == "required":
        assert got == (None, 2)
    else:
        assert str(got).startswith(default.replace("WORKDIR", str(tmp_path))), got


def setting_descriptions(model=FlowConfig) -> list[str]:
    """The description of every setting, every framework's and backend's."""
    texts = []
    for field in model.model_fields.values():
        texts.append(field.description or "")
        for kind in one_of_sections(field) or [field.annotation]:
            if isinstance(kind, type) and hasattr(kind, "model_fields"):
                texts += setting_descriptions(kind)
    return texts


def every_help() -> list[str]:
    """Every text the reference pages are written from: the commands', the settings' and the trainers' helps."""
    parsers = [action.help or "" for parser in PARSERS for action in parser._actions]
    return [text for _, command in commands() for text in helps(command)] + setting_descriptions() + parsers


def readme_headings() -> set[str]:
    return {line.lstrip("#").strip() for line in (REPO / "README.md").read_text().splitlines() if line.startswith("#")}


def test_every_document_a_help_cites_exists():
    texts = every_help()
    assert any("docs/benchmarks/index.md" in text for text in texts)  # --compile's
    for text in texts:
        for section in re.findall(r"README: ([A-Z][\w ,'-]*\w)", text):
            assert section in readme_headings(), f"a help cites README section {section!r}, which is not there"
        for path in re.findall(r"\b((?:docs|flows|infra|containers|cli|tasks|benchmarks)/[\w./-]*\w)", text):
            assert (REPO / path).exists(), f"a help cites {path}, which is not there: {text}"
        for path in re.findall(r"(?<![\w/])(trainer/[\w./-]*\w)", text):  # the trainer's, inside containers/
            assert (REPO / "containers" / path).exists(), f"a help cites {path}, which is not there: {text}"


def strings(path: Path) -> list[str]:
    """The string constants of a Python file that its code uses (f-strings' constant parts), not its docstrings."""
    tree = ast.parse(path.read_text())
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, documented) and node.body and isinstance(node.body[0], ast.Expr)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_every_readme_section_and_docs_page_the_code_cites_exists():
    """What a log line, an error or a help cites: a README section (`README: Benchmark`), a docs/ page."""
    headings = readme_headings()
    for folder in ("cli", "flows", "infra", "tasks", "benchmarks", "containers"):
        for source in (REPO / folder).rglob("*.py"):
            for text in strings(source):
                for section in re.findall(r"README: ([A-Z][\w ,'-]*\w)", text):
                    assert section in headings, f"{source.relative_to(REPO)} cites README section {section!r}"
                for page in re.findall(r"(?<![\w/])(docs/[\w/-]+\.md)\b", text):
                    assert (REPO / page).exists(), f"{source.relative_to(REPO)} cites {page}, which is not there"
