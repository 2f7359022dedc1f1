"""The web page when the sidecar fails it: refusals, answers it cannot read, a restart.

A live sidecar serves the page; what it never sends itself (a 503 or 429 on a plain read,
a proxy's HTML error page, JSON of another shape) is put on the wire by the browser's own
network layer (Playwright's routing) for the one route a test names, every other request
reaching the sidecar. Time is Playwright's clock, moved by the test: a wait the page chose
is read off the clock it runs on, never measured. The page fixture fails a test on any
uncaught exception or console error the test did not expect.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import msgspec
import pytest
from playwright import sync_api

from app.server import Sidecar
from app.settings import SidecarSettings
from tests.e2e.conftest import CHROMIUM, WAIT_MS
from tests.support.polling import wait_for
from tests.support.ports import held_tcp_ports
from tests.support.zmq_peers import RawPublisher, stats_probe

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} absent")
WAIT_S = WAIT_MS / 1000

COUNT_READS = """
window.__reads = {};
window.__read = {};
const fetched = window.fetch;
window.fetch = async (url, ...rest) => {
  const path = String(url).split("?")[0];
  window.__reads[path] = (window.__reads[path] ?? 0) + 1;
  const response = await fetched(url, ...rest);
  const body = response.json.bind(response);
  response.json = () => body().finally(() => {
    window.__read[path] = (window.__read[path] ?? 0) + 1;
  });
  return response;
};
"""
"""An init script (Playwright's, outside the page's CSP) that counts the page's reads by path:
those asked (``__reads``), and those whose answer the page has read (``__read``; the page
handles it, and sets its timer for the next read, in the same turn of its loop)."""
STATS_READS = "() => window.__reads['api/v1/stats'] ?? 0"
STATS_ANSWERS = "() => window.__read['api/v1/stats'] ?? 0"
HEADER = (
    "() => { const e = document.getElementById('updated');"
    " return { ...e.dataset, text: e.textContent }; }"
)
"""The header's state (``state``, ``retryS``, ``failures``) and its words."""


def header(page: sync_api.Page) -> dict[str, str]:
    return page.evaluate(HEADER)


def open_counted(page: sync_api.Page, url: str) -> None:
    """``url`` on a paused clock: the page's timers fire only when the test moves it. An
    installed clock otherwise runs in real time too, and a retry due 1 s after the clock's
    move went out before the test had counted the reads."""
    page.add_init_script(COUNT_READS)
    start = time.time()
    page.clock.install(time=start)
    page.clock.pause_at(start + 3600)  # ahead of the clock by far: never in its past
    page.goto(url)


def answer_stats(page: sync_api.Page, answer: Callable[[sync_api.Route], None]) -> None:
    page.route("**/api/v1/stats", answer)


def test_a_refusal_with_retry_after_is_waited_out_then_the_page_recovers(
    page: sync_api.Page, sidecar: str, allowed_errors: list[str]
) -> None:
    allowed_errors.append("status of 503")
    refused = {"left": 1}

    def refuse_once(route: sync_api.Route) -> None:
        if refused["left"]:
            refused["left"] -= 1
            body = json.dumps({"detail": "busy <b>now</b>"})
            route.fulfill(status=503, headers={"Retry-After": "20"}, body=body)
        else:
            route.continue_()

    answer_stats(page, refuse_once)
    open_counted(page, sidecar)
    page.wait_for_function("() => document.getElementById('updated').dataset.state === 'error'")
    shown = header(page)
    assert shown["retryS"] == "20"
    assert shown["text"] == "stats unavailable: busy <b>now</b>; trying again in 20 s"
    page.clock.run_for(19_000)
    assert page.evaluate(STATS_READS) == 1, "asked again before the Retry-After"
    page.clock.run_for(1_500)
    page.wait_for_function("() => document.getElementById('updated').dataset.state === 'ok'")
    assert page.evaluate(STATS_READS) == 2


def test_failures_in_a_row_wait_twice_as_long_each_up_to_30_s(
    page: sync_api.Page, sidecar: str, allowed_errors: list[str]
) -> None:
    allowed_errors.append("status of 500")
    answer_stats(page, lambda route: route.fulfill(status=500, body="<h1>proxy error</h1>"))
    open_counted(page, sidecar)
    waits = []
    for failures in range(1, 7):
        page.wait_for_function(
            "n => document.getElementById('updated').dataset.failures === String(n)", arg=failures
        )
        assert page.evaluate(STATS_READS) == failures
        waits.append(int(header(page)["retryS"]))
        assert "HTTP 500" in header(page)["text"]
        if failures == 6:
            # Before the clock fires the next read: a read already in flight when the route
            # goes would still fail, after the clock moved, and wait 30 s more for good.
            page.unroute("**/api/v1/stats")
        page.clock.run_for(waits[-1] * 1000)
    assert waits == [2, 4, 8, 16, 30, 30]
    page.wait_for_function("() => document.getElementById('updated').dataset.state === 'ok'")


def odd_numbers(stats: dict[str, Any]) -> dict[str, Any]:
    """The sidecar's answer with numbers no sidecar sends: NaN as a string, a huge one, a
    negative one, nulls where numbers go, and an empty listener."""
    return {
        **stats,
        "hit_ratio": "NaN",
        "stores_per_s": 1e308,
        "lookup_blocks": -5,
        "tracked_blocks": None,
        "blocks_by_medium": {"CPU": 2**70, "GPU": -1},
        "evictions": {"capacity": None},
        "listener": {},
    }


NO_JSON = "stats unavailable: HTTP 200 with no JSON answer; trying again in 2 s"
UNREADABLE: dict[str, Callable[[dict[str, Any]], tuple[str, str | None]]] = {
    "cut short": lambda stats: (json.dumps(stats)[:40], NO_JSON),
    "a proxy's page": lambda stats: ("<html>bad gateway</html>", NO_JSON),
    "null": lambda stats: ("null", "stats not shown: "),
    "an empty object": lambda stats: ("{}", "stats not shown: "),
    # Shown as the views can (a count of "x" reads NaN), or named: either way, nothing throws.
    "fields of other types": lambda stats: (json.dumps(dict.fromkeys(stats, "x")), None),
    "odd numbers": lambda stats: (json.dumps(odd_numbers(stats)), None),
}
"""Answers the views cannot read as they are, and what the header says of each (None: it may
show the answer or name the problem)."""


@pytest.mark.parametrize("view", ["overview", "blocks", "publishers", "events"])
@pytest.mark.parametrize("shape", list(UNREADABLE))
def test_an_answer_a_view_cannot_read_is_named_in_the_header_and_nothing_throws(
    page: sync_api.Page, sidecar: str, view: str, shape: str
) -> None:
    body, said = UNREADABLE[shape](httpx.get(f"{sidecar}/api/v1/stats").json())
    answer_stats(
        page,
        lambda route: route.fulfill(status=200, content_type="application/json", body=body),
    )
    open_counted(page, f"{sidecar}/#/{view}")
    page.wait_for_function(
        "() => ['ok', 'error'].includes(document.getElementById('updated').dataset.state)"
    )
    shown = header(page)
    if said is not None:
        assert shown["state"] == "error" and shown["text"].startswith(said), shown
    page.clock.run_for(max(1, int(shown["retryS"] or 0)) * 1000)
    # The next answer, read alike, and read before the route goes: one still in flight then
    # would set the page's next read after the clock moved, on a clock that no longer moves.
    page.wait_for_function(f"() => ({STATS_ANSWERS})() >= 2")
    page.unroute("**/api/v1/stats")
    page.clock.run_for(30_000)
    page.wait_for_function("() => document.getElementById('updated').dataset.state === 'ok'")


def test_a_session_that_ends_is_named_with_what_to_do(
    page: sync_api.Page, allowed_errors: list[str]
) -> None:
    """The cookie gone (expired, or the sidecar's token changed): the sidecar's own 401."""
    allowed_errors.append("status of 401")
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"], port=0, token="t0ken")  # env aside
    with Sidecar(settings) as running:
        page.goto(f"{running.url}/?token=t0ken")
        page.wait_for_function("() => document.getElementById('updated').dataset.state === 'ok'")
        page.context.clear_cookies()
        page.wait_for_function("() => document.getElementById('updated').dataset.state === 'error'")
        assert "open the page as /?token=TOKEN again" in header(page)["text"]


def _restartable(port: int) -> SidecarSettings:
    """A sidecar listening for publishers, served on ``port`` (held for the test, so that a
    second sidecar binds it again), with no token whatever the environment holds."""
    return SidecarSettings(listen=["tcp://127.0.0.1:*"], port=port, token=None)


def test_a_sidecar_that_restarts_is_waited_for_and_read_again(
    page: sync_api.Page, allowed_errors: list[str]
) -> None:
    """Down, then up again with every counter back at zero, on the same port."""
    allowed_errors.append("net::ERR_")  # the refused connections, as the browser reports them

    page.add_init_script(COUNT_READS)
    page.clock.install()
    # Held for the whole test (tests/support/ports.py): freed by the first sidecar, the port
    # could be taken (another test's bind, a connection's local end) before the second bound it.
    with held_tcp_ports() as port:
        with Sidecar(_restartable(port)) as first:
            page.goto(f"{first.url}/#/events")
            page.wait_for_function(
                "() => document.getElementById('updated').dataset.state === 'ok'"
            )
            page.wait_for_function(
                "() => document.getElementById('feed-state').textContent.startsWith('live')"
            )
        page.clock.run_for(1_000)
        page.wait_for_function("() => document.getElementById('updated').dataset.state === 'error'")
        page.wait_for_function(
            "() => document.getElementById('feed-state').textContent.startsWith('reconnecting')"
        )
        with Sidecar(_restartable(port)):
            # The clock runs in real time here too (the feed draws on animation frames): a retry
            # may have gone out as the sidecar came up, and one failing just before sets its
            # next after any move. Moved by the longest wait until the page has read again.
            wait_for(
                lambda: moved(page, "() => document.getElementById('updated').dataset.state"),
                lambda state: state == "ok", "the page reads the sidecar again", WAIT_S,
            )  # fmt: skip
            wait_for(  # the stream's own retry, or the page's after a refusal
                lambda: moved(page, "() => document.getElementById('feed-state').textContent"),
                lambda text: text.startswith("live"), "the feed is live again", WAIT_S,
            )  # fmt: skip


def moved(page: sync_api.Page, read: str) -> Any:
    """``read`` after moving the page's clock by the longest wait it sets (30 s)."""
    page.clock.run_for(30_000)
    return page.evaluate(read)


def test_messages_in_the_feed_that_are_not_events_are_counted_and_left_out(
    page: sync_api.Page, sidecar: str
) -> None:
    event = {"id": 7, "kind": "stored", "medium": "CPU", "block_hashes": ["1"], "block_count": 1}
    stream = "".join(
        f"data: {data}\n\n"
        for data in (
            "{",
            "null",
            json.dumps({**event, "id": "7"}),
            json.dumps({"id": 8}),
            json.dumps(event),
        )
    )
    page.route(
        "**/api/v1/events/stream",
        lambda route: route.fulfill(status=200, content_type="text/event-stream", body=stream),
    )
    page.goto(f"{sidecar}/#/events")
    page.wait_for_function("() => document.querySelector('#event-feed li[data-id=\"7\"]')")
    page.wait_for_function(
        "() => Number(document.getElementById('event-feed').dataset.malformed) >= 4"
    )
    assert "messages left out: not events" in page.text_content("#feed-state")


def test_a_history_the_sidecar_refuses_is_named_over_the_charts_until_it_answers(
    page: sync_api.Page, sidecar: str, allowed_errors: list[str]
) -> None:
    allowed_errors.append("status of 429")
    page.route(
        "**/api/v1/history*",
        lambda route: route.fulfill(
            status=429, headers={"Retry-After": "12"}, body='{"detail": "too many requests"}'
        ),
    )
    open_counted(page, sidecar)
    state = page.locator("#history-state")
    sync_api.expect(state).to_have_text(
        "history unavailable: too many requests; trying again in 12 s"
    )
    page.clock.run_for(11_000)
    assert page.evaluate("() => window.__reads['api/v1/history']") == 1
    page.unroute("**/api/v1/history*")
    page.clock.run_for(1_500)
    sync_api.expect(state).to_have_text("")


def test_the_insight_view_stops_reading_when_hidden_with_a_read_in_flight(
    page: sync_api.Page, sidecar: str
) -> None:
    held: list[sync_api.Route] = []
    page.route("**/api/v1/insight", lambda route: held.append(route))  # answered once hidden
    open_counted(page, f"{sidecar}/#/insight")
    page.get_by_role("tab", name="Overview").click()
    page.wait_for_function("() => !document.getElementById('view-overview').hidden")

    def routed() -> list[sync_api.Route]:
        page.evaluate("() => 0")  # a call into Playwright, which hands it the routed requests
        return held

    wait_for(routed, bool, "the insight read held in flight")
    held[0].continue_()
    page.wait_for_function("() => document.getElementById('insight-status').textContent")
    page.clock.run_for(60_000)
    assert page.evaluate("() => window.__reads['api/v1/insight']") == 1


def test_the_insight_view_shows_nothing_of_a_publisher_the_restarted_sidecar_has_not_met(
    page: sync_api.Page, allowed_errors: list[str]
) -> None:
    """Up again with no publisher yet, the sidecar lists none: the view said "No publisher
    yet." under the picker, the headline and the facts of the one the sidecar before knew."""
    allowed_errors.append("net::ERR_")  # the refused connections, as the browser reports them
    facts = "#insight-facts dd"

    with held_tcp_ports() as port:
        with Sidecar(_restartable(port)) as first, httpx.Client(base_url=first.url) as http:
            bound = http.get("/api/v1/stats").json()["listener"]["endpoints"][0]
            peer = RawPublisher(connect=bound, topic=b"e0")
            try:
                wait_for(
                    lambda: peer.pub.send_multipart([b"kvscope.stats", b"\0" * 8, stats_probe()])
                    or http.get("/api/v1/insight").json()["publishers"],
                    bool, "the publisher listed", WAIT_S,
                )  # fmt: skip
            finally:
                peer.close()
            page.goto(f"{first.url}/#/insight")
            sync_api.expect(page.locator("#insight-publisher option")).to_have_text(["e0@0"])
            sync_api.expect(page.locator(facts).first).to_be_visible()
        with Sidecar(_restartable(port)):
            sync_api.expect(page.locator("#insight-status")).to_have_text("No publisher yet.")
            sync_api.expect(page.locator("#insight-publisher option")).to_have_count(0)
            sync_api.expect(page.locator(facts)).to_have_count(0)
            sync_api.expect(page.locator("#insight-efficiency")).to_have_text("\u2013")


def test_the_overview_drops_the_card_of_a_medium_the_restarted_sidecar_does_not_report(
    page: sync_api.Page, allowed_errors: list[str]
) -> None:
    """Up again with no block indexed, the sidecar reports no medium: the CPU card kept the
    count the sidecar before it gave, as though the blocks were still held."""
    allowed_errors.append("net::ERR_")  # the refused connections, as the browser reports them
    stored = {
        "type": "BlockStored",
        "block_hashes": [1, 2],
        "parent_block_hash": None,
        "token_ids": [],
        "block_size": 16,
        "lora_id": None,
        "medium": "CPU",
    }

    with held_tcp_ports() as port:
        with Sidecar(_restartable(port)) as first, httpx.Client(base_url=first.url) as http:
            bound = http.get("/api/v1/stats").json()["listener"]["endpoints"][0]
            peer = RawPublisher(connect=bound, topic=b"e0")
            sent = iter(range(10**6))
            try:
                wait_for(
                    lambda: peer.send(next(sent), msgspec.msgpack.encode([1.0, [stored], 0]))
                    or http.get("/api/v1/stats").json()["blocks_by_medium"],
                    lambda media: media.get("CPU") == 2, "two blocks on the CPU", WAIT_S,
                )  # fmt: skip
            finally:
                peer.close()
            page.goto(f"{first.url}/#/overview")
            card = page.locator("[data-card='blocks:CPU'] .big")
            sync_api.expect(card).to_have_text("2 blocks")
        with Sidecar(_restartable(port)):
            sync_api.expect(card).to_have_count(0)
            sync_api.expect(page.locator("#copies-note")).to_be_hidden()
