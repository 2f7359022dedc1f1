"""The HTTP server's sockets where the host resolves to an address family this machine lacks,
and the URL file written once they listen (and the paths that setting takes).

A kernel booted without IPv6 still resolves ``localhost`` to ``::1`` in many
images; asyncio passes such an address over. The sidecar's own binding raised
the raw ``OSError`` of ``socket.socket()`` (a traceback, no setting named) and
left the sockets it had bound for the host's earlier addresses open.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path

import pytest
from pydantic import ValidationError

from app import http_socket
from app.http_socket import HostError, bind_http
from app.settings import SidecarSettings

REAL_SOCKET = socket.socket
"""Taken before a test replaces the module's (``http_socket.socket`` is the module)."""
V4 = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))
V6 = (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0))


class NoIPv6:
    """This machine's sockets, as a kernel without IPv6 makes them: the real ``socket`` for
    every other family, each one kept to see whether it was closed."""

    def __init__(self) -> None:
        self.made: list[socket.socket] = []

    def __call__(self, family: int, kind: int, proto: int) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        sock = REAL_SOCKET(family, kind, proto)
        self.made.append(sock)
        return sock


@pytest.fixture
def no_ipv6(monkeypatch: pytest.MonkeyPatch) -> NoIPv6:
    sockets = NoIPv6()
    monkeypatch.setattr(http_socket.socket, "socket", sockets)
    return sockets


def resolving_to(monkeypatch: pytest.MonkeyPatch, *infos: tuple) -> None:
    monkeypatch.setattr(http_socket.socket, "getaddrinfo", lambda *args, **kwargs: list(infos))


def test_an_address_of_a_family_this_machine_lacks_is_passed_over(
    monkeypatch: pytest.MonkeyPatch, no_ipv6: NoIPv6
) -> None:
    resolving_to(monkeypatch, V6, V4)
    sockets = bind_http("localhost", 0)
    try:
        assert [sock.family for sock in sockets] == [socket.AF_INET]
        assert sockets[0].getsockname()[0] == "127.0.0.1"
    finally:
        for sock in sockets:
            sock.close()


def test_a_host_with_no_usable_address_is_a_host_error_and_leaves_no_socket_open(
    monkeypatch: pytest.MonkeyPatch, no_ipv6: NoIPv6
) -> None:
    resolving_to(monkeypatch, V6)
    with pytest.raises(HostError, match=r"^cannot bind localhost:0: Address family not supp"):
        bind_http("localhost", 0)
    assert no_ipv6.made == []


def test_a_failing_bind_after_a_passed_over_address_closes_what_was_bound(
    monkeypatch: pytest.MonkeyPatch, no_ipv6: NoIPv6
) -> None:
    with REAL_SOCKET() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        here = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port))
        resolving_to(monkeypatch, V6, here, (*V4[:4], ("127.0.0.1", port)))
        with pytest.raises(http_socket.PortError, match="Address already in use"):
            bind_http("localhost", port)
    assert len(no_ipv6.made) == 2 and all(sock.fileno() == -1 for sock in no_ipv6.made)


@pytest.mark.parametrize(
    ("host", "hint"),
    [
        ("[::1]", "an IPv6 address is written without brackets here: ::1"),
        ("localhost:8000", "the port is a setting of its own (--port, KVSCOPE_PORT)"),
        ("http://localhost", "a host is a name or an address, without a scheme or a path"),
        ("127.0.0.1 ", "it has white space around it"),
    ],
)
def test_a_host_written_as_in_a_url_is_refused_saying_how_to_write_it(host: str, hint: str) -> None:
    """A host as a URL writes it (brackets, a port, a scheme) or pasted with a space was only
    "cannot resolve '[::1]': Name or service not known", which says nothing of the fix."""
    with pytest.raises(HostError) as refused:
        bind_http(host, 0)
    assert str(refused.value).startswith(f"cannot resolve {host!r}: ")
    assert str(refused.value).endswith(f"; {hint}")


def test_a_url_file_that_cannot_be_written_is_named_on_one_escaped_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The file is the user's KVSCOPE_URL_FILE: its name went into the warning as it was, so a
    newline in it forged a second log line and an escape sequence reached the terminal."""
    path = tmp_path / "missing" / "url\n\x1b[31mWARNING forged line"
    with REAL_SOCKET() as sock, caplog.at_level(logging.WARNING, logger="app.http_socket"):
        sock.bind(("127.0.0.1", 0))
        http_socket.write_url_file(path, sock)
    assert [record.getMessage() for record in caplog.records] == [
        f"cannot write the URL file {tmp_path}/missing/url\\n\\x1b[31mWARNING forged line: "
        "No such file or directory"
    ]


def test_a_url_file_that_is_a_directory_leaves_no_partial_file_beside_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The URL was written to ``.NAME.partial`` and moved over the path; where the move
    failed (the path a directory), the partial file stayed beside it for good."""
    taken = tmp_path / "taken"
    taken.mkdir()
    with REAL_SOCKET() as sock, caplog.at_level(logging.WARNING, logger="app.http_socket"):
        sock.bind(("127.0.0.1", 0))
        http_socket.write_url_file(taken, sock)
    assert [record.getMessage() for record in caplog.records] == [
        f"cannot write the URL file {taken}: Is a directory"
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["taken"]


@pytest.mark.parametrize("url_file", ["/", ".", "..", "run/", "run/.", "/tmp/run/.."])
def test_a_url_file_that_names_a_directory_is_refused_by_the_settings(url_file: str) -> None:
    """`/` and `.` stopped the sidecar with a traceback once it listened (a path with no
    name has no partial file's name), and `/tmp/` wrote `/.tmp.partial`."""
    with pytest.raises(ValidationError) as refused:
        SidecarSettings(listen=["tcp://127.0.0.1:0"], url_file=url_file)
    assert [error["ctx"]["error"].args[0] for error in refused.value.errors()] == [
        f"{url_file!r} names a directory, not a file to write"
    ]


@pytest.mark.parametrize("kind", ["directory", "FIFO", "device"])
def test_a_url_file_that_is_there_and_no_regular_file_is_refused_and_left_as_it_is(
    tmp_path: Path, kind: str
) -> None:
    """The URL was written beside the path and moved over it, and the file removed as serving
    ended: a FIFO of the user's was replaced, then deleted, and so was /dev/null for a sidecar
    run as root; a directory was a warning only once the sidecar listened."""
    if kind == "directory":
        path = tmp_path / "run"
        path.mkdir()
    elif kind == "FIFO":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    else:
        path = Path(os.devnull)
    before = path.stat()
    with pytest.raises(ValidationError) as refused:
        SidecarSettings(listen=["tcp://127.0.0.1:0"], url_file=str(path))
    assert [error["ctx"]["error"].args[0] for error in refused.value.errors()] == [
        f"{str(path)!r} names a {kind}, not a file to write"
    ]
    after = path.stat()
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)


def test_an_empty_url_file_is_none_as_the_image_healthcheck_reads_it() -> None:
    """`KVSCOPE_URL_FILE=` is how an image's variable is unset; it stopped the sidecar with
    a traceback once it listened."""
    assert SidecarSettings(listen=["tcp://127.0.0.1:0"], url_file="").url_file is None
