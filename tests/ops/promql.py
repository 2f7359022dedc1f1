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


_SELECTOR = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
_COUNTER_FUNCTION = re.compile(r"\b(rate|irate|increase|resets)\s*\(")


def _arguments(expr: str, start: int) -> str:
    """The text inside the parenthesis that opens just before ``start``."""
    depth = 1
    for end in range(start, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[end], 0)
        if depth == 0:
            return expr[start:end]
    raise ValueError(f"unbalanced parentheses in {expr!r}")


def counter_function_names(expr: str) -> set[str]:
    """The names ``expr`` hands to rate(), irate(), increase() or resets(), which need counters."""
    return {
        name
        for match in _COUNTER_FUNCTION.finditer(expr)
        for name in metric_names(_arguments(expr, match.end()))
    }


def divisors(expr: str) -> list[str]:
    """What each ``/`` in ``expr`` divides by, as written: the parenthesised expression that
    follows it, or, where no parenthesis follows, the rest of ``expr`` (label values aside)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return [
        _arguments(text, match.end()) if match[1] else text[match.end() :]
        for match in re.finditer(r"/\s*(\()?", text)
    ]


def quantile_arguments(expr: str) -> list[str]:
    """What ``expr`` hands to each histogram_quantile(), the quantile included."""
    return [
        _arguments(expr, match.end()) for match in re.finditer(r"\bhistogram_quantile\s*\(", expr)
    ]


def matched_labels(expr: str) -> set[tuple[str, str]]:
    """(metric, label) for every label matcher of every selector in ``expr``."""
    return {
        (name, label)
        for name, matchers in _SELECTOR.findall(expr)
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers)
    }


GROUPING = "by|without|on|ignoring"
"""Every kind of grouping clause: those that keep the labels they name, and those that drop them."""
AGGREGATIONS = "sum|min|max|avg|group|stddev|stdvar|count|count_values|bottomk|topk|quantile"
"""PromQL's aggregation operators."""


def groupings(expr: str, clauses: str = GROUPING) -> list[set[str]]:
    """The labels each of ``expr``'s grouping ``clauses`` names, clause by clause."""
    return [
        {label.strip() for label in labels.split(",") if label.strip()}
        for labels in re.findall(rf"\b(?:{clauses})\s*\(([^)]*)\)", expr)
    ]


def grouping_labels(expr: str, clauses: str = GROUPING) -> set[str]:
    """The labels ``expr`` names in its grouping ``clauses`` (default: every kind)."""
    return set().union(*groupings(expr, clauses))


def bare_aggregations(expr: str) -> list[str]:
    """The aggregations in ``expr`` with no grouping clause before their argument
    (``sum(x)``): they keep no label at all."""
    return re.findall(rf"(?<![\w:])(?:{AGGREGATIONS})\s*\(", expr)


_REPLACED = re.compile(r',\s*"(\w+)"\s*,\s*"[^"]*"\s*,\s*"[^"]*"\s*,\s*"[^"]*"\s*\)')


def kept_labels(rule_expr: str) -> set[str]:
    """The labels a recording rule's series carry, the rules being written as they are: what
    its ``by`` clauses keep, and what its label_replace() calls set."""
    return grouping_labels(rule_expr, "by") | set(_REPLACED.findall(rule_expr))


_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend_labels(legend: str) -> set[str]:
    """The labels a Grafana legend format fills in (``{{engine}}``)."""
    return set(_LEGEND_LABEL.findall(legend))


def legend_of(legend: str, labels: dict[str, str]) -> str:
    """The legend Grafana shows for a series with ``labels`` (a missing label: empty)."""
    return _LEGEND_LABEL.sub(lambda match: labels.get(match[1], ""), legend)
