"""Why a lookup missed: the first missing block of a prompt's chain decides the request's loss.

Every lookup that stops short of its chain's end is charged once, to the
reason of the block it stopped at:

- ``in_flight``: the block is being written (stored, not yet readable);
- ``evicted``: it was stored before and left for room;
- ``not_admitted``: it was offered, and the policy's admission refused it;
- ``no_room``: it was offered, admitted, and the store was refused because
  the tier could not make room: the request had more blocks than the tier
  holds (its own blocks are protected from its store's evictions), or the
  rest of the tier was pinned by loads and stores in flight. Not a first
  sighting: a larger tier, or fewer pins, would have stored it;
- ``cold``: none of those is remembered: never stored (or stored so long
  ago that the memory below has forgotten it).

The blocks it lost are split in two: those after the break that the tier
still holds are ``prefix_lost`` (stored, but unreachable behind the break),
the others go to the first miss's reason. The tokens lost are counted with
them, each block as its own tokens (the caller names a lookup's block size:
inside vLLM, a hybrid model's KV cache groups differ in tokens per chunk).
Finding the held ones would cost a dictionary probe per lost
block on every lookup; the store that follows a miss (vLLM's and the
canonical replay's order: look up, then store what was missed) probes those
very blocks anyway, so the split is taken from it: a miss's blocks are
charged when the next store starts at the break (split by what that store
found held), or at the next miss (all to the reason). Counters therefore
only ever grow, and lag by at most one lookup.

Remembering evictions and refusals (the policy's, and the tier's for want of room) costs
memory, so each is kept in two
generations of hashes: a generation holds up to ``horizon`` hashes, then
becomes the old one and the one before it is dropped. A reason is therefore
remembered for at least ``horizon`` and at most ``2 * horizon`` such events:
with the default horizon of ``HORIZON_CAPACITIES`` tiers, a block evicted
and asked for again within several tiers' worth of evictions is charged to
eviction.

The manager calls this on every missed lookup and once per store (with
that store's refusals and evictions), so the form in use is C
(``_miss_attribution.c``, built by ``pip install`` where a C compiler
is): fixed tables of the hashes' hash values, one probe per block, and
counters in C. The Python forms here
(``PyGenerations``, ``PyMissAttribution``) keep the same contract where
kvscope was installed without a compiler (the sidecar image), at several
times the cost; tests hold both forms to the same sequences.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Literal, get_args

from offload.base import BlockHash

Reason = Literal["cold", "evicted", "not_admitted", "no_room", "in_flight", "prefix_lost"]
REASONS: Final[tuple[Reason, ...]] = get_args(Reason)
_MISS_HITS = "a missed lookup needs 0 <= hits < len(block_hashes), got {hits} of {length}"
JUDGED: Final[tuple[Reason, ...]] = ("cold", "evicted", "not_admitted", "no_room")
"""The reasons ``reason`` judges and a later ``miss`` accepts (in_flight is the caller's own
finding, prefix_lost never decides a lookup)."""
_JUDGED = (
    "reason must be 'cold', 'evicted', 'not_admitted' or 'no_room' with in_flight false, "
    "got {reason!r}"
)
MAX_BLOCK_TOKENS: Final = 2**31 - 1
"""Tokens of one block at most, the manager's block size bound (so the C form's counts stay
in 64 bits)."""
HORIZON_CAPACITIES: Final = 4
"""Generations hold this many tiers' worth of hashes: the hit-ratio curve asks what a tier
up to 8x larger would hit, and two generations of 4x cover that reuse distance."""
C_REMEMBERED_BYTES: Final = 32
"""The most the C form keeps per hash a generation holds: each generation is a table of
8-byte hash values sized once to the least power of two of at least twice its horizon, so
under four slots a hash, and no hash object is kept."""
PY_REMEMBERED_BYTES: Final = 208
"""The most the Python form keeps per hash a generation holds: the hash object (97 bytes at
the longest, 64, a sample frame carries) and its share of a set's table. A set grows its
table to the power of two above four times its entries once it is three fifths full, so a
full generation's table has at most 128 slots of 16 bytes for every 19 entries (108 bytes
an entry, right after the growth at 19; later growths leave fewer). A hash the policy keeps
alive anyway (gated's refusals, in its offer history) costs less."""
ATTRIBUTION_FIXED_BYTES: Final = 4096
"""What either form keeps whatever the capacity: its objects, the empty generations, the
counts and a pending miss's hash, the larger form's, rounded up."""


def attribution_bytes(capacity: int, remembered_bytes: int | None = None) -> int:
    """The most a manager of ``capacity`` slots keeps to attribute misses, every generation
    full of hashes nothing else keeps alive: three memories (evicted, refused, no room) of two
    generations of ``HORIZON_CAPACITIES`` tiers of hashes each, at ``remembered_bytes`` a
    hash (None: the form in use's, ``C_REMEMBERED_BYTES`` or ``PY_REMEMBERED_BYTES``), the
    form in use being the one a vLLM worker's memory check counts. Stated from each form's
    layout rather than measured on one workload, since what a set's table holds per entry
    depends on where its growth falls; tests/offload/test_policy_memory.py holds both forms
    under it at the capacities where that share is largest."""
    if remembered_bytes is None:
        remembered_bytes = REMEMBERED_BYTES
    return ATTRIBUTION_FIXED_BYTES + 6 * HORIZON_CAPACITIES * remembered_bytes * capacity


class PyGenerations:
    """A set of recent hashes in two generations of at most ``horizon`` each (Python sets).

    The generation turns at its ``horizon``-th hash, part way through a batch if need be,
    as the C form's does: a batch past the horizon (one store's refusals of a long prompt)
    would otherwise become one generation of any size, and the two forms would forget at
    different points. A batch that fits is one C-level ``set.update``.
    """

    __slots__ = ("horizon", "new", "old")

    def __init__(self, horizon: int) -> None:
        self.horizon = horizon
        self.new: set[BlockHash] = set()
        self.old: set[BlockHash] = set()

    def add(self, block_hashes: Iterable[BlockHash]) -> None:
        hashes = block_hashes if isinstance(block_hashes, list | tuple) else list(block_hashes)
        new, horizon = self.new, self.horizon
        if len(new) + len(hashes) < horizon:
            new.update(hashes)
            return
        for block_hash in hashes:
            if block_hash not in new:
                new.add(block_hash)
                if len(new) >= horizon:
                    self.old, self.new = new, set()
                    new = self.new

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self.new or block_hash in self.old

    def __len__(self) -> int:
        return len(self.new) + len(self.old)

    def clear(self) -> None:
        self.new.clear()
        self.old.clear()


class PyMissAttribution:
    """Per-reason counts of missed lookups, blocks and the memory they need."""

    __slots__ = ("_pending", "blocks", "evicted", "lookups", "no_room", "refused", "tokens")

    def __init__(self, capacity: int, horizon_capacities: int) -> None:
        horizon = max(1, capacity * horizon_capacities)
        self.evicted = PyGenerations(horizon)
        self.refused = PyGenerations(horizon)
        self.no_room = PyGenerations(horizon)
        self.lookups = dict.fromkeys(REASONS, 0)
        """Lookups charged to each reason (``prefix_lost`` never decides a lookup)."""
        self.blocks = dict.fromkeys(REASONS, 0)
        """Blocks lost to each reason."""
        self.tokens = dict.fromkeys(REASONS, 0)
        """Tokens of the blocks lost to each reason."""
        self._pending: tuple[Reason, BlockHash, int, int] | None = None
        """The last miss's reason, break block, lost blocks and tokens per block, until a
        store splits them."""

    @property
    def remembered(self) -> int:
        """Hashes held to tell evicted, refused and no-room blocks from cold ones (the memory
        cost)."""
        return len(self.evicted) + len(self.refused) + len(self.no_room)

    def miss(
        self,
        block_hashes: Sequence[BlockHash],
        hits: int,
        in_flight: bool,
        block_tokens: int = 1,
        reason: Reason | None = None,
    ) -> None:
        """Charge a lookup of ``block_hashes`` that found the first ``hits`` and stopped at
        the next: it lost that block and every one after it, of ``block_tokens`` tokens each
        (1: tokens count blocks).

        ``in_flight``: the block it stopped at is held but still being written (the
        caller's lookup already found out, so the tier is not asked again). ``reason``:
        the one ``reason()`` judged when the lookup ran, for a caller charging it later
        (None: judged now).
        """
        if reason is not None and (in_flight or reason not in JUDGED):
            raise ValueError(_JUDGED.format(reason=reason))
        if not 0 <= hits < len(block_hashes):
            raise ValueError(_MISS_HITS.format(hits=hits, length=len(block_hashes)))
        if not 1 <= block_tokens <= MAX_BLOCK_TOKENS:
            raise ValueError(
                f"block_tokens must be from 1 to {MAX_BLOCK_TOKENS}, got {block_tokens}"
            )
        block_hash = block_hashes[hits]
        lost = len(block_hashes) - hits
        if in_flight:
            reason = "in_flight"
        elif reason is None:
            reason = self.reason(block_hash)
        self.lookups[reason] += 1
        self.flush()
        self._pending = (reason, block_hash, lost, block_tokens)

    def reason(self, block_hash: BlockHash) -> Reason:
        """Why a lookup stopping at ``block_hash`` (not being written) misses, by what is
        remembered now: a caller that charges the miss later (vLLM counts a lookup only once
        its request is scheduled) judges it here, at the lookup, before stores in between
        refuse, evict or forget the block."""
        # An empty memory (refused under a policy that admits all, no_room while every store
        # finds room) is passed over by its sets' truth, without a call into it.
        evicted, refused, no_room = self.evicted, self.refused, self.no_room
        if (evicted.new or evicted.old) and block_hash in evicted:
            return "evicted"
        if (refused.new or refused.old) and block_hash in refused:
            return "not_admitted"
        if (no_room.new or no_room.old) and block_hash in no_room:
            return "no_room"
        return "cold"

    def stored(
        self,
        requested: Sequence[BlockHash],
        held: int,
        refused: Iterable[BlockHash],
        evicted: Iterable[BlockHash],
        no_room: Iterable[BlockHash] = (),
        /,
    ) -> None:
        """A store of ``requested`` (a chain's blocks, in order) found ``held`` of them
        already held; admission refused ``refused``, ``evicted`` left for room, and
        ``no_room`` were admitted but not stored, the tier unable to make room (the
        manager's one call per store). Positional only, as the C form's arguments are.

        When it starts at the last miss's break, those held blocks are the ones
        that miss lost behind it: ``prefix_lost``; the rest go to its reason.
        """
        # Most stores refuse nothing and find room: an empty collection adds nothing.
        if refused:
            self.refused.add(refused)
        if evicted:
            self.evicted.add(evicted)
        if no_room:
            self.no_room.add(no_room)
        pending = self._pending
        if pending is None or not requested or pending[1] != requested[0]:
            return
        if self._pending is not pending:  # the compare ran code that made another miss
            return
        self._pending = None
        self._charge(pending, min(held, pending[2] - 1))

    def flush(self) -> None:
        """Charge the pending miss's blocks, all to its reason (no store split them)."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._charge(pending, 0)

    def _charge(self, pending: tuple[Reason, BlockHash, int, int], behind: int) -> None:
        """A miss's blocks and their tokens: ``behind`` to ``prefix_lost``, the rest to its
        reason."""
        reason, _block_hash, lost, block_tokens = pending
        self.blocks[reason] += lost - behind
        self.tokens[reason] += (lost - behind) * block_tokens
        self.blocks["prefix_lost"] += behind
        self.tokens["prefix_lost"] += behind * block_tokens

    def reset(self) -> None:
        self.flush()
        self.evicted.clear()
        self.refused.clear()
        self.no_room.clear()


try:
    from offload.cpu._miss_attribution import Generations, MissAttribution

    REMEMBERED_BYTES = C_REMEMBERED_BYTES
except ImportError:  # installed without a C compiler
    Generations, MissAttribution = PyGenerations, PyMissAttribution  # type: ignore[misc]
    REMEMBERED_BYTES = PY_REMEMBERED_BYTES
"""What one hash a generation holds costs at most in the form in use."""
