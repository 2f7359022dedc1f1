"""The HTTP server's listening sockets, bound before uvicorn starts, and the URL they serve.

uvicorn binds when its event loop starts and, when that fails, logs the error
and exits with its own status; bound here first, a port that is taken or a
host that does not resolve is an error naming the setting, like any other
bad setting (app/cli.py). The sockets are those uvicorn would have bound:
one per address the host resolves to, as asyncio's ``create_server`` does.

``write_url_file`` records the URL a local client reaches them at, for the
container image's healthcheck (docker/healthcheck.py): the port on the
command line, or one picked by port 0, is known to the probe only that way.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
from pathlib import Path

from app.settings import SettingError
from offload.shown import shown, shown_repr

logger = logging.getLogger(__name__)

_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1"}
"""A wildcard address, and the one a client on this machine connects to instead."""


class HostError(SettingError):
    """The host resolves to no address, or to none of this machine's."""

    setting = "host"


class PortError(SettingError):
    """The port cannot be bound on the host's addresses (taken, or privileged)."""

    setting = "port"


def bind_http(host: str, port: int) -> list[socket.socket]:
    """A bound (not yet listening) socket per address of ``host``; ``HostError`` or
    ``PortError`` when one cannot be had, with every socket bound so far closed.

    An address of a family this machine has no sockets for (IPv6 on a kernel booted
    without it, where ``localhost`` may still resolve to ``::1``) is passed over, as
    asyncio's ``create_server`` does; a host with no address left is a ``HostError``.
    """
    try:
        infos = socket.getaddrinfo(
            host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise HostError(
            f"cannot resolve {shown_repr(host)}: {exc.strerror}{_written_as_in_a_url(host)}"
        ) from None
    except UnicodeError as exc:  # a label over 63 characters, or empty: no name to look up
        raise HostError(f"cannot resolve {shown_repr(host)}: {shown(exc)}") from None
    sockets: list[socket.socket] = []
    unusable: OSError | None = None
    for family, kind, proto, _, address in dict.fromkeys(infos):
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as exc:  # no such family here: the host's other addresses serve
            unusable = exc
            continue
        sockets.append(sock)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio: an IPv6 wildcard leaves IPv4 alone
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
        except OSError as exc:
            for bound in sockets:
                bound.close()
            error = HostError if exc.errno == errno.EADDRNOTAVAIL else PortError
            raise error(
                f"cannot bind {_address(host, port)}: {os.strerror(exc.errno or 0)}"
            ) from None
    if not sockets and unusable is not None:
        raise HostError(f"cannot bind {_address(host, port)}: {os.strerror(unusable.errno or 0)}")
    return sockets


def _written_as_in_a_url(host: str) -> str:
    """How to write a host that did not resolve, where it reads as a URL's part (brackets,
    a port, a scheme) or was pasted with white space; else nothing. The resolver's own
    words (Name or service not known) say nothing of the fix."""
    if host != host.strip():
        return "; it has white space around it"
    if "/" in host:
        return "; a host is a name or an address, without a scheme or a path"
    if host.startswith("[") and host.endswith("]"):
        return f"; an IPv6 address is written without brackets here: {shown(host[1:-1])}"
    name, colon, port = host.rpartition(":")
    if colon and name and ":" not in name and port.isdigit():
        return "; the port is a setting of its own (--port, KVSCOPE_PORT)"
    return ""


def base_url(host: str, port: int) -> str:
    """``http://HOST:PORT``, the host in brackets when it is an IPv6 address."""
    return f"http://{_address(host, port)}"


def local_url(sock: socket.socket) -> str:
    """The base URL a client on this machine reaches ``sock`` at: for a wildcard bind, the
    loopback address, as a browser refuses ``http://[::]:PORT/`` and Chrome
    ``http://0.0.0.0:PORT/``."""
    host, port = sock.getsockname()[:2]
    return base_url(_LOOPBACK.get(host, host), port)


def write_url_file(path: Path, sock: socket.socket) -> None:
    """Write the base URL a client on this machine reaches ``sock`` at, whole or not at all.

    A file that cannot be written (a read-only root without a scratch /tmp) is
    a warning, not a failure: the healthcheck then falls back to the
    environment's port, as it did before there was a file.
    """
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(local_url(sock) + "\n")
        partial.replace(path)
    except OSError as exc:  # the path is the user's: a newline in it would forge a log line
        logger.warning("cannot write the URL file %s: %s", shown(path), exc.strerror or exc)
        with contextlib.suppress(OSError):  # written, then not moved (the path is a directory)
            partial.unlink(missing_ok=True)


def remove_url_file(path: Path, sock: socket.socket) -> None:
    """Remove the file ``write_url_file`` wrote for ``sock`` as serving ends: left, it named
    a port no longer served, and a reader waiting for the next server's took it at once. A
    file naming another URL (a server sharing the path wrote it since) is left as it is."""
    with contextlib.suppress(OSError):
        if path.read_text() == local_url(sock) + "\n":
            path.unlink()


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
