"""What one vLLM request did with the tier, kept on its ``ReqContext``.

vLLM 0.33 counts a request's use of a block once, when the request
finishes, in prompt order; until then a request's blocks are ordered by
their place in its prompt. This is the record that makes that possible:
the keys the request met (in the order met), which it found stored
(reused) and which it stored itself.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import OffloadKey, ReqContext

from offload.cpu.request_recency import RequestRecency

GROUP_BYTES = 4
"""An OffloadKey ends in its KV cache group index, 4 bytes big-endian."""


class RequestAccess:
    """One request's accesses to one manager, for one generation of it."""

    __slots__ = ("finished", "generation", "inserted", "owner", "recency", "reused", "seen")

    def __init__(self, owner: object, generation: int, context: ReqContext) -> None:
        self.owner = owner
        self.generation = generation
        self.recency = RequestRecency(context.get_offload_key_position)
        self.seen: dict[OffloadKey, None] = {}
        self.inserted: set[OffloadKey] = set()
        self.reused: set[OffloadKey] = set()
        self.finished = False

    def met(self, keys: list[OffloadKey]) -> list[OffloadKey]:
        """Record keys met; returns those met for the first time, in order."""
        seen = self.seen
        new = [key for key in keys if key not in seen]
        if new and self.finished:
            raise ValueError("a finished request cannot meet new blocks")
        seen.update(dict.fromkeys(new))
        return new

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
        position = self.recency.position
        places = [position(key) for key in keys]
        if all(place is not None for place in places):
            order = dict(zip(keys, places, strict=True))
            keys.sort(key=order.__getitem__)
        return keys
