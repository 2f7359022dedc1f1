"""The web page against what its peers and its URL may hold: markup, scripts, long strings.

Much of what the page shows comes from workers on the network (stream names, label
values, block hashes) or from its own URL (the fragment's parameters). Here a raw
publisher sends a live sidecar frames whose every free-text field holds markup, script
and 128-character unbroken strings, and a real Chromium opens each view: nothing runs
(a flag the payloads would set stays unset), the text shows as text, and no element
stretches the page past its window. Each wait is a condition, never a duration.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
import msgspec
import pytest
from playwright import sync_api

from app.server import Sidecar
from app.settings import SidecarSettings
from offload.wire.stats_frame import Sample, StatsFrame, WorkerConfig, encode_stats_frame
from tests.e2e.conftest import CHROMIUM
from tests.support.polling import wait_for
from tests.support.zmq_peers import RawPublisher

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} absent")

Hostile = tuple[str, Callable[[], None]]
"""The hostile sidecar's URL, and a function that has its peers send their frames again."""
RAN = "() => window.__pwned ?? null"
"""What a payload that ran would have left behind."""
PAYLOADS = (
    '<img src=x onerror="window.__pwned=1">',
    "</script><script>window.__pwned=2</script>",
    "javascript:window.__pwned=3",
    "W" * 128,  # a label value's longest: one unbroken word
)
DIRECTIONS = ("__proto__", "constructor")
"""Names of what every JavaScript object inherits: a page that looks a label up in a plain
object finds something there that is not a string."""
LONG_MEDIUM = "M" * 32
"""A medium's longest name, one unbroken word: it titles a card of the overview."""
UNKNOWN_HASH = "0x" + "cd" * 64
"""A bytes hash's longest: a search for it says so in one unbroken word."""
BIDI = "\u202eevil\u200b"
"""A right-to-left override and a zero-width space."""
HOSTILE_TOPIC = b'<svg onload="window.__pwned=4">'
WIDTH = "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
OVERFLOWING = """() => [...document.querySelectorAll('.card, .chart')]
  .filter(box => box.offsetParent && box.scrollWidth > box.clientWidth + 1)
  .map(box => `${box.className} ${box.dataset.card ?? box.dataset.chart ?? ''}`)"""
"""The boxes of the page whose text runs past their right edge (over their neighbour)."""
VIEWS = ("overview", "blocks", "publishers", "events", "insight")


def stats_payload(step: int) -> bytes:
    """A stats frame whose eviction and miss reasons are the payloads, and whose transfer
    directions are ``DIRECTIONS``, counting up by step."""
    counters = [
        Sample(name=name, labels={"reason": text}, value=float(step * (i + 1)))
        for name in ("kvscope_evicted_blocks_total", "kvscope_lookup_miss_blocks_total")
        for i, text in enumerate(PAYLOADS)
    ] + [
        Sample(name="kvscope_transfer_bytes_total", labels={"direction": d}, value=1e3 * step)
        for d in DIRECTIONS
    ]
    config = WorkerConfig(policy="lru", capacity_blocks=8, block_size=16)
    frame = StatsFrame(ts=time.time(), engine_id="e0", rank=0, config=config, counters=counters)
    return encode_stats_frame(frame)


def kv_batch(hashes: list[Any], medium: str | None = "CPU") -> bytes:
    stored = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": [],
        "block_size": 16,
        "lora_id": None,
        "medium": medium,
        "lora_name": PAYLOADS[0],
    }
    return msgspec.msgpack.encode([time.time(), [stored], 0])


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    """A sidecar fed by two raw peers until its API holds every payload: the stats frames'
    reasons in its history, a markup topic's stream and markup bytes as a block hash. Yields
    its URL and a function that sends each peer's frames once more."""
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"], port=0, token=None)  # env aside
    with Sidecar(settings) as sidecar, httpx.Client(base_url=sidecar.url) as http:
        bound = http.get("/api/v1/stats").json()["listener"]["endpoints"][0]
        worker = RawPublisher(connect=bound, topic=b"e0")
        stranger = RawPublisher(connect=bound, topic=HOSTILE_TOPIC)
        try:
            steps = iter(range(10**6))

            def feed() -> None:
                step = next(steps)
                worker.pub.send_multipart([b"kvscope.stats", b"\0" * 8, stats_payload(step)])
                worker.send(step, kv_batch([step, PAYLOADS[1].encode()], LONG_MEDIUM))
                stranger.send(step, kv_batch([10**6 + step]))

            def history() -> dict[str, Any]:
                feed()
                return http.get("/api/v1/history", params={"resolution": 1}).json()

            def holds_every_payload(answer: dict[str, Any]) -> bool:
                reasons = {
                    s["labels"].get("reason")
                    for s in answer["series"]
                    if s["metric"] == "miss_blocks" and sum(v is not None for v in s["values"]) > 1
                }
                directions = {
                    s["labels"]["direction"]
                    for s in answer["series"]
                    if s["metric"] == "transfer_bytes_per_s"
                }
                names = {p["name"] for p in http.get("/api/v1/stats").json()["publishers"]}
                return (
                    reasons >= set(PAYLOADS)
                    and directions >= set(DIRECTIONS)
                    and f"hex:{HOSTILE_TOPIC.hex()}@0" in names
                )

            wait_for(history, holds_every_payload, "two points of every payload's series", 60)
            # Refused where it enters: a medium that is markup, holds a bidi override or a
            # zero-width space, or is not UTF-8 at all (each the event, counted against its
            # publisher; the batch's other events stand).
            for medium in (PAYLOADS[0], "CPU\u202e", "C\u200bPU", "\ufffd"):
                batch = kv_batch([1], medium).replace("\ufffd".encode(), b"\xff\xfe\xfd")
                worker.send(next(steps), batch)

            def refused(stats: dict[str, Any]) -> bool:
                (mine,) = (p for p in stats["publishers"] if p["name"] == "e0@0")
                return mine["malformed"] >= 4

            wait_for(lambda: http.get("/api/v1/stats").json(), refused, "the media refused")
            yield sidecar.url, feed
        finally:
            worker.close()
            stranger.close()


def legend(page: sync_api.Page, chart: str) -> list[str]:
    return page.eval_on_selector_all(
        f"[data-chart='{chart}'] .u-legend th", "cells => cells.map(c => c.textContent)"
    )


@pytest.mark.parametrize("view", VIEWS)
def test_markup_from_a_peer_shows_as_text_and_never_widens_the_page(
    page: sync_api.Page, hostile: Hostile, view: str, allowed_errors: list[str]
) -> None:
    allowed_errors.append("status of 404")  # the search for a hash no tier holds
    base, feed = hostile
    page.set_viewport_size({"width": 1280, "height": 900})
    # Insight shows one publisher's lost blocks: the worker's, whose stats name the reasons
    # (by default the first the sidecar lists, which a loaded machine may make the stranger).
    query = {"blocks": f"?q={UNKNOWN_HASH}", "insight": "?publisher=e0@0"}.get(view, "")
    page.goto(f"{base}/#/{view}{query}")
    page.wait_for_function("() => document.getElementById('updated').dataset.state === 'ok'")
    if view == "overview":
        page.wait_for_selector(f"[data-card='blocks:{LONG_MEDIUM}']")
        wanted = {f"evicted: {text}" for text in PAYLOADS}
        wait_for(lambda: legend(page, "throughput"), lambda s: wanted <= set(s), "the legend")
        wanted = set(DIRECTIONS)
        wait_for(lambda: legend(page, "bandwidth"), lambda s: wanted <= set(s), "directions")
    elif view == "insight":
        wanted = set(PAYLOADS)
        wait_for(lambda: legend(page, "miss-reasons"), lambda s: wanted <= set(s), "the legend")
    elif view == "events":  # the feed shows what arrives once it is open

        def shown() -> bool:
            feed()
            return page.evaluate(
                "hash => [...document.querySelectorAll('#event-feed li')]"
                ".some(li => li.textContent.includes(hash))",
                "0x" + PAYLOADS[1].encode().hex(),
            )

        wait_for(shown, bool, "an event of the markup hash")
    elif view == "publishers":
        page.get_by_role("cell", name=f"hex:{HOSTILE_TOPIC.hex()}@0").first.wait_for()
    else:
        page.wait_for_selector("#blocks-table tbody tr[data-hash^='0x']")
        page.wait_for_selector("#block-result [data-missing]")
    assert page.evaluate(RAN) is None, "a payload ran"
    assert page.evaluate("() => document.images.length") == 1, "only the header's icon is an image"
    assert not page.query_selector("main script, main svg, main iframe")
    width = page.evaluate(WIDTH)
    assert width[0] <= width[1], f"the {view} view is {width[0]} px wide in a {width[1]} px window"
    assert page.evaluate(OVERFLOWING) == [], "text runs out of its box"


@pytest.mark.parametrize("value", ["__proto__", "constructor", "<b>6h</b>"])
def test_a_chart_range_the_page_does_not_offer_reads_as_its_default(
    page: sync_api.Page, hostile: Hostile, value: str
) -> None:
    """``range`` names a key of the page's own table of ranges: one every object inherits
    once read as a range of no resolution, and the history was asked for ``since=NaN`` in
    a loop with no pause."""
    base, _ = hostile
    page.goto(f"{base}/#/overview?range={value}")
    asked = page.wait_for_function(  # a first read of the history and an update
        "() => { const urls = performance.getEntriesByType('resource').map(e => e.name)"
        ".filter(url => url.includes('/api/v1/history')); return urls.length >= 2 && urls; }"
    ).json_value()
    assert page.eval_on_selector("#range", "select => select.value") == "15m"
    assert all("resolution=1" in url and "NaN" not in url for url in asked), asked


@pytest.mark.parametrize(
    ("fragment", "control", "shown"),
    [
        (f"events?medium={PAYLOADS[0]}&kind=<b>removed</b>", "#filter-event-medium", PAYLOADS[0]),
        (f"blocks?medium={PAYLOADS[2]}&publisher={BIDI}", "#filter-publisher", BIDI),
        (f"insight?publisher={PAYLOADS[1]}", "#insight-publisher", "e0@0"),
        (f"events?medium={'M' * 10_000}", "#filter-event-medium", "M" * 10_000),
    ],
)
def test_markup_in_the_url_fragment_is_a_filter_value_never_markup(
    page: sync_api.Page, hostile: Hostile, fragment: str, control: str, shown: str
) -> None:
    base, _ = hostile
    page.goto(f"{base}/#/{fragment}")
    page.wait_for_function(
        "([control, text]) => [...document.querySelectorAll(`${control} option`)]"
        ".some(o => o.textContent === text)",
        arg=[control, shown],
    )
    assert page.evaluate(RAN) is None
    assert not page.query_selector("main b, main img, main script")
    width = page.evaluate(WIDTH)
    assert width[0] <= width[1], f"{width[0]} px wide in a {width[1]} px window"


def test_a_block_search_for_markup_says_it_is_no_hash(
    page: sync_api.Page, hostile: Hostile, allowed_errors: list[str]
) -> None:
    allowed_errors.append("status of 400")  # the API's answer to a search that is no hash
    base, _ = hostile
    page.goto(f"{base}/#/blocks?q={PAYLOADS[0]}")
    page.wait_for_selector("#block-result [data-missing]")
    assert page.input_value("#block-query") == PAYLOADS[0]
    assert "is not a block hash" in page.text_content("#block-result")
    assert page.evaluate(RAN) is None


def test_the_pages_policy_stops_a_script_or_a_foreign_load_that_got_in_anyway(
    page: sync_api.Page, hostile: Hostile, allowed_errors: list[str]
) -> None:
    """A second wall behind escaping: markup put into the page by hand (as a bug in the page
    would) runs no inline script and loads nothing from another origin, and the page itself,
    all of it under that policy, logs no violation of it (the fixture fails on any)."""
    allowed_errors.append("Content Security Policy")  # the violations provoked here
    allowed_errors.append("status of 404")  # the injected image's own (same-origin) load
    base, _ = hostile
    page.add_init_script(
        "window.__violations = [];"
        "document.addEventListener('securitypolicyviolation',"
        " e => window.__violations.push(e.effectiveDirective));"
    )
    response = page.goto(f"{base}/#/overview")
    assert response is not None
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    page.wait_for_function("() => document.getElementById('view-overview').dataset.rendered")
    assert page.evaluate("() => window.__violations") == [], "the page broke its own policy"
    page.evaluate(
        """() => {
        const views = document.getElementById('views');
        views.insertAdjacentHTML('beforeend', '<img src=x onerror="window.__pwned=7">');
        const script = document.createElement('script');
        script.textContent = 'window.__pwned = 8';
        views.append(script, Object.assign(new Image(), { src: 'http://192.0.2.1/x.png' }));
    }"""
    )
    page.wait_for_function("() => window.__violations.length >= 3")
    assert page.evaluate(RAN) is None
    assert sorted(set(page.evaluate("() => window.__violations"))) == [
        "img-src",
        "script-src-attr",
        "script-src-elem",
    ]


@pytest.mark.parametrize(
    ("view", "picker", "name"),
    [
        ("blocks", "#filter-medium", LONG_MEDIUM),
        ("blocks", "#filter-publisher", f"hex:{HOSTILE_TOPIC.hex()}@0"),
        ("events", "#filter-event-medium", LONG_MEDIUM),
        ("insight", "#insight-publisher", f"hex:{HOSTILE_TOPIC.hex()}@0"),
    ],
)
def test_a_picker_holding_a_long_name_never_widens_a_narrow_phones_page(
    page: sync_api.Page, hostile: Hostile, view: str, picker: str, name: str
) -> None:
    """The pickers were at most 32em wide, 448 px: in a 360 px window one offering a
    32-character medium or a 68-character publisher pushed its view past the window's edge."""
    base, _ = hostile
    page.set_viewport_size({"width": 360, "height": 800})
    page.goto(f"{base}/#/{view}")
    page.wait_for_function(
        "([picker, name]) => [...document.querySelectorAll(`${picker} option`)]"
        ".some(o => o.textContent === name)",
        arg=[picker, name],
    )
    width = page.evaluate(WIDTH)
    assert width[0] <= width[1], f"the {view} view is {width[0]} px wide in a {width[1]} px window"
    right = page.eval_on_selector(picker, "select => select.getBoundingClientRect().right")
    assert right <= width[1], f"{picker} ends at {right} px in a {width[1]} px window"


LOOKALIKE_REASONS = ("a b", "a  b", "a   b")
"""Eviction reasons that differ only by the spaces between their words."""


def lookalike_stats(step: int) -> bytes:
    """A stats frame of stream e0@0 whose transfer direction and miss reason are blank ("",
    the first of each metric's label values) beside one named (and a miss reason of one
    space), and whose eviction reasons are ``LOOKALIKE_REASONS``, counting up by step."""
    counters = (
        [
            Sample(name="kvscope_transfer_bytes_total", labels={"direction": d}, value=1e3 * step)
            for d in ("", "gpu_to_cpu")
        ]
        + [
            Sample(name="kvscope_lookup_miss_blocks_total", labels={"reason": r}, value=float(step))
            for r in ("", " ", "cold")
        ]
        + [
            Sample(name="kvscope_evicted_blocks_total", labels={"reason": r}, value=float(step))
            for r in LOOKALIKE_REASONS
        ]
    )
    config = WorkerConfig(policy="lru", capacity_blocks=8, block_size=16)
    frame = StatsFrame(ts=time.time(), engine_id="e0", rank=0, config=config, counters=counters)
    return encode_stats_frame(frame)


LOOKALIKE_MEDIA = ("CPU", "cpu")
"""Two media whose names differ only by case."""


@pytest.fixture(scope="module")
def lookalikes() -> Iterator[str]:
    """A sidecar whose one peer (e0@0) holds a block on each of ``LOOKALIKE_MEDIA`` and whose
    history holds rates of the blank labels of ``lookalike_stats``: its URL."""
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"], port=0, token=None)  # env aside
    with Sidecar(settings) as sidecar, httpx.Client(base_url=sidecar.url) as http:
        bound = http.get("/api/v1/stats").json()["listener"]["endpoints"][0]
        peer = RawPublisher(connect=bound, topic=b"e0")
        try:
            steps = iter(range(10**6))

            def history() -> dict[str, Any]:
                step = next(steps)
                peer.pub.send_multipart([b"kvscope.stats", b"\0" * 8, lookalike_stats(step)])
                events = [
                    msgspec.msgpack.decode(kv_batch([i], medium))[1][0]
                    for i, medium in enumerate(LOOKALIKE_MEDIA)
                ]
                peer.send(step, msgspec.msgpack.encode([time.time(), events, 0]))
                return http.get("/api/v1/history", params={"resolution": 1}).json()

            def blank_rates(answer: dict[str, Any]) -> bool:
                points = {
                    (s["metric"], s["labels"].get("direction", s["labels"].get("reason"))): sum(
                        v is not None for v in s["values"]
                    )
                    for s in answer["series"]
                }
                media = http.get("/api/v1/stats").json()["blocks_by_medium"]
                return (
                    points.get(("transfer_bytes_per_s", ""), 0) >= 1
                    and points.get(("miss_blocks", ""), 0) >= 2
                    and all(points.get(("evictions", r), 0) >= 2 for r in LOOKALIKE_REASONS)
                    and set(LOOKALIKE_MEDIA) <= set(media)
                )

            wait_for(history, blank_rates, "the blank labels' rates", 60)
            yield sidecar.url
        finally:
            peer.close()


def test_media_whose_names_differ_only_by_case_head_cards_that_read_apart(
    page: sync_api.Page, lookalikes: str
) -> None:
    """A card's heading is set in capitals: the cards of media "CPU" and "cpu" both read
    "CPU BLOCKS". A medium's name keeps the case its peer wrote."""
    page.goto(f"{lookalikes}/#/overview")
    headings = page.locator("[data-card^='blocks:'] h2")
    sync_api.expect(headings).to_have_count(len(LOOKALIKE_MEDIA))
    shown = headings.evaluate_all("hs => hs.map(h => h.innerText)")  # as drawn, capitals and all
    assert len(set(shown)) == len(LOOKALIKE_MEDIA), shown
    assert {text.split(" ")[0] for text in shown} == set(LOOKALIKE_MEDIA), shown


@pytest.mark.parametrize(
    ("view", "chart", "names"),
    [
        ("overview", "bandwidth", ("(blank)", "GPU→CPU")),
        ("insight?publisher=e0@0", "miss-reasons", ("(blank)", '" "', "cold")),
    ],
)
def test_a_line_a_worker_left_unnamed_is_drawn_and_its_legend_button_named(
    page: sync_api.Page, lookalikes: str, view: str, chart: str, names: tuple[str, ...]
) -> None:
    """A label value may be empty: a chart whose first line was named "" stayed blank (no
    plot, and no note saying there was nothing to draw), and its legend's button for that
    line had no name to show or to be read by. One of white space alone is quoted, so that
    " " and "" read apart (both read "(blank)")."""
    page.goto(f"{lookalikes}/#/{view}")
    legend = page.locator(f"[data-chart='{chart}'] .u-legend")
    for name in names:
        sync_api.expect(legend.get_by_role("button", name=name, exact=True)).to_have_count(1)
    sync_api.expect(legend.get_by_role("button")).to_have_count(len(names))
    assert page.is_visible(f"[data-chart='{chart}'] .plot canvas")


STATS_CLOCKS = {"boot": 12_345.0, "past": -1e300}
"""Stats frames' times by a worker clock that counts from its boot, and by one far in the past
(any finite time is a frame's)."""
STATS_LAGS = {"boot": re.compile(r"^\d{1,3}(,\d{3})* d \d{1,2} h$"), "past": "over 100,000 d"}
"""The stats lag each reads as: days and hours, or past any clock's range, a bound."""


def stats_lags(
    page: sync_api.Page, sidecar: str, topic: bytes, stamps: Mapping[str, Callable[[], float]]
) -> dict[str, sync_api.Locator]:
    """Each worker of ``stamps`` (its name, and the time its stats frames carry) publishing
    on ``topic`` until the sidecar lists it: the stats lag cell of its row, the publishers
    view open."""
    with httpx.Client(base_url=sidecar) as http:
        bound = http.get("/api/v1/stats").json()["listener"]["endpoints"][0]
        peer = RawPublisher(connect=bound, topic=topic)
        config = WorkerConfig(policy="lru", capacity_blocks=8, block_size=16)

        def names() -> list[str]:
            for name, stamp in stamps.items():
                frame = StatsFrame(ts=stamp(), engine_id=name, rank=0, config=config)
                peer.pub.send_multipart([b"kvscope.stats", b"\0" * 8, encode_stats_frame(frame)])
            return [p["name"] for p in http.get("/api/v1/stats").json()["publishers"]]

        try:
            wait_for(names, lambda found: all(f"{n}@0" in found for n in stamps), "every worker")
        finally:
            peer.close()
    page.goto(f"{sidecar}/#/publishers")
    return {
        name: page.locator(f"#publishers tr[data-publisher='{name}@0'] td").nth(3)
        for name in stamps
    }


def test_stats_stamped_by_a_clock_far_behind_read_as_grouped_days(
    page: sync_api.Page, sidecar: str
) -> None:
    """The stats lag read "498884 h 9 min" for a clock counting from its worker's boot, and
    "2.7777777638888895e+296 h 40 min" for one in the far past: past a day, an age is days,
    grouped as every count on the page is, and hours; past 100,000 days (no clock's lag) a
    bound, where the day count took hundreds of digits."""
    stamps = {name: (lambda ts=ts: ts) for name, ts in STATS_CLOCKS.items()}
    for name, lag in stats_lags(page, sidecar, b"boot", stamps).items():
        sync_api.expect(lag).to_have_text(STATS_LAGS[name])


AHEAD_CLOCKS = {"ahead": 3 * 86_400.0, "future": 1e300}
"""How far ahead of the sidecar's clock a worker's stamps its stats frames."""
AHEAD_LAGS = {
    "ahead": r"^clock (2 d 23 h|3 d 0 h) ahead$",
    "future": r"^clock over 100,000 d ahead$",
}
"""The stats lag each reads as."""


def test_stats_stamped_by_a_clock_ahead_say_how_far_ahead(
    page: sync_api.Page, sidecar: str
) -> None:
    """A negative stats lag read "0 s", hiding the skew: it reads as the clock ahead."""
    stamps = {
        name: (lambda ahead=ahead: time.time() + ahead) for name, ahead in AHEAD_CLOCKS.items()
    }
    for name, lag in stats_lags(page, sidecar, b"ahead", stamps).items():
        sync_api.expect(lag).to_have_text(re.compile(AHEAD_LAGS[name]))


def test_reasons_that_differ_only_by_spaces_name_legend_lines_that_read_apart(
    page: sync_api.Page, lookalikes: str
) -> None:
    """A label value is printable ASCII, runs of spaces included: the legend folded each run
    into one space, and three eviction reasons read as one name three times."""
    page.goto(f"{lookalikes}/#/overview")
    wanted = {f"evicted: {reason}" for reason in LOOKALIKE_REASONS}
    wait_for(lambda: legend(page, "throughput"), lambda s: wanted <= set(s), "the reasons")
    shown = page.eval_on_selector_all(
        "[data-chart='throughput'] .u-legend th", "cells => cells.map(c => c.innerText.trim())"
    )
    assert wanted <= set(shown), shown  # as drawn, spaces and all
