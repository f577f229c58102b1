"""Headless Chromium for the UI tests (Debian's, driven by playwright), and a watch on every request a page makes."""

import time
from urllib.parse import urlsplit

from infra.services.chromium import CHROMIUM, CHROMIUM_ARGS

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "ApiWatch"]  # the browser's launch, from infra; the watch


class ApiWatch:
    """Every request a page makes to this machine, seen from the browser: what the UI asked the API and got."""

    def __init__(self, page, port: int):
        self.page, self.port, self.pending, self.seen, self.problems = page, port, set(), [], []
        page.on("request", self.sent)
        page.on("requestfinished", lambda request: self.pending.discard(request))
        page.on("requestfailed", self.failed)
        page.on("response", self.answered)

    def ours(self, url: str) -> bool:
        return urlsplit(url).hostname in ("127.0.0.1", "localhost")

    def api(self, url: str) -> bool:
        return self.ours(url) and urlsplit(url).path.startswith(("/api/", "/ui-settings"))

    def sent(self, request) -> None:
        if self.ours(request.url) and urlsplit(request.url).port != self.port:  # e.g. the default port 4200
            self.problems.append(f"{request.method} {request.url}: not the UI's port {self.port}")
        self.pending.add(request)

    def failed(self, request) -> None:
        self.pending.discard(request)
        if self.ours(request.url) and request.failure != "net::ERR_ABORTED":  # aborted: the page moved on
            self.problems.append(f"{request.method} {request.url}: {request.failure}")

    def answered(self, response) -> None:
        if self.api(response.url):
            self.seen.append((response.status, urlsplit(response.url).path))
            if response.status >= 400:
                self.problems.append(f"{response.request.method} {response.url}: {response.status}")

    def settle(self, seconds: float = 15) -> None:
        """Wait until no request to this machine is in flight (half a second in a row)."""
        deadline, quiet_since = time.monotonic() + seconds, None
        while time.monotonic() < deadline:
            busy = any(self.ours(r.url) for r in self.pending)
            quiet_since = None if busy else quiet_since or time.monotonic()
            if quiet_since and time.monotonic() - quiet_since > 0.5:
                return
            self.page.wait_for_timeout(100)  # lets the browser's events in (a sleep would hold them back)
