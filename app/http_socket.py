"""The HTTP server's listening sockets, bound before uvicorn starts.

uvicorn binds when its event loop starts and, when that fails, logs the error
and exits with its own status; bound here first, a port that is taken or a
host that does not resolve is an error naming the setting, like any other
bad setting (app/cli.py). The sockets are those uvicorn would have bound:
one per address the host resolves to, as asyncio's ``create_server`` does.
"""

from __future__ import annotations

import errno
import os
import socket

from app.settings import SettingError


class HostError(SettingError):
    """The host resolves to no address, or to none of this machine's."""

    setting = "host"


class PortError(SettingError):
    """The port cannot be bound on the host's addresses (taken, or privileged)."""

    setting = "port"


def bind_http(host: str, port: int) -> list[socket.socket]:
    """A bound (not yet listening) socket per address of ``host``; ``HostError`` or
    ``PortError`` when one cannot be had, with every socket bound so far closed."""
    try:
        infos = socket.getaddrinfo(
            host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise HostError(f"cannot resolve {host!r}: {exc.strerror}") from None
    sockets: list[socket.socket] = []
    for family, kind, proto, _, address in dict.fromkeys(infos):
        sock = socket.socket(family, kind, proto)
        sockets.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # as asyncio: an IPv6 wildcard leaves IPv4 to its own
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            for bound in sockets:
                bound.close()
            error = HostError if exc.errno == errno.EADDRNOTAVAIL else PortError
            raise error(
                f"cannot bind {_address(host, port)}: {os.strerror(exc.errno or 0)}"
            ) from None
    return sockets


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
