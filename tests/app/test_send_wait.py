"""The send wait's rule (app/api/send_wait.py), on times and buffer sizes given to it.

The loopback tests in tests/hostile/test_http_streams.py show a connection held to it;
these show the arithmetic: the grace once per wait, the rate over all the time waited
since, and the time the server wrote below the mark left out.
"""

from __future__ import annotations

import pytest

from app.api.send_wait import SendWait

KIB = 1024


def test_a_client_that_reads_nothing_in_a_window_is_timed_out_even_in_its_grace() -> None:
    wait = SendWait(window_s=2.0, min_bytes_per_s=0)
    assert wait.measure(0.0, 100 * KIB) == 2.0
    assert wait.window_end(2.0, 100 * KIB) == "send_timeout"


def test_the_first_window_asks_a_byte_and_the_rest_the_rate_over_all_since() -> None:
    wait = SendWait(window_s=2.0, min_bytes_per_s=10 * KIB)
    wait.measure(0.0, 500 * KIB)
    assert wait.window_end(2.0, 500 * KIB - 1) is None  # the grace: a byte will do
    assert wait.window_end(4.0, 450 * KIB) is None  # 50 KiB in 2 s: past 20 KiB
    assert wait.window_end(6.0, 445 * KIB) is None  # 55 KiB in 4 s: past 40 KiB
    assert wait.window_end(8.0, 440 * KIB) == "send_too_slow"  # a byte short of 60 KiB in 6 s


@pytest.mark.parametrize(("least", "verdict"), [(20 * KIB, None), (40 * KIB, "send_too_slow")])
def test_drains_below_the_mark_neither_restart_the_window_nor_give_a_grace(
    least: int, verdict: str | None
) -> None:
    """A stretch ends at each drain below the low-water mark, and the server writes past the
    high-water mark at once: each such stretch once began a window of its own, with a grace
    of its own, so a client that drained 48 KiB each 1.9 s was never asked for the rate."""
    wait = SendWait(window_s=2.0, min_bytes_per_s=least)
    wait.measure(0.0, 64 * KIB)
    wait.pause(1.9, 16 * KIB)
    assert wait.measure(1.9, 64 * KIB) == pytest.approx(0.1)  # the window runs on
    assert wait.window_end(2.0, 62 * KIB) is None  # the grace ends: it read
    wait.pause(3.8, 16 * KIB)
    assert wait.measure(3.8, 64 * KIB) == pytest.approx(0.2)
    assert wait.window_end(4.0, 60 * KIB) == verdict  # 50 KiB in 2 s: 25 KiB/s


def test_time_the_server_spent_writing_below_the_mark_is_left_out() -> None:
    """An event stream between its events: what the client read then cannot be told from what
    the server added, so neither the bytes nor the time count."""
    wait = SendWait(window_s=2.0, min_bytes_per_s=10 * KIB)
    wait.measure(0.0, 100 * KIB)
    assert wait.window_end(2.0, 90 * KIB) is None  # the grace
    wait.pause(3.0, 60 * KIB)  # 30 KiB in 1 s
    assert wait.measure(600.0, 80 * KIB) == 1.0  # ten minutes later, the window's second half
    assert wait.window_end(601.0, 70 * KIB) is None  # 40 KiB in 2 s waited: past 20 KiB
