"""kvscope's lookup counters under vLLM 0.33's own scheduler: one count per scheduling.

vLLM's scheduler asks the connector about a waiting request every step until
it admits it: while no GPU blocks are free, and while a hit is still being
written (the lookup is deferred). vLLM's own prefix-cache stats for its
connector count the request once, when it is admitted; kvscope's lookup
counters (and so the hit ratio of its dashboards and ``/api/v1/stats``) do
the same, so a request that waits is not weighted by how long it waited.
Until 2026-11-29 each of those steps counted its lookups again: a request
that waited four steps for GPU blocks counted its four hits five times.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from vllm.v1.kv_offload.base import ReqContext, ScheduleEndContext
from vllm.v1.request import RequestStatus

from offload.cpu.manager_stats import ManagerStats
from offload.cpu.policies import registry
from tests.vllm.vllm_engine import BLOCK_TOKENS, Engine

PROMPT = range(1, 4 * BLOCK_TOKENS + 1)
"""Four chunks (one block each)."""


def _counts(engine: Engine) -> tuple[int, int, int, int, int]:
    """kvscope's lookups, blocks asked, blocks and tokens found, and misses."""
    stats: ManagerStats = engine.manager.core.stats
    misses = sum(engine.manager.core.misses.lookups.values())
    return (
        stats.lookup_calls,
        stats.lookup_blocks,
        stats.lookup_hit_blocks,
        stats.lookup_hit_tokens,
        misses,
    )


def test_a_request_waiting_for_gpu_blocks_counts_its_lookup_once_when_scheduled(
    tmp_path: Path,
) -> None:
    """Its prefix is on the CPU tier, but a running request holds every GPU block: vLLM
    asks about it each step, and counts it once it admits it; so does kvscope."""
    engine = Engine(tmp_path, num_gpu_blocks=10, extra={"num_cpu_blocks": 32})
    engine.add("a", PROMPT, max_tokens=1)
    for _ in range(2):  # a runs, its four chunks are stored
        engine.step()
    # 8 of the 9 usable GPU blocks, and the ninth once it decodes: a's cached blocks go.
    engine.add("hog", range(1000, 1000 + 8 * BLOCK_TOKENS), max_tokens=50)
    engine.step()
    before = _counts(engine)
    assert before == (2, 2, 0, 0, 2), "a and the hog: each missed its first chunk"
    waiting = engine.add("b", [*PROMPT, *range(200, 200 + BLOCK_TOKENS)], max_tokens=1)
    for _ in range(4):
        assert list(engine.step().num_scheduled_tokens) == ["hog"]
        assert waiting.status is RequestStatus.WAITING
        assert _counts(engine) == before, "a request left waiting counts no lookup"
    assert engine.external_hits == 0, "nor does it in vLLM's stats"

    engine.scheduler.finish_requests("hog", RequestStatus.FINISHED_ABORTED)
    engine.step()  # b is admitted: its four chunks load
    assert waiting.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    # Its four chunks found and its fifth missed, once.
    assert _counts(engine) == (7, 7, 4, 4 * BLOCK_TOKENS, 3)
    assert engine.manager.core.stats.lookup_hit_tokens == engine.external_hits


def test_a_lookup_deferred_while_its_hit_is_written_counts_once_it_is_scheduled(
    tmp_path: Path,
) -> None:
    """Its prefix is still being stored: the tier answers HIT_PENDING, and vLLM defers the
    request each step until the store lands; it counts the hits once, and so does kvscope
    (where each deferred step counted five chunks asked, none found and one missed: a hit
    ratio of 4 in 26, where the admitted lookup alone gives 4 in 6)."""
    engine = Engine(tmp_path, num_gpu_blocks=16, extra={"num_cpu_blocks": 32})
    engine.add("a", PROMPT, max_tokens=1)
    engine.step(hold=True)  # a's store is in flight
    engine.step(hold=True)  # a is done
    assert engine.scheduler.reset_prefix_cache(), "only the CPU tier holds a's blocks"
    before = _counts(engine)
    deferred = engine.add("c", [*PROMPT, *range(300, 300 + BLOCK_TOKENS)], max_tokens=1)
    for _ in range(3):
        engine.step(hold=True)
        assert deferred.status is RequestStatus.WAITING
        assert _counts(engine) == before, "a deferred lookup counts nothing"

    engine.step()  # a's store is reported finished
    engine.step()  # c is admitted: its four chunks load
    assert deferred.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    calls, blocks, hits, hit_tokens, misses = _counts(engine)
    assert (calls - before[0], blocks - before[1], hits, hit_tokens, misses - before[4]) == (
        5,
        5,
        4,
        4 * BLOCK_TOKENS,
        1,
    )
    assert hit_tokens == engine.external_hits


def test_a_request_admitted_with_no_hit_and_never_offered_counts_its_lookup_once(
    tmp_path: Path,
) -> None:
    """A running prefill takes all but 10 tokens of the step's budget: b is admitted with
    those (its first chunk missed, none computed whole), then aborted, so no load or offer
    ever names it. vLLM counted its lookup when it admitted it; kvscope counts it then too
    (where it once counted it never: the hit ratio's denominator missed such requests)."""
    engine = Engine(tmp_path, num_gpu_blocks=64, extra={"num_cpu_blocks": 32}, token_budget=64)
    engine.add("long", range(1000, 1000 + 64 + 54), max_tokens=1)
    engine.step()  # 64 of its 118 tokens: its lookup counted at its first offer
    before = _counts(engine)
    queries = engine.external_queries
    admitted = engine.add("b", PROMPT, max_tokens=1)
    output = engine.step()
    assert output.num_scheduled_tokens == {"long": 54, "b": 10}
    assert engine.manager.core.stats.store_requested_blocks == 7, "b offered nothing"
    assert _counts(engine) == (before[0] + 1, before[1] + 1, 0, 0, before[4] + 1)
    assert engine.external_queries > queries, "vLLM counted b's lookup as it admitted it"

    engine.scheduler.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    assert admitted.status is RequestStatus.FINISHED_ABORTED
    engine.step()
    engine.step()
    assert _counts(engine) == (before[0] + 1, before[1] + 1, 0, 0, before[4] + 1)


REFUSING_POLICY = '''
from offload.cpu.policies.lru import LRUCachePolicy


class refuse_all(LRUCachePolicy):
    """Admits nothing: every block offered is refused (not admitted)."""

    name = "refuse_all"

    def admit(self, block_hashes, free, request=None):
        return []
'''


def test_a_miss_is_charged_the_reason_it_had_when_it_was_looked_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """a and b are admitted in one step with the same prompt, both missing its first
    chunk, never offered before: cold. a's offer comes first and is refused; b's lookup
    is counted at b's offer, after it, and stays cold (judged then, it was charged to
    not_admitted: a refusal that came after the lookup)."""
    (tmp_path / "refusing_policy.py").write_text(REFUSING_POLICY)
    monkeypatch.syspath_prepend(str(tmp_path))
    # The policy registers itself for the process; the registry is as it was afterwards.
    monkeypatch.setattr(registry, "_POLICIES", dict(registry._POLICIES))
    monkeypatch.delitem(sys.modules, "refusing_policy", raising=False)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    extra = {
        "num_cpu_blocks": 32,
        "eviction_policy": "refuse_all",
        "cache_policy_module_path": "refusing_policy",
    }
    engine = Engine(model_dir, num_gpu_blocks=64, extra=extra)
    engine.add("a", PROMPT, max_tokens=1)
    engine.add("b", PROMPT, max_tokens=1)
    output = engine.step()
    assert set(output.num_scheduled_tokens) == {"a", "b"}
    misses = engine.manager.core.misses
    # a's four chunks refused, then b's (after b's lookups were counted).
    assert engine.manager.core.stats.store_not_admitted_blocks == 8
    assert misses.lookups == {**dict.fromkeys(misses.lookups, 0), "cold": 2}
    # Asked again now, the first chunk was refused: that is its reason from here on.
    engine.add("c", PROMPT, max_tokens=1)
    engine.step()
    assert misses.lookups == {**dict.fromkeys(misses.lookups, 0), "cold": 2, "not_admitted": 1}


def _scheduled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runner: str) -> Engine:
    """x and b (five 16-token blocks each, chunks of four blocks) each admitted with 16
    tokens, then preempted by a prefix-cache reset and scheduled again, each with its first
    chunk missed and no chunk computed: vLLM's V1 model runner (``runner`` "0") names them
    as resumed requests, its V2 one (the default where it runs) as new ones."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", runner)
    extra = {"num_cpu_blocks": 32, "blocks_per_chunk": 4}
    engine = Engine(tmp_path, num_gpu_blocks=7, extra=extra, prefill_chunk=16)
    assert engine.scheduler.use_v2_model_runner is (runner == "1")
    engine.add("x", range(1000, 1000 + 5 * BLOCK_TOKENS), max_tokens=1)
    engine.add("b", range(1, 1 + 5 * BLOCK_TOKENS), max_tokens=1)
    engine.step()
    assert _counts(engine) == (2, 2, 0, 0, 2)
    assert engine.scheduler.reset_prefix_cache(reset_running_requests=True)
    output = engine.step()
    assert output.num_scheduled_tokens == {"x": 16, "b": 16}
    resumed = output.scheduled_cached_reqs.resumed_req_ids
    assert resumed == (set() if runner == "1" else {"x", "b"})
    assert engine.external_queries == 4 * 5 * BLOCK_TOKENS, "vLLM counted four schedulings"
    return engine


@pytest.mark.parametrize("runner", ["0", "1"])
def test_a_request_scheduled_again_and_preempted_before_its_first_chunk_counts_its_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runner: str
) -> None:
    """Scheduled again after a preemption, b is preempted again (GPU blocks run out) with
    three blocks of its first chunk computed, so no offer names it. vLLM's scheduler
    preempts only running requests, so its lookups asked before were of the scheduling
    that ran: kvscope counts them then, under either model runner (where, under the V1
    runner, it once counted them never)."""
    engine = _scheduled_again(tmp_path, monkeypatch, runner)
    engine.step()
    engine.step()
    output = engine.step()
    assert output.preempted_req_ids == {"b"}
    assert engine.scheduler.requests["b"].status is RequestStatus.PREEMPTED
    # x's offer of its first chunk counted x's; b's preemption counted b's.
    assert engine.manager.core.stats.store_requested_blocks == 1
    assert _counts(engine) == (4, 4, 0, 0, 4)
    engine.scheduler.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    engine.step()
    assert _counts(engine) == (4, 4, 0, 0, 4)


MANAGER_CALLS = (
    "on_new_request",
    "lookup",
    "get_load_source",
    "prepare_load",
    "touch",
    "complete_load",
    "prepare_store",
    "complete_store",
    "on_request_finished",
)
"""The methods through which vLLM's connector tells kvscope's manager of one request."""


def _calls_about(engine: Engine, req_id: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """What vLLM tells kvscope's manager of ``req_id`` from here on, in order: each call naming
    it, with its keys (and a lookup's answer), and at each step's end whether the step names it
    new or preempted. The manager still does every call."""
    calls: list[tuple] = []
    manager = engine.manager
    for name in MANAGER_CALLS:
        method = getattr(manager, name)

        def recorded(*args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
            answer = _method(*args, **kwargs)
            context = next(arg for arg in (*args, *kwargs.values()) if isinstance(arg, ReqContext))
            if context.req_id == req_id:
                given = [
                    sorted(arg) if isinstance(arg, set | frozenset) else arg
                    for arg in (*args, *kwargs.values())
                    if arg is not context
                ]
                calls.append((_name, given, answer if _name == "lookup" else None))
            return answer

        monkeypatch.setattr(manager, name, recorded)
    schedule_end = manager.on_schedule_end

    def ended(context: ScheduleEndContext) -> None:
        named = (req_id in context.new_req_ids, req_id in context.preempted_req_ids)
        calls.append(("on_schedule_end", *named))
        schedule_end(context)

    monkeypatch.setattr(manager, "on_schedule_end", ended)
    return calls


def _preempted_then_aborted(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, num_gpu_blocks: int
) -> tuple[Engine, list[tuple], dict[str, int]]:
    """x (three blocks) and b (eight) prefill in steps of 72 tokens; once b's prompt is done
    and its first token sampled (nine blocks in all), a reset of vLLM's prefix cache preempts
    both. In the next step x is computed again (51 tokens) and b looked up again, its first
    chunk missed (never stored: the store threshold is out of reach). With ``num_gpu_blocks``
    of 20 b is scheduled again with the 21 tokens left, no chunk computed whole; with 13 its
    whole sequence no longer fits beside x (vLLM admits a request only then), and it is left
    waiting. Then b is aborted. Returns the engine, what vLLM told kvscope's manager of b, and
    the tokens the step after the reset scheduled."""
    model_dir.mkdir()
    extra = {"num_cpu_blocks": 32, "blocks_per_chunk": 4, "store_threshold": 1000}
    engine = Engine(model_dir, num_gpu_blocks=num_gpu_blocks, extra=extra, token_budget=72)
    calls = _calls_about(engine, "b", monkeypatch)
    engine.add("x", range(1000, 1000 + 3 * BLOCK_TOKENS), max_tokens=30)
    request = engine.add("b", range(1, 1 + 8 * BLOCK_TOKENS), max_tokens=3)
    for _ in range(3):
        engine.step()
    assert request.num_tokens == 8 * BLOCK_TOKENS + 1
    assert engine.scheduler.reset_prefix_cache(reset_running_requests=True)
    output = engine.step()
    assert output.preempted_req_ids == {"x", "b"}
    engine.scheduler.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    engine.step()
    return engine, calls, output.num_scheduled_tokens


@pytest.mark.parametrize("runner", ["0", "1"])
def test_a_request_scheduled_again_and_aborted_before_its_first_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runner: str
) -> None:
    """The limit the README states. vLLM counts b's lookup after the reset where it scheduled
    b again, not where it left b waiting. Under vLLM's V1 model runner (``runner`` "0") it tells
    kvscope's manager exactly the same of b in both (no load, no offer, not among the step's new
    requests, then its end), so no count the manager keeps can tell them apart: the scheduled
    b's lookup goes uncounted, one chunk asked and missed. Under the V2 runner the step names b
    new where it scheduled it, and that lookup counts."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", runner)
    scheduled, told, ran = _preempted_then_aborted(tmp_path / "scheduled", monkeypatch, 20)
    left, told_left, ran_left = _preempted_then_aborted(tmp_path / "left", monkeypatch, 13)
    assert (ran, ran_left) == ({"x": 51, "b": 21}, {"x": 51})
    assert scheduled.scheduler.use_v2_model_runner is (runner == "1")
    queried = scheduled.external_queries - left.external_queries
    assert queried == 8 * BLOCK_TOKENS + 1, "vLLM counted b's lookup where it scheduled b"
    assert _counts(left) == (1, 1, 0, 0, 1), "b's lookup at its admission, its chunk missed"
    more = scheduled.manager.core.stats.lookup_tokens - left.manager.core.stats.lookup_tokens
    if runner == "0":
        assert told == told_left
        assert (_counts(scheduled), more) == (_counts(left), 0)
    else:
        assert told != told_left
        assert (_counts(scheduled), more) == ((2, 2, 0, 0, 2), 4 * BLOCK_TOKENS)


def test_a_request_preempted_by_a_reset_and_left_waiting_counts_its_lookup_once_scheduled(
    tmp_path: Path,
) -> None:
    """A reset of vLLM's prefix cache preempts x and b between steps; in the next step x is
    scheduled again, and b is looked up but no longer fits (it sampled a token into a ninth
    block). vLLM names both preempted at that step's end, but b's lookup of that step is of
    a scheduling that did not run: it counts nothing until b is admitted. (Nothing is
    stored, its threshold never reached, so every lookup misses and no load holds x.)"""
    extra = {"num_cpu_blocks": 32, "blocks_per_chunk": 4, "store_threshold": 1000}
    engine = Engine(tmp_path, num_gpu_blocks=13, extra=extra)
    engine.add("x", range(1000, 1000 + 3 * BLOCK_TOKENS), max_tokens=6)
    engine.step()
    waiting = engine.add("b", range(1, 1 + 8 * BLOCK_TOKENS), max_tokens=3)
    engine.step()  # b's eight blocks computed, and its lookup counted at its offer
    before = _counts(engine)
    assert engine.scheduler.reset_prefix_cache(reset_running_requests=True)
    output = engine.step()
    assert output.preempted_req_ids == {"x", "b"}
    assert list(output.num_scheduled_tokens) == ["x"]
    assert waiting.status is RequestStatus.PREEMPTED
    assert _counts(engine) == before, "b's lookup, left waiting, counts nothing"
    for _ in range(4):  # x decodes its last three tokens; then b fits
        engine.step()
    assert waiting.status is RequestStatus.RUNNING
    calls, blocks, _, _, misses = _counts(engine)
    assert (calls, blocks, misses) == (before[0] + 1, before[1] + 1, before[4] + 1)
