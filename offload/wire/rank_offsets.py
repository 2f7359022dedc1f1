"""Data-parallel ranks' endpoints: each rank's own, moved from one configuration.

vLLM runs one engine per data-parallel rank from one ``kv_connector_extra_config``;
each moves the endpoints it binds by its rank, as vLLM moves its own KV-event
endpoints, and ranks whose moved ports would meet are refused before any binds.
"""

from __future__ import annotations

from offload.wire.endpoints import bound_address, fixed_port


def offset_endpoint(endpoint: str, rank: int) -> str:
    """The endpoint that data-parallel rank ``rank`` binds, so that ranks sharing one
    configuration do not collide.

    vLLM's rule for its own KV-event publisher: a TCP port moves up by the
    rank, a wildcard or 0 port is left to the OS. vLLM leaves an ipc path as
    it is, but ZMQ lets a second socket take over a bound path without an
    error, so here an ipc path gets ``_dp<rank>`` appended, as vLLM names its
    inproc endpoints. A moved port may pass 65535, and a longer path a unix
    socket's limit: check the result with ``endpoint_refusal``.
    """
    if not rank:
        return endpoint
    if endpoint.startswith("ipc://"):
        return f"{endpoint}_dp{rank}"
    tcp = fixed_port(endpoint)
    return endpoint if tcp is None else f"tcp://{tcp[0]}:{tcp[1] + rank}"


def ports_overlap(first: str, second: str, ranks: int) -> bool:
    """Whether ``ranks`` data-parallel ranks, each moving both ports up by its rank, would
    bind one port twice: fixed TCP ports fewer than ``ranks`` apart on addresses that
    overlap (``_addresses_overlap``)."""
    a, b = fixed_port(first), fixed_port(second)
    if a is None or b is None or not _addresses_overlap(a[0], b[0]):
        return False
    return abs(a[1] - b[1]) < ranks


def _addresses_overlap(first: str, second: str) -> bool:
    """Whether binding one port on both hosts can collide.

    A wildcard binds the port on every address it covers, so the bind of
    another address there fails: ``*`` and ``0.0.0.0`` cover every IPv4
    address (``*`` is bound without ZMQ's IPv6 option: ``binds_ipv6``), and
    ``[::]`` every address (IPv6, and IPv4 too, as ZMQ binds it dual-stack).
    A host name or interface may be any address, so it overlaps every
    wildcard; two specific addresses overlap when they are one address
    however written (``127.0.0.1``, ``[::ffff:127.0.0.1]``).
    """
    if first == second:
        return True
    a, b = bound_address(first), bound_address(second)
    if a is not None and b is not None:
        return a == b or any(
            address.is_unspecified and (address.version == 6 or other.version == 4)
            for address, other in ((a, b), (b, a))
        )
    known = a if a is not None else b
    return known is not None and known.is_unspecified
