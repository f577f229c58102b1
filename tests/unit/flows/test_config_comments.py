"""The commands that the example configs' comments tell a user to type are true of the CLI: each `trainflow ...`
command exists with every option it passes, and every other option a comment names is one of those commands'."""

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer

from cli import app
from tests.fakes.paths import REPO

CONFIGS = sorted((REPO / "flows" / "configs").glob("*.yaml")) + [REPO / "prefect.yaml"]
# a trainflow command in backticks anywhere, or alone on a comment line (an optional `# note` after it)
COMMAND = re.compile(r"`(trainflow [^`]*)`|^\s*(trainflow \S.*?)(?:\s+#.*)?$")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
OTHER_PROGRAMS = re.compile(r"\b(?:dockerd|docker|prefect|az|make)\b[^`)#]*")  # their options are not ours


def comment_lines(path: Path) -> list[str]:
    """The text after the `#` of every comment in a YAML file."""
    return [line.split("#", 1)[1] for line in path.read_text().splitlines() if "#" in line]


def commands_in(path: Path) -> list[str]:
    """Every `trainflow ...` command of a file's comments."""
    return [found.group(1) or found.group(2) for line in comment_lines(path) if (found := COMMAND.search(line))]


def resolve(words: list[str]) -> tuple[Any, list[str]]:
    """The CLI's command that `words` (after `trainflow`) name (a click command, as typer makes it), and the words
    left: its arguments."""
    command = typer.main.get_command(app)
    while words and hasattr(command, "commands") and not words[0].startswith("-"):
        assert words[0] in command.commands, f"trainflow has no command {words[0]!r}"
        command, words = command.commands[words[0]], words[1:]
    return command, words


def options_of(command) -> set[str]:
    """Every option name of a command, its --no- forms included."""
    return {name for param in command.params for name in [*param.opts, *param.secondary_opts]}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_command_in_a_config_comment_exists_with_its_options(path):
    for text in commands_in(path):
        command, args = resolve(shlex.split(text)[1:])
        unknown = [
            word
            for word in args
            if OPTION.fullmatch(word.split("=")[0]) and word.split("=")[0] not in options_of(command)
        ]
        assert not unknown, f"{path.name}: `{text}` passes {unknown}, which `trainflow {command.name}` does not take"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_option_a_config_comment_names_belongs_to_a_command_it_names(path):
    named = set().union(*(options_of(resolve(shlex.split(text)[1:])[0]) for text in commands_in(path)))
    mentioned = {option for line in comment_lines(path) for option in OPTION.findall(OTHER_PROGRAMS.sub("", line))}
    assert mentioned <= named, (
        f"{path.name}'s comments name {sorted(mentioned - named)}, which no command they name takes"
    )
