"""The web page in real headless Chromium, against a live demo: it renders and its numbers move.

Chromium is driven from its command line: `--dump-dom` prints the DOM after the
page's scripts ran for a virtual-time budget (shorter than the delay before
the page opens its event stream: virtual time stands still while a request
is open), `--screenshot` saves a PNG. Two dumps taken apart, while the demo's
worker replays, must show different lookup counts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.demo_process import running_demo

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian package chromium not installed")

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--virtual-time-budget=1500",
]  # fmt: skip


def chromium(tmp_path: Path, *args: str) -> str:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    done = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def shown(dom: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert match, f"#{element_id} not in the rendered page"
    return match.group(1)


def test_the_page_renders_live_numbers_that_change(tmp_path: Path) -> None:
    with running_demo(rate=300) as base:
        url = f"{base}/"
        first = chromium(tmp_path, "--dump-dom", url)
        assert shown(first, "updated").startswith("updated"), "the page never read the API"
        assert int(shown(first, "blocks-cpu").replace(",", "")) > 0
        screenshot = tmp_path / "page.png"
        chromium(tmp_path, f"--screenshot={screenshot}", "--window-size=1400,1000", url)
        assert screenshot.stat().st_size > 10_000, f"screenshot at {screenshot}"
        second = chromium(tmp_path, "--dump-dom", url)
        looked_up = shown(first, "hit-detail"), shown(second, "hit-detail")
        assert looked_up[0] != looked_up[1], f"the lookup counts stayed {looked_up[0]}"
        assert shown(second, "hit-ratio").endswith("%")


def test_with_a_token_the_page_opened_once_with_it_runs_on_its_cookie(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSCOPE_TOKEN", "page-token")  # the demo reads it from its environment
    with running_demo(rate=300) as base:
        refused = chromium(tmp_path, "--dump-dom", f"{base}/")
        assert "missing bearer token" in refused and 'id="blocks-cpu"' not in refused
        opened = chromium(tmp_path, "--dump-dom", f"{base}/?token=page-token")
        assert shown(opened, "updated").startswith("updated"), "the page never read the API"
        assert int(shown(opened, "blocks-cpu").replace(",", "")) > 0
