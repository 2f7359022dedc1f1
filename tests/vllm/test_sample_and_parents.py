"""The sampled access stream and the stored runs' parents, from vLLM's calls to a live socket.

Each test builds kvscope's spec from a real ``OffloadingConfig`` with
``kvscope_endpoint`` and drives its manager as vLLM 0.33's
``OffloadingConnectorScheduler`` does: every key of a request gets its token
position (``update_offload_keys``), the lookup asks key by key from the end
of the GPU prefix cache's hit to the first miss (again each step until the
request is scheduled), a hit is loaded, and stores are offered step by step
from chunk 0 (or from after the loaded chunks). What reaches a real SUB
socket is decoded with kvscope's sample-frame schema and vLLM's own KV-event
types.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import pytest
import zmq
from vllm.distributed.kv_events import BlockStored, KVEventBatch
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadingManager,
    OffloadKey,
    ReqContext,
    ScheduleEndContext,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VLLMCPUManager

from bench.tooling.vllm_config import offloading_config
from offload.cpu.config import ConfigError
from offload.insight.sampling import DEFAULT_RATE
from offload.vllm import KVScopeOffloadingSpec
from offload.vllm.manager import KVScopeManager
from offload.wire.framing import DEFAULT_KV_TOPIC, DEFAULT_SAMPLE_TOPIC, DEFAULT_STATS_TOPIC
from offload.wire.sample_frame import SampleFrame, decode_sample_frame
from tests.support.polling import wait_until

TOKENS_PER_CHUNK = 16
"""offloading_config's block of 16 tokens, one block per chunk."""

_VLLM_EVENTS = msgspec.msgpack.Decoder(KVEventBatch)


def raw(number: int) -> bytes:
    """A block's raw hash, as vLLM's GPU events name it."""
    return number.to_bytes(8, "big")


def key(number: int) -> OffloadKey:
    return make_offload_key(raw(number), 0)


class Request:
    """One request as the connector shows it to a manager: a context knowing every key's place."""

    def __init__(
        self, req_id: str, hashes: list[int], chunk_tokens: int = TOKENS_PER_CHUNK
    ) -> None:
        self.keys = [key(h) for h in hashes]
        self.ctx = ReqContext(req_id=req_id)
        for place, request_key in enumerate(self.keys, 1):
            self.ctx.set_offload_key_position(request_key, place * chunk_tokens)


class Scheduler:
    """vLLM's scheduler-side calls, one request at a time."""

    def __init__(self, manager: OffloadingManager) -> None:
        self.manager = manager

    def step(self) -> None:
        """The end of a scheduler step (build_connector_meta's last call)."""
        self.manager.on_schedule_end(ScheduleEndContext((), ()))

    def lookup(self, request: Request, gpu_chunks: int = 0) -> int:
        """get_num_new_matched_tokens: from the GPU prefix cache's end to the first miss."""
        hits = 0
        for request_key in request.keys[gpu_chunks:]:
            if self.manager.lookup(request_key, request.ctx) is not LookupResult.HIT:
                break
            hits += 1
        return hits

    def load(self, request: Request, start: int, end: int) -> None:
        keys = request.keys[start:end]
        self.manager.prepare_load(keys, request.ctx)
        self.manager.touch(keys, request.ctx)
        self.manager.complete_load(keys, request.ctx)

    def store(self, request: Request, start: int, end: int, success: bool = True) -> None:
        """One step's offer (a store job), completed before the step ends."""
        output = self.manager.prepare_store(request.keys[start:end], request.ctx)
        assert output is not None
        self.manager.complete_store(output.keys_to_store, request.ctx, success=success)
        self.step()


class Subscriber:
    """A SUB socket on kvscope's endpoint, keeping every frame by topic."""

    def __init__(self, context: zmq.Context, endpoint: str) -> None:
        self.sub = context.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.frames: dict[bytes, list[bytes]] = {}

    def read(self) -> None:
        while self.sub.poll(20):
            topic, _seq, payload = self.sub.recv_multipart()
            self.frames.setdefault(topic, []).append(payload)

    def samples(self) -> list[SampleFrame]:
        return [decode_sample_frame(p) for p in self.frames.get(DEFAULT_SAMPLE_TOPIC, [])]

    def stored(self) -> list[BlockStored]:
        """Stored events of every KV batch, decoded with vLLM's own types."""
        return [
            event
            for payload in self.frames.get(DEFAULT_KV_TOPIC, [])
            for event in _VLLM_EVENTS.decode(payload).events
            if isinstance(event, BlockStored)
        ]


@contextmanager
def subscribed(
    extra: dict,
    events: bool = False,
    blocks_per_chunk: int = 1,
    tokens_per_block: int | tuple[int, ...] = TOKENS_PER_CHUNK,
) -> Iterator[tuple[KVScopeManager, Subscriber]]:
    """A manager publishing on a port of its own choosing, and a subscriber that already
    hears it on the endpoint the publisher bound (a port probed free and bound later could
    be taken in between)."""
    spec = KVScopeOffloadingSpec(
        offloading_config(
            {"num_cpu_blocks": 64, "kvscope_endpoint": "tcp://127.0.0.1:*", **extra},
            events=events,
            blocks_per_chunk=blocks_per_chunk,
            tokens_per_block=tokens_per_block,
        )
    )
    manager = spec.get_manager()
    assert isinstance(manager, KVScopeManager) and manager.telemetry is not None
    context = zmq.Context()
    subscriber = Subscriber(context, manager.telemetry.publisher.endpoint)

    def heard() -> bool:
        """A PUB socket drops what it sends before a subscription arrives: wait for one."""
        manager.telemetry.publish_stats()
        subscriber.read()
        return DEFAULT_STATS_TOPIC in subscriber.frames

    try:
        wait_until(heard, "a stats frame from the vLLM manager")
        yield manager, subscriber
    finally:
        manager.shutdown()
        subscriber.sub.close(0)
        context.term()


@pytest.mark.parametrize(
    ("value", "rate"),
    [
        (0, 0.0),
        (0.05, 0.05),
        ("0.25", 0.25),
        ("1e-06", 1e-06),
        ("1", 1.0),
        (1, 1.0),
        (None, DEFAULT_RATE),
    ],
)
def test_sample_rate_is_read_from_the_extra_config(value: object, rate: float) -> None:
    extra = {"num_cpu_blocks": 4, "kvscope_endpoint": "tcp://127.0.0.1:*"}
    if value is not None:
        extra["sample_rate"] = value
    manager = KVScopeOffloadingSpec(offloading_config(extra)).get_manager()
    try:
        assert manager.telemetry is not None
        samples = manager.telemetry.samples
        assert (samples.sampler.rate if samples is not None else 0.0) == rate
    finally:
        manager.shutdown()


def test_without_a_publisher_nothing_is_sampled() -> None:
    spec = KVScopeOffloadingSpec(offloading_config({"num_cpu_blocks": 4, "sample_rate": 0}))
    assert spec.settings.sample_rate == 0
    assert spec.get_manager().telemetry is None


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (-0.1, "sample_rate=-0.1 must be a number from 0"),
        # Equal to 0, so taken for it; refused as the text "-0" is.
        (
            -0.0,
            "sample_rate=-0.0 must be a number from 0 (no sample) to 1 (every block): it is a "
            "negative zero",
        ),
        (1.5, "sample_rate=1.5 must be a number from 0"),
        ("often", "sample_rate='often' must be a decimal number such as 2, 0.5 or 1e-05"),
        ("2", "sample_rate='2' must be a number from 0"),
        (True, "sample_rate=True must be a number from 0"),
        (float("nan"), "sample_rate=nan must be a number from 0"),
        ([0.1], "sample_rate=[0.1] must be a number from 0"),
        # The sampling test would keep 9.3e-10 of the blocks, or none below 4.7e-10.
        (
            6e-10,
            "sample_rate=6e-10 must be a number from 0 (no sample) to 1 (every block), "
            "and 0 or at least 1e-06",
        ),
        # JSON on a command line reads 1e400 written out as an int beyond any float.
        pytest.param(
            10**400,
            "sample_rate=<an integer of more than 19 digits> must be a number from 0",
            id="int-beyond-any-float",
        ),
    ],
)
def test_a_bad_sample_rate_is_a_clear_error_naming_it(value: object, named: str) -> None:
    extra = {"num_cpu_blocks": 4, "kvscope_endpoint": "tcp://127.0.0.1:*", "sample_rate": value}
    with pytest.raises(ConfigError, match=re.escape(named)):
        KVScopeOffloadingSpec(offloading_config(extra))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("+0.5", "it has a plus sign"),
        (" 0.5 ", "it has white space"),
        ("0_5", "it has an underscore"),
        ("nan", "it has a character that is not a digit"),
        ("inf", "it has a character that is not a digit"),
        (".5", "it is not in that form"),
        ("0.\u0665", "it has a digit that is not ASCII 0-9"),
        # Each equals 0, so every bound took it for the rate 0: off, as written or not.
        ("-0", "it is a negative zero"),
        ("-0.0", "it is a negative zero"),
        ("-0e5", "it is a negative zero"),
        ("1e-400", "it is too small: a double reads it as 0"),
        ("-1e-400", "it is too small: a double reads it as 0"),
    ],
)
def test_a_sample_rate_given_as_text_is_read_as_every_kvscope_number_is(
    text: str, problem: str
) -> None:
    """float() took each of these (0.5, or nan and inf refused only by their range); the demo's
    --sample-rate and every fractional KVSCOPE_* variable refuse them, naming the problem."""
    extra = {"num_cpu_blocks": 4, "kvscope_endpoint": "tcp://127.0.0.1:*", "sample_rate": text}
    with pytest.raises(ConfigError, match=re.escape(problem)) as caught:
        KVScopeOffloadingSpec(offloading_config(extra))
    assert f"sample_rate={text!r} must be a decimal number" in str(caught.value)


def test_a_sample_rate_without_kvscope_endpoint_is_refused() -> None:
    with pytest.raises(ConfigError, match=re.escape("sample_rate=0.1 needs kvscope_endpoint")):
        KVScopeOffloadingSpec(offloading_config({"num_cpu_blocks": 4, "sample_rate": 0.1}))


def test_each_scheduling_of_a_request_is_sampled_once_from_where_its_lookup_began() -> None:
    with subscribed({"sample_rate": 1}) as (manager, subscriber):
        vllm = Scheduler(manager)
        # Looked up twice (not scheduled the first time), then stored over two steps.
        first = Request("first", [1, 2, 3, 4, 5])
        manager.on_new_request(first.ctx)
        assert vllm.lookup(first) == 0
        vllm.step()
        assert vllm.lookup(first) == 0
        vllm.store(first, 0, 3)
        vllm.store(first, 3, 5)
        manager.on_request_finished(first.ctx)
        # Its first two chunks hit the GPU prefix cache: the tier is asked from the third.
        second = Request("second", [1, 2, 3, 6, 7])
        manager.on_new_request(second.ctx)
        assert vllm.lookup(second, gpu_chunks=2) == 1
        vllm.load(second, 2, 3)
        vllm.store(second, 3, 5)
        manager.on_request_finished(second.ctx)
        # Its first two chunks hit the GPU prefix cache, the third misses in the tier,
        # and vLLM offers all four from chunk 0: the tier's references start at the third.
        offered = Request("offered", [1, 2, 50, 51])
        manager.on_new_request(offered.ctx)
        assert vllm.lookup(offered, gpu_chunks=2) == 0
        vllm.store(offered, 0, 4)
        manager.on_request_finished(offered.ctx)
        # Preempted after its first chunk, scheduled again: two schedulings.
        third = Request("third", [8, 9])
        manager.on_new_request(third.ctx)
        assert vllm.lookup(third) == 0
        vllm.store(third, 0, 1)
        assert vllm.lookup(third) == 1
        vllm.load(third, 0, 1)
        vllm.store(third, 1, 2)
        manager.on_request_finished(third.ctx)
        vllm.step()

        def sampled() -> list[list]:
            vllm.step()  # a frame goes out at a step's end once its period is over
            subscriber.read()
            return [r.sampled for frame in subscriber.samples() for r in frame.requests]

        expected = [first.keys, second.keys[2:], offered.keys[2:], third.keys[:1], third.keys]
        wait_until(lambda: len(sampled()) >= len(expected), "five sampled requests")
        assert sampled() == expected
        frames = subscriber.samples()
    assert {(f.rate, f.engine_id, f.config.capacity_blocks) for f in frames} == {
        (1.0, "engine-0", 64)
    }
    assert sum(frame.block_refs for frame in frames) == 5 + 3 + 2 + 1 + 2


def _chains(vllm: Scheduler) -> None:
    """Requests whose stored runs hang under blocks the tier met in several ways."""
    # No prefix anywhere, stored over two steps: the second run hangs under the first.
    first = Request("first", [1, 2, 3, 4, 5, 6])
    vllm.manager.on_new_request(first.ctx)
    vllm.lookup(first)
    vllm.store(first, 0, 3)
    vllm.store(first, 3, 6)
    vllm.manager.on_request_finished(first.ctx)
    # Its prefix (1, 2, 3) hits the GPU cache, so the tier is asked from 20 on and
    # never looks 3 up; vLLM offers from chunk 0, and the new run hangs under 3.
    gpu_prefix = Request("gpu-prefix", [1, 2, 3, 20, 21])
    vllm.manager.on_new_request(gpu_prefix.ctx)
    vllm.lookup(gpu_prefix, gpu_chunks=3)
    vllm.store(gpu_prefix, 0, 5)
    vllm.manager.on_request_finished(gpu_prefix.ctx)
    # 1 on the GPU, 2 and 3 loaded from the tier: the offer starts after them.
    loaded = Request("loaded", [1, 2, 3, 30])
    vllm.manager.on_new_request(loaded.ctx)
    assert vllm.lookup(loaded, gpu_chunks=1) == 2
    vllm.load(loaded, 1, 3)
    vllm.store(loaded, 3, 4)
    vllm.manager.on_request_finished(loaded.ctx)
    # A failed first job leaves 40 missing before a held 41: one offer, two runs.
    broken = Request("broken", [40, 41])
    vllm.manager.on_new_request(broken.ctx)
    vllm.lookup(broken)
    vllm.store(broken, 0, 1, success=False)
    vllm.store(broken, 1, 2)
    vllm.manager.on_request_finished(broken.ctx)
    again = Request("again", [40, 41, 42])
    vllm.manager.on_new_request(again.ctx)
    assert vllm.lookup(again) == 0
    vllm.store(again, 0, 3)
    vllm.manager.on_request_finished(again.ctx)


def test_stored_runs_name_the_block_before_them_in_vllms_event_types() -> None:
    with subscribed({"sample_rate": 0}, events=True) as (manager, subscriber):
        vllm = Scheduler(manager)
        _chains(vllm)
        ours = [(event.keys, event.removed) for event in manager.take_events()]
        # kvscope's stream names raw block hashes (the keys without their group bytes).
        expected = [
            ([raw(1), raw(2), raw(3)], None),
            ([raw(4), raw(5), raw(6)], raw(3)),
            ([raw(20), raw(21)], raw(3)),  # a GPU-cached block the tier never looked up
            ([raw(30)], raw(3)),
            ([raw(41)], raw(40)),
            ([raw(40)], None),
            ([raw(42)], raw(41)),
        ]

        def stored() -> list[tuple[list, bytes | None]]:
            vllm.step()  # the publisher sends at a step's end once its interval is over
            subscriber.read()
            return [(e.block_hashes, e.parent_block_hash) for e in subscriber.stored()]

        wait_until(lambda: len(stored()) >= len(expected), "every stored run")
        assert stored() == expected
        assert {e.medium for e in subscriber.stored()} == {"CPU"}
    # vLLM's own events name no parent, and still come one per store, as vLLM's manager's.
    theirs_manager = VLLMCPUManager(64, "lru", enable_events=True)
    _chains(Scheduler(theirs_manager))
    theirs = [(event.keys, event.removed) for event in theirs_manager.take_events()]
    assert ours == theirs
    assert ([key(40), key(42)], False) in ours


def stored_runs(vllm: Scheduler, subscriber: Subscriber) -> list[tuple[list, bytes | None]]:
    """The stored events' runs and parents, once a step has published them (in one batch:
    all of them at once)."""

    def stored() -> list[tuple[list, bytes | None]]:
        vllm.step()
        subscriber.read()
        return [(e.block_hashes, e.parent_block_hash) for e in subscriber.stored()]

    wait_until(stored, "the request's stored events")
    return stored()


def test_a_block_the_store_threshold_refuses_splits_the_run_it_was_in() -> None:
    """2 was offered once, 1 and 3 twice: only 1 and 3 are stored, and 3 hangs under 2 (the
    block before it in the request), not under 1, which it does not follow."""
    with subscribed({"sample_rate": 0, "store_threshold": 2}) as (manager, subscriber):
        vllm = Scheduler(manager)
        for number, hashes in enumerate([[1], [3]]):  # a first offer each, nothing stored
            earlier = Request(f"earlier-{number}", hashes)
            vllm.manager.on_new_request(earlier.ctx)
            vllm.store(earlier, 0, 1)
            vllm.manager.on_request_finished(earlier.ctx)
        request = Request("request", [1, 2, 3])
        vllm.manager.on_new_request(request.ctx)
        vllm.store(request, 0, 3)
        vllm.manager.on_request_finished(request.ctx)
        assert stored_runs(vllm, subscriber) == [([raw(1)], None), ([raw(3)], raw(2))]


def test_chunks_an_offer_leaves_out_split_the_run_they_were_in() -> None:
    """vLLM leaves a sliding window's null blocks out of an offer: 5 does not follow 2, so it
    starts a run, under no parent the tier knows (4 was not offered)."""
    with subscribed({"sample_rate": 0}) as (manager, subscriber):
        vllm = Scheduler(manager)
        request = Request("request", [1, 2, 3, 4, 5, 6])
        vllm.manager.on_new_request(request.ctx)
        keys = [request.keys[place] for place in (0, 1, 4, 5)]
        output = manager.prepare_store(keys, request.ctx)
        assert output is not None and output.keys_to_store == keys
        manager.complete_store(keys, request.ctx)
        vllm.manager.on_request_finished(request.ctx)
        assert stored_runs(vllm, subscriber) == [([raw(1), raw(2)], None), ([raw(5), raw(6)], None)]
