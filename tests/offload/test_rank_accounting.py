"""Tensor-parallel job accounting: a job is done only when every rank has reported it.

Unit cases for each rule and refusal, a property test over random
interleavings of per-rank reports, and a real CPU manager driven through
the accounting to show a store stays invisible until its last rank reports.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offload import CPUOffloadingManager
from offload.transfer.job import Direction
from offload.transfer.rank_accounting import JobOutcome, RankAccounting

STORE, LOAD = Direction.GPU_TO_CPU, Direction.CPU_TO_GPU


def counters(accounting: RankAccounting) -> tuple[int, int, int, int]:
    return (
        accounting.jobs_in_flight,
        accounting.jobs_ok,
        accounting.jobs_failed,
        accounting.rank_reports,
    )


def test_a_job_finishes_only_when_its_last_rank_reports() -> None:
    accounting = RankAccounting(world_size=3)
    accounting.register(7, STORE, [1, 2])
    assert accounting.report(7, 2, True) is None
    assert accounting.report(7, 0, True) is None
    assert accounting.jobs_in_flight == 1
    outcome = accounting.report(7, 1, True)
    assert outcome == JobOutcome(7, STORE, [1, 2], ())
    assert outcome.success
    assert counters(accounting) == (0, 1, 0, 3)


def test_a_failure_on_one_rank_fails_the_job_for_all_but_only_at_the_last_report() -> None:
    accounting = RankAccounting(world_size=4)
    accounting.register(1, STORE, [5])
    assert accounting.report(1, 3, False) is None
    assert accounting.report(1, 0, True) is None
    assert accounting.report(1, 1, False) is None
    outcome = accounting.report(1, 2, True)
    assert outcome is not None
    assert not outcome.success
    assert outcome.failed_ranks == (1, 3)
    assert counters(accounting) == (0, 0, 1, 4)


@pytest.mark.parametrize("success", [True, False])
def test_world_size_one_finishes_on_the_single_report(success: bool) -> None:
    accounting = RankAccounting(world_size=1)
    accounting.register(0, LOAD, ["a"])
    outcome = accounting.report(0, 0, success)
    assert outcome == JobOutcome(0, LOAD, ["a"], () if success else (0,))
    assert counters(accounting) == (0, int(success), int(not success), 1)


def test_reports_for_different_jobs_interleave_and_outcomes_come_in_finishing_order() -> None:
    accounting = RankAccounting(world_size=2)
    for job_id in (1, 2, 3):
        accounting.register(job_id, STORE, [job_id])
    reports = [(3, 1, True), (1, 0, True), (2, 1, False), (2, 0, True), (3, 0, True), (1, 1, True)]
    finished = [o for o in (accounting.report(*r) for r in reports) if o is not None]
    assert [(o.job_id, o.success) for o in finished] == [(2, False), (3, True), (1, True)]
    assert counters(accounting) == (0, 2, 1, 6)


def test_a_finished_job_is_forgotten_so_its_id_may_be_registered_again() -> None:
    accounting = RankAccounting(world_size=2)
    accounting.register(4, STORE, [1])
    accounting.report(4, 0, True)
    accounting.report(4, 1, True)
    accounting.register(4, LOAD, [1])
    assert accounting.report(4, 1, True) is None
    assert accounting.report(4, 0, True) == JobOutcome(4, LOAD, [1], ())


@pytest.mark.parametrize("world_size", [0, -1])
def test_world_size_below_one_is_refused(world_size: int) -> None:
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        RankAccounting(world_size)


@pytest.mark.parametrize("world_size", [2.0, True, "2"])
def test_a_world_size_that_is_not_an_int_is_refused(world_size: object) -> None:
    with pytest.raises(TypeError, match="world_size must be an int"):
        RankAccounting(world_size)


@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize(
    ("job_id", "rank", "message"),
    [
        (1, -1, r"rank -1 is outside \[0, "),
        (1, 3, r"rank 3 is outside \[0, "),
        (9, 0, "job 9 is not in flight"),
        (1, 0.5, "rank must be an int, got float 0.5"),
        (1, True, "rank must be an int, got bool True"),
        (1, "0", "rank must be an int, got str '0'"),
    ],
)
def test_bad_reports_are_refused_and_change_nothing(
    world_size: int, job_id: int, rank: object, message: str
) -> None:
    accounting = RankAccounting(world_size)
    accounting.register(1, STORE, [1])
    before = counters(accounting)
    with pytest.raises(ValueError, match=message):
        accounting.report(job_id, rank, False)
    assert counters(accounting) == before
    # The job still needs, and takes, every rank's report, failure-free.
    outcomes = [accounting.report(1, r, True) for r in range(world_size)]
    assert outcomes[-1] == JobOutcome(1, STORE, [1], ())


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_report_after_the_job_finished_is_refused(world_size: int) -> None:
    accounting = RankAccounting(world_size)
    accounting.register(1, STORE, [1])
    for rank in range(world_size):
        accounting.report(1, rank, True)
    with pytest.raises(ValueError, match="already finished"):
        accounting.report(1, 0, True)
    assert counters(accounting) == (0, 1, 0, world_size)


def test_the_same_rank_reporting_a_job_twice_is_refused_and_changes_nothing() -> None:
    accounting = RankAccounting(world_size=2)
    accounting.register(1, STORE, [1])
    accounting.report(1, 0, True)
    with pytest.raises(ValueError, match="rank 0 already reported job 1"):
        accounting.report(1, 0, False)
    assert counters(accounting) == (1, 0, 0, 1)
    # The refused failure left no mark: the job still succeeds.
    assert accounting.report(1, 1, True) == JobOutcome(1, STORE, [1], ())


def test_registering_an_id_in_flight_is_refused_and_keeps_the_first_job() -> None:
    accounting = RankAccounting(world_size=2)
    accounting.register(1, STORE, [1])
    accounting.report(1, 0, True)
    with pytest.raises(ValueError, match="job 1 is already in flight"):
        accounting.register(1, LOAD, [2])
    assert accounting.report(1, 1, True) == JobOutcome(1, STORE, [1], ())


@settings(max_examples=200, deadline=None)
@given(data=st.data(), world_size=st.integers(1, 4), num_jobs=st.integers(1, 6))
def test_random_interleavings_finish_every_job_once_after_its_last_report(
    data: st.DataObject, world_size: int, num_jobs: int
) -> None:
    results = data.draw(
        st.lists(
            st.lists(st.booleans(), min_size=world_size, max_size=world_size),
            min_size=num_jobs,
            max_size=num_jobs,
        ),
        label="results[job][rank]",
    )
    reports = data.draw(
        st.permutations([(job, rank) for job in range(num_jobs) for rank in range(world_size)]),
        label="report order",
    )
    last_report = {job: i for i, (job, _) in enumerate(reports)}
    accounting = RankAccounting(world_size)
    registered: set[int] = set()
    finished: list[tuple[int, int]] = []  # (report index, job)
    for i, (job, rank) in enumerate(reports):
        if job not in registered:  # each job registers just before its first report
            accounting.register(job, STORE, [job])
            registered.add(job)
        outcome = accounting.report(job, rank, results[job][rank])
        if outcome is not None:
            assert outcome.job_id == job
            assert outcome.block_hashes == [job]
            assert outcome.success == all(results[job])
            assert outcome.failed_ranks == tuple(r for r, ok in enumerate(results[job]) if not ok)
            finished.append((i, job))
        assert accounting.jobs_in_flight == len(registered) - len(finished)
    assert finished == sorted((i, job) for job, i in last_report.items())
    ok = sum(all(r) for r in results)
    assert counters(accounting) == (0, ok, num_jobs - ok, num_jobs * world_size)


@pytest.mark.parametrize("failing_rank", [None, 0, 2])
def test_a_store_becomes_visible_only_when_every_rank_reported_it(failing_rank: int | None) -> None:
    world_size = 4
    manager = CPUOffloadingManager(block_size=16, num_blocks=8)
    accounting = RankAccounting(world_size)
    hashes = [b"a", b"b", b"c"]
    out = manager.prepare_store(hashes)
    assert out is not None
    accounting.register(1, STORE, out.block_hashes_to_store)
    for rank in range(world_size - 1):
        assert accounting.report(1, rank, rank != failing_rank) is None
        assert manager.lookup(hashes) == 0
    outcome = accounting.report(1, world_size - 1, True)
    assert outcome is not None
    manager.complete_store(outcome.block_hashes, outcome.success)
    if failing_rank is None:
        assert manager.lookup(hashes) == 3
        assert manager.pool.num_free == 5
    else:
        assert manager.lookup(hashes) == 0
        assert not any(h in manager.policy.blocks for h in hashes)
        assert manager.pool.num_free == manager.num_blocks
    assert manager.invariant_violations() == []


def test_a_load_keeps_its_blocks_pinned_until_every_rank_reported_it() -> None:
    world_size = 2
    manager = CPUOffloadingManager(block_size=16, num_blocks=2)
    out = manager.prepare_store([1, 2])
    assert out is not None
    manager.complete_store(out.block_hashes_to_store)
    accounting = RankAccounting(world_size)
    manager.prepare_load([1, 2])
    accounting.register(5, LOAD, [1, 2])
    assert accounting.report(5, 1, True) is None
    assert manager.prepare_store([3]) is None  # both blocks still pinned: nothing to evict
    outcome = accounting.report(5, 0, True)
    assert outcome is not None and outcome.direction is LOAD
    manager.complete_load(outcome.block_hashes)
    assert manager.prepare_store([3]) is not None
    assert manager.invariant_violations() == []
