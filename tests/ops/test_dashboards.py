"""The committed dashboards are what dashboards/generate.py writes, and each panel is usable.

Usable: a description saying what healthy looks like, a unit on its axis, the
``$datasource`` variable behind every query, only known variables, and ratios
read from the recording rules rather than divided in the panel. The figure of
silent publishers is evaluated by promtool beside the alert on them.
Whether every query returns data is the live test's job (test_prometheus_live.py).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import generate
from dashboards.overview import EVENTS_ROW, VLLM_ROW
from offload.telemetry.metrics import SPECS
from tests.ops.artifacts import (
    DASHBOARD_DIR,
    ROOT,
    alerts,
    dashboards,
    panel_queries,
    panels,
    recorded_names,
    rules,
)
from tests.ops.promql import (
    bare_aggregations,
    counter_function_names,
    grouping_labels,
    is_vllm,
    kept_labels,
    legend_labels,
    metric_names,
    substitute,
)
from tests.support.prometheus import needs_promtool, promtool

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
FILTERS = ("instance", "engine", "rank")
"""The filters every dashboard offers: kvscope's worker series all carry them, and only the
sidecar (instance) picks one pod, engine ids repeating from pod to pod."""
VLLM_DEFINITIONS = (
    "v1/metrics/loggers.py",
    "distributed/kv_transfer/kv_connector/v1/offloading/metrics.py",
)
"""Where vLLM 0.33 names the vllm:* series the dashboards plot."""
EXPOSITION_SUFFIX = re.compile(r"_(?:total|bucket|count|sum)$")
"""What prometheus_client adds to a counter's or a histogram's name in the exposition."""
NAMED_UNITS = {"s": "seconds", "bytes": "bytes", "Bps": "bytes", "percentunit": "ratio"}
"""Axis units and the word a kvscope series plotted on them carries in its name."""
PER_SECOND = re.compile(r"/s$|^(?:cps|Bps)$")
"""Axis units of a rate."""


def _all_panels() -> list[Any]:
    return [
        pytest.param(panel, id=f"{name}: {panel['title']}")
        for name, board in dashboards().items()
        for _row, panel in panels(board)
    ]


def test_regenerating_gives_the_committed_files_byte_for_byte() -> None:
    generated = generate.render_all()
    committed = {path.name: path.read_text() for path in DASHBOARD_DIR.glob("*.json")}
    assert sorted(committed) == sorted(generated), "a JSON file no generator writes, or one missing"
    for name, text in generated.items():
        assert committed[name] == text, (
            f"{name} is stale: run .venv/bin/python dashboards/generate.py"
        )


def test_the_script_checks_from_the_command_line() -> None:
    checked = subprocess.run(
        [sys.executable, "dashboards/generate.py", "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr


def test_check_names_a_stale_file(tmp_path: Path) -> None:
    for name, text in generate.render_all().items():
        (tmp_path / name).write_text(text)
    (tmp_path / "kvscope-overview.json").write_text("{}\n")
    assert generate.stale(tmp_path) == ["kvscope-overview.json"]


def _unit(panel: dict[str, Any]) -> str | None:
    if panel["type"] == "heatmap":
        return panel["options"]["yAxis"].get("unit")
    return panel["fieldConfig"]["defaults"].get("unit")


@pytest.mark.parametrize("panel", _all_panels())
def test_every_panel_has_a_description_a_unit_and_the_datasource_variable(
    panel: dict[str, Any],
) -> None:
    where = panel["title"]
    assert "healthy" in panel.get("description", "").lower(), f"{where}: no healthy value"
    assert _unit(panel), f"{where}: no unit"
    assert panel["datasource"] == DATASOURCE, where
    assert panel["targets"], f"{where}: no query"
    assert all(target["datasource"] == DATASOURCE for target in panel["targets"]), where


@pytest.mark.parametrize("panel", _all_panels())
def test_every_panel_plots_series_in_the_unit_of_its_axis(panel: dict[str, Any]) -> None:
    """A seconds, bytes or ratio axis plots series named so (vLLM's names are vLLM's, and
    test_vllm_series_are_ones_vllm_exports holds them); a per-second axis plots rates, and
    any other rates only inside a histogram's quantile or heatmap (rates of its buckets)."""
    unit = _unit(panel) or ""
    for target in panel["targets"]:
        names = {name for name in metric_names(target["expr"]) if not is_vllm(name)}
        if not names:
            continue
        where = f"{panel['title']} [{unit}]: {target['expr']}"
        if unit in NAMED_UNITS:
            assert any(NAMED_UNITS[unit] in name for name in names), where
        rated = counter_function_names(target["expr"])
        if PER_SECOND.search(unit):
            assert rated, f"a per-second axis, no rate: {where}"
        else:
            assert all(name.endswith("_bucket") for name in rated), f"a rate on {where}"


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_every_dashboard_has_the_datasource_variable_and_the_filters(name: str) -> None:
    variables = {v["name"]: v for v in dashboards()[name]["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for label in FILTERS:
        assert variables[label]["datasource"] == DATASOURCE
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["includeAll"] and variable["multi"], variable["name"]


@pytest.mark.parametrize("name", sorted(dashboards()))
def test_every_filter_a_dashboard_offers_narrows_one_of_its_panels(name: str) -> None:
    board = dashboards()[name]
    exprs = [target["expr"] for _row, panel in panels(board) for target in panel["targets"]]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            used = [e for e in exprs if re.search(rf"\${variable['name']}\b", e)]
            assert used, f"{board['title']}: filter ${variable['name']} narrows no panel"


def test_queries_name_only_the_dashboards_variables() -> None:
    for board in dashboards().values():
        known = {v["name"] for v in board["templating"]["list"]} | {"__rate_interval"}
        for _row, panel in panels(board):
            for target in panel["targets"]:
                used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
                assert used <= known, f"{board['title']} / {panel['title']}: {used - known}"


def test_ratios_come_from_the_recording_rules() -> None:
    recorded = recorded_names()
    for query in panel_queries():
        assert "/" not in query.expr, f"divides in the panel, record the ratio instead: {query}"
        for name in metric_names(query.expr):
            if ":" in name and not name.startswith("vllm:"):
                assert name in recorded, f"{name} is not a recording rule: {query}"


def test_a_recorded_series_legend_names_every_label_its_rule_keeps() -> None:
    """A recording rule records one series per label set it keeps (a tier: its engine, rank
    and medium, publisher and sidecar; a vLLM engine: a data-parallel server runs several),
    so a panel plotting it as recorded needs each of those labels in its legend, or two of
    its series read alike: two ranks of one engine, two engines of one vLLM server. The live
    test sees one rank of one engine per demo and no vLLM, so it cannot tell. ``job`` aside:
    ``instance`` names the scrape target."""
    kept = {rule["record"]: kept_labels(rule["expr"]) for rule in rules() if "record" in rule}
    checked = 0
    for query in panel_queries():
        if bare_aggregations(query.expr) or grouping_labels(query.expr, "by"):
            continue  # an aggregation's series carry the labels it keeps, not the rule's
        for name in metric_names(query.expr) & set(kept):
            checked += 1
            missing = kept[name] - {"job"} - legend_labels(query.legend)
            assert not missing, f"the legend leaves out {sorted(missing)}: {query}"
    assert checked, "no panel plots a recorded series"


def test_panels_plot_rates_not_increases() -> None:
    """A panel's window, $__rate_interval, is longer than Grafana's step (by a scrape at
    least): an increase() over it counts each point's neighbours' events too, by a factor
    that changes with the zoom, where a rate() reads per second at any zoom. (Rules and
    alerts, each on a window of its own, may count increases.)"""
    for query in panel_queries():
        assert not re.search(r"\bincrease\s*\(", query.expr), f"an increase on a panel: {query}"


def test_every_publisher_metric_is_on_the_event_feed_row() -> None:
    """The worker's publisher is the feed's other end: what it sent, dropped, left out and
    answered to replays (in full or cut short) tells its losses from the sidecar's, so each
    of its families is plotted beside the sidecar's own."""
    plotted = {
        name for q in panel_queries() if q.row == EVENTS_ROW for name in metric_names(q.expr)
    }
    publisher = {name for name in SPECS if name.startswith("kvscope_publisher_")}
    assert publisher, "no kvscope_publisher_* metric"
    assert publisher <= plotted, f"not plotted: {sorted(publisher - plotted)}"


def test_vllm_queries_stand_apart_and_say_whose_they_are() -> None:
    """The live test skips queries on vLLM's series (no vLLM there) query by query, so no
    query may mix them with kvscope's: the skip would leave those unchecked. Outside the
    vLLM row (transfers: inside vLLM 0.33 vLLM counts them, kvscope's series stay empty),
    a vLLM query's legend and its panel's description say it is vLLM's."""
    assert [q for q in panel_queries() if q.row == VLLM_ROW], f"no row {VLLM_ROW!r}"
    outside = 0
    for board in dashboards().values():
        for row, panel in panels(board):
            for target in panel["targets"]:
                names = metric_names(target["expr"])
                if not any(is_vllm(name) for name in names):
                    continue
                where = f"{board['title']} / {panel['title']}: {target['expr']}"
                assert all(is_vllm(name) for name in names), f"mixes vLLM's and kvscope's: {where}"
                if row != VLLM_ROW:
                    outside += 1
                    shown = f"{panel['title']} {target['legendFormat']}"
                    assert "vLLM" in shown, f"no legend or title says vLLM: {where}"
                    assert "vLLM" in panel["description"], f"no description says vLLM: {where}"
    assert outside, "no vLLM transfer series beside kvscope's"


def test_vllm_series_are_ones_vllm_exports() -> None:
    """The names panels and rules give vLLM's series are in vLLM 0.33's source."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vllm not installed (make test installs vllm==0.33.0)")
    package = Path(spec.origin).parent
    source = "".join((package / path).read_text() for path in VLLM_DEFINITIONS)
    exprs = [query.expr for query in panel_queries()] + [rule["expr"] for rule in rules()]
    names = {name for expr in exprs for name in metric_names(expr) if name.startswith("vllm:")}
    assert names
    for name in sorted(names):
        assert f'"{EXPOSITION_SUFFIX.sub("", name)}"' in source, f"vLLM defines no {name}"


def test_the_stores_panel_shows_every_fate_of_an_offered_block() -> None:
    """A block offered to prepare_store is skipped (held already), not admitted (the policy's
    admission), refused (no room) or admitted, then completed or failed: a fate left off
    the panel reads, under gated or store_threshold, as offered blocks vanishing."""
    plotted = {
        name for q in panel_queries() if q.panel == "Stores" for name in metric_names(q.expr)
    }
    fates = {name for name in SPECS if re.fullmatch(r"kvscope_store_\w+_blocks_total", name)}
    assert len(fates) > 1, "no kvscope_store_*_blocks_total metrics"
    assert fates <= plotted, f"not on the Stores panel: {sorted(fates - plotted)}"


SILENT_PANEL = "Publishers silent > 60 s"
SILENT_INPUT = {
    "kvscope's publisher, silent": (
        'kvscope_sidecar_ingest_lag_seconds{job="kvscope", instance="s:8000", publisher="p"}',
        "1+60x10",
    ),
    "its tier": (
        'kvscope_blocks_capacity{job="kvscope", instance="s:8000", engine="e", rank="0", '
        'medium="CPU", publisher="p"}',
        "100x10",
    ),
    "vLLM's own event stream, quiet while its engine idles": (
        'kvscope_sidecar_ingest_lag_seconds{job="kvscope", instance="s:8000", '
        'publisher="vllm-gpu@0"}',
        "1+60x10",
    ),
    "another pod's kvscope publisher, named alike, talking": (
        'kvscope_sidecar_ingest_lag_seconds{job="kvscope", instance="t:8000", publisher="p"}',
        "1x10",
    ),
    "its tier too": (
        'kvscope_blocks_capacity{job="kvscope", instance="t:8000", engine="e", rank="0", '
        'medium="CPU", publisher="p"}',
        "100x10",
    ),
}
"""One silent publisher that sends stats frames, and two that are not to be counted."""


@pytest.mark.e2e
@needs_promtool
def test_the_silent_publishers_figure_counts_those_the_alert_watches(tmp_path: Path) -> None:
    """KVScopePublisherSilent leaves out vLLM's own event stream (no stats frames, quiet
    whenever its engine idles); the Health row's figure beside it must too, or an idle
    vLLM turns it red with no alert and no fault."""
    (query,) = [q for q in panel_queries() if q.panel == SILENT_PANEL]
    board = next(b for b in dashboards().values() if b["title"] == query.dashboard)
    expr = substitute(query.expr, {v["name"] for v in board["templating"]["list"]})
    (alert,) = [a["expr"] for a in alerts() if a["alert"] == "KVScopePublisherSilent"]
    case = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": selector, "values": values}
                    for selector, values in SILENT_INPUT.values()
                ],
                "promql_expr_test": [
                    {"expr": e, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 1}]}
                    for e in (expr, f"count({alert})")
                ],
            }
        ],
    }
    path = tmp_path / "silent.yml"
    path.write_text(yaml.safe_dump(case))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
