"""Every test in this folder is end to end: marked ``e2e`` so ``-m "not e2e"`` leaves them out.

The page's tests share a browser: Debian's ``chromium``, which Playwright is pointed at (it
downloads none of its own), and a fresh page per test that fails its test on any script
error or console error the test did not expect.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest

from app.server import Sidecar
from app.settings import SidecarSettings

if TYPE_CHECKING:
    from playwright import sync_api

CHROMIUM: Final = Path("/usr/bin/chromium")
WAIT_MS: Final = 30_000  # a generous deadline for a state to be reached, not a speed asserted


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "e2e":
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def artefacts(tmp_path: Path) -> Path:
    """Where a test leaves what a person may want to look at (screenshots): the folder named
    by ``KVSCOPE_ARTEFACTS`` (a CI job uploads it), else the test's own ``tmp_path``."""
    named = os.environ.get("KVSCOPE_ARTEFACTS")
    if not named:
        return tmp_path
    folder = Path(named)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def sidecar() -> Iterator[str]:
    """A sidecar of its own (no publisher) for a module's pages: its URL."""
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"], port=0, token=None)  # env aside
    with Sidecar(settings) as running:
        yield running.url


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    # The one deadline for expect() too: its own default, 5 s, is one a loaded machine's
    # first page load can take.
    playwright.expect.set_options(timeout=WAIT_MS)
    with playwright.sync_playwright() as running:
        chromium = running.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def allowed_errors() -> list[str]:
    """Console errors a test expects (a substring each); every other one fails the test."""
    return []


@pytest.fixture
def page(browser: sync_api.Browser, allowed_errors: list[str]) -> Iterator[sync_api.Page]:
    """A fresh page (own cookies) that fails its test on any script error or console error."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    page.on(
        "console", lambda m: m.type == "error" and errors.append(f"{m.text} ({m.location['url']})")
    )
    yield page
    context.close()
    unexpected = [e for e in errors if not any(allowed in e for allowed in allowed_errors)]
    assert not unexpected, f"the page logged errors: {unexpected}"
