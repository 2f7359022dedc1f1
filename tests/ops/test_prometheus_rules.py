"""The shipped Prometheus config and rules pass promtool, and every alert is tested both ways.

``promtool test rules`` runs the unit tests in docker/prometheus/tests/; the
structural test here holds that each alert has a case where it fires and one
where it stays silent, and a runbook for whoever it wakes.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.ops.artifacts import PROMETHEUS_CONFIG, RULE_FILES, RULE_TESTS, alerts
from tests.support.prometheus import needs_promtool, promtool


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
