"""Whether this machine has IPv6 on its loopback, or a link-local address, for the tests
that need them.

A container or kernel without IPv6 has no ``::1``, and a machine with no link but its
loopback no link-local address: a test that binds there is skipped, saying why, rather
than failing for the machine.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import NamedTuple

import pytest


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6_loopback = pytest.mark.skipif(
    not _ipv6_loopback(), reason="no IPv6 loopback on this machine"
)


class LinkLocal(NamedTuple):
    """A link-local address of this machine and the interface it is on."""

    address: str
    interface: str
    index: int


_LINK_SCOPE = 0x20
"""The scope ``/proc/net/if_inet6`` gives a link-local address."""


def link_local() -> LinkLocal | None:
    """A link-local address this machine can bind, from the kernel's own list (Linux); None
    where it has none (or no such list)."""
    try:
        rows = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return None
    for row in rows:
        digits, index, _, scope, _, interface = row.split()
        if int(scope, 16) != _LINK_SCOPE:
            continue
        found = LinkLocal(str(ipaddress.IPv6Address(int(digits, 16))), interface, int(index, 16))
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
                probe.bind((found.address, 0, 0, found.index))
        except OSError:  # not usable yet (its duplicate detection still running)
            continue
        return found
    return None


def other_interface(interface: str) -> str | None:
    """An interface of this machine other than ``interface``; None where it has no other."""
    return next((name for _, name in socket.if_nameindex() if name != interface), None)


needs_link_local = pytest.mark.skipif(
    link_local() is None,
    reason="no link-local IPv6 address on this machine (no interface but the loopback has one)",
)
