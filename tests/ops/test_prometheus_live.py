"""A real Prometheus, with the shipped config and rules, scrapes two live `kvscope demo`s
and a sidecar in listen mode (whose listen socket's series the demos, connecting, lack).

One demo runs lru (the distance to the optimum is its own policy's), the other
gated (whose admission candidates have a panel of their own, and whose distance
to the optimum the curve does not tell). Both run engine "demo", rank 0, as two
pods of one deployment would run engine 0: only the scrape target tells them
apart, and the rules and legends must keep them apart. The config is the shipped
prometheus.yml with only the sidecar's targets moved to these loopback ports,
the intervals cut to 1 s (so rates exist within seconds) and the vLLM job left
out (no vLLM here). Through Prometheus' HTTP API, every query of every
dashboard panel must return data, every rule must evaluate cleanly, and every
legend must name labels the query's series carry and tell its series apart.
Every metric a panel, a rule, a runbook or a promtool test's input names must
be one these sidecars serve on /metrics, with the labels its matchers and
groupings name (a test's input with exactly the labels the sidecar gives it);
rate() and increase() may read only counters (and a histogram's series), histogram_quantile() only
buckets kept apart by ``le``. Every counter of what kvscope shed, refused or dropped,
every gauge of bytes a buffer holds, and every gauge of what it holds but leaves out
or cannot reach, is on a panel. A renamed metric or label breaks these tests.
Queries on vLLM's series are the exception, and the only one: with no vLLM
scraped they have no data (test_dashboards.py holds that no query mixes them
with kvscope's, that outside the vLLM row they say they are vLLM's, and that
vLLM exports them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from prometheus_client import Metric
from prometheus_client.parser import text_string_to_metric_families

from app.server import Sidecar
from app.settings import SidecarSettings
from dashboards.rules import (
    DEAD_WRITE_RATIO,
    HIT_RATIO,
    OCCUPANCY,
    TOKEN_HIT_RATIO,
    TRANSFER_FAILURE_RATIO,
    TURNOVER,
    WINDOW_EFFICIENCY,
    WINDOW_OPTIMUM_HIT_RATIO,
    WINDOW_TIER_HIT_RATIO,
)
from tests.ops.artifacts import (
    PROMETHEUS_CONFIG,
    PROMETHEUS_DIR,
    RULE_TESTS,
    PanelQuery,
    alerts,
    dashboards,
    panel_queries,
    panels,
    recorded_names,
    rules,
)
from tests.ops.promql import (
    counter_function_names,
    grouping_labels,
    is_vllm,
    kept_labels,
    legend_labels,
    legend_of,
    matched_labels,
    metric_names,
    quantile_arguments,
    substitute,
)
from tests.support.demo_process import running_demo
from tests.support.polling import wait_for
from tests.support.prometheus import (
    WAIT_S,
    needs_prometheus,
    query,
    running_prometheus,
    worker_exposition,
)
from tests.support.zmq_peers import RawPublisher

pytestmark = [pytest.mark.e2e, needs_prometheus, pytest.mark.timeout(180)]
PROMETHEUS_OWN = {"up"}
"""Series Prometheus makes itself for every target."""
TARGET_LABELS = {"job", "instance"}
"""Labels Prometheus adds to every series it scrapes."""
COUNTING = {"counter", "histogram", "summary"}
"""Family types whose series only go up: what rate() and increase() may read."""
TIER_RULES = (
    HIT_RATIO, TOKEN_HIT_RATIO, OCCUPANCY, DEAD_WRITE_RATIO, TURNOVER, TRANSFER_FAILURE_RATIO
)  # fmt: skip
"""The recorded ratios of a worker's tier and transfers: one per engine and rank, and sidecar."""


def config_for(targets: list[str], tmp_path: Path) -> Path:
    """The shipped config, scraping only ``targets`` for the sidecar, every second."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = [job for job in config["scrape_configs"] if job["job_name"] == "kvscope"]
    if len(jobs) != 1:
        raise ValueError(f"{PROMETHEUS_CONFIG} has {len(jobs)} jobs named kvscope, not one")
    (job,) = jobs
    job["static_configs"] = [{"targets": targets}]
    config["scrape_configs"] = [job]
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(PROMETHEUS_DIR / pattern) for pattern in config["rule_files"]]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def demos() -> Iterator[dict[str, str]]:
    """The module's two live demos' base URLs, by policy."""
    with running_demo(rate=300) as lru, running_demo(rate=300, policy="gated") as gated:
        yield {"lru": lru, "gated": gated}


@pytest.fixture(scope="module")
def listening() -> Iterator[str]:
    """A sidecar in listen mode (the demos' connect), a publisher admitted to its listen
    socket: its base URL. The listen socket's series exist only on such a sidecar."""
    settings = SidecarSettings(listen=["tcp://127.0.0.1:*"], port=0, token=None)  # env aside
    with Sidecar(settings) as sidecar, httpx.Client(base_url=sidecar.url, timeout=10) as http:
        (bound,) = http.get("/api/v1/stats").json()["listener"]["endpoints"]
        publisher = RawPublisher(connect=bound)
        try:
            wait_for(
                lambda: http.get("/api/v1/stats").json()["listener"]["connections"], bool,
                "the publisher admitted to the listen socket", WAIT_S,
            )  # fmt: skip
            yield sidecar.url
        finally:
            publisher.close()


@pytest.fixture(scope="module")
def prometheus(
    demos: dict[str, str], listening: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """Prometheus with the shipped config and rules, scraping both demos and the listening
    sidecar; its API client."""
    tmp_path = tmp_path_factory.mktemp("prometheus")
    bases = [*demos.values(), listening]
    config = config_for([urlsplit(base).netloc for base in bases], tmp_path)
    with running_prometheus(config, tmp_path / "tsdb") as api:
        yield api


def _has_data(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(series["value"][1])) for series in result)


def _checked_queries() -> list[PanelQuery]:
    """Every panel query but those on vLLM's series (no vLLM is scraped here)."""
    return [q for q in panel_queries() if not any(is_vllm(name) for name in metric_names(q.expr))]


def _variables() -> set[str]:
    return {v["name"] for board in dashboards().values() for v in board["templating"]["list"]}


def test_each_demo_has_its_own_tier_ratios_though_both_run_engine_demo(
    demos: dict[str, str], prometheus: httpx.Client
) -> None:
    """Two sidecars whose workers are labelled alike (engine "demo", rank 0, CPU) get a
    recorded ratio each, named by its scrape target: summed by engine, rank and medium, the
    lru and the gated demo read as one tier, and an alert on it could name neither."""
    instances = {urlsplit(base).netloc for base in demos.values()}

    def demo_instances(result: list[dict[str, Any]]) -> set[str | None]:
        return {s["metric"].get("instance") for s in result if s["metric"]["engine"] == "demo"}

    for name in TIER_RULES:
        wait_for(
            lambda name=name: demo_instances(query(prometheus, name)),
            lambda found: found == instances,
            f"{name} for each demo", WAIT_S,
        )  # fmt: skip


def test_every_dashboard_query_returns_data_its_legend_can_name_apart(
    prometheus: httpx.Client,
) -> None:
    """Two series of one query under one legend are two lines Grafana shows alike: which
    pod's is which cannot be read (the demos' engines are named alike, see above)."""
    variables = _variables()
    for panel_query in _checked_queries():
        promql = substitute(panel_query.expr, variables)
        result = wait_for(
            lambda promql=promql: query(prometheus, promql), _has_data,
            f"data for {panel_query}", WAIT_S,
        )  # fmt: skip
        for series in result:
            missing = legend_labels(panel_query.legend) - set(series["metric"])
            assert not missing, f"the legend names labels the series lack {missing}: {panel_query}"
        shown = [legend_of(panel_query.legend, series["metric"]) for series in result]
        assert len(shown) == len(set(shown)), f"series alike in the legend {shown}: {panel_query}"


def test_every_kvscope_recording_rule_records_and_every_rule_evaluates(
    prometheus: httpx.Client,
) -> None:
    for name in sorted(recorded_names()):
        if not is_vllm(name):
            wait_for(
                lambda name=name: query(prometheus, name), _has_data, f"{name} recorded", WAIT_S
            )
    groups = prometheus.get("/api/v1/rules").json()["data"]["groups"]
    loaded = [rule for group in groups for rule in group["rules"]]
    assert len(loaded) == len(rules())
    broken = [(rule["name"], rule.get("lastError")) for rule in loaded if rule["health"] != "ok"]
    assert not broken, broken


@dataclass(frozen=True, slots=True)
class Exported:
    """One series name as the sidecar exports it: its family's type, the labels it carries."""

    kind: str
    labels: frozenset[str]


def _exported(families: Iterable[Metric]) -> dict[str, Exported]:
    return {
        sample.name: Exported(family.type, frozenset(sample.labels))
        for family in families
        for sample in family.samples
    }


def listen_mode_series(listening: str) -> dict[str, Exported]:
    """The series a sidecar serves only in listen mode (the demos' connect): its listen
    socket's, from the listening sidecar."""
    body = httpx.get(f"{listening}/metrics", timeout=10).text
    series = _exported(text_string_to_metric_families(body))
    return {name: s for name, s in series.items() if name.startswith("kvscope_sidecar_listen_")}


@pytest.fixture(scope="module")
def exported(demos: dict[str, str], listening: str) -> dict[str, Exported]:
    """Every series the two demos' sidecars serve on /metrics, and the listen socket's."""
    series = listen_mode_series(listening)
    for base in demos.values():
        # The optimum's gauges appear with its first computation over the window.
        body = wait_for(
            lambda base=base: worker_exposition(base),
            lambda text: "kvscope_sidecar_window_optimum_hits{" in text,
            "the optimum's first computation", WAIT_S,
        )  # fmt: skip
        for name, found in _exported(text_string_to_metric_families(body)).items():
            known = series.get(name)
            labels = found.labels if known is None else known.labels | found.labels
            series[name] = Exported(found.kind, labels)
    return series


def _exprs() -> list[str]:
    return [q.expr for q in panel_queries()] + [rule["expr"] for rule in rules()]


def _kvscope(names: set[str]) -> set[str]:
    """kvscope's exported series among ``names``: not vLLM's, recorded, or Prometheus's."""
    return {n for n in names if not is_vllm(n)} - recorded_names() - PROMETHEUS_OWN


def test_every_metric_a_panel_or_rule_names_is_one_kvscope_exports(
    exported: dict[str, Exported],
) -> None:
    named = {name for expr in _exprs() for name in _kvscope(metric_names(expr))}
    unknown = named - set(exported)
    assert not unknown, f"named but not exported: {sorted(unknown)}"


def test_every_listen_socket_metric_is_plotted(listening: str) -> None:
    """Listen mode's own figures (its peers, frames and refusals) are on a panel, beside the
    alerts on its refusals: a new one the sidecar serves shows up unplotted here."""
    plotted = {name for q in panel_queries() for name in metric_names(q.expr)}
    listen = set(listen_mode_series(listening))
    assert listen, "no listen-socket series"
    assert listen <= plotted, f"not plotted: {sorted(listen - plotted)}"


LOSS_WORDS = frozenset({"shed", "refused", "dropped", "missed", "overflow", "faults"})
"""The words of a counter's name that say it counts what kvscope lost, refused or got past."""
LEFT_OUT_WORDS = frozenset({"conflicting", "stranded"})
"""The words of a gauge's name that say it counts what kvscope holds but leaves out or
cannot reach: worker samples left out of /metrics, blocks no prefix lookup reaches."""


def test_every_loss_buffer_and_left_out_count_kvscope_keeps_is_plotted(
    exported: dict[str, Exported],
) -> None:
    """Every buffer is bounded in bytes and what it sheds is counted, so that an operator can
    see both: a counter of losses or refusals (HTTP requests refused by reason, event-stream
    readers shed, frames dropped while a replay held them, transfer jobs refused at
    submit, ...) and a gauge of bytes held that no panel plots is one the dashboards never
    show. So is a gauge of what kvscope holds but leaves out (worker samples /metrics leaves
    out for disagreeing with another publisher's, blocks stranded past a lookup's reach)."""
    plotted = {name for q in panel_queries() for name in metric_names(q.expr)}
    losses = {
        name
        for name, series in exported.items()
        if series.kind == "counter" and LOSS_WORDS & set(name.split("_"))
    }
    gauges = {name for name, series in exported.items() if series.kind == "gauge"}
    held = {name for name in gauges if name.startswith("kvscope_") and name.endswith("_bytes")}
    left_out = {name for name in gauges if LEFT_OUT_WORDS & set(name.split("_"))}
    assert losses and held and left_out, "no loss counter, bytes or left-out gauge exported"
    unplotted = (losses | held | left_out) - plotted
    assert not unplotted, f"not plotted: {sorted(unplotted)}"


def test_every_metric_a_runbook_or_panel_description_names_is_one_kvscope_exports(
    exported: dict[str, Exported],
) -> None:
    """What an alert or a panel tells the operator to look at exists under that name."""
    boards = dashboards().values()
    texts = [panel["description"] for board in boards for _row, panel in panels(board)] + [
        text for alert in alerts() for text in alert["annotations"].values()
    ]
    words = {name for text in texts for name in re.findall(r"\bkvscope_\w+\b(?!\*)", text)}
    # A metric's namespace is its first two words; others (kvscope_endpoint) are settings.
    namespaces = {"_".join(name.split("_")[:2]) for name in exported}
    named = {word for word in words if "_".join(word.split("_")[:2]) in namespaces}
    assert named, "no metric named in a runbook or a panel's description"
    suffixes = ("", "_total", "_bucket")
    unknown = {name for name in named if not any(name + end in exported for end in suffixes)}
    assert not unknown, f"named but not exported: {sorted(unknown)}"


def test_every_series_a_rule_test_feeds_in_is_one_kvscope_exports_with_its_labels(
    exported: dict[str, Exported],
) -> None:
    """The promtool tests' input series are the sidecar's (the labels Prometheus adds aside):
    an alert tested on a series kvscope does not export, or labelled otherwise, proves
    nothing about the alert on the real one."""
    fed = [
        series["series"]
        for path in RULE_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for series in test["input_series"]
    ]
    assert fed, "no input series in the promtool tests"
    for selector in fed:
        name, _, matchers = selector.partition("{")
        if not _kvscope({name}):
            continue
        assert name in exported, f"not exported: {selector}"
        labels = set(re.findall(r"(\w+)\s*=", matchers)) - TARGET_LABELS
        assert labels == exported[name].labels, f"{selector}: {sorted(exported[name].labels)}"


def test_every_label_a_panel_or_rule_matches_or_groups_by_is_on_its_series(
    exported: dict[str, Exported],
) -> None:
    """A matcher names a label of its own series; a grouping (by, on) of a query on exported
    series alone names a label one of them carries (those on recorded series are the
    legend test's: their labels are the rule's grouping)."""
    for expr in _exprs():
        for name, label in matched_labels(expr):
            if _kvscope({name}):
                assert label in exported[name].labels | TARGET_LABELS, f"{name}: {label}: {expr}"
        names = metric_names(expr)
        if names == _kvscope(names):
            carried = TARGET_LABELS.union(*(exported[name].labels for name in names))
            assert grouping_labels(expr) <= carried, f"{expr}: {grouping_labels(expr) - carried}"


def _filtered_labels(board: dict[str, Any]) -> dict[str, str]:
    """Each filter ``board`` offers, by the label it filters (its label_values' second one)."""
    return {
        match[1]: variable["name"]
        for variable in board["templating"]["list"]
        if variable["type"] == "query" and (match := re.search(r",\s*(\w+)\)$", variable["query"]))
    }


def test_every_filter_a_dashboard_offers_narrows_every_series_that_carries_its_label(
    exported: dict[str, Exported],
) -> None:
    """A filter that narrows some panels and not others, on series carrying its label, leaves
    panels showing what the operator filtered away (the worker's series once ignored the
    publisher filter, stranded blocks the medium filter): every selector of a kvscope series
    (exported, with the scrape target's labels; or recorded: its rule's kept labels)
    carrying a filter's label matches it. vLLM's series have their own filter ($model; their
    instance is vLLM's server, their engine not kvscope's)."""
    recorded = {r["record"]: kept_labels(r["expr"]) for r in rules() if "record" in r}
    checked = 0
    for board in dashboards().values():
        filters = _filtered_labels(board)
        for _row, panel in panels(board):
            for target in panel["targets"]:
                expr = target["expr"]
                for name in metric_names(expr) - PROMETHEUS_OWN:
                    if is_vllm(name):
                        continue
                    carried = recorded.get(name) or exported[name].labels | TARGET_LABELS
                    for label in carried & set(filters):
                        checked += 1
                        matcher = rf'{re.escape(name)}\{{[^}}]*\b{label}=~"\${filters[label]}"'
                        assert re.search(matcher, expr), f"${filters[label]} not on {name}: {expr}"
    assert checked, "no series a filter narrows"


def test_rate_reads_counters_and_quantiles_read_buckets_by_le(
    exported: dict[str, Exported],
) -> None:
    for expr in _exprs():
        for name in _kvscope(counter_function_names(expr)):
            assert exported[name].kind in COUNTING, f"rate or increase of a gauge {name}: {expr}"
        for argument in quantile_arguments(expr):
            for name in _kvscope(metric_names(argument)):
                assert exported[name].kind == "histogram", f"not a histogram {name}: {expr}"
                assert name.endswith("_bucket"), f"histogram_quantile of {name}: {expr}"
            assert "le" in grouping_labels(argument, "by"), f"buckets summed over le: {expr}"


def test_the_efficiency_panel_shows_the_figure_the_sidecars_api_gives(
    demos: dict[str, str], prometheus: httpx.Client
) -> None:
    """Through the shipped rules, the efficiency and the optimum's hit ratio Prometheus records
    are /api/v1/insight's for the same computation of the optimum (the run counter names it).
    The gated demo has none: the curve does not simulate its policy."""
    lru = f'instance="{urlsplit(demos["lru"]).netloc}"'

    def recorded(name: str, runs: int) -> list[float]:
        same_run = f"kvscope_sidecar_window_optimum_runs_total{{{lru}}} == {runs}"
        found = query(prometheus, f"{name}{{{lru}}} and on (instance, publisher) ({same_run})")
        return [float(series["value"][1]) for series in found]

    def agrees() -> bool:
        insight = httpx.get(f"{demos['lru']}/api/v1/insight", timeout=10).json()
        (publisher,) = insight["publishers"]
        optimum, efficiency = publisher["optimum"], publisher["efficiency"]
        if optimum is None or efficiency is None:
            return False
        runs = optimum["runs"]
        same_efficiency = recorded(WINDOW_EFFICIENCY, runs) == pytest.approx([efficiency])
        best = recorded(WINDOW_OPTIMUM_HIT_RATIO, runs)
        return same_efficiency and best == pytest.approx([optimum["hit_ratio"]])

    wait_for(agrees, bool, "Prometheus records the API's efficiency", WAIT_S)
    (gated,) = httpx.get(f"{demos['gated']}/api/v1/insight", timeout=10).json()["publishers"]
    assert gated["efficiency"] is None
    (efficiency,) = query(prometheus, WINDOW_EFFICIENCY)
    (tier,) = query(prometheus, WINDOW_TIER_HIT_RATIO)
    (best,) = query(prometheus, f"{WINDOW_OPTIMUM_HIT_RATIO}{{{lru}}}")
    assert 0 < float(efficiency["value"][1]) <= 1
    assert float(tier["value"][1]) <= float(best["value"][1])
