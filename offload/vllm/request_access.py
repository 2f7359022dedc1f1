"""What one vLLM request did with the tier, kept on its ``ReqContext``.

vLLM 0.33 counts a request's use of a block once, when the request
finishes, in prompt order; until then a request's blocks are ordered by
their place in its prompt. This is the record that makes that possible:
the keys the request met (in the order met), which it found stored
(reused) and which it stored itself. It also tells one scheduling of the
request from vLLM's lookups: vLLM asks a waiting request again each step
until it schedules it, and only the lookups of the scheduling that ran are
counted (``asked``, ``take_lookups``), once, each miss with the reason
judged when it was asked.

With kvscope's publisher on it also names the block before a stored run:
the key one chunk earlier in the request (by token position), whatever the
tier knows of that block. vLLM offers a request's chunks in prompt order,
from its first (the GPU prefix cache's hits included) or from after the
ones it loaded, each KV cache group's after the other's, so that key is the
one before the run in the same offer, or the last one of its group in the
request's previous load or offer. With a sampler it keeps each scheduling's
references for the sampled access stream.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext

from offload.cpu.miss_attribution import Reason
from offload.cpu.request_recency import RequestRecency

Asked = tuple[LookupResult, Reason | None]
"""A key's latest answer, and for a miss why it missed, judged when it was asked."""

GROUP_BYTES = 4
"""An OffloadKey ends in its KV cache group index, 4 bytes big-endian."""

GROUP_PLACES = 1 << 16
"""Places of one token position in the policy's order, one per KV cache group: vLLM's group
indices (into its list of groups) stay below it, and positions below 2**32 tokens keep the
places within the 2**48 the LRU ranks."""


def group_starts(keys: list[OffloadKey]) -> list[int]:
    """Where in ``keys`` another KV cache group's keys begin (0 excluded): vLLM offers and
    loads each group's keys after the other's, so with one group (the common case) the
    first and last keys tell at once."""
    if keys[0][-GROUP_BYTES:] == keys[-1][-GROUP_BYTES:]:
        return []
    return [
        place
        for place, (before, key) in enumerate(pairwise(keys), 1)
        if before[-GROUP_BYTES:] != key[-GROUP_BYTES:]
    ]


class RequestAccess:
    """One request's accesses to one manager, for one generation of it."""

    __slots__ = (
        "asked_step",
        "finished",
        "generation",
        "inserted",
        "last",
        "lookups",
        "owner",
        "position",
        "recency",
        "referenced",
        "reused",
        "seen",
        "start",
    )

    def __init__(self, owner: object, generation: int, context: ReqContext, groups: int) -> None:
        """``groups``: the KV cache groups offloaded; with one, no two keys share a position."""
        self.owner = owner
        self.generation = generation
        self.position = context.get_offload_key_position
        """The token position where a key's chunk ends in the request; None: not given."""
        self.recency = RequestRecency(self._policy_place if groups > 1 else self.position)
        self.seen: dict[OffloadKey, None] = {}
        self.inserted: set[OffloadKey] = set()
        self.reused: set[OffloadKey] = set()
        self.finished = False
        self.last: dict[bytes, tuple[int, OffloadKey]] = {}
        """By KV cache group: the token position where the group's last key of the latest load
        or offer ends, and the key."""
        self.referenced: list[OffloadKey] = []
        """Keys loaded or offered since the current scheduling's lookup (when sampling)."""
        self.asked_step = -1
        """The scheduler step of this request's latest lookup."""
        self.lookups: dict[OffloadKey, Asked] = {}
        """The current scheduling's lookups, each key once with its latest answer (and a
        miss's reason), until the scheduling runs (``take_lookups``)."""
        self.start: int | None = None
        """Where the current scheduling's lookup began; None: no lookup since the last record."""

    def unmet(self, keys: list[OffloadKey]) -> list[OffloadKey]:
        """The keys not met before, in order, recorded by ``meet`` once the policy observed
        them; a finished request meeting new keys is refused here, before anything changes."""
        seen = self.seen
        new = [key for key in keys if key not in seen]
        if new and self.finished:
            raise ValueError("a finished request cannot meet new blocks")
        return new

    def meet(self, keys: list[OffloadKey]) -> None:
        """Record keys met for the first time (those ``unmet`` returned)."""
        self.seen.update(dict.fromkeys(keys))

    def reuse(self, keys: list[OffloadKey]) -> None:
        """Keys found already stored; re-reading a block this request stored is no reuse."""
        inserted = self.inserted
        self.reused.update(key for key in keys if key not in inserted)

    def prompt_order(self) -> list[OffloadKey]:
        """Keys met, KV cache group by group, each in prompt order when every position is known.

        As vLLM orders a request's keys for its policy: grouped by group
        index, then sorted by token position if vLLM gave one for each key.
        """
        keys = sorted(self.seen, key=lambda key: key[-GROUP_BYTES:])
        position = self.position
        places = [position(key) for key in keys]
        if all(place is not None for place in places):
            order = dict(zip(keys, places, strict=True))
            keys.sort(key=order.__getitem__)
        return keys

    def parent(self, keys: list[OffloadKey], first: int, chunk_tokens: int) -> OffloadKey | None:
        """The key one chunk before ``keys[first]`` in this request, before ``keys`` are placed.

        ``chunk_tokens``: the tokens of one chunk of ``keys[first]``'s group.
        None at the request's start, and when neither the key before it in
        this offer (of its group) nor its group's last placed key ends there
        (the tier never met the block: not known). A chunk's predecessor ends
        at the last chunk boundary before it, so a partial tail (not on a
        boundary) hangs under the whole chunk before it, as in vLLM's own
        events.
        """
        position, head = self.position, keys[first]
        at = position(head)
        if at is None or at <= chunk_tokens:
            return None
        before = _chunk_before(at, chunk_tokens)
        group = head[-GROUP_BYTES:]
        if first and keys[first - 1][-GROUP_BYTES:] == group:
            return keys[first - 1] if position(keys[first - 1]) == before else None
        last = self.last.get(group)
        return last[1] if last is not None and last[0] == before else None

    def run_starts(
        self, chain: list[OffloadKey], chunk_tokens: Callable[[OffloadKey], int]
    ) -> list[int]:
        """The places in ``chain`` (0 excluded) whose key does not continue the key before it.

        There a run of stored blocks must end: another KV cache group's keys
        begin, or chunks of the request lie between the two (a sliding
        window's null blocks vLLM leaves out of an offer, or keys the store
        threshold kept out of the chain). ``chunk_tokens`` gives a key's
        group's tokens per chunk. A key whose position vLLM did not give is
        taken to continue the one before it.
        """
        starts = group_starts(chain)
        position = self.position
        first, last = position(chain[0]), position(chain[-1])
        if (
            not starts
            and first is not None
            and last is not None
            and last - first == (len(chain) - 1) * chunk_tokens(chain[0])
        ):
            return []  # one group, each chunk from the first to the last: the common case
        breaks = set(starts)
        for place, (before, key) in enumerate(pairwise(chain), 1):
            ends, at = position(before), position(key)
            if ends is not None and at is not None and ends != _chunk_before(at, chunk_tokens(key)):
                breaks.add(place)
        return sorted(breaks)

    def place(self, keys: list[OffloadKey], sampling: bool) -> None:
        """Keys loaded or offered for store, in prompt order within each group: each group's
        last one for the next offer's parent, and all of them for the sample when ``sampling``."""
        position, last = self.position, self.last
        tails = [*(keys[start - 1] for start in group_starts(keys)), keys[-1]]
        for tail in tails:
            at = position(tail)
            if at is not None:
                last[tail[-GROUP_BYTES:]] = (at, tail)
        if sampling:
            self.referenced += keys

    def _policy_place(self, key: OffloadKey) -> int | None:
        """A key's place in the request for the policy: its token position, then its KV cache
        group, a lower group nearer the tail.

        vLLM's LRU ranks a running request's blocks by position and evicts
        blocks of one rank in key order. A chunk's copies in several groups
        share its position and its raw hash, so the lower group's copy leaves
        first; ordered by when they were ranked instead, a copy of the higher
        group ranked earlier (reused beside a new lower one) left first.
        """
        at = self.position(key)
        if at is None:
            return None
        return (at + 1) * GROUP_PLACES - 1 - int.from_bytes(key[-GROUP_BYTES:], "big")

    def asked(
        self, key: OffloadKey, step: int, result: LookupResult, reason: Reason | None
    ) -> list[OffloadKey]:
        """A lookup of ``key`` in scheduler step ``step``, answered ``result`` (a miss:
        because of ``reason``).

        vLLM looks a waiting request up again each step until it is
        scheduled (no GPU blocks free, a lookup deferred while a hit is
        still being written or loaded), and again after a preemption; a
        lookup in a new step starts a new scheduling. The one before it
        leaves its lookups uncounted (it never ran, or they were taken when
        it did, or it ran unseen: under vLLM's V1 model runner, scheduled
        again after a preemption, then preempted by a reset of vLLM's prefix
        cache before anything counted them) and returns its references, if
        it ran, once, for the sample.
        Lookups within a step (prefix, tail, group after group, a key asked
        twice) are one scheduling's: each key once, with its latest answer,
        and its references begin at the earliest.
        """
        if step == self.asked_step:
            references: list[OffloadKey] = []
        else:
            references = self.take_references()
            self.asked_step, self.lookups = step, {}
        self.lookups[key] = (result, reason)
        at = self.position(key)
        if at is not None and (self.start is None or at < self.start):
            self.start = at
        return references

    def take_lookups(self) -> dict[OffloadKey, Asked]:
        """The current scheduling's lookups, taken once vLLM has scheduled the request: at
        its first load or offer, or at the end of the step that admitted it (as vLLM counts
        its connector's prefix-cache queries, when it admits a request, so a lookup of a
        request left waiting counts nothing)."""
        lookups, self.lookups = self.lookups, {}
        return lookups

    def take_references(self) -> list[OffloadKey]:
        """The current scheduling's references to the tier, in prompt order, taken once.

        As the demo worker records a request: from where the lookup began
        (the GPU prefix cache's hits, offered for store from chunk 0, are not
        the tier's references) to the last block loaded or offered. Nothing
        when no lookup began it.
        """
        start, keys = self.start, self.referenced
        self.start, self.referenced = None, []
        if start is None or not keys:
            return []
        position = self.position
        placed = {at: key for key in keys if (at := position(key)) is not None and at >= start}
        return [placed[at] for at in sorted(placed)]


def _chunk_before(at: int, chunk_tokens: int) -> int:
    """Where the chunk before one ending at token ``at`` ends: the last chunk boundary before
    it (a partial tail, not on a boundary, follows the whole chunk before it)."""
    return (at - 1) // chunk_tokens * chunk_tokens
