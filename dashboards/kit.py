"""The building blocks every kvscope dashboard shares: filters, variables, panel kinds, JSON.

Each panel kind demands a unit and a description, so no dashboard can ship a
panel without either; every query goes through the ``$datasource`` variable.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import dashboard, heatmap, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prometheus_model

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
Panel = timeseries.Panel | stat.Panel | heatmap.Panel

# Label matchers for the dashboard's filters. Grafana writes a multi-value or
# "All" selection as a regex, hence =~ everywhere.
SIDECAR = ('instance=~"$instance"',)
"""Every kvscope series is one sidecar's (its scrape target), and only the target tells two
pods' series apart: engine ids and publisher names repeat from pod to pod (below). The
sidecar-wide series (index, listen socket, sheds, memory) carry no other filter's label."""
PUBLISHER = (*SIDECAR, 'publisher=~"$publisher"')
"""The sidecar's own kvscope_sidecar_* series of one stream: a publisher, no engine or rank."""
WORKER = (*PUBLISHER, 'engine=~"$engine"', 'rank=~"$rank"')
"""Worker metrics: every kvscope_* series a stats frame carries (tier, transfers, the worker's
publisher). The sidecar labels each with the stream it came on, so the publisher filter
narrows them as it narrows the sidecar's own."""
MEDIUM = 'medium=~"$medium"'
"""The medium filter, for a series of a tier's that is the sidecar's (stranded blocks)."""
TIER = (*WORKER, MEDIUM)
"""Tier metrics: the worker's series that also carry a medium (and the recording rules on them)."""
VLLM = ('model_name=~"$model"',)
"""vLLM's own vllm:* series (and the recording rules on them)."""

# Legends of series that are one worker's or one stream's (no sum across them). Engine
# ids and publisher names repeat from pod to pod (a deployment's replicas all run engine
# 0, every pod's sidecar follows tcp://127.0.0.1:5560, vLLM numbers its engine 0 on every
# server), so such a legend names the scrape target too, or two pods' lines read alike.
ON = "{{publisher}} on {{instance}}"
"""A publisher on its sidecar (the scrape target): a stream, or the worker behind it."""
TIER_LEGEND = f"{{{{engine}}}}/{{{{rank}}}} {{{{medium}}}}, {ON}"
"""One worker's tier."""
VLLM_ON = "{{model_name}} engine {{engine}} on {{instance}}"
"""One vLLM engine's series of a served model: a data-parallel server runs several."""

# A pseudo-unit Grafana shows as a suffix: kvscope counts blocks, not bytes.
BLOCKS = "suffix: blocks"
BLOCKS_PER_S = "suffix: blocks/s"
TOKENS_PER_S = "suffix: tokens/s"


def series(metric: str, scope: Sequence[str], *matchers: str) -> str:
    """``metric{...}`` under the dashboard's filters (``scope``) and a panel's own matchers."""
    return f"{metric}{{{', '.join((*scope, *matchers))}}}"


def rate(metric: str, scope: Sequence[str], *matchers: str) -> str:
    """Per-second rate of a counter over Grafana's scrape-aware window."""
    return f"rate({series(metric, scope, *matchers)}[$__rate_interval])"


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL target and the legend its series get."""

    expr: str
    legend: str


def _target(ref: str, query: Query) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .ref_id(ref)
        .datasource(DATASOURCE)
        .expr(query.expr)
        .legend_format(query.legend)
    )


def _targets(panel: Panel, queries: Sequence[Query]) -> None:
    if not queries:
        raise ValueError("a panel needs at least one query")
    for index, query in enumerate(queries):
        panel.with_target(_target(chr(ord("A") + index), query))


def _describe(panel: Panel, title: str, about: str) -> None:
    if not about.strip():
        raise ValueError(f"panel {title!r} needs a description of what healthy looks like")
    panel.title(title).description(about).datasource(DATASOURCE)


def timeseries_panel(
    title: str,
    about: str,
    unit: str,
    *queries: Query,
    width: int = 12,
    percent: bool = False,
) -> timeseries.Panel:
    """A time series; ``percent`` pins the axis to 0..1 for ratios."""
    panel = timeseries.Panel().unit(unit).fill_opacity(10).span(width).height(8)
    _describe(panel, title, about)
    if percent:
        panel.min(0).max(1)
    _targets(panel, queries)
    return panel


def stat_panel(
    title: str, about: str, unit: str, *queries: Query, red_from: float | None = None
) -> stat.Panel:
    """A single figure per series, green below ``red_from`` and red from it (never, if None)."""
    steps = [model.Threshold(color="green")]
    if red_from is not None:
        steps.append(model.Threshold(value=red_from, color="red"))
    panel = (
        stat.Panel()
        .unit(unit)
        .span(6)
        .height(5)
        .thresholds(dashboard.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(steps))
    )
    _describe(panel, title, about)
    _targets(panel, queries)
    return panel


def heatmap_panel(title: str, about: str, unit: str, buckets: str) -> heatmap.Panel:
    """Prometheus histogram buckets (``sum by (le)`` of their rates) as a heatmap over time."""
    panel = (
        heatmap.Panel().calculate(False).y_axis(heatmap.YAxisConfig().unit(unit)).span(12).height(9)
    )
    _describe(panel, title, about)
    panel.with_target(
        _target("A", Query(buckets, "{{le}}")).format(prometheus_model.PromQueryFormat.HEATMAP)
    )
    return panel


def _filter(
    name: str, title: str, metric: str, about: str, label: str | None = None
) -> dashboard.QueryVariable:
    """A multi-value filter on the values of ``label`` (default: ``name``) in ``metric``."""
    return (
        dashboard.QueryVariable(name)
        .label(title)
        .description(about)
        .datasource(DATASOURCE)
        .query(f"label_values({metric}, {label or name})")
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
    )


FILTERS = ("instance", "publisher", "engine", "rank", "medium", "model")
"""Every filter a dashboard may offer, in the order they appear (and narrow each other)."""


def variables(
    filters: Sequence[str] = FILTERS,
) -> list[dashboard.DatasourceVariable | dashboard.QueryVariable]:
    """The data source and ``filters``; each filter offers the values the one before allows."""
    capacity = "kvscope_blocks_capacity"
    known = {
        "instance": _filter(
            "instance",
            "Sidecar",
            "kvscope_sidecar_tracked_blocks",
            "the sidecar's scrape target (its pod): engine ids and publisher names repeat "
            "from pod to pod, so this is what picks one",
        ),
        "publisher": _filter(
            "publisher",
            "Publisher",
            series("kvscope_sidecar_frames_total", SIDECAR),
            "the stream the sidecar follows (its endpoint, or TOPIC@RANK in listen mode)",
        ),
        "engine": _filter(
            "engine", "Engine", series(capacity, PUBLISHER), "kvscope engine id (stats frames)"
        ),
        "rank": _filter(
            "rank",
            "Rank",
            series(capacity, (*PUBLISHER, 'engine=~"$engine"')),
            "data-parallel rank",
        ),
        "medium": _filter(
            "medium", "Medium", series(capacity, WORKER), "the tier a block lives in (CPU)"
        ),
        "model": _filter(
            "model",
            "vLLM model",
            "vllm:kv_cache_usage_perc",
            "vLLM's served model (vLLM's own series only)",
            label="model_name",
        ),
    }
    unknown = set(filters) - set(known)
    if unknown:
        raise ValueError(f"no such filter: {sorted(unknown)}")
    chosen = [known[name] for name in FILTERS if name in filters]
    return [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        *chosen,
    ]


def build_dashboard(
    uid: str,
    title: str,
    about: str,
    rows: Sequence[tuple[str, Sequence[Panel]]],
    filters: Sequence[str] = FILTERS,
) -> dashboard.Dashboard:
    """A dashboard of titled rows, panels numbered in order so the JSON is stable, offering
    ``filters`` (only those its queries use)."""
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(about)
        .tags(["kvscope"])
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .variables(variables(filters))
    )
    ids = itertools.count(1)
    for row_title, panels in rows:
        board.with_row(dashboard.Row(row_title).id(next(ids)))
        for panel in panels:
            board.with_panel(panel.id(next(ids)))
    return board


def render(board: dashboard.Dashboard) -> str:
    """The dashboard's JSON as committed: sorted keys, two-space indent, final newline."""
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
