"""Just enough PromQL reading for the tests: Grafana's variables filled in, metric names found.

Not a parser: it relies on the dashboards' and rules' own style (label
matchers in braces, grouping in ``by (...)``), which the tests hold anyway.
"""

from __future__ import annotations

import re

RATE_INTERVAL = "10s"
"""``$__rate_interval`` in the tests: a few scrapes at the tests' 1 s interval."""
VARIABLE_VALUE = ".*"
"""Every filter variable at "All", which Grafana sends as this regex."""

_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring",
     "group_left", "group_right", "inf", "nan"}
)  # fmt: skip


def substitute(expr: str, variables: set[str]) -> str:
    """``expr`` as Grafana would send it with every filter at All.

    Raises ValueError naming a variable that is neither a dashboard variable
    nor ``$__rate_interval``: such a query would reach Prometheus unfilled.
    """

    def value(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        if name == "__rate_interval":
            return RATE_INTERVAL
        if name in variables:
            return VARIABLE_VALUE
        raise ValueError(f"unknown variable ${name} in {expr!r}")

    return _VARIABLE.sub(value, expr)


def metric_names(expr: str) -> set[str]:
    """The metric (and recorded series) names ``expr`` selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)  # matchers, ranges
    text = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text
    )  # grouping labels
    names = re.findall(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:]|\s*\()", text)
    return {name for name in names if name not in _KEYWORDS}


def is_vllm(name: str) -> bool:
    """vLLM's own series, or a kvscope recording rule on them: data only when vLLM is scraped."""
    return name.startswith(("vllm:", "kvscope:vllm_"))
