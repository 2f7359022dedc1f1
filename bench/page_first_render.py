"""The web page's first render with a million blocks indexed, and its requests beside the API's p99.

Run from the repository root: .venv/bin/python -m bench.page_first_render [--opens N]

As bench/sidecar_latency.py sets it up (and with its code): a feeder process
drives a real EventPublisher, ``kvscope serve --port 0`` follows it, the
feeder stores ``BLOCKS`` distinct blocks and then churns at
``--events-per-s`` while publishing a worker's stats frame every second.
The sidecar and the feeder get half the CPUs, the browser and this process
the other half (``split_cpus``). Once the sidecar tracks every block,
Debian's headless Chromium (driven by
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
Meanwhile a second client in this process requests the same URLs over its
own kept-alive connection for as long as the page is open: the API's own p99
for each, beside the page, under the same load (the browser's CPU included).
It sends at random (Poisson) instants, ``BESIDE_MEAN_GAP_S`` apart on
average, whatever the answers: a client that sends each request when the
previous one is answered puts one request into each of the sidecar's busy
moments where a page on its own clock puts its share of all of them
(coordinated omission), and would flatter the API. After the browser closes,
the API's routes are timed again alone, ``--rounds`` times each, the same way.

Every response carries the sidecar's own time (``Server-Timing``): from the
request's arrival at the app to its response. That is the budget's measure:
a page request is held against the API's p99 for the same route in the
sidecar's time, where what the page asks for counts and the browser's own
work does not. No p99 holds every request under it (a hundredth of the
API's own are over), so the page's requests over it are counted, and the
route is slower than the API's only if equally fast requests would be over
that often less than once in a hundred (``over_p99_by_chance``). The
client-side times (the browser's Resource Timing, the client's own clock)
are printed beside it.

JSON lines: one for the first render (every open, the median and the worst,
and the worst over the 1 s bound); one per route the page requested, at load
and polling (its files count as one route; in the sidecar's time and the
client's: the page's p99 and worst, the API's p99 beside it, and alone for
API routes); and the
JavaScript the page shipped (bytes, against the 200 KB budget). Figures,
not assertions: nothing here fails on time.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from math import comb
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from bench.sidecar_latency import BLOCKS, indexed_sidecar, percentiles
from bench.tooling.common import count, emit

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Request

CHROMIUM = Path("/usr/bin/chromium")
FIRST_RENDER_BOUND_MS = 1000.0
JS_BUDGET_BYTES = 200 * 1024
RENDERED = "() => document.getElementById('view-overview')?.dataset.rendered === 'true'"
FIRST_RENDER = "() => performance.getEntriesByName('kvscope:first-render')[0].startTime"
OPEN_TIMEOUT_MS = 60_000
HISTORY_SINCE = "/api/v1/history?since=\u2026"
SIGNIFICANCE = 0.01
"""A route's page requests are slower than the API's when so many of them are over its
p99 that equally fast requests would be that many less often than this."""
BESIDE_MEAN_GAP_S = 0.01
"""Mean time between the API client's requests; random, so they land anywhere in a second."""


@dataclass
class PageOpen:
    """One cold open of the page, as its browser saw it."""

    first_render_ms: float
    polled: set[str]
    """The routes requested after the first render: the page's polls."""
    script_bytes: int


def request_kind(url: str) -> str:
    """Path and query; the page's incremental history reads differ by ``since``, and are one
    kind, ``HISTORY_SINCE``."""
    parts = urlsplit(url)
    if parts.path == "/api/v1/history" and "since=" in parts.query:
        return HISTORY_SINCE
    return parts.path + (f"?{parts.query}" if parts.query else "")


def route(kind: str) -> str:
    """The page's files are one route, each answered from memory the same way: held against
    the API as one kind, so that each has enough requests for a p99."""
    return "/static/\u2026" if kind.startswith("/static/") else kind


def open_page(browser: Browser, url: str, polls: int, timings: Timings) -> PageOpen:
    """Open the page cold, wait for its first render, then for ``polls`` more API requests;
    every request it made goes into ``timings`` (ms as the browser timed it)."""
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
    for request in finished:
        response = request.response()
        timings.add(
            request_kind(request.url),
            request.timing["responseEnd"] - request.timing["requestStart"],
            None if response is None else server_ms(response.headers),
        )
    polled = {route(request_kind(request.url)) for request in finished[at_render:]}
    scripts = sum(r.sizes()["responseBodySize"] for r in finished[:at_render] if ".js" in r.url)
    context.close()
    return PageOpen(first_render, polled, scripts)


def server_ms(headers: Mapping[str, str]) -> float:
    """The sidecar's own time for a response, from its ``server-timing: app;dur=MS``."""
    return float(headers["server-timing"].partition("dur=")[2])


def page_targets() -> list[str]:
    """What the page loads and polls, known before it opens (for the client beside it)."""
    from app.api.page import STATIC_DIR, page_assets

    names = sorted(page_assets(STATIC_DIR))
    static = [f"/static/{name}" for name in names if not name.endswith("LICENSE")]
    return ["/", *static, "/api/v1/stats", "/api/v1/history?resolution=1", HISTORY_SINCE]


class Timings:
    """Milliseconds per request by route (``route``): as the client saw them, and the
    sidecar's own (its ``Server-Timing``)."""

    def __init__(self) -> None:
        self.client: dict[str, list[float]] = defaultdict(list)
        self.server: dict[str, list[float]] = defaultdict(list)

    def add(self, kind: str, client_ms: float, server_ms: float | None) -> None:
        self.client[route(kind)].append(client_ms)
        if server_ms is not None:
            self.server[route(kind)].append(server_ms)

    def get(self, http: httpx.Client, kind: str) -> None:
        """One request of ``kind``; the incremental history read asks for the last 2 s."""
        if kind == HISTORY_SINCE:
            params = {"since": time.time() - 2, "resolution": 1}
            target = "/api/v1/history"
        else:
            params, target = None, kind
        began = time.perf_counter()
        response = http.get(target, params=params)
        took = (time.perf_counter() - began) * 1e3
        response.raise_for_status()
        self.add(kind, took, server_ms(response.headers))


def paced(
    base_url: str, kinds: list[str], measured: Timings, stop: threading.Event, rounds: int | None
) -> None:
    """Each of ``kinds`` once per round, in a random order, at random (Poisson) instants
    ``BESIDE_MEAN_GAP_S`` apart on average, into ``measured``; ``rounds`` rounds, or until
    ``stop``. Each route's first call is not timed."""
    rng = random.Random(0)
    with httpx.Client(base_url=base_url, timeout=30) as http:
        for kind in kinds:
            Timings().get(http, kind)
        done = 0
        while not stop.is_set() and (rounds is None or done < rounds):
            for kind in rng.sample(kinds, len(kinds)):
                if stop.wait(rng.expovariate(1 / BESIDE_MEAN_GAP_S)):
                    break
                measured.get(http, kind)
            done += 1


@contextmanager
def timed_beside(base_url: str, kinds: list[str]) -> Iterator[Timings]:
    """``paced`` requests of ``kinds`` on a thread of this process until the block ends."""
    measured, stop = Timings(), threading.Event()
    thread = threading.Thread(
        target=paced, args=(base_url, kinds, measured, stop, None), name="beside-the-page",
        daemon=True,
    )  # fmt: skip
    thread.start()
    try:
        yield measured
    finally:
        stop.set()
        thread.join()


def split_cpus() -> tuple[set[int], set[int]] | None:
    """The CPUs for the sidecar and the feeder, and those for the browser and the client
    beside the page; None on one CPU.

    Deployed, the browser runs on the operator's machine, not beside the sidecar: on a
    small machine sharing every CPU, the browser's bursts of parsing and drawing at each
    load and poll would take the sidecar's CPU, and its requests' times would measure the
    machine, not the sidecar. The feeder stands for the worker, which does run beside it.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def over_p99_by_chance(over: int, requests: int) -> float:
    """How likely at least ``over`` of ``requests`` are above the API's p99 when they are
    as fast as the API's: one in a hundred of the API's own are, so the count is binomial."""
    return sum(
        comb(requests, k) * 0.01**k * 0.99 ** (requests - k) for k in range(over, requests + 1)
    )


def p99(samples: list[float]) -> float:
    return percentiles(samples)[1] if len(samples) >= 2 else samples[0]


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--opens", type=count, default=5, help="cold page opens")
    parser.add_argument("--polls", type=count, default=40, help="API requests after each render")
    parser.add_argument("--rounds", type=count, default=200, help="requests per API route alone")
    parser.add_argument("--events-per-s", type=count, default=20_000, help="churn, block events/s")
    args = parser.parse_args()
    if args.rounds < 100:
        parser.error(f"--rounds must be at least 100 for a p99 to mean anything, got {args.rounds}")
    if not CHROMIUM.exists():
        parser.error(f"Debian's chromium is needed ({CHROMIUM} absent)")
    kinds = page_targets()
    split = split_cpus()
    if split is not None:
        os.sched_setaffinity(0, split[0])  # the feeder and the sidecar start from here
    with indexed_sidecar(args.events_per_s) as (http, _, stats):
        if split is not None:
            os.sched_setaffinity(0, split[1])  # and Playwright, Chromium and the client
        with sync_playwright() as playwright:
            url = str(http.base_url).rstrip("/")
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=["--no-sandbox"]
            )
            page = Timings()
            with timed_beside(url, kinds) as api:
                opens = [open_page(browser, f"{url}/", args.polls, page) for _ in range(args.opens)]
            browser.close()
        api_kinds = [kind for kind in kinds if kind.startswith("/api/")]
        api_alone = Timings()
        paced(url, api_kinds, api_alone, threading.Event(), args.rounds)
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
    polled = set().union(*(opened.polled for opened in opens))
    for path in sorted(page.server):
        server_p99, api_server_p99 = p99(page.server[path]), p99(api.server[path])
        client_p99, api_client_p99 = p99(page.client[path]), p99(api.client[path])
        over = sum(ms > api_server_p99 for ms in page.server[path])
        chance = over_p99_by_chance(over, len(page.server[path]))
        emit(
            {
                "bench": "page_first_render", "measure": "page_request_ms", "request": path,
                "polled": path in polled,
                "requests": len(page.server[path]), "api_requests": len(api.server[path]),
                "server_page_p99": round(server_p99, 2),
                "server_page_max": round(max(page.server[path]), 2),
                "server_api_p99": round(api_server_p99, 2),
                "server_over_api_p99": over, "server_over_by_chance": round(chance, 4),
                "client_page_p99": round(client_p99, 2),
                "client_api_p99": round(api_client_p99, 2),
                "client_api_p99_alone": round(p99(api_alone.client[path]), 2)
                if api_alone.client.get(path) else None,
                "within_p99": chance >= SIGNIFICANCE,
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


if __name__ == "__main__":
    main()
