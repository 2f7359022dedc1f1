"""The operators' kit as the tests read it: the committed dashboards and the Prometheus rules."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = ROOT / "dashboards"
PROMETHEUS_DIR = ROOT / "docker" / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))


@dataclass(frozen=True, slots=True)
class PanelQuery:
    """One target of one panel, with where it sits (for failure messages)."""

    dashboard: str
    row: str
    panel: str
    expr: str
    legend: str

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.row} / {self.panel}: {self.expr}"


def dashboards() -> dict[str, dict[str, Any]]:
    """Every committed dashboard JSON, by file name."""
    return {
        path.name: json.loads(path.read_text()) for path in sorted(DASHBOARD_DIR.glob("*.json"))
    }


def panels(board: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(row title, panel) for every panel but rows, those inside collapsed rows included."""
    row = ""
    for panel in board["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            for inner in panel.get("panels", []):
                yield row, inner
        else:
            yield row, panel


def panel_queries() -> list[PanelQuery]:
    """Every target of every panel of every dashboard."""
    return [
        PanelQuery(board["title"], row, panel["title"], target["expr"], target["legendFormat"])
        for board in dashboards().values()
        for row, panel in panels(board)
        for target in panel["targets"]
    ]


def rules() -> list[dict[str, Any]]:
    """Every recording and alerting rule, from every rule file."""
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]
