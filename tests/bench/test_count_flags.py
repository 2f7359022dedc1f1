"""A benchmark's count flags take whole numbers of at least 1, refused by name otherwise.

``type=int`` took 0, which ended a benchmark in a traceback (the best of no runs), and a
negative ``--requests``, which sliced the trace to all but its last requests in silence.
"""

from __future__ import annotations

import pytest

from tests.support.bench_flags import assert_refused_before_any_run


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["bench.hot_path", "--no-peer", "--repeat", "0"], "argument --repeat: must be at least 1"),
        (["bench.vllm_race", "--requests", "-5"], "argument --requests: plain decimal digits"),
        (["bench.telemetry_overhead", "--chunk", "0"], "argument --chunk: must be at least 1"),
        (["bench.insight_accuracy", "--seeds", "2.5"], "it has a character that is not a digit"),
        (["bench.insight_overhead", "--pairs", "0"], "argument --pairs: must be at least 1"),
        (["bench.transfer_cuda", "--sizes", "0"], "argument --sizes: must be at least 1"),
        (["bench.transfer_cuda", "--batches", "8", "-1"], "argument --batches: plain decimal"),
    ],
)
def test_a_count_below_one_or_not_whole_is_refused_before_any_run(
    command: list[str], message: str
) -> None:
    assert_refused_before_any_run(command, message)
