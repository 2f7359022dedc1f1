"""vLLM 0.33's ``OffloadingManager`` on kvscope's CPU manager.

vLLM's scheduler calls this with ``OffloadKey`` bytes and a ``ReqContext``
per request; kvscope's manager, block pool and policy registry do the work
and keep their counters, events and invariant checks. What is vLLM's alone
lives here: one key per lookup, request records (a request's use counts once,
at its end, in prompt order), the reuse threshold, vLLM's event fields and
stats payload. Allocation order, eviction order and events match vLLM's own
CPU manager (tests/vllm runs vLLM's manager tests against this class).

With kvscope's publisher on, each stored run names its parent (the key one
chunk before it in its request, of its KV cache group, from the request's
chain). Each scheduling of a request counts its lookups once (the lookup
counters, their hit ratio, each miss's reason as judged when it was asked)
and, with a sampler, goes into the sampled access stream once, however many
times vLLM looked it up before scheduling it.
kvscope's publisher names CPU blocks by raw block hash, as vLLM's GPU events
name the prefix cache's blocks (see ``published.py``).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterator, Mapping, Sequence
from itertools import count

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    ConfigInfoMapping,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    get_offload_group_idx,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from offload.base import PrepareStoreOutput as CorePrepareStoreOutput
from offload.cpu.manager import CPUOffloadingManager
from offload.vllm.published import PublishedNames
from offload.vllm.request_access import RequestAccess
from offload.vllm.settings import SpecSettings
from offload.vllm.stats import fill_stats
from offload.worker_telemetry import WorkerTelemetry

STATS_INTERVAL_S = 1.0
"""How often a stats frame goes to kvscope's publisher, at a scheduler step's end."""


class KVScopeManager(OffloadingManager):
    """The scheduler side of kvscope in vLLM: one CPU tier, its policy and its telemetry."""

    def __init__(
        self,
        core: CPUOffloadingManager,
        settings: SpecSettings,
        chunk_tokens: Mapping[int, int],
        *,
        vllm_events: bool,
        telemetry: WorkerTelemetry | None = None,
        config_info: ConfigInfoMapping | None = None,
    ) -> None:
        self.core = core
        self.medium = Medium.CPU
        self.telemetry = telemetry
        self._sampling = telemetry is not None and telemetry.samples is not None
        self._chunk_tokens = dict(chunk_tokens)
        """Tokens of one chunk by KV cache group index: groups may differ."""
        self._published = PublishedNames(chunk_tokens)
        self._write_order: dict[OffloadKey, int] | None = {} if core.events_enabled else None
        """Keys being written -> the order prepare_store handed them out in, while events are
        on: vLLM completes a store with a set, and the stored events' runs, parents and
        groups follow the order of the keys. At most one entry per slot being written."""
        self._writes = count()
        self._step = 0
        """Scheduler steps ended: a lookup in a new step begins a new scheduling."""
        self._uncounted: dict[str, RequestAccess] = {}
        """Requests whose latest lookups are not counted yet, by request id (vLLM names the
        requests a step admitted or preempted by id only, at its end); one entry per request
        vLLM holds at most, each gone once counted, finished or reset."""
        self._blocks = core.policy.blocks
        self._events: list[OffloadingEvent] | None = [] if vllm_events else None
        self._outbox: list = []
        self._config_info = dict(config_info or {})
        self._generation = 0
        self._next_stats = 0.0
        self._shut_down = False
        self.store_threshold = settings.store_threshold
        self.max_tracker_size = settings.max_tracker_size
        self.counts: OrderedDict[OffloadKey, int] | None = (
            OrderedDict() if settings.store_threshold >= 2 else None
        )
        """Offers per key, least recent first, when stores need a threshold of offers."""
        self.stores_skipped_in_current_batch = 0
        self.allocation_sizes: list[int] = []
        self.reported: dict[tuple[str, tuple[str, ...]], float] = {}
        """Counter values already handed to vLLM's metrics, to hand over increases only."""

    # --- lookups and loads ---

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        block = self._blocks.get(key)
        if block is None:
            result = LookupResult.MISS
        elif block.ref < 0:
            result = LookupResult.HIT_PENDING
        else:
            result = LookupResult.HIT
        # A miss's reason is judged now: stores before the lookup is counted (other
        # requests' in this step) may refuse, evict or forget the block.
        reason = self.core.misses.reason(key) if result is LookupResult.MISS else None
        access = self._access(req_context)
        references = access.asked(key, self._step, result, reason)
        self._uncounted[req_context.req_id] = access
        if references:  # this lookup began a new scheduling of the request, after one that ran
            self._record(references)
        return result

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource.HOST

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> CPULoadStoreSpec:
        keys = list(keys)
        # Checked, met, then pinned: a bad key or a policy failing to observe the request
        # leaves no block pinned (nor the load counted) for a load vLLM never completes.
        blocks = self.core.readable(keys)
        access = self._met(keys, req_context, reused=keys)
        self._count_lookups(access, req_context.req_id)
        spec = self.core.pin(blocks)
        if self.telemetry is not None and keys:
            access.place(keys, self._sampling)
        return CPULoadStoreSpec(spec.block_ids)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.core.touch(keys)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.core.complete_load(keys)

    # --- stores ---

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """vLLM's store: the keys the reuse threshold lets through, stored by the core tier.

        What the request met is recorded first, as vLLM's manager records it: the policy must
        observe new keys before they are inserted (ARC learns from its ghosts), and once it
        has, a retry observes nothing twice. The rest (offer counts, threshold skips,
        allocation sizes, the sample's references) is recorded once the tier answered: an
        offer whose store raised (a policy failing) is not counted, so a retry counts as the
        first try.
        """
        keys = list(keys)
        counts, threshold = self.counts, self.store_threshold
        # Each tracked key's offers with this one, read before it is counted; a key not
        # tracked yet reaches one offer at most, below any threshold in use (2 or more).
        offers = Counter(key for key in keys if key in counts) if counts is not None else Counter()
        blocks = self._blocks
        new: list[OffloadKey] = []
        ready: list[OffloadKey] = []
        skipped = 0
        first = last = 0  # where the new keys begin and end in the offer
        for index, key in enumerate(keys):
            block = blocks.get(key)
            if block is None:
                if counts is not None and counts.get(key, 0) + offers[key] < threshold:
                    skipped += 1
                    continue
                if not new:
                    first = index
                new.append(key)
                last = index
            elif block.ref >= 0:
                ready.append(key)
        met = set(new).union(ready)
        access = self._met([key for key in keys if key in met], req_context, reused=ready)
        # First: a miss is charged before the store splits it.
        self._count_lookups(access, req_context.req_id)
        chain = keys[first : last + 1] if new else []
        if len(chain) != len(new):
            # Keys the tier holds split the new ones into runs: the core skips them and
            # names each run's parent from this chain. A key the threshold refused must
            # not be stored, so it leaves the chain, and the key after it starts a run.
            chain = [key for key in chain if key in blocks or key in met]
        parent: OffloadKey | None = None
        restarts: dict[int, OffloadKey | None] = {}
        if self.telemetry is not None and new:
            parent = self._parent(access, keys, first)
            if starts := access.run_starts(chain, self._tokens_of):
                # Each named from the offer, where the key before it may be one the
                # threshold kept out of the chain.
                place = {key: index for index, key in enumerate(keys)}
                restarts = {at: self._parent(access, keys, place[chain[at]]) for at in starts}
        output: CorePrepareStoreOutput | None = None
        if new:
            try:
                output = self.core.prepare_store(
                    chain, access.recency, offered=keys, parent=parent, restarts=restarts
                )
            finally:
                self._drain()  # blocks evicted before a failure did leave
            self.allocation_sizes.append(len(new))
        if counts is not None:
            self._count_offers(keys)
            self.stores_skipped_in_current_batch += skipped
        if self.telemetry is not None and keys:
            access.place(keys, self._sampling)
        if not new:
            return PrepareStoreOutput([], CPULoadStoreSpec([]), [])
        if output is None:
            return None
        access.inserted.update(output.block_hashes_to_store)
        if self._write_order is not None:
            self._write_order.update(zip(output.block_hashes_to_store, self._writes, strict=False))
        return PrepareStoreOutput(
            keys_to_store=list(output.block_hashes_to_store),
            store_spec=CPULoadStoreSpec(output.store_spec.block_ids),
            evicted_keys=list(output.block_hashes_evicted),
        )

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        if self._write_order is not None:
            keys, order = list(keys), self._write_order
            in_write_order = sorted(keys, key=lambda key: order.pop(key, -1))
            if success:
                # Stored events list their runs in write order, the order their parents
                # follow. A failed store frees its slots in the caller's order, as vLLM's
                # manager does, so the slots later stores are given stay vLLM's.
                keys = in_write_order
        changed = self.core.complete_store(keys, success)
        self._drain()
        if not success and changed and self._events is not None:
            # vLLM announces the rollback as metadata only: the slots were never readable.
            self._events.append(
                OffloadingEvent(list(changed), self.medium, removed=True, metadata_only=True)
            )

    # --- requests ---

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._access(req_context)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        # Lookups still uncounted are of a scheduling that never ran (the request waited) or,
        # under vLLM's V1 model runner, of one scheduled again after a preemption with nothing
        # loaded, offered or preempted since: vLLM tells the manager the same of both, so
        # neither counts (the undercount README's "Run inside vLLM" bounds).
        self._uncounted.pop(req_context.req_id, None)
        access = req_context.get_state(RequestAccess)
        if (
            access is None
            or access.owner is not self
            or access.generation != self._generation
            or access.finished
        ):
            return
        access.finished = True
        if self._sampling:
            self._record(access.take_references())
        self.core.policy.finish(access.prompt_order(), access.reused, access.recency)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """Count the lookups of the requests the step admitted that no load or offer counted
        (no hit, no chunk computed yet), and of those preempted, then ship the step's events
        and the sample (when due) to kvscope's publisher, and stats once a second.

        Under vLLM's V1 model runner a request scheduled again after a preemption is not
        among the step's new ones (the V2 runner puts it there), and nothing else the
        manager is told names it. vLLM preempts running requests only, so one preempted
        with lookups uncounted from an earlier step ran the scheduling they began: they
        count now (its next lookup would drop them). One aborted before any of that (no
        load, no offer, no later preemption) is told of as one left waiting, and its
        lookups never count.
        """
        for req_id in context.new_req_ids:
            access = self._uncounted.get(req_id)
            if access is not None:
                self._count_lookups(access, req_id)
        for req_id in context.preempted_req_ids:
            access = self._uncounted.get(req_id)
            # Lookups of this step may be of a scheduling left waiting: a reset of vLLM's
            # prefix cache preempts running requests before the step, not in it.
            if access is not None and access.asked_step < self._step:
                self._count_lookups(access, req_id)
        self._step += 1
        if self.telemetry is None:
            return
        if self._outbox:
            events, self._outbox = self._outbox, []
            self.telemetry.publisher.publish_events(events)
        self.telemetry.publish_sample()
        now = time.monotonic()
        if now >= self._next_stats:
            self._next_stats = now + STATS_INTERVAL_S
            self.telemetry.publish_stats()

    def reset_cache(self) -> None:
        self._drain()
        self.core.reset()
        if self._write_order is not None:
            self._write_order.clear()
        # vLLM announces a reset itself; only kvscope's publisher hears of the blocks.
        self._drain(vllm=False)
        self._generation += 1
        self._uncounted.clear()  # their records belong to the generation before

    # --- reporting ---

    def take_events(self) -> Iterator[OffloadingEvent]:
        if self._events is None:
            return
        events, self._events = self._events, []
        blocks = self._blocks
        for event in events:
            if event.metadata_only:
                # A retry may own the key again before this rollback is read.
                keys = [key for key in event.keys if key not in blocks]
                if not keys:
                    continue
                event = OffloadingEvent(keys, event.medium, removed=True, metadata_only=True)
            yield event

    def get_stats(self) -> OffloadingConnectorStats:
        stats = OffloadingConnectorStats()
        skipped = self.stores_skipped_in_current_batch if self.counts is not None else None
        fill_stats(stats, self.core, self.allocation_sizes, skipped, self.reported)
        self.allocation_sizes.clear()
        self.stores_skipped_in_current_batch = 0
        return stats

    def config_info(self) -> Sequence[ConfigInfoMapping]:
        return [self._config_info]

    def shutdown(self) -> None:
        """Hand kvscope's publisher what is left (events, the sample, stats), then close it.

        Closed whatever the publishing raised: an open publisher keeps its thread and its
        bound endpoint, so a connector built again in this process could not bind it.
        Idempotent: a second call (vLLM's teardown paths may overlap) only waits for the
        close, since publishing to a closed publisher raises.
        """
        if self.telemetry is None:
            return
        try:
            if not self._shut_down:
                self._shut_down = True
                self.on_schedule_end(ScheduleEndContext((), ()))
                self.telemetry.publish_sample(force=True)
        finally:
            self.telemetry.publisher.close()

    # --- helpers ---

    def _access(self, req_context: ReqContext) -> RequestAccess:
        access = req_context.get_state(RequestAccess)
        if access is None or access.owner is not self or access.generation != self._generation:
            access = RequestAccess(self, self._generation, req_context, len(self._chunk_tokens))
            req_context.set_state(access)
        return access

    def _met(
        self, keys: list[OffloadKey], req_context: ReqContext, reused: list[OffloadKey]
    ) -> RequestAccess:
        """The request met ``keys`` (``reused``: found stored): the policy observes those it
        meets for the first time, and they are recorded as met once it did, so a policy
        that failed there observes them on the retry."""
        access = self._access(req_context)
        new = access.unmet(keys)
        if new:
            self.core.policy.observe(new, access.recency)
            access.meet(new)
        access.reuse(reused)
        return access

    def _count_lookups(self, access: RequestAccess, req_id: str) -> None:
        """Count the lookups of the scheduling vLLM ran (the request's first load or offer
        since them, or the end of the step that admitted or preempted it): each key asked
        once, with its latest answer, however many steps vLLM asked it before scheduling the
        request, as vLLM's own prefix-cache stats count it."""
        self._uncounted.pop(req_id, None)
        lookups = access.take_lookups()
        if not lookups:
            return
        stats, misses = self.core.stats, self.core.misses
        for key, (result, reason) in lookups.items():
            tokens = self._tokens_of(key)  # its own group's: groups differ in tokens per chunk
            stats.lookup_calls += 1
            stats.lookup_blocks += 1
            stats.lookup_tokens += tokens
            if result is LookupResult.HIT:
                stats.lookup_hit_blocks += 1
                stats.lookup_hit_tokens += tokens
            elif result is LookupResult.MISS:
                # vLLM asks key by key and stops at the first miss: this one decides the loss.
                misses.miss((key,), 0, False, tokens, reason=reason)

    def _record(self, references: list[OffloadKey]) -> None:
        """One scheduling's references, into the sample (an empty list counts nothing)."""
        assert self.telemetry is not None  # sampling needs the publisher
        self.telemetry.record_request(references)

    def _parent(self, access: RequestAccess, keys: list[OffloadKey], at: int) -> OffloadKey | None:
        """The key one chunk of its group before ``keys[at]`` in its request."""
        return access.parent(keys, at, self._tokens_of(keys[at]))

    def _tokens_of(self, key: OffloadKey) -> int:
        """Tokens of one chunk of ``key``'s KV cache group; the first group's (the tier's
        block size) for a group the config does not name, which vLLM's manager accepts too
        (its own tests store keys of group 1 in a tier configured with one group)."""
        return self._chunk_tokens.get(get_offload_group_idx(key), self.core.block_size)

    def _count_offers(self, keys: list[OffloadKey]) -> None:
        """Count an offer per key; the least recently offered keys leave a full tracker.

        Keys of this offer never push out each other, so an offer larger than
        the tracker still makes progress.
        """
        counts = self.counts
        assert counts is not None
        known: set[OffloadKey] = set()
        for key in keys:
            if key in counts:
                counts.move_to_end(key)
                counts[key] += 1
                known.add(key)
        others = len(counts) - len(known)
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self.max_tracker_size:
                if others == 0:
                    continue
                counts.popitem(last=False)
                others -= 1
            counts[key] = 1

    def _drain(self, vllm: bool = True) -> None:
        """Take the core's events: to kvscope's publisher, and as vLLM events."""
        events = self.core.take_events()
        if not events:
            return
        if self.telemetry is not None:
            self._outbox += self._published(events)
        if vllm and self._events is not None:
            medium, converted = self.medium, self._events
            start = len(converted)
            for event in events:
                if len(converted) > start and not event.removed and not converted[-1].removed:
                    # One call's runs (one core event each, for their parents) are one
                    # vLLM event, as vLLM announces a store.
                    converted[-1].keys.extend(event.block_hashes)
                else:
                    converted.append(
                        OffloadingEvent(list(event.block_hashes), medium, event.removed)
                    )
