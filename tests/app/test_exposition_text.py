"""TextFormat writes what prometheus_client's generate_latest writes, byte for byte, and
keeps only the names and labels of the last rendering, never a value."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
    SummaryMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families

from app.api import create_app
from app.api.exposition_text import TextFormat
from app.settings import SidecarSettings
from app.state.sidecar import SidecarState
from offload.wire.stats_frame import Sample, StatsFrame, WorkerConfig


class Families:
    """A fixed list of families as a collector, for generate_latest."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> list[Metric]:
        return self.families


def assert_written_as_generate_latest(families: list[Metric]) -> None:
    """Cold (nothing kept) and warm (everything kept), the text is generate_latest's."""
    expected = generate_latest(Families(families))
    text = TextFormat()
    assert text.render(families) == expected
    assert text.render(families) == expected


def sidecar_state() -> SidecarState:
    state = SidecarState.from_settings(SidecarSettings(connect=["tcp://127.0.0.1:1"]))
    publisher = state.publishers["tcp://127.0.0.1:1"]
    publisher.frames, publisher.gaps = 7, 1
    publisher.stats = StatsFrame(
        ts=1.0, engine_id="e0", rank=0,
        config=WorkerConfig(policy="lru", capacity_blocks=8, block_size=16),
        counters=[Sample(name="kvscope_stores", value=3.0)],
        gauges=[Sample(name="kvscope_tier_blocks", labels={"medium": "CPU"}, value=5.0)],
    )  # fmt: skip
    return state


def test_the_sidecars_families_are_written_as_generate_latest_writes_them() -> None:
    state = sidecar_state()
    exposition = create_app(SidecarSettings(connect=["tcp://127.0.0.1:1"]), state).state.metrics
    assert_written_as_generate_latest(list(exposition.registry.collect()))


def test_names_and_label_values_are_escaped_as_generate_latest_escapes_them() -> None:
    odd = GaugeMetricFamily("kvscope.odd-name", "Help with \\ and\na newline.", labels=["a", "b"])
    odd.add_metric(['back\\slash "quoted"', "new\nline"], 1.5)
    odd.add_metric(["ünïcode", ""], float("nan"))
    big = GaugeMetricFamily("big", "Go writes exponents sooner than Python.")
    big.add_metric([], 1234567.0)
    big.add_metric([], float("inf"))
    big.add_metric([], -2)
    assert_written_as_generate_latest([odd, big])


def test_every_type_is_headed_and_its_samples_named_as_generate_latest_does() -> None:
    counter = CounterMetricFamily("c", "A counter.", labels=["z", "a"])  # labels sort by name
    counter.add_metric(["1", "2"], 3)
    histogram = HistogramMetricFamily("h", "A histogram.", labels=["g"])
    histogram.add_metric(["0"], [("0.5", 1), ("+Inf", 2)], 0.75)
    summary = SummaryMetricFamily("s", "A summary.", count_value=2, sum_value=1.0)
    info = InfoMetricFamily("i", "An info.", value={"version": "1"})
    states = StateSetMetricFamily("st", "A state set.", value={"up": True, "down": False})
    unknown = UnknownMetricFamily("u", "Untyped.", value=1)
    units = GaugeMetricFamily("size", "With a unit.", value=2, unit="bytes")
    assert_written_as_generate_latest(
        [counter, histogram, summary, info, states, unknown, units, GaugeMetricFamily("e", "")]
    )


def test_timestamped_and_openmetrics_only_samples_are_left_to_generate_latest() -> None:
    created = CounterMetricFamily("c", "With a created time.", value=1, created=100.0)
    gauge_histogram = GaugeHistogramMetricFamily(
        "gh", "Moves _gsum and _gcount out.", buckets=[("+Inf", 2)], gsum_value=3
    )
    stamped = GaugeMetricFamily("t", "Timestamped.")
    stamped.add_metric([], 1, timestamp=1234.5)
    plain = GaugeMetricFamily("p", "Plain, after them.", value=4)
    assert_written_as_generate_latest([created, gauge_histogram, stamped, plain])


def test_values_are_written_anew_and_only_the_last_renderings_series_are_kept() -> None:
    text = TextFormat()

    def gauge(values: dict[str, float]) -> list[Metric]:
        family = GaugeMetricFamily("g", "A gauge.", labels=["publisher"])
        for publisher, value in values.items():
            family.add_metric([publisher], value)
        return [family]

    for values in ({"a": 1, "b": 2}, {"a": 5, "c": 6}):
        assert text.render(gauge(values)) == generate_latest(Families(gauge(values)))
    # Kept: what the last rendering wrote ("b" went), so memory follows the series served.
    assert sorted(key[2] for key in text._series) == [(("publisher", "a"),), (("publisher", "c"),)]


def test_metrics_show_a_changed_count_and_a_new_publisher_after_a_scrape() -> None:
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"])
    state = SidecarState.from_settings(settings)
    exposition = create_app(settings, state).state.metrics

    def frames() -> dict[str, float]:
        return {
            sample.labels["publisher"]: sample.value
            for family in text_string_to_metric_families(exposition.render().decode())
            if family.name == "kvscope_sidecar_frames"
            for sample in family.samples
        }

    assert frames() == {}
    first = state.listened_publisher(b"engine-a", 0)
    assert first is not None
    first.frames = 7
    assert frames() == {"engine-a@0": 7}
    first.frames = 9
    second = state.listened_publisher(b"engine-b", 0)
    assert second is not None
    assert frames() == {"engine-a@0": 9, "engine-b@0": 0}
