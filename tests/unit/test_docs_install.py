"""`make setup` installs what builds the documentation site (MkDocs, Material for MkDocs) at the lock's versions, so a
fresh machine's `make test` builds it (tests/integration/test_docs_site.py)."""

import re
import tomllib
from importlib import metadata

from tests.fakes.paths import REPO


def test_make_setup_installs_the_site_s_tools_at_the_lock_s_versions():
    pins = dict(
        pin.split("==")
        for pin in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    )
    assert set(pins) == {"mkdocs", "mkdocs-material"}
    lock = (REPO / "containers" / "requirements" / "constraints.txt").read_text().splitlines()
    assert all(f"{name}=={version}" in lock for name, version in pins.items())
    assert re.search(r"\$\(INSTALL\) -c \$\(LOCK\) -e '\.\[dev,docs\]'", (REPO / "Makefile").read_text())
    assert all(metadata.version(name) == version for name, version in pins.items())
