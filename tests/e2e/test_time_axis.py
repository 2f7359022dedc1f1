"""The overview charts' time axis: labels that never meet, and a date only where it tells.

A live sidecar serves the page, and the browser's network layer (Playwright's routing) puts
on the wire the history it is given: a real one crosses midnight or starts on a whole minute
only by chance. Reads after the first get no new points, so the charts keep what the test
drew. The browser runs in en-US and in UTC, or in a time zone whose clocks change within the
history, so the test knows which tick starts a new day and how its time and date read.
What the chart drew is read off the chart (its ticks, their places and labels, and the
axis's font), and each label is measured in that font.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from playwright import sync_api

from tests.e2e.conftest import CHROMIUM, WAIT_MS
from tests.support.keyboard import tab_to

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} absent")

MIDNIGHT = 1_795_996_800
"""2026-11-30 00:00 UTC."""
HISTORIES = {
    "a quarter hour of an afternoon": (MIDNIGHT - 9 * 3600 - 6 * 60 - 37, 1, 900, 3),
    "two minutes across midnight": (MIDNIGHT - 61, 1, 121, 2),
    "six hours across midnight": (MIDNIGHT - 3 * 3600 + 7, 10, 2160, 2),
    "one point": (MIDNIGHT - 9 * 3600 + 7, 1, 1, 1),
}
"""Each history's first point (unix seconds), its resolution, its number of points and the
fewest ticks a reader should get: a quarter hour has three even on a phone (5 min apart)."""
CLOCK_CHANGES = {
    "New York, forward": ("America/New_York", 1_772_953_200),
    "New York, back": ("America/New_York", 1_793_512_800),
    "Berlin, forward": ("Europe/Berlin", 1_774_746_000),
    "Berlin, back": ("Europe/Berlin", 1_792_890_000),
}
"""When a zone's clocks change in 2026 (unix seconds): New York's forward from 2:00 to 3:00
on March 8 (07:00 UTC) and back from 2:00 to 1:00 on November 1 (06:00 UTC); Berlin's forward
from 2:00 to 3:00 on March 29 (01:00 UTC) and back from 3:00 to 2:00 on October 25 (01:00
UTC)."""
RESIZED_AND_DRAWN = """chart =>
  JSON.parse(chart.dataset.timeAxis).width === chart.querySelector(".plot").clientWidth"""
"""Whether the chart has redrawn its time axis at its plot's width, after a resize."""
STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 14400, 21600, 43200)
"""The steps between ticks a reader expects, in seconds, up to the longest history's."""
CHART_UNITS = {
    "hit-ratio": "%",
    "occupancy": "blocks",
    "throughput": "blocks/s",
    "dead-writes": "blocks/s",
    "bandwidth": "B/s",
    "latency": "s",
}
"""The overview's charts, and the unit each one's caption names."""
WIDTHS = (390, 900, 1920)
"""A phone's window, one chart a row across a window, and a wide desktop's."""
MEASURED = """({ font, labels }) => {
  const context = document.createElement("canvas").getContext("2d");
  context.font = font;
  const width = (line) => context.measureText(line).width;
  return labels.map((label) => Math.max(...label.split("\\n").map(width)));
}"""
"""Each label's width in the axis's font: its widest line."""
BLANK = 16
"""The least blank between two neighbouring labels' boxes (CSS pixels), as the README
promises: labels that merely do not overlap (1 px apart, 3 px) read as one."""


def history(start: int, step: int, points: int) -> dict[str, Any]:
    """An answer of /api/v1/history with a series for every chart of the overview, each
    number's full label wide: 100 blocks looked up a second, 0 to 4 of them hits (a ratio
    from the second point on), 27,447 blocks held on the GPU and 127,447 on the CPU (from the
    first), 5,608 stores, 4,000 loads and 12,345 evictions a second, 3 dead writes a second,
    2.87 GB/s and 424 µs at the 99th percentile from GPU to CPU."""
    hits = itertools.accumulate(float(step * (i % 5)) for i in range(points))
    elapsed = [float(step * i) for i in range(points)]  # a counter rising by one a second
    series = [
        ("lookup_blocks", "counter", {"medium": "CPU"}, [100 * t for t in elapsed]),
        ("lookup_hit_blocks", "counter", {"medium": "CPU"}, list(hits)),
        ("blocks", "gauge", {"medium": "GPU"}, [27_447.0] * points),
        ("blocks", "gauge", {"medium": "CPU"}, [127_447.0] * points),
        ("stores_completed", "counter", {"medium": "CPU"}, [5_608 * t for t in elapsed]),
        ("loads", "counter", {"medium": "CPU"}, [4_000 * t for t in elapsed]),
        ("evictions", "counter", {"reason": "capacity"}, [12_345 * t for t in elapsed]),
        ("dead_write_blocks", "counter", {}, [3 * t for t in elapsed]),
        ("transfer_bytes_per_s", "gauge", {"direction": "gpu_to_cpu"}, [2.87e9] * points),
        ("transfer_latency_s", "gauge", {"direction": "gpu_to_cpu", "quantile": "0.99"},
         [4.24e-4] * points),
    ]  # fmt: skip
    return {
        "resolution_s": step, "resolutions_s": [1, 10], "retention_s": [900, 21600],
        "times": [float(start + step * i) for i in range(points)],
        "series": [
            {"publisher": "tcp://p:1", "metric": metric, "labels": labels, "kind": kind,
             "values": values}
            for metric, kind, labels, values in series
        ],
    }  # fmt: skip


def points(answer: dict[str, Any], first: int, end: int) -> dict[str, Any]:
    """``answer`` (of /api/v1/history) cut to its points from index ``first`` to ``end``."""
    return {
        **answer,
        "times": answer["times"][first:end],
        "series": [{**one, "values": one["values"][first:end]} for one in answer["series"]],
    }


@contextmanager
def overview(
    browser: sync_api.Browser,
    sidecar: str,
    answer: dict[str, Any],
    width: int,
    name: str,
    zone: str = "UTC",
    later: Sequence[dict[str, Any]] = (),
) -> Iterator[sync_api.Locator]:
    """The overview in a window ``width`` px wide, in time zone ``zone``, its history
    ``answer`` and then the points of each of ``later``, one a read: chart ``name`` once it
    has drawn every point. Fails on any script error of the page."""
    context = browser.new_context(
        viewport={"width": width, "height": 900}, timezone_id=zone, locale="en-US"
    )
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        none_after = {**answer, "times": [], "series": []}
        extensions = list(later)

        def answer_history(route: sync_api.Route) -> None:
            if "since=" not in route.request.url:
                body = answer
            else:
                body = extensions.pop(0) if extensions else none_after
            route.fulfill(status=200, content_type="application/json", body=json.dumps(body))

        page.route("**/api/v1/history*", answer_history)
        page.goto(sidecar)
        chart = page.locator(f"[data-chart='{name}']")
        points = sum(len(part["times"]) for part in (answer, *later))
        sync_api.expect(chart).to_have_attribute("data-points", str(points))
        sync_api.expect(chart).to_have_attribute("data-time-axis", re.compile("."))
        yield chart
        assert not errors, errors
    finally:
        context.close()


def clock_time(tick: datetime, seconds: bool) -> str:
    """``tick``'s time as en-US writes it: "2:53 PM", "12:00:30 AM"."""
    shown = f"{tick.hour % 12 or 12}:{tick.minute:02d}"
    return f"{shown}:{tick.second:02d}" if seconds else shown


def drawn_axis(chart: sync_api.Locator, zone: str) -> tuple[dict[str, Any], list[datetime]]:
    """The time axis ``chart`` drew, and its ticks in ``zone``, once it is checked: every two
    neighbouring ticks stand the room the chart keeps for a label apart (the widest label
    with or without seconds, and a blank) and their labels' boxes, measured, keep at least
    ``BLANK`` between them, each label stays on the canvas and reads its tick's time (with
    seconds where ticks are under a minute apart), and a date is written under the first
    tick and under the first of each new day only."""
    axis = json.loads(chart.get_attribute("data-time-axis") or "")
    widths = chart.page.evaluate(MEASURED, axis)
    ticks, at, labels = axis["ticks"], axis["at"], axis["labels"]
    # Seconds where ticks are under a minute apart (a lone tick's step is not known here).
    seconds = labels[0].split("\n")[0].count(":") == 2
    room = axis["room"]["seconds" if seconds else "minutes"]
    for (left, wide), (right, next_wide) in itertools.pairwise(zip(at, widths, strict=True)):
        assert right - left >= room, (labels, at, room)
        assert right - left - wide / 2 - next_wide / 2 >= BLANK, (labels, at, widths)
    assert at[0] - widths[0] / 2 >= 0 and at[-1] + widths[-1] / 2 <= axis["width"], (at, widths)
    assert len(ticks) == 1 or seconds == (ticks[1] - ticks[0] < 60), labels
    times = [datetime.fromtimestamp(tick, ZoneInfo(zone)) for tick in ticks]
    for i, (label, tick) in enumerate(zip(labels, times, strict=True)):
        new_day = i == 0 or tick.date() != times[i - 1].date()
        time_line, *date_line = label.replace("\u202f", " ").split("\n")
        assert time_line == f"{clock_time(tick, seconds)} {tick:%p}", (i, labels)
        assert date_line == ([f"{tick:%b} {tick.day}"] if new_day else []), (i, labels)
    return axis, times


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", list(HISTORIES))
def test_time_labels_fit_between_their_ticks_with_a_date_where_the_day_is_new(
    browser: sync_api.Browser, sidecar: str, name: str, width: int
) -> None:
    """uPlot wrote a tick's date under its time ("11/29/26 2:23pm") but spaced its ticks by
    the time alone (":00" where ticks were seconds apart), so the date ran into its
    neighbour's label ("2:24pm"). The labels are checked as ``drawn_axis`` says, and there
    are as many as a reader should get: the ticks are a step a reader expects apart, the
    least that leaves the labels room (uPlot has no 2 min step, and a quarter hour whose
    1 min ticks crowd had 5 min ones even a window wide). One point alone spans a thousand
    days in uPlot's own scale, past every step of the axis: it gets a minute around it, and
    a tick."""
    start, step, points, least = HISTORIES[name]
    # The hit ratio needs two points (a counter's increase); the blocks held, one.
    drawn = "hit-ratio" if points > 1 else "occupancy"
    with overview(browser, sidecar, history(start, step, points), width, drawn) as chart:
        axis, times = drawn_axis(chart, "UTC")
    ticks, at, labels = axis["ticks"], axis["at"], axis["labels"]
    assert len(ticks) >= least, labels
    if len(ticks) > 1:
        apart = ticks[1] - ticks[0]
        assert apart in STEPS, labels
        # The step below would have crowded its labels (with seconds if under a minute).
        if apart > STEPS[0]:
            less = max(s for s in STEPS if s < apart)
            less_px = less * (at[1] - at[0]) / apart
            assert less_px < axis["room"]["seconds" if less < 60 else "minutes"], (labels, less)
    crosses = "midnight" in name
    assert len({tick.date() for tick in times}) == (2 if crosses else 1), labels


@pytest.mark.parametrize("change", list(CLOCK_CHANGES))
def test_time_labels_fit_between_their_ticks_where_the_clocks_change(
    browser: sync_api.Browser, sidecar: str, change: str
) -> None:
    """uPlot keeps ticks of hours on the reader's clock but finds their step as if every
    interval were a step long: where clocks go forward one interval is an hour short, and in
    Berlin two labels ran into each other at some widths (308 px, 460 px to 468 px on the
    page of the day). Six hours across each change, the window resized from 300 px to
    1,000 px by 4 px: at every width the labels are checked as ``drawn_axis`` says."""
    zone, at = CLOCK_CHANGES[change]
    start = at - 3 * 3600 + 7
    with overview(browser, sidecar, history(start, 10, 2160), 300, "hit-ratio", zone) as chart:
        for width in range(300, 1001, 4):
            chart.page.set_viewport_size({"width": width, "height": 900})
            chart.page.wait_for_function(RESIZED_AND_DRAWN, arg=chart.element_handle())
            drawn_axis(chart, zone)


def whole_hours(first: int, last: int, zone: str, hours: int) -> list[int]:
    """Every time from ``first`` to ``last`` (unix seconds) at which the clock in ``zone``
    reads a whole hour divisible by ``hours``, the first time only where it reads it twice."""
    found: list[int] = []
    read: set[tuple[object, int]] = set()
    for tick in range(first + -first % 900, last + 1, 900):  # every zone here is in quarters
        local = datetime.fromtimestamp(tick, ZoneInfo(zone))
        if local.minute == 0 and local.hour % hours == 0 and (local.date(), local.hour) not in read:
            read.add((local.date(), local.hour))
            found.append(tick)
    return found


@pytest.mark.parametrize("change", list(CLOCK_CHANGES))
def test_ticks_of_hours_stand_on_hours_of_their_step_where_the_clocks_change(
    browser: sync_api.Browser, sidecar: str, change: str
) -> None:
    """uPlot stepped ticks of hours a fixed time from the first and corrected by an hour at
    a change: after it, ticks two hours apart could stand on odd hours (3:00, 5:00, 7:00 from
    New York's 1:00 of the day it goes forward), and an hour the change repeats had two
    ticks that read alike. Six hours from an hour and from three hours before each change,
    at widths from 300 px to 1,000 px, wherever the ticks are hours apart they stand on
    every hour of the reader's clock that the step divides, an hour the change skips having
    none and one it repeats one, at its first; and the labels are checked as ``drawn_axis``
    says."""
    zone, at = CLOCK_CHANGES[change]
    step, points = 10, 2160
    steps: set[int] = set()
    for start in (at - 3600 + 7, at - 3 * 3600 + 7):
        answer = history(start, step, points)
        with overview(browser, sidecar, answer, 300, "hit-ratio", zone) as chart:
            for width in range(300, 1001, 50):
                chart.page.set_viewport_size({"width": width, "height": 900})
                chart.page.wait_for_function(RESIZED_AND_DRAWN, arg=chart.element_handle())
                axis, times = drawn_axis(chart, zone)
                ticks = axis["ticks"]
                if len(ticks) < 2 or min(b - a for a, b in itertools.pairwise(ticks)) < 3600:
                    continue  # a step under an hour, uPlot's own
                hours = min((b.hour - a.hour) % 24 for a, b in itertools.pairwise(times))
                assert hours > 0, f"two ticks read one hour: {axis['labels']}"
                steps.add(hours)
                expected = whole_hours(start, start + step * (points - 1), zone, hours)
                assert ticks == expected, (width, axis["labels"])
    assert len(steps) >= 2, f"the widths drew ticks of {steps} hours only"


@pytest.mark.parametrize("name", ["a quarter hour of an afternoon", "six hours across midnight"])
def test_every_chart_on_a_phone_has_three_time_ticks(
    browser: sync_api.Browser, sidecar: str, name: str
) -> None:
    """On a phone (390 px) a chart's canvas is 324 px wide, and the y axis of full labels
    ("127,447 blocks", "12,345 blocks/s") took over 100 px of it: the occupancy chart, and
    the others whose unit is a word, had one time tick. Where the full labels leave the time
    axis less than three ticks' room the y axis writes them short ("125k") and the caption
    names the unit: every chart of the overview has three time ticks, their labels checked
    as ``drawn_axis`` says."""
    start, step, points, _ = HISTORIES[name]
    with overview(browser, sidecar, history(start, step, points), 390, "hit-ratio") as first:
        for chart_id, unit in CHART_UNITS.items():
            chart = first.page.locator(f"[data-chart='{chart_id}']")
            sync_api.expect(chart).to_have_attribute("data-points", str(points))
            sync_api.expect(chart).to_have_attribute("data-time-axis", re.compile("."))
            sync_api.expect(chart.locator("figcaption .unit")).to_have_text(f", in {unit}")
            axis, _ = drawn_axis(chart, "UTC")
            assert len(axis["ticks"]) >= 3, (chart_id, axis["labels"])


def test_a_chart_whose_first_point_is_on_a_whole_minute_shows_its_label_whole(
    browser: sync_api.Browser, sidecar: str
) -> None:
    """A label is centred on its tick; a history whose first point is a tick (a whole minute
    always is) put half the first label left of the plot, where only the y axis's width of
    room was: on the hit-ratio chart, whose labels ("2%") are narrow, the date lost its first
    digit off the canvas's edge. No ink may touch the canvas's left edge."""
    with overview(browser, sidecar, history(1_795_952_400, 1, 21), 1400, "hit-ratio") as chart:
        ink = chart.locator("canvas").evaluate(
            """canvas => {
              const column = canvas.getContext("2d").getImageData(0, 0, 2, canvas.height).data;
              return column.filter((value, i) => i % 4 === 3 && value > 0).length;
            }"""
        )
    assert ink == 0, f"{ink} pixels drawn at the left edge: a label cut off"


LEGEND_VALUES = ".u-legend .u-series .u-value"
"""A chart's legend's values: the time's, then each line's."""


def test_a_chart_reads_its_earlier_values_by_keyboard(
    browser: sync_api.Browser, sidecar: str
) -> None:
    """Reading a past value took a mouse: hovering moves uPlot's cursor, and the legend then
    shows that instant's values. The plot is a tab stop, named for its keys, with a visible
    focus; Left and Right move the cursor a point (900 points stand closer than a pixel
    apart here, and each key still moves one), Home and End to the first and last, Escape
    back to the newest values, and the legend, on this chart and on the charts in step with
    it, reads the history's point at that index."""
    start, step, points, _ = HISTORIES["a quarter hour of an afternoon"]
    with overview(browser, sidecar, history(start, step, points), 900, "hit-ratio") as chart:
        page = chart.page
        plot = chart.get_by_role(
            "group",
            name="Hit ratio (lookups): use left and right arrow keys to read earlier values",
        )
        tab_to(page, "#range", plot, 10, "the hit-ratio chart's plot")
        occupancy = page.locator("[data-chart='occupancy']").locator(LEGEND_VALUES)

        def shows(index: int) -> None:
            at = datetime.fromtimestamp(start + step * index, ZoneInfo("UTC"))
            time = f"{clock_time(at, seconds=True)} {at:%p}"
            # 100 blocks looked up a second, index % 5 of them hits (no ratio at the first).
            ratio = f"{index % 5}%" if index else "\u2013"
            sync_api.expect(chart.locator(LEGEND_VALUES)).to_have_text([time, ratio])
            sync_api.expect(occupancy).to_have_text([time, "27,447 blocks", "127,447 blocks"])

        keys = [("ArrowLeft", 898), ("ArrowLeft", 897), ("ArrowLeft", 896), ("Home", 0)]
        keys += [("ArrowLeft", 0), ("ArrowRight", 1), ("End", 899), ("ArrowLeft", 898)]
        keys += [("Escape", 899), ("ArrowLeft", 898)]  # from the newest again, not from 898
        for key, index in keys:
            page.keyboard.press(key)
            shows(index)


SAID = """region => {
  window.__said = [];
  new MutationObserver(() => window.__said.push(region.textContent.replaceAll("\u202f", " ")))
    .observe(region, { childList: true, characterData: true, subtree: true });
}"""
"""Records each write into a live region (what a screen reader reads out), in ``__said``."""
SHOWN = """([chart, span]) => {
  const [min, max] = JSON.parse(chart.dataset.timeAxis).shown;
  return min === span[0] && max === span[1];
}"""
"""Whether ``chart`` has drawn the time span ``span`` ([min, max], unix seconds)."""


def test_a_chart_zooms_by_keyboard_around_the_point_it_reads(
    browser: sync_api.Browser, sidecar: str
) -> None:
    """Zooming took a mouse: a drag narrows a chart's time range, a double-click shows every
    point again. On the plot, reached by Tab, + (Shift and =, as a US keyboard types it, or
    = alone) shows half the points in view, - twice as many and 0 every point, the point the
    legend reads (the newest, with no cursor) standing where it stood: a zoom in narrows the
    range around it, never past ten points. The chart's live region says each range a key
    shows, once: not the cursor's moves, not a key that changes nothing."""
    start, step, points, _ = HISTORIES["a quarter hour of an afternoon"]
    with overview(browser, sidecar, history(start, step, points), 900, "hit-ratio") as chart:
        page = chart.page
        plot = chart.get_by_role("group", name=re.compile(r"plus and minus to zoom, zero to"))
        tab_to(page, "#range", plot, 10, "the hit-ratio chart's plot")
        chart.get_by_role("status").evaluate(SAID)
        time = chart.locator(LEGEND_VALUES).first

        def at(index: int) -> str:
            clock = datetime.fromtimestamp(start + step * index, ZoneInfo("UTC"))
            return f"{clock_time(clock, seconds=True)} {clock:%p}"

        def shows(first: int, last: int) -> str:
            """Waits for the chart to show points ``first`` to ``last``; what is said then."""
            span = [start + step * first, start + step * last]
            page.wait_for_function(SHOWN, arg=[chart.element_handle(), span])
            return f"showing {at(first)} to {at(last)}"

        said = []
        page.keyboard.press("Shift+Equal")  # no cursor: around the newest, at the right edge
        said.append(shows(450, 899))
        page.keyboard.press("Home")  # the first point in view, and 150 points on
        for _ in range(150):
            page.keyboard.press("ArrowRight")
        sync_api.expect(time).to_have_text(at(600))
        page.keyboard.press("Equal")  # 600 stays a third of the way across
        said.append(shows(525, 749))
        sync_api.expect(time).to_have_text(at(600))
        page.keyboard.press("Minus")
        said.append(shows(450, 899))
        page.keyboard.press("Digit0")
        said.append(shows(0, 899).replace("showing", "showing all:"))
        page.keyboard.press("Digit0")  # all shown already: nothing to say
        page.keyboard.press("ArrowLeft")  # the cursor's move: the legend says it
        sync_api.expect(time).to_have_text(at(599))
        closer = [(300, 749), (450, 674), (524, 636), (561, 617), (580, 608), (589, 603)]
        closer += [(593, 602)]  # ten points, the closest
        for first, last in closer:
            page.keyboard.press("Shift+Equal")
            said.append(shows(first, last))
        page.keyboard.press("Shift+Equal")  # no closer
        page.keyboard.press("Minus")
        said.append(shows(586, 605))
        sync_api.expect(time).to_have_text(at(599))
        page.wait_for_function("length => window.__said.length >= length", arg=len(said))
        assert page.evaluate("() => window.__said") == said


def test_a_chart_follows_the_points_read_after_it_is_drawn(
    browser: sync_api.Browser, sidecar: str
) -> None:
    """The history store extends its times in place, and a chart handed uPlot that same
    array: it grew under the plot before the chart compared the plot's time scale with it,
    so every chart read as zoomed in and kept the range it was first drawn with. The history
    comes in two reads, and End on the plot reads the second's last point."""
    start, step, _, _ = HISTORIES["a quarter hour of an afternoon"]
    whole = history(start, step, 63)
    first, second = points(whole, 0, 60), points(whole, 60, 63)
    with overview(browser, sidecar, first, 900, "hit-ratio", later=[second]) as chart:
        chart.get_by_role("group", name=re.compile("arrow keys")).focus()
        chart.page.keyboard.press("End")
        at = datetime.fromtimestamp(start + step * 62, ZoneInfo("UTC"))
        time = f"{clock_time(at, seconds=True)} {at:%p}"
        sync_api.expect(chart.locator(LEGEND_VALUES)).to_have_text([time, "2%"])


def test_a_focused_plot_keeps_the_focus_when_its_chart_is_drawn_anew(
    browser: sync_api.Browser, sidecar: str
) -> None:
    """A chart is drawn anew, its plot replaced, when a line is added or the reader's colour
    scheme changes: the focus went with the old plot, to the top of the page. The new plot
    takes it."""
    start, step, points, _ = HISTORIES["two minutes across midnight"]
    with overview(browser, sidecar, history(start, step, points), 900, "hit-ratio") as chart:
        chart.get_by_role("group", name=re.compile("arrow keys")).focus()
        chart.locator(".u-over").evaluate("plot => { plot.dataset.replaced = 'no'; }")
        chart.page.emulate_media(color_scheme="dark")
        chart.page.wait_for_function(
            """chart => {
              const plot = chart.querySelector('.u-over');
              return plot.dataset.replaced === undefined && plot === document.activeElement;
            }""",
            arg=chart.element_handle(),
        )
