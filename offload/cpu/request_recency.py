"""One request's part in a policy's recency order.

vLLM's scheduler tells the tier where each block sits in its request's prompt
(the token position of the block's end). A policy that keeps a request's
blocks in prompt order (the LRU) reads positions through this object and
keeps the request's rank in it, so a request that stores in several batches,
or out of order, is still ordered as one prefix. Engine-neutral: the vLLM
adapter wraps vLLM's request context in one, tests build them directly.
"""

from __future__ import annotations

from collections.abc import Callable

from offload.base import BlockHash


class RequestRecency:
    """Positions of one request's blocks, and the rank a policy gave the request.

    The rank belongs to one policy and one generation of it (a reset starts a
    new one): a request seen again after a reset, or by another tier, is
    ranked afresh.
    """

    __slots__ = ("generation", "owner", "position", "rank")

    def __init__(self, position: Callable[[BlockHash], int | None]) -> None:
        self.position = position
        self.owner: object | None = None
        self.generation = -1
        self.rank = 0
