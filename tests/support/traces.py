"""Random prefix-closed traces, as every trace vLLM makes is (a block's hash covers its whole
prefix), for the property tests of the optimum and the policies; conversations, chained or
with each request's ids shuffled, for the sampled curve's premise."""

from __future__ import annotations

import random

from hypothesis import strategies as st


@st.composite
def prefix_closed_traces(draw: st.DrawFn, requests: int, depth: int) -> list[list[int]]:
    """Paths from the roots of a random forest: each request follows or grows a branch."""
    children: dict[int | None, list[int]] = {}
    trace = []
    for _ in range(draw(st.integers(1, requests))):
        node: int | None = None
        path = []
        for _ in range(draw(st.integers(1, depth))):
            kids = children.setdefault(node, [])
            if kids and draw(st.booleans()):
                node = draw(st.sampled_from(kids))
            else:
                node = sum(map(len, children.values()))
                kids.append(node)
            path.append(node)
        trace.append(path)
    return trace


def conversations(requests: int, conversations: int, seed: int = 0) -> list[list[int]]:
    """A chained trace: each request is a conversation's history so far (one of a few system
    prompts, then its turns) plus a new turn; conversations chosen with Zipf-like
    popularity, each starting over past 60 blocks."""
    rng = random.Random(seed)
    next_id = 0

    def new(count: int) -> list[int]:
        nonlocal next_id
        next_id += count
        return list(range(next_id - count, next_id))

    systems = [new(rng.randint(2, 6)) for _ in range(10)]
    weights = [1 / (i + 1) ** 0.8 for i in range(conversations)]
    history: dict[int, list[int]] = {}
    trace = []
    for conversation in rng.choices(range(conversations), weights, k=requests):
        so_far = history.get(conversation)
        if so_far is None or len(so_far) > 60:
            so_far = rng.choice(systems) + new(rng.randint(1, 6))
        else:
            so_far = so_far + new(rng.randint(1, 4))
        history[conversation] = so_far
        trace.append(so_far)
    return trace


def unchained(trace: list[list[int]], seed: int = 0) -> list[list[int]]:
    """The same references with each request's ids in random order: the ids recur behind
    other prefixes, as in a trace of random block ids reused at different positions."""
    rng = random.Random(seed)
    return [rng.sample(request, len(request)) for request in trace]
