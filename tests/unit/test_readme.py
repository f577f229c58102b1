"""The README's claims that the code can check: short (the docs hold the rest), few dates, every link resolving,
every YAML example (the README's and the docs' pages) a config trainflow accepts."""

import json
import re
import shlex
from pathlib import Path

import click
import pytest
import typer

from cli import app
from flows.config import load_config
from flows.recipes import PHOTO, Sample, choose_recipe
from tests.fakes.paths import REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]
YAML_BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)


def test_the_readme_is_short_with_at_most_three_dates():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert len(re.findall(r"\b20\d\d-\d\d-\d\d\b", text)) <= 3


def test_every_link_of_the_readme_resolves():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert targets, "the README links into the docs"
    missing = [t for t in targets if not t.startswith("http") and not (REPO / t).exists()]
    assert not missing, missing


def test_the_readme_s_install_times_are_the_measured_ones():
    text = " ".join(README.read_text().split())
    fresh, again = (int(m) for m in re.findall(r"about (\d+) minutes", text)[:2])
    measured = json.loads((REPO / "docs" / "benchmarks" / "install-demo.json").read_text())
    assert "as a non-root user" in text and not measured["as_root"]
    medians = [measured["seconds"][name]["median"] / 60 for name in ("demo", "demo_again")]
    assert [fresh, again] == [round(m) for m in medians]


def test_the_readme_s_own_photos_line_names_the_recipe_they_get():
    [line] = [text for text in README.read_text().splitlines() if "trainflow run --data ./my-photos  " in text]
    assert line.endswith(": the photo recipe") and PHOTO.path.name == "photos.yaml"
    imagenet_like = Sample("./my-photos", ((500, 375),) * 24 + ((375, 500),) * 8)  # ImageNet's usual photographs
    assert choose_recipe(None, "./my-photos", False, imagenet_like).recipe is PHOTO  # no --config, no model named


def command_lines(page: Path) -> list[list[str]]:
    """The page's trainflow command lines in its sh blocks, as words, the comment cut off."""
    blocks = re.findall(r"```sh\n(.*?)```", page.read_text(), re.S)
    lines = [line.split("#")[0] for block in blocks for line in block.splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith(".venv/bin/trainflow ")]


@pytest.mark.parametrize("page", [README, REPO / "docs" / "guides" / "own-photos.md"], ids=lambda p: p.name)
def test_every_trainflow_command_line_of_the_page_uses_options_its_command_takes(page):
    """The first screen's and the own-photos guide's commands (run --init-from, predict --model ...) parse."""
    root = typer.main.get_command(app)
    for words in command_lines(page):
        command, rest = root, list(words)
        while isinstance(command, click.Group) and rest and rest[0] in command.commands:
            command = command.commands[rest.pop(0)]
        assert not isinstance(command, click.Group), words
        command.make_context(command.name, rest, resilient_parsing=False)  # raises on an unknown option or value


def yaml_examples() -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(REPO)}#{n}", block)
        for page in PAGES
        for n, block in enumerate(YAML_BLOCK.findall(page.read_text()))
    ]


@pytest.mark.parametrize(("where", "block"), yaml_examples(), ids=[where for where, _ in yaml_examples()])
def test_every_yaml_example_is_a_config_trainflow_accepts(tmp_path: Path, where, block):
    path = tmp_path / "example.yaml"
    path.write_text(block)
    load_config(path, {}, environ={})  # raises ConfigError, naming the setting, for an example that drifted
