"""Headless Chromium for the console's tests: Debian's ``chromium``, driven by Playwright.

Playwright never downloads a browser of its own here: it launches ``/usr/bin/chromium``
(``HERDER_CHROMIUM`` to use another). Without it, or without the ``playwright``
package, the tests that need a browser are skipped, saying exactly what to install;
``make test`` installs Debian's ``chromium`` first when it runs as root.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path(os.environ.get("HERDER_CHROMIUM", "/usr/bin/chromium"))
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def page() -> Iterator[Any]:
    """A fresh page of a headless Chromium, closed with the test."""
    if not CHROMIUM.exists():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: run `apt-get install -y chromium` as root (Debian), "
            "or set HERDER_CHROMIUM to a Chromium binary"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is missing: pip install -e '.[test]'")
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=ARGS, headless=True
        )
        try:
            context = browser.new_context(viewport={"width": 1500, "height": 1300})
            yield context.new_page()
        finally:
            browser.close()


def screenshot_dir(tmp_path: Path) -> Path:
    """Where screenshots go: ``HERDER_SCREENSHOTS`` if set, else the test's directory."""
    where = Path(os.environ.get("HERDER_SCREENSHOTS", tmp_path))
    where.mkdir(parents=True, exist_ok=True)
    return where
