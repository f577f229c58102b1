"""The documentation site (mkdocs.yml, docs/) builds with --strict, so a broken link, a missing page or a page left out
of the nav fails; and read as a reader reads it, in headless Chromium, every page opens with every asset it loads and
every link it makes (page and anchor) found, and every page can be reached from the front page."""

import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urlsplit

import pytest

from tests.fakes.browser import CHROMIUM, CHROMIUM_ARGS
from tests.fakes.paths import BIN, REPO

pytestmark = pytest.mark.integration
QUIET = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about its successor


def build(site: Path, *options: str) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the checkout's site into `site`."""
    command = [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(site), *options]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=QUIET)


def test_the_site_builds_with_strict(tmp_path):
    result = build(tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "reference" / "settings" / "index.html").exists()


def test_strict_fails_on_a_broken_link(tmp_path):
    """What the build above would meet: a page linking to a page that is not there (copied docs, one link added)."""
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(REPO / "docs"), str(docs)], check=True)
    (docs / "index.md").write_text((docs / "index.md").read_text() + "\n[gone](guides/no-such-page.md)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text((REPO / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}"))
    result = build(tmp_path / "site", "--config-file", str(config))
    assert result.returncode == 1
    assert "guides/no-such-page.md" in result.stderr


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args) -> None:
        pass


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # the browser closed a connection it no longer needed (it reports what it could not load)


@contextmanager
def serving(folder: Path) -> Iterator[str]:
    """`folder` over HTTP on a free port of this machine, as a web server serves the built site."""
    server = QuietServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


PAGE_FACTS = """() => ({
    title: document.title,
    h1: document.querySelector("article h1")?.textContent ?? "",
    ids: [...document.querySelectorAll("[id]")].map(e => e.id),
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
})"""


class Reader:
    """Headless Chromium reading the site page by page: what each page is, links to and loads, and what failed."""

    def __init__(self, page, root: str):
        self.page, self.root = page, root
        self.facts: dict[str, dict] = {}
        self.problems: list[str] = []
        page.on("requestfailed", self.failed)
        page.on("response", self.answered)

    def failed(self, request) -> None:
        if request.failure != "net::ERR_ABORTED":  # aborted: the reader moved on (a missing file answers 404)
            self.problems.append(f"{request.url}: {request.failure} (on {self.page.url})")

    def answered(self, response) -> None:
        if response.status >= 400:
            self.problems.append(f"{response.url}: {response.status} (on {self.page.url})")
        if not response.url.startswith(self.root):
            self.problems.append(f"{response.url}: fetched from outside the site (on {self.page.url})")

    def read_all(self, start: str) -> None:
        """Open `start` and every page of the site it links to, and theirs, once each."""
        queue = [start]
        while queue:
            url = queue.pop()
            if url in self.facts:
                continue
            self.page.goto(url, wait_until="load")
            self.facts[url] = self.page.evaluate(PAGE_FACTS)
            queue += [page for page, _ in map(urldefrag, self.facts[url]["links"]) if self.ours(page)]

    def ours(self, url: str) -> bool:
        """A page of the site (not a download such as a benchmark's JSON or a plot)."""
        return url.startswith(self.root) and (url.endswith("/") or url.endswith(".html"))

    def broken_links(self) -> list[str]:
        """Every link to an anchor its page lacks, or to a file of the site (a JSON, a plot) that is not there."""
        broken = []
        for url, facts in self.facts.items():
            for link in facts["links"]:
                page, anchor = urldefrag(link)
                if self.ours(page) and anchor and anchor not in self.facts[page]["ids"]:
                    broken.append(f"{url} links to {link}: no such anchor")
                elif page.startswith(self.root) and not self.ours(page) and not self.page.request.head(page).ok:
                    broken.append(f"{url} links to {link}: not found")
        return broken


def test_every_page_opens_in_chromium_with_its_links_and_assets_found(tmp_path):
    from playwright.sync_api import sync_playwright

    assert build(tmp_path / "site").returncode == 0
    built = {p.parent.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    with serving(tmp_path / "site") as root, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        reader = Reader(browser.new_page(), root)
        reader.read_all(f"{root}/")
        broken = reader.broken_links()
        browser.close()
    assert not reader.problems, "\n".join(reader.problems)
    assert not broken, "\n".join(broken)
    front = reader.facts[f"{root}/"]
    assert front["title"] == "trainflow" and front["h1"].strip().startswith("trainflow")
    read = {urlsplit(url).path.strip("/") or "." for url in reader.facts}
    assert read == built, f"pages no link reaches: {sorted(built - read)}"
    assert {"reference/commands", "reference/settings", "reference/errors", "guides/azure"} <= read
