"""The web page in a real headless Chromium driven by Playwright, against a live `kvscope demo`.

The browser runs in real time (no virtual-time budget), so the page's polls
and event stream run while a test watches. Every wait is a condition checked
until it holds (Playwright's ``wait_for_function``, or ``wait_for`` on the
API), never a sleep or a duration; nothing here asserts on time (the page's
speed budgets are measured by bench/page_first_render.py). Debian's
``chromium`` is the browser: Playwright is pointed at it, and downloads none of
its own. The demo keeps running, so a comparison with the API either reads
what cannot change (configuration, counters that only grow) or brackets the
page's reading between two API readings.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import msgspec
import pytest

from app.server import Sidecar
from app.settings import SidecarSettings
from app.state.block_index import PAGE_SCAN
from offload.base import OffloadingEvent
from offload.wire.framing import DEFAULT_STATS_TOPIC
from tests.e2e.conftest import CHROMIUM, WAIT_MS
from tests.support.demo_process import running_demo
from tests.support.keyboard import tab_to
from tests.support.polling import wait_for
from tests.support.tcp_relay import TcpRelay
from tests.support.zmq_peers import RawPublisher, kv_payload, stats_probe

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev extra)")

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason=f"Debian package chromium not installed ({CHROMIUM} absent)"
)

TOKEN = "page-token"
WAIT_S = WAIT_MS / 1000
VIEWS = ("overview", "blocks", "publishers", "events", "insight")
CHARTS = ("hit-ratio", "occupancy", "throughput", "dead-writes", "bandwidth", "latency")
DIRECTIONS = {"gpu_to_cpu": "GPU→CPU", "cpu_to_gpu": "CPU→GPU"}
RENDERED = "() => document.getElementById('view-overview').dataset.rendered === 'true'"
"""The overview has drawn the cards and the charts once. Waits and reads are functions: the
page's Content-Security-Policy has no 'unsafe-eval', so a bare expression would not run."""
UPDATED = "() => document.getElementById('updated').textContent.startsWith('updated')"
FEED_IDS = "() => [...document.querySelectorAll('#event-feed li')].map(li => Number(li.dataset.id))"
ROWS = "#blocks-table tbody tr[data-hash]"
INSIGHT_DRAWN = (
    "() => document.getElementById('view-insight').dataset.rendered === 'true'"
    " && document.querySelector(\"[data-chart='hit-ratio-curve']\").dataset.empty === 'false'"
)
INSIGHT_SHOWN = """() => ({
  curve: JSON.parse(document.querySelector("[data-chart='hit-ratio-curve']").dataset.curve),
  current: Number(document.querySelector("[data-chart='hit-ratio-curve']").dataset.current),
  series: document.querySelector("[data-chart='hit-ratio-curve']").dataset.series,
  verdicts: [...document.querySelectorAll('#insight-verdicts li')].map(li => li.textContent),
  deadWrites: document.getElementById('insight-dead-writes').dataset.ratio,
  efficiency: document.getElementById('insight-efficiency').dataset.efficiency,
  efficiencyText: document.getElementById('insight-efficiency').textContent,
  windowCaption: document.querySelector('#insight-window figcaption').textContent,
  windowPair: [...document.querySelectorAll('#insight-window dd')].map((dd) => [
    dd.previousElementSibling.textContent, dd.dataset.series, dd.dataset.ratio,
    dd.textContent.trim(),
    dd.querySelector('meter').value / dd.querySelector('meter').max]),
  windowNote: document.querySelector('#insight-window .detail').textContent,
  windowInCurve: Boolean(document.querySelector("[data-chart='hit-ratio-curve'] #insight-window")),
  curveLegend: [...document.querySelectorAll(
    "[data-chart='hit-ratio-curve'] .u-legend .u-series .u-label")].map((l) => l.textContent),
  deadWritesText: document.getElementById('insight-dead-writes').textContent,
  viewText: document.getElementById('view-insight').innerText,
  points: JSON.parse(document.querySelector("[data-chart='hit-ratio-curve']").dataset.points),
  ticks: JSON.parse(document.querySelector("[data-chart='hit-ratio-curve']").dataset.ticks),
  tickLabels: JSON.parse(
    document.querySelector("[data-chart='hit-ratio-curve']").dataset.tickLabels),
})"""
"""What the insight view shows, read in one turn of the page's loop (it renders each answer
in one turn, so every part comes from the same answer)."""
REASONS = {
    "cold": ("cold", 1),
    "evicted": ("evicted", 2),
    "not_admitted": ("not admitted", 3),
    "no_room": ("no room", 6),
    "in_flight": ("in flight", 4),
    "prefix_lost": ("prefix lost", 5),
}
"""Each miss reason (app/static/js/views/insight.js): its name in words, and its colour (the
stylesheet's ``--series-N``)."""
MISS_REASONS_SHOWN = """() => {
  const chart = document.querySelector("[data-chart='miss-reasons']");
  const colour = (value) => {
    const probe = document.createElement("span");
    probe.style.color = value;
    document.body.append(probe);
    const computed = getComputedStyle(probe).color;
    probe.remove();
    return computed;
  };
  const root = getComputedStyle(document.documentElement);
  return {
    legend: [...chart.querySelectorAll(".u-legend .u-series")].slice(1).map((row) => [
      row.querySelector(".u-label").textContent,
      colour(getComputedStyle(row.querySelector(".u-marker")).borderColor),
    ]),
    palette: [1, 2, 3, 4, 5, 6, 7, 8].map((n) => colour(root.getPropertyValue(`--series-${n}`))),
    key: [...chart.querySelectorAll("#miss-reasons-key dt")].map((dt) => dt.textContent),
    keyShown: chart.querySelector("#miss-reasons-key").checkVisibility(),
  };
}"""
"""The lost-blocks chart's legend (each line's name and colour, past the time's), the colours
of the palette, and the names its key explains."""


@pytest.fixture(scope="module")
def demo() -> Iterator[str]:
    """A slow demo (40 requests/s): the feed's last 200 events span a second or more."""
    with running_demo(rate=40) as base:
        yield base


@pytest.fixture(scope="module")
def demo_with_token() -> Iterator[str]:
    # In the demo's environment only: set in this one, it stayed set for the module's later
    # tests while this fixture lived (a sidecar they built from the environment took it).
    with running_demo(rate=40, token=TOKEN) as base:
        yield base


def api(page: sync_api.Page, base: str, path: str, **params: Any) -> Any:
    answer = page.request.get(f"{base}/api/v1/{path}", params=params or None)
    assert answer.ok, (path, answer.status)
    return answer.json()


def number(text: str) -> int:
    """A count as the page shows it ("1,966", locale separators and all)."""
    digits = re.sub(r"\D", "", text)
    assert digits, f"no number in {text!r}"
    return int(digits)


T = TypeVar("T")


def significant_figures_kept(text: str) -> bool:
    """The page's number rule: three significant figures, more only for whole digits."""
    whole, _, decimals = text.replace(",", "").partition(".")
    return len(decimals) <= max(0, 3 - len(whole.lstrip("0"))) or whole.strip("0") == ""


def open_view(page: sync_api.Page, base: str, fragment: str) -> None:
    page.goto(f"{base}/#/{fragment}")
    view = fragment.split("?")[0]
    page.wait_for_function(
        "view => document.getElementById(`tab-${view}`).getAttribute('aria-selected') === 'true'",
        arg=view,
    )


@contextmanager
def sized_page(browser: sync_api.Browser, width: int, height: int) -> Iterator[sync_api.Page]:
    """A page in a window of ``width`` x ``height``, waiting ``WAIT_MS`` at most, closed after."""
    context = browser.new_context(viewport={"width": width, "height": height})
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        yield page
    finally:
        context.close()


def read_views(
    page: sync_api.Page, base: str, read: Callable[[sync_api.Page, str], T]
) -> dict[str, T]:
    """``read`` of each view once it is drawn from an answer, not only its frame."""
    found = {}
    for view in VIEWS:
        open_view(page, base, view)
        page.wait_for_function(UPDATED)
        found[view] = read(page, view)
    return found


def history_points(page: sync_api.Page, base: str, least: int) -> dict[str, Any]:
    """/api/v1/history once it holds ``least`` points (the demo has been running that long)."""
    return wait_for(
        lambda: api(page, base, "history", resolution=1),
        lambda history: len(history["times"]) >= least,
        f"{least} points of history",
        WAIT_S,
    )


def chart(page: sync_api.Page, name: str) -> dict[str, str]:
    return page.eval_on_selector(f"[data-chart='{name}']", "element => ({...element.dataset})")


def expected_series(history: dict[str, Any]) -> dict[str, set[str]]:
    """The series names each chart draws from this history, by the page's naming."""
    series = [s for s in history["series"] if any(v is not None for v in s["values"])]
    labels = [(s["metric"], s["labels"]) for s in series]
    return {
        "occupancy": {lab["medium"] for metric, lab in labels if metric == "blocks"},
        "throughput": {"stores", "loads"}
        | {f"evicted: {lab['reason']}" for metric, lab in labels if metric == "evictions"},
        "bandwidth": {
            DIRECTIONS[lab["direction"]] for m, lab in labels if m == "transfer_bytes_per_s"
        },
        "latency": {
            f"{DIRECTIONS[lab['direction']]} p{round(100 * float(lab['quantile']))}"
            for metric, lab in labels
            if metric == "transfer_latency_s"
        },
    }


def test_the_overview_charts_start_before_the_page_opened_and_extend_live(
    page: sync_api.Page, demo: str
) -> None:
    history = history_points(page, demo, 5)
    opened = time.time()
    page.goto(f"{demo}/")
    page.wait_for_function(RENDERED)
    drawn = {name: chart(page, name) for name in CHARTS}
    for name, data in drawn.items():
        assert data["empty"] == "false", f"{name} draws nothing"
        assert float(data["firstTs"]) < opened - 1, f"{name} starts when the page opened"
        assert int(data["points"]) >= len(history["times"]), name
    later = api(page, demo, "history", resolution=1)
    # Each chart's series are those the API has: all it had before the page, none it lacks after.
    for name in ("occupancy", "throughput", "bandwidth", "latency"):
        shown = set(drawn[name]["series"].split("|"))
        assert expected_series(history)[name] <= shown <= expected_series(later)[name], name
    assert drawn["occupancy"]["series"] == "GPU|CPU", "GPU first, then CPU"
    # Live: the charts gain the points that follow.
    page.wait_for_function(
        "last => Number(document.querySelector(\"[data-chart='occupancy']\").dataset.lastTs)"
        " > last",
        arg=float(drawn["occupancy"]["lastTs"]),
    )


def test_the_cards_show_the_numbers_the_api_returns_with_units_and_they_move(
    page: sync_api.Page, demo: str
) -> None:
    page.goto(f"{demo}/")
    page.wait_for_function(RENDERED)

    def card(name: str) -> tuple[str, str, str]:
        found = page.locator(f"[data-card='{name}']")
        value, unit, detail = (
            found.locator(part).text_content() or "" for part in (".value", ".unit", ".detail")
        )
        return value, unit, detail

    blocks_cpu, unit, held = card("blocks:CPU")
    _, _, hit_detail = card("hit-ratio")
    _, _, tracked_detail = card("events-rate")
    stats = api(page, demo, "stats")  # read after the page did: counters only grow
    capacity = stats["publishers"][0]["capacity_blocks"]
    assert unit == "blocks" and 0 < number(blocks_cpu) <= capacity
    # A medium counts copies, the index distinct blocks: each card says which it shows.
    assert held.startswith("copies held, ") and held.endswith("B"), held
    # What copies are is said under the cards, where a keyboard or a touch reaches it (a
    # tooltip reached neither), and each medium's heading is described by it.
    note = page.locator("#copies-note")
    sync_api.expect(note).to_be_visible()
    sync_api.expect(note).to_contain_text("KV cache groups")
    heading = page.locator("[data-card='blocks:CPU'] h2")
    sync_api.expect(heading).to_have_accessible_description(note.text_content() or "")
    tracked, most = tracked_detail.split(" distinct blocks tracked, at most ")
    assert 0 < number(tracked) <= number(most) == stats["max_blocks"], tracked_detail
    hits, looked_up = map(number, hit_detail.removesuffix(" blocks looked up").split(" of "))
    assert 0 <= hits <= looked_up <= stats["lookup_blocks"], hit_detail
    assert card("hit-ratio")[1] == "%"
    # A percent is written against its number, as the API's verdicts and the README write it.
    hit_ratio = page.locator("[data-card='hit-ratio'] .big").text_content() or ""
    assert re.fullmatch(r"[\d.,]+%", hit_ratio), hit_ratio
    rates = {"stores-rate": "blocks/s", "loads-rate": "blocks/s"}
    rates |= {"evictions-rate": "blocks/s", "events-rate": "events/s"}
    for name, expected in rates.items():
        value, unit, _ = card(name)
        assert unit == expected, name
        assert significant_figures_kept(value), f"{name} shows {value!r}"
    # The page polls: the lookup count it shows moves while the demo's worker replays.
    page.wait_for_function(
        "shown => document.querySelector(\"[data-card='hit-ratio'] .detail\").textContent "
        "!== shown",
        arg=hit_detail,
    )


def test_the_publishers_view_shows_each_publishers_health_and_config(
    page: sync_api.Page, demo: str
) -> None:
    open_view(page, demo, "publishers")
    page.wait_for_function("() => document.querySelectorAll('#publishers tbody tr').length > 0")
    cells = {
        header: cell
        for table in ("#publishers", "#publisher-config")
        for header, cell in zip(
            page.locator(f"{table} thead th").all_text_contents(),
            page.locator(f"{table} tbody tr").first.locator("td").all_text_contents(),
            strict=True,
        )
    }
    stats = api(page, demo, "stats")
    (publisher,) = stats["publishers"]
    assert page.locator("#publishers tbody tr").count() == 1
    assert cells["status"].strip() == "connected" and publisher["connected"]
    assert (cells["publisher"], cells["mode"], cells["engine"], cells["policy"]) == (
        publisher["name"],
        publisher["mode"],
        publisher["engine_id"],
        publisher["policy"],
    )
    assert number(cells["capacity"]) == publisher["capacity_blocks"]
    assert number(cells["block size"]) == publisher["block_size"]
    assert 0 < number(cells["frames"]) <= publisher["frames"]
    for header in (
        "gaps",
        "missed",
        "malformed",
        "held dropped",
        "family changes",
        "source family mismatches",
        "dropped",
    ):
        counted = header.replace(" ", "_")
        assert number(cells[header]) <= (publisher[counted] or 0), header
    # Ages by the page's rule for seconds: under 1 s in ms or µs ("0.00627 s ago" was shown).
    for name, after in (("last frame", " ago"), ("stats lag", "")):
        written = re.fullmatch(rf"([\d.,]+) (µs|ms|s){after}", cells[name])
        assert written, cells[name]
        figure, unit = written.groups()
        assert unit != "s" or float(figure.replace(",", "")) >= 1 or figure == "0", cells[name]
    assert publisher["stats_ts"] is not None


def test_the_blocks_view_pages_through_the_index_with_filters(
    page: sync_api.Page, demo: str
) -> None:
    open_view(page, demo, "blocks")
    page.wait_for_function(f"() => document.querySelectorAll('{ROWS}').length > 0")
    # What the page shows of a block is what the API says of the same entry (same hash and
    # sequence number) while it is indexed: the oldest blocks (the GPU's shared prefix) stay.
    rows = page.locator(ROWS).evaluate_all(
        "rows => rows.map(r => [r.dataset.hash, Number(r.dataset.seq),"
        " [...r.cells].slice(1, 5).map(c => c.textContent)])"
    )
    same = 0
    for block_hash, seq, (_media, publishers, size, _hits) in rows:
        answer = page.request.get(f"{demo}/api/v1/blocks/{block_hash}")
        if answer.ok and answer.json()["seq"] == seq:
            block = answer.json()
            assert publishers == ", ".join(block["publishers"]) and int(size) == block["block_size"]
            same += 1
    assert same > 0, f"no block the page listed is still indexed as listed: {rows[:3]}"
    page.select_option("#filter-medium", "CPU")
    page.wait_for_function("() => location.hash.includes('medium=CPU')")
    page.wait_for_function(
        f"() => [...document.querySelectorAll('{ROWS} td:nth-child(2)')]"
        ".every(c => c.textContent.split(', ').includes('CPU'))"
    )
    seqs = [int(s) for s in page.locator(ROWS).evaluate_all("rows => rows.map(r => r.dataset.seq)")]
    assert seqs and seqs == sorted(seqs), "in order of first store"
    page.click("text=Next")
    page.wait_for_function("last => location.hash.includes(`cursor=${last}`)", arg=seqs[-1])
    page.wait_for_function(
        f"last => [...document.querySelectorAll('{ROWS}')]"
        ".every(r => Number(r.dataset.seq) > last)",
        arg=seqs[-1],
    )
    (name,) = [p["name"] for p in api(page, demo, "stats")["publishers"]]
    page.select_option("#filter-publisher", name)
    page.wait_for_function(
        "() => location.hash.includes('publisher=') && !location.hash.includes('cursor')"
    )
    page.wait_for_function(f"() => document.querySelectorAll('{ROWS}').length > 0")
    shown = page.locator(f"{ROWS} td:nth-child(3)").all_text_contents()
    assert set(shown) == {name}


def bracketed(
    read_api: Callable[[], Any], read_page: Callable[[], Any], what: str
) -> tuple[Any, Any, Any]:
    """The page's reading between two of the API's, until it equals one of them (the demo
    may change what is read between the three)."""
    return wait_for(
        lambda: (read_api(), read_page(), read_api()),
        lambda got: got[1] in (got[0], got[2]),
        what,
        WAIT_S,
    )


def test_a_block_search_shows_its_residency_per_tier_and_its_link_restores_it(
    page: sync_api.Page, demo: str, allowed_errors: list[str]
) -> None:
    allowed_errors.append(f"({demo}/api/v1/blocks/")  # the browser notes each 404 and 400 asked
    open_view(page, demo, "blocks")
    first = api(page, demo, "blocks", limit=1)["blocks"][0]["block_hash"]

    def block_media() -> str:
        answer = page.request.get(f"{demo}/api/v1/blocks/{first}")
        return "|".join(answer.json()["media"]) if answer.ok else "missing"

    def search() -> str:
        page.fill("#block-query", "")
        page.goto(f"{demo}/#/blocks")
        page.fill("#block-query", first)
        page.press("#block-query", "Enter")
        page.wait_for_function(
            "() => document.querySelector('#block-result [data-held], "
            "#block-result [data-missing]')"
        )
        found = page.locator("#block-result dl")
        return found.get_attribute("data-held") or "" if found.count() else "missing"

    _, shown, _ = bracketed(block_media, search, f"the page shows block {first} as the API does")
    assert f"q={first}" in page.url
    if shown != "missing":
        terms = page.locator("#block-result dt").all_text_contents()
        facts = dict(zip(terms, page.locator("#block-result dd").all_text_contents(), strict=True))
        assert facts["hash"] == first
        for medium in ("GPU", "CPU"):
            assert facts[medium] == ("held" if medium in shown.split("|") else "not held")
    # The link alone restores the search.
    page.goto("about:blank")
    page.goto(f"{demo}/#/blocks?q={first}")
    page.wait_for_function(
        "() => document.querySelector('#block-result dl, #block-result p')"
        " && !document.querySelector('#block-result').textContent.endsWith('…')"
    )
    assert page.input_value("#block-query") == first
    # A bytes hash in hex the int-hashed demo never saw, and text that is no hash at all.
    page.fill("#block-query", "0x00ff")
    page.press("#block-query", "Enter")
    page.wait_for_selector("#block-result [data-missing]")
    assert "0x00ff is not indexed" in (page.text_content("#block-result") or "")
    page.fill("#block-query", "zz")
    page.press("#block-query", "Enter")
    page.wait_for_function(
        "() => document.querySelector('#block-result').textContent.includes('is not a block hash')"
    )


def test_a_prefix_lookup_shows_the_run_held_on_each_tier(page: sync_api.Page, demo: str) -> None:
    open_view(page, demo, "blocks")
    chain = [b["block_hash"] for b in api(page, demo, "blocks", limit=3)["blocks"]]
    chain.append("987654321987654321")  # never stored: the chain breaks by here

    def api_runs() -> tuple[dict[str, int], int]:
        answer = page.request.post(f"{demo}/api/v1/lookup", data={"block_hashes": chain}).json()
        return answer["runs"], answer["break_index"]

    def page_runs() -> tuple[dict[str, int], int]:
        page.fill("#lookup-hashes", "\n".join(chain))
        page.click("text=Look up")
        page.wait_for_selector("#lookup-result [data-break]")
        runs = page.locator("#lookup-result li").evaluate_all(
            "items => Object.fromEntries(items.map(i => [i.dataset.medium, Number(i.dataset.run)]))"
        )
        return runs, int(page.get_attribute("#lookup-result [data-break]", "data-break") or "-1")

    _, (runs, broke), _ = bracketed(api_runs, page_runs, "the page's lookup is the API's")
    assert set(runs) == {"GPU", "CPU"} and broke <= 3
    assert f"{len(chain)} blocks" in (page.text_content("#lookup-result") or "")


def test_the_live_feed_filters_pauses_and_resumes(page: sync_api.Page, demo: str) -> None:
    with page.expect_request(f"{demo}/api/v1/events/stream"):
        open_view(page, demo, "events?kind=stored&medium=CPU")
    page.wait_for_function(f"() => ({FEED_IDS})().length >= 5")
    assert (page.input_value("#filter-kind"), page.input_value("#filter-event-medium")) == (
        "stored",
        "CPU",
    )
    shown = page.locator("#event-feed li").evaluate_all(
        "items => items.map(i => [i.className, i.dataset.medium])"
    )
    assert {tuple(item) for item in shown} == {("stored", "CPU")}
    ids = page.evaluate(FEED_IDS)
    assert ids == sorted(ids, reverse=True) and len(set(ids)) == len(ids), "newest first, once"
    page.click("#pause")
    frozen = page.evaluate(FEED_IDS)
    wait_for(
        lambda: api(page, demo, "events", since=max(frozen), limit=1)["last_id"],
        lambda last: last > max(frozen) + 50,
        "the demo publishes 50 more events",
        WAIT_S,
    )
    page.wait_for_function(
        "() => /paused: [1-9]/.test(document.getElementById('feed-state').textContent)"
    )
    assert page.evaluate(FEED_IDS) == frozen, "a paused feed stays as it was"
    # A toggle keeps its name: renamed "Resume" as it was pressed, it read "Resume, pressed".
    sync_api.expect(page.get_by_role("button", name="Pause", pressed=True)).to_have_id("pause")
    page.click("#pause")
    sync_api.expect(page.get_by_role("button", name="Pause", pressed=False)).to_have_id("pause")
    page.wait_for_function(f"top => ({FEED_IDS})()[0] > top", arg=max(frozen))


def test_the_feed_resumes_after_a_broken_connection_without_duplicates(
    page: sync_api.Page, demo: str, allowed_errors: list[str]
) -> None:
    """Through a relay that breaks every connection: the browser reconnects with Last-Event-ID,
    the sidecar resumes right after it, and the feed shows every id once, none missing."""
    allowed_errors.append("net::ERR_")  # the broken connections, as the browser reports them
    target = urlsplit(demo)
    with TcpRelay((target.hostname or "127.0.0.1", target.port or 80)) as relay:
        base = f"http://127.0.0.1:{relay.port}"
        open_view(page, base, "events")
        page.wait_for_function(f"() => ({FEED_IDS})().length >= 20")
        with page.expect_request(lambda r: r.url.endswith("/events/stream")) as reconnected:
            assert relay.cut() >= 1
        resumed_after = int(reconnected.value.all_headers()["last-event-id"])
        page.wait_for_function(
            f"last => ({FEED_IDS})().includes(last) && ({FEED_IDS})().includes(last + 1)",
            arg=resumed_after,
            polling="raf",
        )
        ids = page.evaluate(FEED_IDS)
        assert ids == list(range(ids[0], ids[0] - len(ids), -1)), "each id once, none missing"
        feed = page.eval_on_selector("#event-feed", "feed => ({...feed.dataset})")
        assert (feed["duplicates"], feed["unheld"]) == ("0", "0")
        assert int(feed["reconnects"]) >= 1


@pytest.mark.parametrize(
    ("fragment", "control", "value"),
    [
        ("overview?range=6h", "#range", "6h"),
        ("blocks?medium=GPU", "#filter-medium", "GPU"),
        ("publishers", None, None),
        ("events?kind=removed", "#filter-kind", "removed"),
        ("insight", None, None),
    ],
)
def test_a_deep_link_restores_its_view_and_state(
    page: sync_api.Page, demo: str, fragment: str, control: str | None, value: str | None
) -> None:
    open_view(page, demo, fragment)
    view = fragment.split("?")[0]
    for other in VIEWS:
        selected = page.get_attribute(f"#tab-{other}", "aria-selected")
        assert selected == str(other == view).lower(), other
        visible = page.locator(f"#view-{other}").is_visible()
        assert visible == (other == view), other
    if control is not None:
        page.wait_for_function(
            "([control, value]) => document.querySelector(control).value === value",
            arg=[control, value],
        )


def test_the_tabs_follow_the_aria_pattern_with_arrow_keys_and_visible_focus(
    page: sync_api.Page, demo: str
) -> None:
    page.goto(f"{demo}/")
    page.wait_for_function(UPDATED)
    assert page.get_attribute("#tabs", "role") == "tablist"
    # A screen reader read "Views" twice, the navigation landmark's name and then the tab list's.
    sync_api.expect(page.get_by_role("tablist")).to_have_accessible_name("Views")
    sync_api.expect(page.get_by_role("navigation")).not_to_have_accessible_name("Views")
    page.focus("#tab-overview")
    steps = [("ArrowRight", "blocks"), ("ArrowRight", "publishers"), ("End", "insight")]
    steps += [("ArrowRight", "overview"), ("ArrowLeft", "insight"), ("Home", "overview")]
    for key, expected in steps:
        page.keyboard.press(key)
        page.wait_for_function("view => location.hash === `#/${view}`", arg=expected)
        # the router shows the view on the hash's change event, after the key's handler
        page.locator(f"#view-{expected}").wait_for(state="visible")
        focused = page.evaluate("() => document.activeElement.id")
        assert focused == f"tab-{expected}", key
        tabs = page.locator("[role=tab]").evaluate_all(
            "tabs => tabs.map(t => [t.getAttribute('aria-selected'), t.tabIndex])"
        )
        assert [t for t in tabs if t == ["true", 0]] == [["true", 0]], "one selected tab stop"
        assert tabs[VIEWS.index(expected)] == ["true", 0], key
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none", "the focused tab shows its focus"


def test_a_line_is_hidden_and_shown_again_from_its_legend_by_keyboard(
    page: sync_api.Page, demo: str
) -> None:
    """uPlot hides a chart's line when its name in the legend is clicked, a listener on a
    table cell no key reached: each name is a button that Tab reaches, with a visible focus,
    that Enter and Space press, and that says whether its line is shown."""
    page.goto(f"{demo}/")
    page.wait_for_function(RENDERED)
    page.wait_for_function(
        "() => document.querySelector(\"[data-chart='occupancy']\").dataset.series === 'GPU|CPU'"
    )
    cpu = page.locator("[data-chart='occupancy']").get_by_role("button", name="CPU", exact=True)
    row = cpu.locator("xpath=ancestor::tr")
    # Past the hit-ratio chart's plot and names, and the GPU's name.
    tab_to(page, "#range", cpu, 20, "the CPU line's name")
    sync_api.expect(cpu).to_have_attribute("aria-pressed", "true")
    page.keyboard.press("Enter")
    sync_api.expect(cpu).to_have_attribute("aria-pressed", "false")
    sync_api.expect(row).to_have_class(re.compile(r"\bu-off\b"))  # uPlot's hidden line
    page.keyboard.press("Space")
    sync_api.expect(cpu).to_have_attribute("aria-pressed", "true")
    sync_api.expect(row).not_to_have_class(re.compile(r"\bu-off\b"))


def test_a_point_read_by_keyboard_stays_under_the_cursor_as_points_arrive(
    page: sync_api.Page, demo: str
) -> None:
    """uPlot's cursor stands at a place on the plot, and each new point moves the plot under
    it: a point the arrow keys chose gave way to a later one within a second. The point the
    keys chose stays in the legend while new ones are drawn."""
    page.goto(f"{demo}/")
    page.wait_for_function(RENDERED)
    chart = page.locator("[data-chart='occupancy']")
    # Both lines drawn (a line added rebuilds the plot), and a few points.
    page.wait_for_function(
        """() => {
          const chart = document.querySelector("[data-chart='occupancy']");
          return chart.dataset.series === 'GPU|CPU' && Number(chart.dataset.points) >= 5;
        }"""
    )
    keys = re.compile(r"^Occupancy per medium: use left and right arrow keys")
    chart.get_by_role("group", name=keys).focus()
    # The point before the newest: in the plot's right half, where a new point moves the
    # plot under the cursor by more than half a point's width.
    page.keyboard.press("ArrowLeft")
    legend_time = chart.locator(".u-legend .u-series .u-value").first
    read = legend_time.text_content()
    last = chart.get_attribute("data-last-ts")
    page.wait_for_function(
        "last => document.querySelector(\"[data-chart='occupancy']\").dataset.lastTs !== last",
        arg=last,
    )
    assert legend_time.text_content() == read


CONTRAST = """([text, back]) => {
  const lum = (selector, prop) => {
    const [element, pseudo] = selector.split(/(?=::)/);
    const style = getComputedStyle(document.querySelector(element), pseudo ?? null);
    const [r, g, b] = style[prop].match(/[\\d.]+/g).map(Number).map(v => v / 255)
      .map(c => c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4);
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const a = lum(text, 'color');
  const b = lum(back, 'backgroundColor');
  return [(Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05), b];
}"""
"""The contrast of ``text``'s colour on ``back``'s background (selectors; ``text`` may name a
pseudo-element, "#block-query::placeholder"), and the background's luminance."""


LABELLED = """(view) => [...document.querySelectorAll(`#view-${view} label`)].map((label) => {
  const words = label.cloneNode(true);
  words.querySelectorAll('input, select, textarea').forEach((control) => control.remove());
  const control = label.control;
  const role = control.tagName === 'SELECT' ? 'combobox'
    : control.type === 'search' ? 'searchbox' : 'textbox';
  return [control.id, role, words.textContent.replace(/[\\s:]+$/, '')];
})"""
"""Each label of a view: its control's id and role, and the words it shows."""


@pytest.mark.parametrize("view", VIEWS)
def test_every_control_is_named_by_the_label_it_shows(
    page: sync_api.Page, demo: str, view: str
) -> None:
    """A voice command names a control by the words beside it: the overview's range, shown
    as "Charts:", was named "Chart range" by an aria-label over its label, and "Charts"
    reached nothing."""
    open_view(page, demo, view)
    page.wait_for_function(UPDATED)
    for control, role, words in page.evaluate(LABELLED, view):
        named = page.get_by_role(role, name=words)
        assert named.evaluate_all("found => found.map((e) => e.id)") == [control], words


LIVE_REGIONS = "[role=status], [role=alert], [role=log], [aria-live]:not([aria-live=off])"
LISTEN = """([view, live]) => {
  window.__spoken = [];
  window.__moved = { header: 0, view: 0 };
  new MutationObserver((records) => {
    const moved = new Set();
    for (const record of records) {
      const node = record.target.nodeType === Node.ELEMENT_NODE
        ? record.target : record.target.parentElement;
      const region = node.closest(live);
      if (region) window.__spoken.push(`${region.id || region.className}: ${region.textContent}`);
      if (node.closest('#updated')) moved.add('header');
      if (node.closest(`#view-${view}`)) moved.add('view');
    }
    moved.forEach((part) => { window.__moved[part] += 1; });
  }).observe(document.body, { subtree: true, childList: true, characterData: true });
}"""
"""Records each write into a live region (what a screen reader reads out), and counts the
turns in which the header's clock and the view moved."""


@pytest.mark.parametrize("view", VIEWS)
def test_live_regions_speak_only_when_what_they_say_changes(
    page: sync_api.Page, demo: str, view: str
) -> None:
    """The header's clock was a live region, rewritten each second, and so were the events
    view's counts (with every event), the insight view's sample counts and the publishers'
    summary (the same words each second): a screen reader read the page out without end.
    With the sidecar healthy and the view settled, the page moves and no region speaks."""
    settled = {
        "overview": RENDERED,
        "blocks": f"() => document.querySelectorAll('{ROWS}').length > 0",
        "publishers": "() => document.querySelectorAll('#publishers tbody tr').length > 0",
        "events": "() => document.getElementById('feed-state').textContent.startsWith('live')",
        "insight": "() => document.getElementById('view-insight').dataset.rendered === 'true'",
    }
    open_view(page, demo, view)
    page.wait_for_function(UPDATED)
    page.wait_for_function(settled[view])
    page.evaluate(LISTEN, [view, LIVE_REGIONS])
    page.wait_for_function("() => window.__moved.header >= 3 && window.__moved.view >= 3")
    assert page.evaluate("() => window.__spoken") == []


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_page_reads_in_the_light_and_the_dark_scheme(
    page: sync_api.Page, demo: str, scheme: str
) -> None:
    page.emulate_media(color_scheme=scheme)
    page.goto(f"{demo}/")
    page.wait_for_function(RENDERED)
    pairs = [
        ("h1", "body"),
        (".card .value", ".card"),
        (".card .detail", ".card"),
        ("[aria-selected=true]", "[aria-selected=true]"),
        ("#updated", "header"),
    ]
    for text, back in pairs:
        ratio, background = page.evaluate(CONTRAST, [text, back])
        assert ratio >= 4.5, f"{text} on {back} in the {scheme} scheme: {ratio:.2f}:1"
        if back == "body":
            assert (background < 0.1) == (scheme == "dark"), background
    open_view(page, demo, "blocks")  # the placeholders say what a field takes
    for field in ("#block-query", "#lookup-hashes"):
        ratio, _ = page.evaluate(CONTRAST, [f"{field}::placeholder", field])
        assert ratio >= 4.5, f"{field}'s placeholder in the {scheme} scheme: {ratio:.2f}:1"


def test_a_screenshot_of_each_view_is_saved(
    page: sync_api.Page, demo: str, artefacts: Path
) -> None:
    history_points(page, demo, 20)  # charts with some history in them
    ready = {
        "overview": RENDERED,
        "blocks": f"() => document.querySelectorAll('{ROWS}').length > 0",
        "publishers": "() => document.querySelectorAll('#publishers tbody tr').length > 0",
        "events": f"() => ({FEED_IDS})().length > 20",
        "insight": INSIGHT_DRAWN,
    }
    shots = [(view, "light") for view in VIEWS] + [("overview", "dark")]
    for view, scheme in shots:
        page.emulate_media(color_scheme=scheme)
        open_view(page, demo, view)
        page.wait_for_function(ready[view])
        suffix = "" if scheme == "light" else f"-{scheme}"
        screenshot = artefacts / f"web-page-{view}{suffix}.png"
        page.screenshot(path=str(screenshot), full_page=view != "blocks")
        assert screenshot.read_bytes().startswith(b"\x89PNG"), screenshot
        assert screenshot.stat().st_size > 10_000, f"an empty-looking page at {screenshot}"


def test_with_a_token_the_page_opened_once_with_it_runs_on_its_cookie(
    page: sync_api.Page, demo_with_token: str, allowed_errors: list[str]
) -> None:
    allowed_errors.append("status of 401")  # the refused first load
    base = demo_with_token
    refused = page.goto(f"{base}/")
    assert refused is not None and refused.status == 401
    assert "missing bearer token" in page.content()
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    opened = page.goto(f"{base}/?token={TOKEN}")
    assert opened is not None and opened.status == 200 and opened.url == f"{base}/"
    page.wait_for_function(f"() => ({RENDERED})() && ({UPDATED})()")  # stats, history, modules
    page.click("#tab-events")
    page.wait_for_function(f"() => ({FEED_IDS})().length > 0")  # the stream, on the cookie
    assert number(page.text_content("[data-card='blocks:CPU'] .value") or "") > 0
    assert urls[0] == f"{base}/?token={TOKEN}"
    later = urls[1:]
    for path in (
        "/",
        "/static/app.js",
        "/static/vendor/uPlot.iife.min.js",
        "/api/v1/events/stream",
    ):
        assert f"{base}{path}" in later, (path, later)
    for path in ("/api/v1/stats", "/api/v1/history"):
        assert any(url.startswith(f"{base}{path}") for url in later), (path, later)
    leaked = [url for url in later if TOKEN in url or "token=" in url]
    assert not leaked, f"the token in a URL after the redirect: {leaked}"
    (cookie,) = page.context.cookies()
    assert cookie["httpOnly"] and TOKEN not in cookie["value"]


def probed_until(
    http: httpx.Client, raw: RawPublisher, ok: Callable[[dict[str, Any]], bool], what: str
) -> dict[str, Any]:
    """Send a stats frame of ``raw``'s stream (its topic @0) until the sidecar's stats pass
    ``ok``: a new peer's first frames are lost until its connection is up (ZMQ's slow
    joiner), and a stats frame names the stream without touching its batches' sequence."""
    payload = stats_probe(raw.topic.decode(), 0)

    def probe() -> dict[str, Any]:
        raw.pub.send_multipart([DEFAULT_STATS_TOPIC, (0).to_bytes(8, "big"), payload])
        return http.get("/api/v1/stats").json()

    return wait_for(probe, ok, what)


def applied(http: httpx.Client, raw: RawPublisher, seq: int, *events: OffloadingEvent) -> None:
    """Send batch ``seq`` of ``raw``'s stream and wait until it is applied: a peer's frames
    arrive in order, so every frame it sent before has been taken too."""
    raw.send(seq, kv_payload(*events, rank=0))
    name = f"{raw.topic.decode()}@0"
    wait_for(
        lambda: {p["name"]: p["last_seq"] for p in http.get("/api/v1/stats").json()["publishers"]},
        lambda last: last.get(name) == seq,
        f"batch {seq} of {name} applied",
    )


def listing(name: str) -> Callable[[dict[str, Any]], bool]:
    return lambda stats: any(p["name"] == name for p in stats["publishers"])


def moves(count: int) -> Callable[[dict[str, Any]], bool]:
    return lambda stats: stats["listener"]["stream_moves"] == count


def test_a_publisher_named_at_length_by_its_peer_never_widens_the_page_and_its_peer_shows(
    browser: sync_api.Browser,
) -> None:
    """A listen-mode peer names its stream by its topic: 128 bytes that are not plain text
    print as 260 characters of hex, which the publisher filter once stretched past the window.
    The publishers view counts the listen socket's peers against their limit, names the
    networks they may come from, and counts a stream's moves from host to host (one engine's
    name sent from 127.0.0.1, then 127.0.0.2, then 127.0.0.1 again) and the moves that forgot
    its blocks (127.0.0.2's share, one medium, was another stream's GPU: no room for the CPU)."""
    settings = SidecarSettings(  # env aside
        listen=["tcp://127.0.0.1:*"],
        listen_allow=["127.0.0.0/8"],
        listen_max_media_per_host=1,
        port=0,
        token=None,
    )
    with Sidecar(settings) as sidecar, httpx.Client(base_url=sidecar.url) as http:
        bound = http.get("/api/v1/stats").json()["listener"]["endpoints"][0]
        elsewhere = f"tcp://127.0.0.2:0;127.0.0.1:{bound.rsplit(':', 1)[1]}"
        raw = RawPublisher(connect=bound, topic=b"\xfe" * 128)
        gpu, engine = RawPublisher(elsewhere, b"gpu"), RawPublisher(bound, b"vllm")
        moved = RawPublisher(elsewhere, b"vllm")
        peers = [raw, gpu, engine, moved]
        try:
            payload = kv_payload(OffloadingEvent([1, 2], 16, "CPU", False))

            def names() -> list[str]:
                raw.pub.send_multipart([raw.topic, (0).to_bytes(8, "big"), payload])
                return [p["name"] for p in http.get("/api/v1/stats").json()["publishers"]]

            wait_for(names, lambda found: any(len(n) > 256 for n in found), "the long name")
            for peer, medium in ((gpu, "GPU"), (engine, "CPU")):
                named = f"{peer.topic.decode()}@0"
                probed_until(http, peer, listing(named), named)
                applied(http, peer, 0, OffloadingEvent([10], 16, medium, False))
            probed_until(http, moved, moves(1), "vllm@0 from 127.0.0.2")
            applied(http, moved, 1)  # its probes all taken: none comes after engine's below
            stats = probed_until(http, engine, moves(2), "vllm@0 back from 127.0.0.1")
            assert stats["listener"]["stream_move_resets"] == 1, stats["listener"]
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            page = context.new_page()
            page.goto(f"{sidecar.url}/#/blocks")
            page.wait_for_function(
                "() => [...document.querySelectorAll('#filter-publisher option')]"
                ".some(o => o.value.length > 256)"
            )
            width = page.evaluate(
                "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
            )
            page.goto(f"{sidecar.url}/#/publishers")
            line = page.get_by_text("Listening on")
            sync_api.expect(line).to_contain_text(
                "4 of at most 128 peers admitted, 0 handshakes refused; at most 32 from one "
                "host, 0 refused past it; 2 stream moves to another host (a count that climbs: "
                "two peers send under one name), 1 forgetting the stream's blocks; peers from "
                "127.0.0.0/8 only, 0 from elsewhere refused."
            )
            context.close()
        finally:
            for peer in peers:
                peer.close()
    assert width[0] <= width[1], f"the page is {width[0]} px wide in a {width[1]} px window"


def test_a_count_that_went_wrong_is_described_by_a_key_on_the_page(
    browser: sync_api.Browser,
) -> None:
    """A marked count's meaning, "not zero", was a tooltip that no keyboard, touch or screen
    reader reached: a key under the health table says it, and describes each marked count.
    Batch 1 of the stream never comes: its gap and the batch it missed are marked."""
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"], port=0, token=None)  # env aside
    with Sidecar(settings) as sidecar, httpx.Client(base_url=sidecar.url) as http:
        bound = http.get("/api/v1/stats").json()["listener"]["endpoints"][0]
        raw = RawPublisher(connect=bound, topic=b"engine")
        try:
            probed_until(http, raw, listing("engine@0"), "engine@0")
            applied(http, raw, 0)
            applied(http, raw, 2)
            with sized_page(browser, 1280, 900) as page:
                open_view(page, sidecar.url, "publishers")
                marked = page.locator("#publishers td.problem")
                sync_api.expect(marked).to_have_count(2)
                key = page.locator("#problem-key")
                sync_api.expect(key).to_be_visible()
                for cell in marked.all():
                    sync_api.expect(cell).to_have_accessible_description(key.text_content() or "")
        finally:
            raw.close()


def test_the_blocks_view_asks_past_a_stretch_of_the_index_its_filter_finds_nothing_in(
    browser: sync_api.Browser,
) -> None:
    """The two blocks on the CPU come after a page's scan of the index: the API's first page
    under the filter is empty with a cursor, and the view follows it to show them."""
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"], port=0, token=None)  # env aside
    gpu = list(range(PAGE_SCAN + 10))
    with Sidecar(settings) as sidecar, httpx.Client(base_url=sidecar.url) as http:
        bound = http.get("/api/v1/stats").json()["listener"]["endpoints"][0]
        raw = RawPublisher(connect=bound, topic=b"engine")
        context = browser.new_context()
        try:
            probed_until(http, raw, listing("engine@0"), "engine@0")
            applied(http, raw, 0, OffloadingEvent(gpu, 16, "GPU", False))
            applied(http, raw, 1, OffloadingEvent(gpu[-2:], 16, "CPU", False))
            first = http.get("/api/v1/blocks", params={"medium": "CPU"}).json()
            assert first["blocks"] == [] and first["next_cursor"] is not None
            page = context.new_page()
            page.goto(f"{sidecar.url}/#/blocks?medium=CPU")
            page.wait_for_function(f"() => document.querySelectorAll('{ROWS}').length === 2")
            shown = page.locator(ROWS).evaluate_all("rows => rows.map(r => r.dataset.hash)")
            assert shown == [str(h) for h in gpu[-2:]]
            assert page.is_disabled("text=Next")
        finally:
            context.close()
            raw.close()


def test_no_view_is_wider_than_a_phones_window(browser: sync_api.Browser, demo: str) -> None:
    """At 390 px (a phone's window) the tab bar stood in one row past the window's edge, and
    the grids of cards, charts and the blocks view's columns kept tracks of 170, 440 and 380 px
    at least, so every view scrolled sideways with the Insight tab cut off: the tabs wrap, a
    track is never wider than its grid, and no view is wider than the window."""
    with sized_page(browser, 390, 800) as page:
        widths = read_views(
            page,
            demo,
            lambda page, _view: page.evaluate(
                "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
            ),
        )
        tab = page.get_by_role("tab", name="Insight").bounding_box()
    assert all(shown <= window for shown, window in widths.values()), widths
    assert tab is not None and tab["x"] + tab["width"] <= 390, tab


def test_the_insight_view_fits_its_labels_and_facts_in_a_phones_window(
    browser: sync_api.Browser, demo: str
) -> None:
    """At 390 px the capacity axis read "0" under every second capacity, the tier's own
    "2,000" among them (uPlot blanked those ticks, and a blank was written as a count), and
    a term as long as "hit ratio measured (every lookup of the tier)" took the facts' whole
    width, leaving each value one character a line: the axis labels every second capacity
    (or third...) counted from the tier's own, and a value keeps room for a line of its own."""
    wait_for(
        lambda: httpx.get(f"{demo}/api/v1/insight").json(),
        lambda body: body["publishers"] and body["publishers"][0]["curve"] is not None,
        "a curve",
        2 * WAIT_S,
    )
    with sized_page(browser, 390, 800) as page:
        open_view(page, demo, "insight")
        page.wait_for_function(INSIGHT_DRAWN)
        shown = page.evaluate(INSIGHT_SHOWN)
        lines = page.evaluate(
            """() => [...document.querySelectorAll('#insight-facts dd')].map((dd) => {
              const range = document.createRange();
              range.selectNodeContents(dd);
              return [dd.textContent, new Set([...range.getClientRects()].map((r) => r.top)).size];
            })"""
        )
    labels, current = shown["tickLabels"], shown["curve"]["capacities"].index(shown["current"])
    assert labels[current] == f"{shown['current']:,}", labels
    labelled = [i for i, label in enumerate(labels) if label]
    assert len(labelled) < len(labels), labels  # seven do not fit side by side
    assert len({b - a for a, b in itertools.pairwise(labelled)}) == 1, labels
    assert lines and all(n <= 2 for _, n in lines), lines


def test_the_feed_names_the_kv_cache_group_of_an_event(browser: sync_api.Browser) -> None:
    """A hybrid model's GPU pool announces each KV cache group's copy of a block on its own:
    the feed says which copy an event is of."""
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"], port=0, token=None)  # env aside
    stored = {
        "type": "BlockStored",
        "block_hashes": [7],
        "parent_block_hash": None,
        "token_ids": [],
        "block_size": 16,
        "lora_id": None,
        "medium": None,
        "group_idx": 1,
    }
    payload = msgspec.msgpack.encode([1.0, [stored], 0])  # fmt: skip
    with Sidecar(settings) as sidecar, httpx.Client(base_url=sidecar.url) as http:
        bound = http.get("/api/v1/stats").json()["listener"]["endpoints"][0]
        raw = RawPublisher(connect=bound, topic=b"engine")
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(f"{sidecar.url}/#/events")
            sent = iter(range(10**6))

            def first_item() -> str:
                raw.send(next(sent), payload)  # until the peer's connection takes it
                return page.evaluate(
                    "() => document.querySelector('#event-feed li')?.textContent ?? ''"
                )

            item = wait_for(first_item, lambda text: "group" in text, "a grouped event shown")
            assert re.fullmatch(r"#\d+ stored GPU group 1 \[7\]", item), item
        finally:
            context.close()
            raw.close()


ONE_PLURAL = re.compile(
    r"(?<![\d.,])1 (?:[a-z-]+ )?(?:blocks|tokens|events|references|frames|stores|reconnections"
    r"|messages|peers|publishers|handshakes)\b"
)
"""A count of one with a plural noun ("1 blocks", "1 sampled references")."""


def test_a_count_of_one_takes_the_singular_in_every_view(browser: sync_api.Browser) -> None:
    """A tier holding one block read "1 blocks" on its card, "1 blocks from the oldest" under
    the index, "A chain of 1 blocks" and a size of "1 tokens": every count beside a noun
    takes its number from one rule, singular for exactly one."""
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"], port=0, token=None)  # env aside
    cleared_then_one = [
        {"type": "AllBlocksCleared"},
        {
            "type": "BlockStored",
            "block_hashes": [7],
            "parent_block_hash": None,
            "token_ids": [],
            "block_size": 1,
            "lora_id": None,
            "medium": "CPU",
        },
    ]
    payload = msgspec.msgpack.encode([1.0, cleared_then_one, 0])
    with Sidecar(settings) as sidecar, httpx.Client(base_url=sidecar.url) as http:
        bound = http.get("/api/v1/stats").json()["listener"]["endpoints"][0]
        raw = RawPublisher(connect=bound, topic=b"engine")
        sent = iter(range(10**6))

        def stats() -> dict[str, Any]:
            raw.send(next(sent), payload)  # until the peer's connection takes it
            return http.get("/api/v1/stats").json()

        # Every batch clears the tier first: however many arrive, it holds the one block.
        wait_for(stats, lambda s: s["blocks_by_medium"].get("CPU") == 1, "one block held")
        try:
            with sized_page(browser, 1400, 1000) as page:
                texts = read_views(
                    page, sidecar.url, lambda page, view: page.inner_text(f"#view-{view}")
                )
                card = page.locator("[data-card='blocks:CPU'] .big")
                open_view(page, sidecar.url, "overview")
                sync_api.expect(card).to_have_text("1 block")
                open_view(page, sidecar.url, "blocks?q=7")
                sync_api.expect(page.locator(ROWS)).to_have_count(1)
                sync_api.expect(page.get_by_text("1 block from the oldest")).to_be_visible()
                size = page.locator("#block-result dt:text-is('block size') + dd")
                sync_api.expect(size).to_have_text("1 token")
                page.fill("#lookup-hashes", "7")
                page.get_by_role("button", name="Look up").click()
                result = page.locator("#lookup-result")
                sync_api.expect(result).to_contain_text("A chain of 1 block: every block is held")
                cpu_run = result.locator("li[data-medium='CPU']")
                sync_api.expect(cpu_run).to_have_text("CPU 1 of 1 block")
                texts["blocks"] = page.inner_text("#view-blocks")
        finally:
            raw.close()
    wrong = {view: ONE_PLURAL.findall(text) for view, text in texts.items()}
    assert not any(wrong.values()), wrong


def test_the_insight_view_draws_the_curve_and_the_verdicts_of_the_api(
    page: sync_api.Page, demo: str, artefacts: Path
) -> None:
    def ready(body: dict[str, Any]) -> bool:
        (publisher,) = body["publishers"]
        kinds = {v["kind"] for v in publisher["verdicts"]}
        return publisher["curve"] is not None and {"capacity", "optimum"} <= kinds

    # The optimum waits for half a window of sampled references: at the demo's 40 requests/s,
    # some 20 s of them.
    wait_for(lambda: api(page, demo, "insight"), ready, "a curve and the optimum", 2 * WAIT_S)
    answers: list[sync_api.Response] = []
    page.on("response", lambda r: r.url.endswith("/api/v1/insight") and answers.append(r))
    open_view(page, demo, "insight")
    page.wait_for_function(INSIGHT_DRAWN)

    def drew_an_answer() -> tuple[dict[str, Any], dict[str, Any]] | None:
        """What the page shows, and the answer (of those it received) it shows, if any."""
        shown = page.evaluate(INSIGHT_SHOWN)
        for answer in list(answers):
            (publisher,) = answer.json()["publishers"]
            curve = publisher["curve"]
            same_curve = curve and shown["curve"] == {
                k: curve[k] for k in ("capacities", "hit_ratios")
            }
            optimum = publisher["optimum"]
            same_window = optimum and [row[2] for row in shown["windowPair"]] == [
                json.dumps(optimum["tier_hit_ratio"]),
                json.dumps(optimum["hit_ratio"]),
            ]
            if (
                same_curve
                and same_window
                and shown["efficiency"] == json.dumps(publisher["efficiency"])
            ):
                return shown, publisher
        return None

    shown, publisher = wait_for(drew_an_answer, bool, "the page draws an answer it got", WAIT_S)
    curve = publisher["curve"]
    assert shown["current"] == curve["current_blocks"] == publisher["capacity_blocks"]
    assert shown["series"] == "|".join(curve["hit_ratios"]) == "lru|arc"
    # A point only where the sample resolves the capacity: the demo's 2,000 blocks at rate 0.05
    # hold 12.5 sampled blocks at 1/8x, under the 16 a point needs.
    resolved = {
        policy: [i for i, ok in enumerate(oks) if ok] for policy, oks in curve["resolved"].items()
    }
    assert shown["points"] == resolved
    # The capacity axis is marked at the curve's own capacities: at powers of two, the tier's
    # 2,000 blocks stood under a "2,048" and every point beside a tick of another size.
    assert shown["ticks"] == curve["capacities"]
    assert shown["tickLabels"] == [f"{c:,}" for c in curve["capacities"]]  # room for each
    # Untouched, the legend reads the tier's own capacity (a dash for every line until hovered).
    legend = page.locator("[data-chart='hit-ratio-curve'] .u-legend")
    sync_api.expect(legend).to_contain_text(f"{curve['current_blocks']:,} blocks")
    assert all(0 not in indices and indices for indices in resolved.values()), resolved
    # Every verdict but the optimum's, whose figure the headline says (once, in one rounding).
    said = [v["text"] for v in publisher["verdicts"] if v["kind"] != "optimum"]
    assert shown["verdicts"] == said
    assert any(text.startswith("doubling the tier") for text in shown["verdicts"])
    expected_dead = publisher["dead_write_ratio"]
    assert shown["deadWrites"] == ("" if expected_dead is None else json.dumps(expected_dead))
    # The efficiency in figures and words, from the same answer as the window below it.
    optimum = publisher["optimum"]
    percent = f"{100 * publisher['efficiency']:.3g}%"
    assert shown["efficiencyText"].startswith(percent), (percent, shown["efficiencyText"])
    # Its standard error beside it, as the API gives it (the demo samples at 0.05).
    error = publisher["efficiency_error"]
    assert error > 0 and f"±{error:.3g} points of the hits" in shown["efficiencyText"], (
        error,
        shown["efficiencyText"],
    )
    assert "of the hits a clairvoyant cache of the same size would get" in shown["efficiencyText"]
    assert shown["viewText"].count("clairvoyant cache of the same size") == 1, shown["viewText"]
    # A figure the page shows in a card and a verdict both reads the same in each, the percent
    # written alike too (the page wrote "97.8 %" beside a verdict's "97.8%").
    dead = f"{100 * publisher['dead_write_ratio']:.3g}%"
    assert shown["deadWritesText"].startswith(f"{dead} of "), shown["deadWritesText"]
    admission = [v for v in shown["verdicts"] if "of stores are never read" in v]
    assert all(v.startswith(dead) for v in admission), (dead, admission)
    assert not re.search(r"\d %", shown["viewText"]), shown["viewText"]
    # The optimum's window is a figure of its own: the optimum beside the tier's policy over
    # the same references, both from empty, bars on one scale. On the whole-stream curve its
    # point sat below the tier's own line and the measured hit ratio (an "optimum" under what
    # the tier gets): the curve draws its policies' lines and nothing else.
    policy = optimum["policy"]
    assert policy == publisher["policy"] == "lru"
    caption = (
        f"Over the last {optimum['window_refs']:,} sampled references, each replayed from an "
        f"empty tier of the tier's {publisher['capacity_blocks']:,} blocks"
    )
    assert shown["windowCaption"] == caption, shown["windowCaption"]
    scale = max(optimum["tier_hit_ratio"], optimum["hit_ratio"]) or 1
    assert [row[:2] for row in shown["windowPair"]] == [
        ["lru, the tier's policy", "policy"],
        ["the optimum", "optimum"],
    ]
    for (*_, text, bar), ratio in zip(
        shown["windowPair"], (optimum["tier_hit_ratio"], optimum["hit_ratio"]), strict=True
    ):
        assert text == f"{100 * ratio:.3g}%", (text, ratio)
        assert bar == pytest.approx(ratio / scale), (bar, ratio)
    assert not shown["windowInCurve"]
    assert shown["curveLegend"] == ["capacity", *curve["hit_ratios"]], shown["curveLegend"]
    # The curve's own figure for the policy, named apart from the window's as another stretch.
    whole = curve["hit_ratios"][policy][curve["current_index"]]
    at_tier = f"{policy} hits {100 * whole:.3g}% at the tier's {curve['current_blocks']:,} blocks"
    assert "The curve below covers every sampled reference since " in shown["windowNote"]
    assert at_tier in shown["windowNote"], (at_tier, shown["windowNote"])
    # Lost blocks by reason over time: the history's miss_blocks series, one line per reason.
    page.wait_for_function("() => document.querySelector(\"[data-chart='miss-reasons']\")"
                           ".dataset.empty === 'false'")  # fmt: skip
    # A worker reports every reason (none lost yet: 0), each named in words in the legend and
    # the key under the chart, and drawn in the colour kept for it.
    assert list(publisher["miss_reasons"]) == list(REASONS)
    misses = page.evaluate(MISS_REASONS_SHOWN)
    assert misses["legend"] == [[label, misses["palette"][n - 1]] for label, n in REASONS.values()]
    assert misses["key"] == [label for label, _ in REASONS.values()]
    assert misses["keyShown"], "the key is hidden"
    # A later answer has the same shape: capacities, the current one, the policies.
    (later,) = api(page, demo, "insight")["publishers"]
    assert later["curve"]["capacities"] == curve["capacities"]
    assert later["curve"]["current_index"] == curve["current_index"]
    assert list(later["curve"]["hit_ratios"]) == list(curve["hit_ratios"])
    screenshot = artefacts / "web-page-insight.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000, f"an empty-looking page at {screenshot}"


def _unchained(publisher: dict[str, Any]) -> dict[str, Any]:
    verdict = {**publisher["verdicts"][0], "kind": "unchained", "text": "the sample's blocks"}
    return {**publisher, "verdicts": [verdict, *publisher["verdicts"]]}


@pytest.mark.parametrize(
    ("case", "changed", "says"),
    [
        ("window filling", lambda p: {**p, "optimum": None}, "its window is still filling"),
        (
            "optimum hit nothing",
            lambda p: {**p, "optimum": {**p["optimum"], "hit_ratio": 0.0}},
            "the optimum hits no sampled block in its window",
        ),
        ("too few sampled blocks", lambda p: p, "too few sampled blocks to tell"),
        ("unchained", _unchained, "do not form prefix chains"),
    ],
)
def test_the_insight_view_says_why_it_shows_no_efficiency(
    page: sync_api.Page,
    demo: str,
    case: str,
    changed: Callable[[dict[str, Any]], dict[str, Any]],
    says: str,
) -> None:
    """The API answers efficiency null for several reasons; the headline names the one that
    holds, read off the rest of the answer. The demo's real answer is given the reason by the
    browser's network layer: the page's words are what is tested, not the sidecar's reasons
    (tests/app/test_insight*.py hold those). Before, an efficiency withheld because the tier's
    size was too few sampled blocks read "the optimum hits no sampled block"."""

    def ready(body: dict[str, Any]) -> bool:
        (publisher,) = body["publishers"]
        return publisher["optimum"] is not None and publisher["optimum"]["hit_ratio"] > 0

    wait_for(lambda: api(page, demo, "insight"), ready, "an optimum that hits", 2 * WAIT_S)

    def withheld(route: sync_api.Route) -> None:
        body = route.fetch().json()
        body["publishers"] = [{**changed(p), "efficiency": None} for p in body["publishers"]]
        route.fulfill(json=body)

    page.route("**/api/v1/insight", withheld)
    open_view(page, demo, "insight")
    page.wait_for_function("() => document.getElementById('view-insight').dataset.rendered")
    headline = page.locator("#insight-efficiency")
    sync_api.expect(headline).to_contain_text(says)
    assert headline.get_attribute("data-efficiency") == "", case
