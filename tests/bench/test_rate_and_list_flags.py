"""A benchmark's sampling rates, shares and policy lists are refused by name before any run.

``--rates 0`` and ``--policies foo`` (``bench.insight_accuracy``) ran the exact sweep and
then ended in a traceback, as ``--rate 0``, ``5`` or ``nan`` did in ``bench.insight_curve``
and ``bench.insight_overhead``; ``--rates abc`` was "invalid _floats value", the name of a
function.
"""

from __future__ import annotations

import pytest

from tests.support.bench_flags import assert_refused_before_any_run

OUT_OF_RANGE = "a sampling rate must be above 0 and at most 1"


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["bench.insight_accuracy", "--rates", "0"], f"argument --rates: {OUT_OF_RANGE}, got 0"),
        (["bench.insight_accuracy", "--rates", "0.05,1.5"],
         f"argument --rates: {OUT_OF_RANGE}, got 1.5"),
        (["bench.insight_accuracy", "--rates", "abc"],
         "argument --rates: a sampling rate must be a decimal number"),
        (["bench.insight_accuracy", "--shares", "0.25,0"],
         "argument --shares: a share must be above 0, got 0"),
        (["bench.insight_accuracy", "--policies", "lru,foo"],
         "argument --policies: unknown policy 'foo' (choose from lru, arc, gated, opt)"),
        (["bench.insight_curve", "--rate", "0"], f"argument --rate: {OUT_OF_RANGE}, got 0"),
        (["bench.insight_curve", "--rate", "nan"],
         "argument --rate: a sampling rate must be a decimal number"),
        (["bench.insight_overhead", "--rate", "5"], f"argument --rate: {OUT_OF_RANGE}, got 5"),
        (["bench.transfer_cuda", "--budget-gib", "-1"],
         "--budget-gib must be a number of GiB above 0, got -1.0"),
        (["bench.transfer_cuda", "--budget-gib", "nan"],
         "--budget-gib must be a number of GiB above 0, got nan"),
    ],
)  # fmt: skip
def test_a_bad_value_is_refused_by_name_before_any_run(command: list[str], message: str) -> None:
    assert_refused_before_any_run(command, message)
