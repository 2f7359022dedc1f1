"""Whether this machine has IPv6 on its loopback, for the tests that need it.

A container or kernel without IPv6 has no ``::1``: a test that binds there is skipped,
saying why, rather than failing for the machine.
"""

from __future__ import annotations

import socket

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
