"""What /metrics serves: every worker's metrics, labelled, and the sidecar's own.

The sidecar's own ``kvscope_sidecar_*`` metrics are read at scrape time: from the
sidecar's state here (the hit-ratio curve's families in app/api/insight_families.py), from
the HTTP side's counts in app/api/http_collector.py; the workers' families come from
app/api/worker_families.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from app.api.exposition_text import TextFormat
from app.api.http_collector import HttpCollector
from app.api.insight_families import insight_families
from app.api.worker_families import WorkerFamilies
from app.gc_pauses import GcPauses, gc_pauses
from app.state.history import DEFAULT_MAX_LABEL_SETS
from app.state.locations import MAX_GROUPS, MAX_LOCATIONS, MEDIA_PER_PUBLISHER
from app.state.sidecar import SidecarState

_PUBLISHER_COUNTERS = (
    ("kvscope_sidecar_frames_total", "Frames received (KV batches and stats).", "frames"),
    ("kvscope_sidecar_gaps_total", "Jumps in a publisher's sequence numbers.", "gaps"),
    ("kvscope_sidecar_missed_batches_total", "Batches lost in gaps, not replayable.", "missed"),
    ("kvscope_sidecar_restarts_total", "Times a publisher's sequence went back.", "restarts"),
    ("kvscope_sidecar_malformed_frames_total", "Frames or events skipped as malformed.",
     "malformed"),
    ("kvscope_sidecar_replayed_batches_total", "Batches applied from replay sockets.",
     "replayed"),
    ("kvscope_sidecar_held_dropped_frames_total",
     "Live frames dropped while a replay held them past replay_hold_bytes.", "held_dropped"),
    ("kvscope_sidecar_family_changes_total",
     "Connect sockets made again, or replay endpoints switched, for the address family their "
     "host name came to resolve to while the publisher was unheard.", "family_changes"),
    ("kvscope_sidecar_source_family_mismatches_total",
     "Connect or replay endpoints whose host name came to resolve, while the publisher was "
     "unheard, to addresses of the other family alone than the source address they leave "
     "from: ZMQ cannot connect them until it resolves to the source's family again.",
     "source_family_mismatches"),
)  # fmt: skip
_LISTENER_COUNTERS = (
    ("kvscope_sidecar_listen_frames_total", "Frames received on the listen socket.", "frames"),
    ("kvscope_sidecar_listen_malformed_frames_total",
     "Listen-socket frames skipped before they named a publisher's stream.", "malformed"),
    ("kvscope_sidecar_listen_refused_frames_total",
     "Listen-socket frames of new streams once the most publishers are tracked.", "refused"),
    ("kvscope_sidecar_listen_refused_connections_total",
     "Listen-socket handshakes refused while max_connections peers were admitted.",
     "refused_connections"),
    ("kvscope_sidecar_listen_refused_host_connections_total",
     "Listen-socket handshakes refused while their host had max_connections_per_host peers "
     "admitted.", "refused_host_connections"),
    ("kvscope_sidecar_listen_refused_addresses_total",
     "Listen-socket handshakes refused for good: the peer's address is outside listen_allow.",
     "refused_addresses"),
    ("kvscope_sidecar_listen_shed_connections_total",
     "Listen-socket connections counted as admitted before their handshake ended, the gate "
     "waiting on 16 per max_connections place already: held against the limits until they "
     "close.", "shed_connections"),
    ("kvscope_sidecar_listen_stream_moves_total",
     "Frames of a listen-mode stream from another host than its last: its locations moved "
     "to that host's share.", "stream_moves"),
    ("kvscope_sidecar_listen_stream_move_resets_total",
     "Of those, moves whose new host's share could not take the stream's locations: what "
     "the stream held was forgotten.", "stream_move_resets"),
)  # fmt: skip
"""The listen socket's own counts; its publishers' frames are counted per publisher above."""


class SidecarCollector(Collector):
    """The sidecar's own health, read at scrape time from its state."""

    def __init__(self, state: SidecarState, workers: WorkerFamilies) -> None:
        self._state = state
        self._workers = workers

    def describe(self) -> list[Metric]:
        return []  # families appear on the first scrape; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        publishers = list(self._state.publishers.values())
        for name, help_text, attribute in _PUBLISHER_COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=["publisher"])
            for publisher in publishers:
                family.add_metric([publisher.name], getattr(publisher, attribute))
            yield family
        replays = CounterMetricFamily(
            "kvscope_sidecar_replays_total",
            "Replays of gaps from publishers' replay sockets, by how they ended (unstarted: its "
            "socket could not be made, nothing was asked).",
            labels=["publisher", "outcome"],
        )
        for publisher in publishers:
            for outcome, count in publisher.replays.items():
                replays.add_metric([publisher.name, outcome], count)
        yield replays
        yield CounterMetricFamily(
            "kvscope_sidecar_ingest_faults_total",
            "Faults of the sidecar's own (bugs) the ingest thread got past: a frame dropped, a "
            "step of its loop skipped, a batch applied in part; each logged with its traceback.",
            self._state.ingest_faults,
        )
        lag = GaugeMetricFamily(
            "kvscope_sidecar_ingest_lag_seconds",
            "Seconds since the publisher's last frame (absent until its first).",
            labels=["publisher"],
        )
        now = time.time()
        for publisher in publishers:
            if publisher.last_frame_at is not None:
                lag.add_metric([publisher.name], now - publisher.last_frame_at)
        yield lag
        listener = self._state.listener
        if listener is not None:
            for name, help_text, attribute in _LISTENER_COUNTERS:
                yield CounterMetricFamily(name, help_text, getattr(listener, attribute))
            yield GaugeMetricFamily(
                "kvscope_sidecar_listen_connections",
                "Peers admitted to the listen socket and still connected.",
                listener.connections,
            )
        index = self._state.index
        locations = index.locations
        with self._state.lock:
            tracked, overflow = len(index), index.overflow
            refused_media = dict(locations.refused_media)
            refused_locations = locations.refused_location_events
            usage = index.usage()
        yield GaugeMetricFamily("kvscope_sidecar_tracked_blocks", "Blocks indexed.", tracked)
        stranded = GaugeMetricFamily(
            "kvscope_sidecar_stranded_blocks",
            "Block copies held (one per KV cache group) that no prefix lookup reaches: a "
            "block before them in their chain is held nowhere.",
            labels=["publisher", "medium"],
        )
        for row in usage:
            stranded.add_metric([row.publisher, row.medium], row.stranded)
        yield stranded
        yield GaugeMetricFamily(
            "kvscope_sidecar_tracked_blocks_max", "Most blocks the index holds.", index.max_blocks
        )
        yield CounterMetricFamily(
            "kvscope_sidecar_index_overflow_total", "Blocks refused by a full index.", overflow
        )
        media = CounterMetricFamily(
            "kvscope_sidecar_refused_media_events_total",
            "Events refused for naming a new medium, by reason: past the "
            f"{MEDIA_PER_PUBLISHER} one publisher may name (publisher), past "
            f"listen_max_media_per_host ({locations.media_per_host}) one host's listen-mode "
            "streams may name (host), past max_media, one place of which is held for the GPU "
            "(max_media; and media past it a stats frame gave block sizes for).",
            labels=["reason"],
        )
        for reason, count in refused_media.items():
            media.add_metric([reason], count)
        yield media
        yield CounterMetricFamily(
            "kvscope_sidecar_refused_location_events_total",
            f"Events refused for naming a KV cache group past the {MAX_GROUPS} tracked per "
            "publisher and medium, or a location past listen_max_locations_per_host "
            f"({locations.locations_per_host}) one host's listen-mode streams may hold, or past "
            f"{MAX_LOCATIONS} in all.",
            refused_locations,
        )
        yield GaugeMetricFamily(
            "kvscope_sidecar_conflicting_samples",
            "Worker samples the last scrape left out: another type or labels than the first "
            "publisher gave their metric.",
            self._workers.conflicting_samples,
        )
        yield GaugeMetricFamily(
            "kvscope_sidecar_worker_text_bytes",
            "Exposition text of the workers' families kept between scrapes: the last text, "
            "each publisher's part of it and each family's header lines (about twice one "
            "stats frame's text per publisher).",
            self._workers.held_bytes,
        )
        event_log = self._state.event_log
        yield CounterMetricFamily(
            "kvscope_sidecar_events_total", "Block events received.", event_log.last_id
        )
        yield CounterMetricFamily(
            "kvscope_sidecar_event_log_shed_total",
            "Events not kept in the recent-events log (past event_batch_max, or too large).",
            event_log.shed,
        )
        yield GaugeMetricFamily(
            "kvscope_sidecar_event_log_bytes",
            "Estimated memory of the recent-events log (at most event_buffer_bytes).",
            event_log.bytes,
        )
        yield from insight_families(publishers, self._state)
        history = self._state.history
        yield GaugeMetricFamily(
            "kvscope_sidecar_history_bytes",
            f"Memory of /api/v1/history's points (at most {history.max_bytes} bytes).",
            history.bytes,
        )
        yield GaugeMetricFamily(
            "kvscope_sidecar_history_series", "Time series kept by the history.", history.series
        )
        yield CounterMetricFamily(
            "kvscope_sidecar_history_refused_total",
            "History readings dropped for a series past history_max_series, or past the "
            "series one publisher's metric may have (one per medium tracked, at least "
            f"{DEFAULT_MAX_LABEL_SETS}).",
            history.refused,
        )


class GcPauseCollector(Collector):
    """How long the interpreter's garbage collections held the sidecar (app/gc_pauses.py)."""

    def __init__(self, pauses: GcPauses) -> None:
        self._pauses = pauses

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "kvscope_sidecar_gc_pause_seconds",
            "Wall-clock seconds of each garbage collection, by generation (2: a full one); "
            "requests and ingest wait while one runs.",
            labels=["generation"],
        )
        for generation, histogram in enumerate(self._pauses.by_generation):
            cumulative = histogram.cumulative()
            bounds = [*map(repr, histogram.bounds), "+Inf"]
            family.add_metric(
                [str(generation)], list(zip(bounds, cumulative, strict=True)), histogram.sum
            )
        yield family


class Exposition:
    """The text /metrics serves: the workers' families, then the sidecar's own registry.

    The two never print one name: frames may not use ``kvscope_sidecar_*``
    names (offload/wire/stats_frame.py), and the names the process, platform
    and GC collectors print are reserved from the workers' families.
    """

    def __init__(self, state: SidecarState, http: HttpCollector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        """The sidecar's own collectors (a registry per sidecar, so two in one process,
        as in tests, never collide)."""
        # What every Python exporter serves: the process's memory, CPU and descriptors,
        # the interpreter's version and its collections.
        process = CollectorRegistry(auto_describe=False)
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=process)
        self.workers = WorkerFamilies(state, _printed_names(process))
        self.registry.register(SidecarCollector(state, self.workers))
        self.registry.register(http)
        self.registry.register(GcPauseCollector(gc_pauses()))
        self.registry.register(process)
        self._text = TextFormat()

    def render(self) -> bytes:
        """Prometheus's text format (version 0.0.4) of every family."""
        return self.workers.text() + self._text.render(self.registry.collect())


def _printed_names(registry: CollectorRegistry) -> set[str]:
    """Every family and series name a registry prints now (a counter's family prints as
    its ``_total`` series)."""
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names
