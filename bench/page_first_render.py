"""The web page's first render with a million blocks indexed, and its requests beside the API's p99.

Run from the repository root: .venv/bin/python -m bench.page_first_render [--opens N]

As bench/sidecar_latency.py sets it up (and with its code): a feeder process
drives a real EventPublisher, ``kvscope serve --port 0`` follows it, the
feeder stores ``BLOCKS`` distinct blocks and then churns at
``--events-per-s`` while publishing a worker's stats frame every second.
Once the sidecar tracks every block, Debian's headless Chromium (driven by
Playwright, as tests/e2e/test_web_page.py drives it) opens the page
``--opens`` times, each in a fresh context (cold cache, new connections),
and reads the page's own ``kvscope:first-render`` performance mark: the time
from navigation start until the overview has drawn its cards from
/api/v1/stats and its charts from /api/v1/history. The browser times every
request the page made (Resource Timing: request sent to response end): those
of the load (the HTML, its modules and uPlot, the first stats and history,
all in flight together, so each one waits behind the others), and the
``--polls`` API requests it makes after the first render (stats and history
each second, one at a time: what the page costs the sidecar as it runs).
Meanwhile a second client in this process times the same URLs over its own
kept-alive connection, one after another, for as long as the page is open:
the API's own p99 for each beside the page, under the same load (the
browser's own CPU included). After the browser closes it times them again
alone, ``--rounds`` times each; both p99s are printed, and the page is held
against the one beside it. Every response carries the sidecar's own time
(``Server-Timing``), so the page's requests are also held against the API's
in the server's measure, where the browser's queueing and the machine's
other work do not count.

JSON lines: one for the first render (every open, the median and the worst,
and the worst over the 1 s bound); one per kind of request the page polls
with (its p99 and worst beside the API's p99); one per request of the load
(its worst beside the API's p99 for it); and the JavaScript the page shipped
(bytes, against the 200 KB budget). Figures, not
assertions: nothing here fails on time.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from bench.sidecar_latency import BLOCKS, indexed_sidecar, percentiles
from bench.tooling.common import emit

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Request

CHROMIUM = Path("/usr/bin/chromium")
FIRST_RENDER_BOUND_MS = 1000.0
JS_BUDGET_BYTES = 200 * 1024
RENDERED = "() => document.getElementById('view-overview')?.dataset.rendered === 'true'"
FIRST_RENDER = "() => performance.getEntriesByName('kvscope:first-render')[0].startTime"
OPEN_TIMEOUT_MS = 60_000


@dataclass
class PageOpen:
    """One cold open of the page, as its browser saw it."""

    first_render_ms: float
    load: dict[str, float]
    """Each request made until the first render (ms, by path and query)."""
    polls: dict[str, list[float]]
    """The API requests made after it, each second, by kind: ms each, and (``urls``) the
    last URL of each kind, for the API's own timing."""
    urls: dict[str, str]
    server: dict[str, list[float]]
    """The sidecar's own time (its ``Server-Timing``) for every request above, by load
    target and by poll kind."""
    script_bytes: int


def target_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def open_page(browser: Browser, url: str, polls: int) -> PageOpen:
    """Open the page cold, wait for its first render, then for ``polls`` more API requests."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    finished: list[Request] = []
    page.on("requestfinished", lambda request: finished.append(request))
    page.goto(url)
    page.wait_for_function(RENDERED, timeout=OPEN_TIMEOUT_MS)
    first_render = float(page.evaluate(FIRST_RENDER))
    at_render = len(finished)
    for _ in range(polls):
        with page.expect_request_finished(lambda r: "/api/v1/" in r.url):
            pass  # the page's own timer makes the request
    took = [
        (target_of(r.url), r.timing["responseEnd"] - r.timing["requestStart"]) for r in finished
    ]
    server: dict[str, list[float]] = defaultdict(list)
    for position, request in enumerate(finished):
        response = request.response()
        if response is not None:
            key = took[position][0] if position < at_render else poll_kind(took[position][0])
            server[key].append(server_ms(response.headers))
    by_kind: dict[str, list[float]] = defaultdict(list)
    urls: dict[str, str] = {}
    for target, ms in took[at_render:]:
        kind = poll_kind(target)
        by_kind[kind].append(ms)
        urls[kind] = target
    scripts = sum(r.sizes()["responseBodySize"] for r in finished[:at_render] if ".js" in r.url)
    context.close()
    return PageOpen(first_render, dict(took[:at_render]), by_kind, urls, server, scripts)


def poll_kind(target: str) -> str:
    """The page's incremental history reads differ by ``since``: one kind for all of them."""
    return target.split("?")[0] + ("?since=…" if "since=" in target else "")


def server_ms(headers: Mapping[str, str]) -> float:
    """The sidecar's own time for a response, from its ``server-timing: app;dur=MS``."""
    return float(headers["server-timing"].partition("dur=")[2])


def page_targets() -> list[str]:
    """What the page loads and polls, known before it opens (for the client beside it)."""
    from app.api.page import STATIC_DIR, page_assets

    names = sorted(page_assets(STATIC_DIR))
    static = [f"/static/{name}" for name in names if not name.endswith("LICENSE")]
    return ["/", *static, "/api/v1/stats", "/api/v1/history?resolution=1"]


class Timings:
    """Milliseconds per request by target: as the client saw them, and the sidecar's own."""

    def __init__(self) -> None:
        self.client: dict[str, list[float]] = defaultdict(list)
        self.server: dict[str, list[float]] = defaultdict(list)

    def get(
        self, http: httpx.Client, target: str, key: str | None = None, **params: object
    ) -> None:
        began = time.perf_counter()
        response = http.get(target, params=params or None)
        self.client[key or target].append((time.perf_counter() - began) * 1e3)
        self.server[key or target].append(server_ms(response.headers))


@contextmanager
def timed_beside(base_url: str, targets: list[str]) -> Iterator[Timings]:
    """Time ``targets`` in turn on a thread of this process until the block ends."""
    measured = Timings()
    stop = threading.Event()

    def run() -> None:
        with httpx.Client(base_url=base_url, timeout=30) as http:
            while not stop.is_set():
                for target in targets:
                    measured.get(http, target)
                since = time.time() - 2
                measured.get(http, "/api/v1/history", HISTORY_SINCE, resolution=1, since=since)

    thread = threading.Thread(target=run, name="beside-the-page", daemon=True)
    thread.start()
    try:
        yield measured
    finally:
        stop.set()
        thread.join()


HISTORY_SINCE = "/api/v1/history?since=\u2026"
"""The key the page's incremental history polls are filed under."""


def api_timings(http: httpx.Client, targets: list[str], rounds: int) -> dict[str, list[float]]:
    """Milliseconds per request, each of ``targets`` once per round, in turn."""
    measured = Timings()
    for _ in range(rounds):
        for target in targets:
            measured.get(http, target)
    return measured.client


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opens", type=int, default=5, help="cold page opens")
    parser.add_argument("--polls", type=int, default=40, help="API requests after each render")
    parser.add_argument("--rounds", type=int, default=200, help="API requests per page request")
    parser.add_argument("--events-per-s", type=int, default=20_000, help="churn, block events/s")
    args = parser.parse_args()
    if args.rounds < 100:
        parser.error(f"--rounds must be at least 100 for a p99 to mean anything, got {args.rounds}")
    if not CHROMIUM.exists():
        parser.error(f"Debian's chromium is needed ({CHROMIUM} absent)")
    with indexed_sidecar(args.events_per_s) as (http, _, stats), sync_playwright() as playwright:
        url = str(http.base_url).rstrip("/")
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        with timed_beside(url, page_targets()) as beside:
            opens = [open_page(browser, f"{url}/", args.polls) for _ in range(args.opens)]
        browser.close()
        worst_load: dict[str, float] = defaultdict(float)
        polled: dict[str, list[float]] = defaultdict(list)
        poll_urls: dict[str, str] = {}
        page_server: dict[str, list[float]] = defaultdict(list)
        for opened in opens:
            for key, times in opened.server.items():
                page_server[key] += times
            for target, ms in opened.load.items():
                worst_load[target] = max(worst_load[target], ms)
            for kind, times in opened.polls.items():
                polled[kind] += times
            poll_urls |= opened.urls
        targets = sorted({*worst_load, *poll_urls.values()})
        api_timings(http, targets, 10)  # untimed: each route's first call
        measured = api_timings(http, targets, args.rounds)
        tracked = http.get("/api/v1/stats").json()["tracked_blocks"]
    renders = [opened.first_render_ms for opened in opens]
    emit(
        {
            "bench": "page_first_render", "measure": "first_render_ms",
            "opens": [round(ms, 1) for ms in renders], "median_ms": round(median(renders), 1),
            "max_ms": round(max(renders), 1), "bound_ms": FIRST_RENDER_BOUND_MS,
            "max_over_bound": round(max(renders) / FIRST_RENDER_BOUND_MS, 3),
            "tracked_blocks": [stats["tracked_blocks"], tracked],
            "within_bound": max(renders) < FIRST_RENDER_BOUND_MS,
        }
    )  # fmt: skip
    for key, times in sorted(page_server.items()):
        api_p99 = _beside_p99(beside.server, key, float("nan"))
        page_p99 = percentiles(times)[1] if len(times) >= 2 else times[0]
        emit(
            {
                "bench": "page_first_render", "measure": "server_ms", "request": key,
                "requests": len(times), "page_p99_ms": round(page_p99, 3),
                "page_max_ms": round(max(times), 3), "api_p99_ms": round(api_p99, 3),
                "within_p99": page_p99 <= api_p99,
            }
        )  # fmt: skip
    for kind, times in sorted(polled.items()):
        alone = percentiles(measured[poll_urls[kind]])[1]
        api_p99 = _beside_p99(beside.client, kind, alone)
        page_p99 = percentiles(times)[1] if len(times) >= 2 else times[0]
        emit(
            {
                "bench": "page_first_render", "measure": "poll_request_ms", "request": kind,
                "requests": len(times), "page_p99_ms": round(page_p99, 2),
                "page_max_ms": round(max(times), 2), "api_p99_ms": round(api_p99, 2),
                "api_p99_alone_ms": round(alone, 2),
                "page_p99_over_api_p99": round(page_p99 / api_p99, 2),
                "within_p99": page_p99 <= api_p99,
            }
        )  # fmt: skip
    for target in sorted(worst_load):
        alone = percentiles(measured[target])[1]
        api_p99 = _beside_p99(beside.client, target, alone)
        emit(
            {
                "bench": "page_first_render", "measure": "load_request_ms", "request": target,
                "page_max_ms": round(worst_load[target], 2), "api_p99_ms": round(api_p99, 2),
                "api_p99_alone_ms": round(alone, 2),
                "page_over_api_p99": round(worst_load[target] / api_p99, 2),
                "within_p99": worst_load[target] <= api_p99,
            }
        )  # fmt: skip
    script_bytes = max(opened.script_bytes for opened in opens)
    emit(
        {
            "bench": "page_first_render", "measure": "javascript_bytes", "bytes": script_bytes,
            "budget_bytes": JS_BUDGET_BYTES,
            "of_budget": round(script_bytes / JS_BUDGET_BYTES, 3), "blocks": BLOCKS,
        }
    )  # fmt: skip


def _beside_p99(beside: dict[str, list[float]], target: str, alone: float) -> float:
    """The p99 of ``target`` timed beside the page (its time alone when too few were)."""
    times = beside.get(target, [])
    return percentiles(times)[1] if len(times) >= 100 else alone


if __name__ == "__main__":
    main()
