"""The shipped Prometheus config and rules pass promtool, and every alert is tested both ways.

``promtool test rules`` runs the unit tests in docker/prometheus/tests/; the
structural tests here hold that each alert has a case where it fires and one
where it stays silent, and a runbook for whoever it wakes, that no rule
sums across scrape targets (the unit tests feed two pods alike but for theirs),
and that no rule divides by a figure that may be 0 (the unit tests feed an idle tier).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.ops.artifacts import PROMETHEUS_CONFIG, RULE_FILES, RULE_TESTS, alerts, rules
from tests.ops.promql import bare_aggregations, divisors, groupings
from tests.support.prometheus import needs_promtool, promtool

TARGET = {"job", "instance"}
"""The scrape target's labels: which pod (which sidecar, which vLLM server) a series is from."""


def _passes(*args: str) -> None:
    result = promtool(*args)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.e2e
@needs_promtool
def test_promtool_checks_the_config_and_the_rules_it_loads() -> None:
    _passes("check", "config", str(PROMETHEUS_CONFIG))
    _passes("check", "rules", *map(str, RULE_FILES))


@pytest.mark.e2e
@needs_promtool
def test_promtool_rule_unit_tests_pass() -> None:
    assert RULE_TESTS, "no promtool tests in docker/prometheus/tests/"
    _passes("test", "rules", *map(str, RULE_TESTS))


def _cases() -> list[dict[str, Any]]:
    return [
        case
        for path in RULE_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]


@pytest.mark.parametrize("alert", alerts(), ids=lambda alert: alert["alert"])
def test_every_alert_has_a_runbook_and_cases_firing_and_silent(alert: dict[str, Any]) -> None:
    name = alert["alert"]
    assert alert["annotations"].get("runbook", "").strip(), f"{name}: no runbook"
    assert alert["labels"].get("severity") in {"warning", "critical"}, f"{name}: no severity"
    cases = [case for case in _cases() if case["alertname"] == name]
    assert any(case.get("exp_alerts") for case in cases), f"{name}: no case where it fires"
    assert any(not case.get("exp_alerts") for case in cases), f"{name}: no case where it is silent"


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule.get("record") or rule["alert"])
def test_no_rule_groups_away_the_scrape_target(rule: dict[str, Any]) -> None:
    """Engine ids and publisher names repeat from pod to pod (a deployment's replicas all
    engine 0, every sidecar's publisher tcp://127.0.0.1:5560), so only the scrape target
    tells two pods' series apart: a rule that groups it away adds their rates, blends their
    ratios and fires an alert that names no pod. promtool's tests show it on the rules as
    they are; this holds a new rule to it too."""
    expr = rule["expr"]
    assert not bare_aggregations(expr), f"an aggregation keeps no label: {expr}"
    for kept in groupings(expr, "by|on"):
        assert kept >= TARGET, f"groups away {sorted(TARGET - kept)}: {expr}"
    for dropped in groupings(expr, "without|ignoring"):
        assert not dropped & TARGET, f"groups away {sorted(dropped & TARGET)}: {expr}"


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule.get("record") or rule["alert"])
def test_no_rule_divides_by_a_figure_that_may_be_zero(rule: dict[str, Any]) -> None:
    """An idle tier (no lookup or eviction in the window), an empty window of the optimum or
    a vLLM server with no transfers gives a denominator of 0, and a ratio of it is NaN (or
    Inf): a panel shows "NaN" for an idle worker, a stat reads it as a figure. Each divisor
    is kept only where above 0, so such a ratio is not recorded at all (no data). promtool's
    idle case shows it on the rules as they are; this holds a new rule to it too."""
    expr = rule["expr"]
    for divisor in divisors(expr):
        assert re.search(r">\s*0\s*$", divisor), f"divides by {divisor!r}, maybe 0: {expr}"
