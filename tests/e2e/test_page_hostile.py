"""The web page against what its peers and its URL may hold: markup, scripts, long strings.

Much of what the page shows comes from workers on the network (stream names, label
values, block hashes) or from its own URL (the fragment's parameters). Here a raw
publisher sends a live sidecar frames whose every free-text field holds markup, script
and 128-character unbroken strings, and a real Chromium opens each view: nothing runs
(a flag the payloads would set stays unset), the text shows as text, and no element
stretches the page past its window. Each wait is a condition, never a duration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
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

RAN = "() => window.__pwned ?? null"
"""What a payload that ran would have left behind."""
PAYLOADS = (
    '<img src=x onerror="window.__pwned=1">',
    "</script><script>window.__pwned=2</script>",
    "javascript:window.__pwned=3",
    "W" * 128,  # a label value's longest: one unbroken word
)
HOSTILE_TOPIC = b'<svg onload="window.__pwned=4">'
WIDTH = "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
VIEWS = ("overview", "blocks", "publishers", "events", "insight")


def stats_payload(step: int) -> bytes:
    """A stats frame whose eviction and miss reasons are the payloads, counting up by step."""
    counters = [
        Sample(name=name, labels={"reason": text}, value=float(step * (i + 1)))
        for name in ("kvscope_evicted_blocks_total", "kvscope_lookup_miss_blocks_total")
        for i, text in enumerate(PAYLOADS)
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
def hostile() -> Iterator[tuple[str, Callable[[], None]]]:
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
                worker.send(step, kv_batch([step, PAYLOADS[1].encode()]))
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
                names = {p["name"] for p in http.get("/api/v1/stats").json()["publishers"]}
                return reasons >= set(PAYLOADS) and f"hex:{HOSTILE_TOPIC.hex()}@0" in names

            wait_for(history, holds_every_payload, "two points of every payload's series", 60)
            # Refused where it enters: a medium that is markup, and one with a bidi override.
            for medium in (PAYLOADS[0], "CPU\u202e"):
                worker.send(next(steps), kv_batch([1], medium))
            wait_for(
                lambda: http.get("/api/v1/stats").json()["publishers"],
                lambda found: any(p["name"] == "e0@0" and p["malformed"] >= 2 for p in found),
                "the markup media refused",
            )
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
    page: sync_api.Page, hostile: tuple[str, Callable[[], None]], view: str
) -> None:
    base, feed = hostile
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(f"{base}/#/{view}")
    page.wait_for_function("() => document.getElementById('updated').dataset.state === 'ok'")
    if view == "overview":
        wanted = {f"evicted: {text}" for text in PAYLOADS}
        wait_for(lambda: legend(page, "throughput"), lambda s: wanted <= set(s), "the legend")
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
    assert page.evaluate(RAN) is None, "a payload ran"
    assert page.evaluate("() => document.images.length") == 1, "only the header's icon is an image"
    assert not page.query_selector("main script, main svg, main iframe")
    width = page.evaluate(WIDTH)
    assert width[0] <= width[1], f"the {view} view is {width[0]} px wide in a {width[1]} px window"
