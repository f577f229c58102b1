"""Debian's Chromium as playwright drives it, headless: for the docs' screenshots (cli/screenshots.py) and the UI
tests. `make setup` installs it from Debian's packages; playwright's own browser downloads are never used."""

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
