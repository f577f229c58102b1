"""The docs' pages as a reader meets them: the diagrams number the steps in the order the code runs them; the pages a
reader follows (start here, install, the tutorial, the how-to guides, concepts, troubleshooting) speak in short
sentences and carry no dates, commit hashes, test names or words about how the project is made; a guide is a task of
at most 150 lines; every command in a code block is one the project, or a tool the page names, has."""

import json
import re
import shlex
import statistics
from pathlib import Path

import pytest

from cli.reference import command_line_problems
from flows.steps import RUN, dataset, image, results, scripts, sync, training
from tests.fakes.paths import REPO

DOCS = REPO / "docs"
GUIDES = sorted((DOCS / "guides").glob("*.md"))
READER_PAGES = [
    *(DOCS / name for name in ("index.md", "install.md", "tutorial.md", "troubleshooting.md")),
    *GUIDES,
    *sorted((DOCS / "concepts").glob("*.md")),
]
COMMAND_PAGES = [REPO / "README.md", *READER_PAGES, DOCS / "contributing.md", DOCS / "architecture.md"]
CODE = re.compile(r"```(\w*)\n(.*?)```", re.S)
UUID = re.compile(r"\b[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\b")
HASH = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")  # hex with digits and letters
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
TEST_NAME = re.compile(r"\btests/|\btest_\w+")
# How the project is made, not how it is used: words a reader cannot place.
DEVELOPMENT = ("this machine", "the issue", "the goal", "lent ", "session", "throwaway", "not committed", "adopted")
VENV = {"python", "pip", "mkdocs", "prefect"}  # the venv's own tools, as .venv/bin/NAME
# The shell's and a Linux system's own tools (systemd's included), which a page may use without naming them.
SHELL = {"cd", "export", "unset", "sudo", "nohup", "cp", "mv", "mkdir", "ls", "cat", "head", "git", "curl"}
SYSTEM = {"systemctl", "loginctl", "journalctl", "apt-get"}
# A numbered step of a diagram, by a word of its line (checked in this order), and the step of flows/steps doing it.
DIAGRAM_WORDS = [
    ("results", results),
    ("build", image),
    ("scripts", scripts),
    ("file share", scripts),
    ("file server", sync),
    ("Blob", dataset),
    ("pool", training),
    ("job", training),
]


def prose(page: Path) -> str:
    """The page without its code blocks, inline code and link targets: what a reader reads as sentences."""
    text = CODE.sub("", page.read_text())
    return re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "CODE", text))


def sentences(page: Path) -> list[str]:
    """The sentences of the page's paragraphs and list items (headings and tables left out)."""
    lines = [line for line in prose(page).splitlines() if not line.lstrip().startswith(("#", "|"))]
    paragraphs = re.split(r"\n\s*\n|\n\s*(?:[-*]|\d+\.) ", "\n".join(lines))
    found = (re.split(r"(?<=[.!?])\s+", " ".join(p.split())) for p in paragraphs)
    return [s for group in found for s in group if len(s.split()) > 1]


@pytest.mark.parametrize("page", [REPO / "README.md", DOCS / "index.md"], ids=lambda p: p.name)
def test_the_diagram_numbers_the_steps_in_the_order_the_code_runs_them(page):
    diagram = next(block for _, block in CODE.findall(page.read_text()) if "build + push" in block)
    numbered = [m for line in diagram.splitlines() if (m := re.search(r"(?<![\w.])([1-7])\.? +(\S.*)", line))]
    assert [int(m.group(1)) for m in numbered] == list(range(1, 8)), diagram
    steps = [next(step for word, step in DIAGRAM_WORDS if word in m.group(2)) for m in numbered]
    assert [RUN.index(step) for step in steps] == sorted(RUN.index(step) for step in steps), steps


@pytest.mark.parametrize("page", READER_PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_a_reader_s_page_has_no_dates_hashes_test_names_or_development_words(page):
    text = page.read_text()
    assert not DATE.findall(text) and not TEST_NAME.findall(text)
    words = prose(page)
    assert not HASH.findall(UUID.sub("", words))
    assert [word for word in DEVELOPMENT if word in words.lower()] == []


@pytest.mark.parametrize("page", READER_PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_a_reader_s_page_speaks_in_short_sentences_without_nested_parentheses(page):
    lengths = [len(s.split()) for s in sentences(page)]
    assert statistics.median(lengths) <= 20, sorted(sentences(page), key=len)[-5:]
    assert not re.search(r"\([^()]*\(", prose(page)), "nested parentheses"


@pytest.mark.parametrize("page", GUIDES, ids=lambda p: p.name)
def test_a_guide_is_a_numbered_task_of_at_most_150_lines(page):
    text = page.read_text()
    assert len(text.splitlines()) <= 150
    assert re.search(r"^## 1\. ", text, re.M), "a guide's steps are numbered sections: ## 1. ..."


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))


def command_problem(line: str, page_prose: str) -> str | None:
    """What is wrong with one command of a page's sh block, if anything."""
    words = shlex.split(line)
    tool = words[0].removeprefix(".venv/bin/")
    if tool == "trainflow":
        return "; ".join(command_line_problems(shlex.join(["trainflow", *words[1:]]))) or None
    if tool == "make":
        unknown = [w for w in words[1:] if "=" not in w and not w.startswith("-") and w not in make_targets()]
        return f"no make target {unknown}" if unknown else None
    if tool in SHELL | SYSTEM | VENV or (REPO / words[0]).exists():
        return None
    return None if tool.lower() in page_prose.lower() else f"{tool} is neither the project's nor a tool the page names"


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_of_a_page_s_code_blocks_is_a_real_one(page):
    page_prose = prose(page).replace("CODE", "") + " ".join(re.findall(r"`([^`]*)`", CODE.sub("", page.read_text())))
    blocks = [block for lang, block in CODE.findall(page.read_text()) if lang in ("sh", "bash", "shell")]
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]  # continued lines joined
    commands = [line.split(" #")[0].strip() for line in lines]
    problems = [(c, p) for c in commands if c and not c.startswith("#") and (p := command_problem(c, page_prose))]
    assert problems == []


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_trainflow_command_a_page_s_sentences_name_is_a_real_one(page):
    """A `trainflow ...` span of a page's prose names a command and options it has (a printed title, `...: ...`, and
    an elided `trainflow ...` are not command lines)."""
    spans = re.findall(r"`(trainflow [^`]*)`", CODE.sub("", page.read_text()))
    lines = [span for span in spans if "..." not in span and ": " not in span]
    assert [(line, problems) for line in lines if (problems := command_line_problems(line))] == []
    # and a sentence saying commands take no `--option` is true of each command it names
    text = " ".join(CODE.sub("", page.read_text()).split())
    for sentence in re.findall(r"[^.]*\btakes? no `--[\w-]+`[^.]*", text):
        option = re.search(r"takes? no `(--[\w-]+)`", sentence).group(1)
        for command in re.findall(r"`(trainflow [\w ]+)`", sentence):
            assert command_line_problems(f"{command} {option}"), f"{page.name}: {command} takes {option}: {sentence}"


def test_the_steps_table_names_the_pools_that_build_the_image():
    """The concepts page's build-image row names every backend whose nodes run the training image, and no other."""
    from infra.compute import BACKENDS

    row = next(line for line in (DOCS / "concepts" / "index.md").read_text().splitlines() if "`build-image`" in line)
    named = re.search(r"run the image: ([^)]*)\)", row).group(1)
    expected = {"docker": "docker", "azureml": "Azure ML"}  # how the page names each backend
    building = {name for name, backend in BACKENDS.items() if backend.needs_image}
    assert building <= set(expected), building
    assert named.split(", ") == [expected[name] for name in sorted(building, key=list(expected).index)]


def test_the_install_page_s_time_is_the_measured_one():

    text = " ".join((DOCS / "install.md").read_text().split())
    [minutes] = re.findall(r"took about (\d+) minutes", text)
    measured = json.loads((DOCS / "benchmarks" / "install-demo.json").read_text())
    assert int(minutes) == round(measured["seconds"]["demo"]["median"] / 60) and not measured["as_root"]


def test_the_long_tier_is_the_modules_contributing_names_and_make_test_leaves_it_out():
    """The `long` row of contributing's tier table names each module that marks tests `long` (the Keras demo's
    comparison by what it compares), and `make test` deselects the mark unless TEST_MARKS says otherwise."""
    row = next(line for line in (DOCS / "contributing.md").read_text().splitlines() if line.startswith("| long |"))
    marking = {
        path.name for path in (REPO / "tests" / "integration").rglob("test_*.py") if "mark.long" in path.read_text()
    }
    named = set(re.findall(r"(test_\w+\.py)", row)) | ({"test_tf_training.py"} if "Keras demo" in row else set())
    assert marking == named
    makefile = (REPO / "Makefile").read_text()
    assert "TEST_MARKS ?= not long" in makefile and '-m "$(TEST_MARKS)"' in makefile
