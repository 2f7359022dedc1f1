"""An out-of-tree policy behind a guard that checks each of its answers before the manager
acts on it.

The manager hands out again the slots a policy evicts, and stores what it admits. A plug-in
that evicted a block a load is reading, returned a block twice or admitted a hash never
offered would have the tier give one slot to two blocks (a transfer overwriting what another
reads) without an error. So a policy registered from outside runs behind this guard, which
keeps its own map of the resident blocks (the manager's lookups read that map) and refuses,
naming the policy, an answer that breaks the contract, before anything is freed or stored.
A refused answer leaves the tier's blocks, slots and events as they were, but the plug-in's
own bookkeeping may then disagree with the tier (it may have dropped a block the tier still
holds), so every later call fails too, naming the first breach, until the tier is reset. The
built-in policies are held to the contract by the test suites and run unguarded.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence

from offload.base import BlockHash
from offload.cpu.block_pool import Block
from offload.cpu.policies.cache_policy import CachePolicy
from offload.cpu.request_recency import RequestRecency


class PolicyContractError(RuntimeError):
    """A cache policy answered what the policy contract does not allow (offload.CachePolicy)."""


class GuardedPolicy(CachePolicy):
    """``inner``'s decisions, each checked against the blocks the tier holds."""

    def __init__(self, inner: CachePolicy, capacity: int) -> None:
        super().__init__(capacity)
        if not isinstance(getattr(inner, "blocks", None), Mapping):
            raise TypeError(f"cache policy {inner.name!r} has no 'blocks' mapping of its blocks")
        self.inner = inner
        self.name = inner.name
        self.blocks: dict[BlockHash, Block] = {}
        self._breached: PolicyContractError | None = None
        """The first breach since the last reset: from then on the tier refuses to go on."""

    def _breach(self, method: str, problem: str) -> PolicyContractError:
        self._breached = PolicyContractError(f"cache policy {self.name!r}: {method}() {problem}")
        return self._breached

    def _whole(self) -> None:
        """Refuse to go on after a breach: the plug-in's map and the tier's may differ."""
        if self._breached is not None:
            raise PolicyContractError(
                f"cache policy {self.name!r} broke the policy contract earlier "
                f"({self._breached}); reset the tier to go on"
            ) from self._breached

    def insert(
        self,
        block_hashes: Sequence[BlockHash],
        blocks: Sequence[Block],
        request: RequestRecency | None = None,
    ) -> None:
        self._whole()
        try:
            self.inner.insert(block_hashes, blocks, request)
        except BaseException as error:
            # The manager frees the slots; what the policy took in before failing leaves it
            # again, as far as it lets it.
            for block_hash in block_hashes:
                if block_hash in self.inner.blocks:
                    try:
                        self.inner.remove(block_hash)
                    except Exception:
                        # Its map and the tier's now differ: nothing it says can be trusted.
                        self._breach("insert", "failed, then could not drop what it took in")
                        error.add_note(str(self._breached))
                        break
            raise
        self.blocks.update(zip(block_hashes, blocks, strict=True))

    def admit(
        self, block_hashes: list[BlockHash], free: int, request: RequestRecency | None = None
    ) -> list[BlockHash]:
        self._whole()
        # A copy: the offer itself stays as the manager made it, whatever the policy does
        # to the list it is given.
        admitted = self.inner.admit(list(block_hashes), free, request)
        try:
            admitted = list(admitted)
            distinct = len(set(admitted)) == len(admitted)
        except TypeError as error:
            raise self._breach("admit", f"must return a list of hashes ({error})") from error
        offered = iter(block_hashes)
        if not distinct or not all(block_hash in offered for block_hash in admitted):
            raise self._breach("admit", "must return offered blocks, each once, in offer order")
        # All of them: the offer itself, so the manager sees that nothing was refused.
        return block_hashes if len(admitted) == len(block_hashes) else admitted

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        self._whole()
        self.inner.touch(block_hashes)

    def observe(self, block_hashes: Iterable[BlockHash], request: RequestRecency) -> None:
        self._whole()
        self.inner.observe(block_hashes, request)

    def finish(
        self,
        block_hashes: Sequence[BlockHash],
        reused: Container[BlockHash],
        request: RequestRecency | None = None,
    ) -> None:
        self._whole()
        self.inner.finish(block_hashes, reused, request)

    def reset(self) -> None:
        """Both maps emptied: they agree again, whatever broke before."""
        self.inner.reset()
        self.blocks.clear()
        self._breached = None

    def evict(
        self, n: int, protected: Container[BlockHash]
    ) -> list[tuple[BlockHash, Block]] | None:
        self._whole()
        before = len(self.inner.blocks)
        evicted = self.inner.evict(n, protected)
        if evicted is None:
            if len(self.inner.blocks) != before:
                raise self._breach("evict", "returned None after removing blocks")
            return None
        try:
            pairs = [(block_hash, block) for block_hash, block in evicted]
        except (TypeError, ValueError) as error:
            raise self._breach("evict", f"must return (hash, block) pairs ({error})") from error
        if len(pairs) != n:
            raise self._breach("evict", f"returned {len(pairs)} blocks, asked for exactly {n}")
        held, inner = self.blocks, self.inner.blocks
        try:
            self._check_evicted(pairs, held, inner, protected)
        except TypeError as error:  # an unhashable "hash"
            raise self._breach("evict", f"returned something that is no hash ({error})") from error
        if len({block_hash for block_hash, _ in pairs}) != n:
            raise self._breach("evict", "returned a block twice")
        for block_hash, _ in pairs:
            del held[block_hash]
        return pairs

    def _check_evicted(
        self,
        pairs: list[tuple[BlockHash, Block]],
        held: Mapping[BlockHash, Block],
        inner: Mapping[BlockHash, Block],
        protected: Container[BlockHash],
    ) -> None:
        for block_hash, block in pairs:
            if held.get(block_hash) is not block:
                raise self._breach("evict", f"returned {block_hash!r:.80}, not a block it held")
            if block.ref != 0:
                state = "being written" if block.ref < 0 else "being read"
                raise self._breach("evict", f"returned block {block_hash!r:.80}, {state}")
            if block_hash in protected:
                raise self._breach("evict", f"returned block {block_hash!r:.80}, protected")
            if block_hash in inner:
                raise self._breach("evict", f"returned block {block_hash!r:.80} and kept it")

    def invariant_violations(self) -> list[str]:
        """The guard's map and the plug-in's holding the same blocks, then the plug-in's own
        check: the manager's lookups read the guard's map, evictions the plug-in's. After a
        breach the maps may differ, as every call then says, and the tier's own bookkeeping
        is what remains to check."""
        if self._breached is not None:
            return []
        held, inner = self.blocks, self.inner.blocks
        problems = [
            f"cache policy {self.name!r}: block {block_hash!r:.80} is in the guard's map, "
            "not as the policy holds it"
            for block_hash, block in held.items()
            if inner.get(block_hash) is not block
        ]
        problems += [
            f"cache policy {self.name!r}: block {block_hash!r:.80} is held by the policy, "
            "not in the guard's map"
            for block_hash in inner
            if block_hash not in held
        ]
        return problems + self.inner.invariant_violations()

    def remove(self, block_hash: BlockHash) -> Block:
        self._whole()
        block = self.inner.remove(block_hash)
        if self.blocks.get(block_hash) is not block:
            raise self._breach("remove", f"returned another block than {block_hash!r:.80}'s")
        del self.blocks[block_hash]
        return block
