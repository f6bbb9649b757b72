"""Debian's Chromium (``/usr/bin/chromium``) driven by Playwright, for the console's
browser tests: :func:`chromium` launches it headless for a module's fixture."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from playwright import sync_api

CHROMIUM = "/usr/bin/chromium"


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium browser, closed on exit (the test fails without one)."""
    assert shutil.which(CHROMIUM), f"no {CHROMIUM}: the console's browser tests need it"
    with sync_api.sync_playwright() as p:
        # --no-sandbox: the suite may run as root, where Chromium's sandbox cannot start.
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()
