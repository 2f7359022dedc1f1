"""Random prefix-closed traces, as every trace vLLM makes is (a block's hash covers its whole
prefix), for the property tests of the optimum and the policies."""

from __future__ import annotations

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
