"""What a user's scripts folder ships as its scripts version: every file but `.git`, Python's caches and what its
`.gitignore` and `.trainflowignore` leave out, refused whole over a size limit (the data belongs in --data).

The ignore files take gitignore's common forms, each line a pattern matched against the path relative to the folder
that holds the file: `name` (anywhere), `dir/` (a folder anywhere), `/name` or `a/b` (from that folder), `*`, `?`
and `**`, `#` comments and `!pattern` to take a path back in.
"""

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

from infra.core.errors import BadInput

IGNORE_FILES = (".gitignore", ".trainflowignore")
ALWAYS_LEFT_OUT = {".git", "__pycache__", ".ipynb_checkpoints"}
LARGEST_NAMED = 3


@dataclass(frozen=True)
class Rule:
    """One pattern of an ignore file in `base` (relative to the scripts folder, "" at its top)."""

    base: str
    pattern: str
    negated: bool
    folders_only: bool
    anchored: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        """Whether the rule names `rel` (relative to the scripts folder)."""
        if self.folders_only and not is_dir:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1 :]
        if self.anchored:
            return fnmatch.fnmatchcase(rel, self.pattern) or fnmatch.fnmatchcase(rel, self.pattern.replace("**/", ""))
        return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], self.pattern) or fnmatch.fnmatchcase(rel, self.pattern)


def parse_rules(text: str, base: str) -> list[Rule]:
    """The rules of one ignore file's text, found in folder `base`."""
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = line[1:] if negated else line
        folders_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        rules.append(Rule(base, line.lstrip("/"), negated, folders_only, anchored))
    return rules


def left_out(rules: list[Rule], rel: str, is_dir: bool) -> bool:
    """Whether the rules leave `rel` out: the last rule that names it decides."""
    out = False
    for rule in rules:
        if rule.matches(rel, is_dir):
            out = not rule.negated
    return out


def script_files(source: Path) -> dict[str, Path]:
    """Relative path -> file of everything the folder ships, in order."""
    files: dict[str, Path] = {}
    rules: list[Rule] = []
    for root, dirs, names in os.walk(source):
        base = os.path.relpath(root, source).replace(os.sep, "/")
        base = "" if base == "." else base
        for ignore in IGNORE_FILES:
            if (Path(root) / ignore).is_file():
                rules += parse_rules((Path(root) / ignore).read_text(errors="replace"), base)
        dirs[:] = sorted(
            d for d in dirs if d not in ALWAYS_LEFT_OUT and not left_out(rules, joined(base, d), is_dir=True)
        )
        for name in sorted(names):
            path, rel = Path(root) / name, joined(base, name)
            if name.endswith(".pyc") or not path.is_file() or left_out(rules, rel, is_dir=False):
                continue
            files[rel] = path
    return files


def joined(base: str, name: str) -> str:
    """`name` in folder `base` ("" at the top), "/"-separated."""
    return f"{base}/{name}" if base else name


def check_size(files: dict[str, Path], source: Path, max_mb: float) -> None:
    """Refuse a folder whose files add up to more than `max_mb`, naming its largest files."""
    sizes = {rel: path.stat().st_size for rel, path in files.items()}
    total = sum(sizes.values())
    if total <= max_mb * 1e6:
        return
    largest = sorted(sizes, key=sizes.__getitem__, reverse=True)[:LARGEST_NAMED]
    named = ", ".join(f"{rel} ({sizes[rel] / 1e6:.0f} MB)" for rel in largest)
    raise BadInput(
        f"the scripts folder {source} holds {total / 1e6:.0f} MB, over script.max_mb {max_mb:g}: its largest files are "
        f"{named}. Data belongs in --data, outputs in ${{{{output}}}}: leave them out with a .trainflowignore (or "
        ".gitignore) line, or raise script.max_mb"
    )
