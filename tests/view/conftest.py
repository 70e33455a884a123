"""Fixtures of the viewer's tests: Debian's Chromium driven by playwright, and `agentrl view` processes.

The browser is the system's (``make test`` installs Debian's ``chromium``); nothing is
downloaded. Without one, the browser tests skip and say why — or fail under CI, where
``make test`` must have installed it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"  # screenshots, git-ignored
AGENTRL = Path(sys.executable).parent / "agentrl"
VIEW_READY = "agentrl view: ready on "


@pytest.fixture(scope="session")
def chromium() -> str:
    """The system Chromium's path."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        why = "no system Chromium (`make test` installs Debian's chromium; or apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {why}")
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def playwright_driver():
    """Playwright's sync API runs an event loop in this thread while it is open: it is closed at
    the end of the module, before any asyncio test runs."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(playwright_driver, chromium):
    """Headless Chromium (the system's), shared; each test opens its own page."""
    b = playwright_driver.chromium.launch(executable_path=chromium, headless=True)
    yield b
    b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.errors = errors
    yield pg
    context.close()
    assert not errors, f"the page raised: {errors}"


@pytest.fixture
def serve_view():
    """``serve_view(run_dir, *args)`` starts ``agentrl view`` on a free port; returns its URL."""
    from agentrl.process.services import ServiceProcess

    procs = []

    def start(*args: str | Path) -> str:
        proc = ServiceProcess([str(AGENTRL), "view", *map(str, args), "--port", "0"], ready=VIEW_READY,
                              startup_timeout=60)
        procs.append(proc)
        return proc.url

    yield start
    for proc in procs:
        proc.stop()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS

