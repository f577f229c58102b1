"""The house's own measures: modules of the orchestrator's infrastructure and of the trainer small enough to have
one reason to change, and an orchestrator that reads the trainer's typed records (nodelib/records.py), never its log
lines for people."""

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.fakes.paths import REPO

MOST_LINES = 450
ORCHESTRATOR = ("cli", "flows", "tasks", "infra", "benchmarks")
# What the trainers' lines for people hold (console.py: "[rank 0] epoch 1 step 20 ... images/s", "val top-1") and the
# marker of their events: a pattern with one of these reads the trainer's output as text
TRAINER_WORDS = ("[rank", "rank\\]", "epoch", "step", "images/s", "top-1", "loss", "@trainflow")
REGEX_CALLS = {"compile", "search", "match", "fullmatch", "findall", "finditer", "sub", "split"}


def test_no_module_of_the_infrastructure_or_the_trainer_is_over_450_lines():
    modules = [*(REPO / "infra").rglob("*.py"), *(REPO / "containers" / "trainer").rglob("*.py")]
    big = {str(p.relative_to(REPO)): n for p in modules if (n := len(p.read_text().splitlines())) > MOST_LINES}
    assert not big, f"split these into modules with one reason to change: {big}"


def patterns(path: Path) -> Iterator[str]:
    """The literal patterns of the `re` calls in a module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "re"
            and node.func.attr in REGEX_CALLS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def reading_trainer_lines(paths: list[Path]) -> list[tuple[str, str]]:
    """(module, pattern) of every regular expression in `paths` that reads the trainer's lines."""
    return [
        (path.name, pattern)
        for path in paths
        for pattern in patterns(path)
        if any(word in pattern.lower() for word in TRAINER_WORDS)
    ]


def test_nothing_outside_the_trainer_reads_its_lines_with_a_regular_expression():
    found = reading_trainer_lines([path for folder in ORCHESTRATOR for path in sorted((REPO / folder).rglob("*.py"))])
    assert not found, f"read the trainer's events (nodelib/records.py) instead: {found}"


def test_the_check_finds_a_pattern_over_trainer_lines(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('import re\nSTEP = re.compile(r"\\[rank (\\d+)\\] epoch (\\d+)")\nNAME = re.compile(r"[a-z]+")\n')
    assert reading_trainer_lines([module]) == [("m.py", r"\[rank (\d+)\] epoch (\d+)")]
