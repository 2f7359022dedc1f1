"""What a policy's tables must hold, for the policies' ``invariant_violations`` self-checks.

A policy's ranking tables are its index: eviction looks only there. A resident
block in none of them is never evicted, so its slot is lost to the tier for
good; a block in a ranking table that is not resident is handed out again by an
eviction; one in two tables is ranked twice. Memory that only informs the
choice (ghost lists, offer histories, the models) must stay within its stated
bound instead. Each check is O(entries), for tests and debugging, never the hot
path; each message names the policy, the table and, where there is one, the block.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from offload.base import BlockHash


def ranking_violations(
    policy: str, resident: Mapping[BlockHash, object], tables: Mapping[str, Iterable[BlockHash]]
) -> list[str]:
    """Every resident block in exactly one of ``tables`` (name -> its blocks), and every
    block in them resident."""
    problems: list[str] = []
    where: dict[BlockHash, str] = {}
    for name, table in tables.items():
        for block_hash in table:
            if block_hash not in resident:
                problems.append(f"{policy}: block {block_hash!r:.80} is in {name} but not resident")
            elif block_hash in where:
                problems.append(
                    f"{policy}: block {block_hash!r:.80} is in both {where[block_hash]} and {name}"
                )
            else:
                where[block_hash] = name
    if len(where) < len(resident):
        names = ", ".join(tables)
        problems += [
            f"{policy}: block {block_hash!r:.80} is resident but in no ranking table ({names})"
            for block_hash in resident
            if block_hash not in where
        ]
    return problems


def rank_order_violations(policy: str, name: str, ranks: Mapping[BlockHash, int]) -> list[str]:
    """The ranks of an ordered table never decrease: eviction scans it from its first entry
    and takes what it finds first as the oldest."""
    problems: list[str] = []
    previous = None
    for block_hash, rank in ranks.items():
        if previous is not None and rank < previous:
            problems.append(
                f"{policy}: block {block_hash!r:.80} in {name} ranks below the block before it"
            )
        previous = rank
    return problems


def bound_violations(policy: str, name: str, size: int, bound: int, bound_is: str) -> list[str]:
    """``size`` entries within ``bound`` (``bound_is`` says what the bound is)."""
    if size <= bound:
        return []
    return [f"{policy}: {name} holds {size} entries, over its bound of {bound} ({bound_is})"]
