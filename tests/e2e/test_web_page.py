"""The web page in a real headless Chromium driven by Playwright, against a live `kvscope demo`.

The browser runs in real time (no virtual-time budget), so the page's event
stream is open and followed while a test watches. Every wait is a
condition checked until it holds (Playwright's ``wait_for_function``), never
a sleep or a duration. Debian's ``chromium`` is the browser: Playwright is
pointed at it, and downloads none of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.demo_process import running_demo

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev extra)")

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"Debian package chromium not installed ({CHROMIUM} absent)"
)

TOKEN = "page-token"
WAIT_MS = 30_000  # a generous deadline for a state to be reached, not a speed asserted
READ = "() => document.getElementById('updated').textContent.startsWith('updated')"
"""The page has read /api/v1/stats at least once and shown it. Waits and reads are functions:
the page's Content-Security-Policy has no 'unsafe-eval', so a bare expression would not run."""
EVENTS = "() => document.querySelectorAll('#event-feed li').length"


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    with running_demo(rate=300) as base:
        yield base


@pytest.fixture(scope="module")
def demo_with_token() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("KVSCOPE_TOKEN", TOKEN)  # the demo reads it from its environment
        with running_demo(rate=300) as base:
            yield base


@pytest.fixture
def page(browser: sync_api.Browser) -> Iterator[sync_api.Page]:
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
    unexpected = [
        error
        for error in errors
        if not error.endswith("/favicon.ico)")  # the browser asks for one; the page has none
        and "status of 401" not in error  # the token test's refused load
    ]
    assert not unexpected, f"the page logged errors: {unexpected}"


def number(text: str) -> int:
    """A count as the page shows it ("1,966", locale separators and all)."""
    digits = re.sub(r"\D", "", text)
    assert digits, f"no number in {text!r}"
    return int(digits)


def newest_event_id(page: sync_api.Page) -> int:
    newest = page.locator("#event-feed li").first.text_content() or ""
    match = re.match(r"#(\d+) ", newest)
    assert match, f"an event the page shows as {newest!r}"
    return int(match.group(1))


def test_the_page_shows_the_numbers_the_api_returns_and_they_move(
    page: sync_api.Page, demo: str
) -> None:
    page.goto(f"{demo}/")
    page.wait_for_function(READ)
    cells = page.locator("#publishers tbody tr").first.locator("td").all_text_contents()
    blocks_cpu = number(page.text_content("#blocks-cpu") or "")
    hit_detail = page.text_content("#hit-detail") or ""
    # Read after the page did: the demo keeps running, so compare what cannot differ
    # (who publishes) and what can only grow (counters), never a live gauge for equality.
    stats = page.request.get(f"{demo}/api/v1/stats").json()
    publisher = stats["publishers"][0]
    assert cells[1:4] == [publisher["name"], publisher["engine_id"], publisher["policy"]]
    assert number(cells[4]) == publisher["capacity_blocks"]
    assert page.locator("#publishers tbody tr").count() == len(stats["publishers"])
    assert page.locator("#publishers tbody .dot.on").count() == 1, "connected, as the API says"
    assert 0 < blocks_cpu <= publisher["capacity_blocks"]
    assert 0 < stats["blocks_by_medium"]["CPU"] <= publisher["capacity_blocks"]
    hits, looked_up = map(number, hit_detail.split(" of "))
    assert 0 <= hits <= looked_up, hit_detail
    assert 0 < looked_up <= stats["lookup_blocks"], "the page's count, read first, is not ahead"
    assert (page.text_content("#hit-ratio") or "").endswith("%")
    # The page polls: the lookup count it shows moves while the demo's worker replays.
    page.wait_for_function(
        "shown => document.getElementById('hit-detail').textContent !== shown", arg=hit_detail
    )


def test_the_live_feed_receives_new_events_over_sse(page: sync_api.Page, demo: str) -> None:
    with page.expect_request(f"{demo}/api/v1/events/stream"):
        page.goto(f"{demo}/")
    page.wait_for_function(f"() => ({EVENTS})() > 0")
    first = newest_event_id(page)
    shown = page.evaluate(EVENTS)
    page.wait_for_function(
        "first => Number(document.querySelector('#event-feed li').textContent"
        ".match(/^#(\\d+)/)[1]) > first",
        arg=first,
    )
    assert page.evaluate(EVENTS) >= shown, "the feed keeps what it showed (up to 100)"
    assert newest_event_id(page) > first
    kinds = page.locator("#event-feed li").evaluate_all("items => items.map(i => i.className)")
    assert set(kinds) <= {"stored", "removed", "cleared"}, kinds  # one class per kind


def test_a_screenshot_of_the_page_is_saved(page: sync_api.Page, demo: str, artefacts: Path) -> None:
    page.goto(f"{demo}/")
    page.wait_for_function(f"() => ({READ})() && ({EVENTS})() > 0")
    screenshot = artefacts / "web-page.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.read_bytes().startswith(b"\x89PNG"), screenshot
    assert screenshot.stat().st_size > 10_000, f"an empty-looking page at {screenshot}"


def test_with_a_token_the_page_opened_once_with_it_runs_on_its_cookie(
    page: sync_api.Page, demo_with_token: str
) -> None:
    base = demo_with_token
    refused = page.goto(f"{base}/")
    assert refused is not None and refused.status == 401
    assert "missing bearer token" in page.content()
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    opened = page.goto(f"{base}/?token={TOKEN}")
    assert opened is not None and opened.status == 200 and opened.url == f"{base}/"
    page.wait_for_function(
        f"() => ({READ})() && ({EVENTS})() > 0"
    )  # stats and stream, on the cookie
    assert number(page.text_content("#blocks-cpu") or "") > 0
    assert urls[0] == f"{base}/?token={TOKEN}"
    later = urls[1:]
    assert f"{base}/" in later and f"{base}/api/v1/events/stream" in later, later
    assert any(url.startswith(f"{base}/api/v1/stats") for url in later), later
    leaked = [url for url in later if TOKEN in url or "token=" in url]
    assert not leaked, f"the token in a URL after the redirect: {leaked}"
    (cookie,) = page.context.cookies()
    assert cookie["httpOnly"] and TOKEN not in cookie["value"]
