"""The docs' pictures: every image a page shows is there, and the screenshots cli/screenshots.py takes from a real
run are in docs/images at the size it takes them (tests/integration/test_screenshots.py runs the script)."""

import re
from pathlib import Path

from PIL import Image

from cli.screenshots import HEIGHT, PLOTS, SHOTS, WIDTH
from tests.fakes.paths import REPO

DOCS = REPO / "docs"
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)")  # ![alt](path "title"), ![alt](<path>)


def missing_images(docs: Path) -> list[str]:
    """`page: path` for every image a markdown page under `docs` shows that is not there (web addresses aside)."""
    missing = []
    for page in sorted(docs.rglob("*.md")):
        for target in IMAGE.findall(page.read_text()):
            path = target.split("#")[0]
            if "://" not in path and not (page.parent / path).is_file():
                missing.append(f"{page.relative_to(docs)}: {target}")
    return missing


def test_every_image_a_page_shows_is_there():
    assert not missing_images(DOCS)


def test_the_check_finds_a_missing_image(tmp_path):
    (tmp_path / "guides").mkdir()
    (tmp_path / "shown.png").write_bytes(b"")
    text = '![here](../shown.png "title")\n![gone](images/gone.png){ width="600" }\n![web](https://x.org/a.png)\n'
    (tmp_path / "guides" / "page.md").write_text(text)
    assert missing_images(tmp_path) == ["guides/page.md: images/gone.png"]


def test_the_screenshots_are_in_docs_images_at_the_viewports_size():
    for name in SHOTS:
        with Image.open(DOCS / "images" / name) as image:
            assert (image.format, image.size) == ("PNG", (WIDTH, HEIGHT)), name
    for name in PLOTS.values():
        assert (DOCS / "images" / name).read_text().count('id="axes_') == 3, name  # the run's chart, its 3 panels
