"""Request lines whose target is no plain path, as raw bytes to real uvicorn on loopback.

RFC 9112 3.2 gives a request target four forms. uvicorn kept only the path of an
absolute URL, so ``GET http://evil.example/api/v1/stats`` with an allowed Host
header was served: the host the request line named was never checked, though a
server must take it over the Host header (3.2.2). ``CONNECT host:port`` was a
parser error naming nothing, and ``OPTIONS *`` a 404 for a path ``*``.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

from tests.hostile.test_http_streams import metric, raw_connection, read_all, served_quietly
from tests.support.http_app import sidecar_app

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
REFUSED = "kvscope_sidecar_http_refused_total"


def answer_to(url: str, request_line: bytes, *hosts: bytes) -> tuple[bytes, bytes]:
    """The status line and body of the answer to ``request_line`` sent with ``hosts`` as its
    Host fields (the server's own address when none are given)."""
    fields = b"".join(b"Host: %b\r\n" % host for host in hosts or [urlsplit(url).netloc.encode()])
    answer = read_all(raw_connection(url, request_line + b"\r\n" + fields + b"\r\n"))
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body


def test_an_absolute_target_is_checked_by_its_own_host_not_the_host_header() -> None:
    app, _ = sidecar_app(host="127.0.0.1")
    with served_quietly(app) as (url, http):
        host = urlsplit(url).netloc.encode()
        status, body = answer_to(url, b"GET /api/v1/stats HTTP/1.1", b"evil.example")
        assert status == b"HTTP/1.1 400 Bad Request"
        by_host_header = json.loads(body)
        for target in (b"http://evil.example/api/v1/stats", b"http://127.0.0.1.evil.example/"):
            status, body = answer_to(url, b"GET %b HTTP/1.1" % target, host)
            assert status == b"HTTP/1.1 400 Bad Request", target
            assert json.loads(body) == by_host_header, target  # the same refusal, no echo
        # Two Host fields are refused whatever the target names (RFC 9112 3.2).
        twice = answer_to(url, b"GET http://localhost/api/v1/stats HTTP/1.1", host, host)
        assert twice[0] == b"HTTP/1.1 400 Bad Request"
        assert metric(http, REFUSED, reason="host_not_allowed") == 4
        # The target's host is served whatever the Host header names, which it stands in for.
        for target in (
            b"http://localhost/api/v1/stats",
            b"HTTP://LOCALHOST:9/api/v1/stats?",
            b"https://[::1]:8000/api/v1/stats",
        ):
            status, body = answer_to(url, b"GET %b HTTP/1.1" % target, b"evil.example")
            assert status == b"HTTP/1.1 200 OK", target
            assert "tracked_blocks" in json.loads(body), target
        # An empty path is "/" (RFC 9110 4.2.3): uvicorn failed on it, a 400 naming nothing.
        for target in (b"http://localhost", b"http://localhost?x=1"):
            status, body = answer_to(url, b"GET %b HTTP/1.1" % target)
            assert (status, body[:15]) == (b"HTTP/1.1 200 OK", b"<!doctype html>"), target
        assert metric(http, REFUSED, reason="host_not_allowed") == 4


@pytest.mark.parametrize(
    ("request_line", "problem"),
    [
        (b"OPTIONS * HTTP/1.1", "asterisk-form"),
        (b"GET * HTTP/1.1", "asterisk-form"),
        (b"CONNECT localhost:80 HTTP/1.1", "authority-form"),
        (b"GET ftp://localhost/api/v1/stats HTTP/1.1", "scheme must be http or https"),
        (b"GET http://ann@localhost/api/v1/stats HTTP/1.1", "user information"),
        (b"GET http:///api/v1/stats HTTP/1.1", "names no host"),
        (b"GET http://:80/api/v1/stats HTTP/1.1", "names no host"),
        (b"GET /api%2Fv1/stats HTTP/1.1", "encoded slash"),
        (b"GET /api%2fv1%2fstats?ftp HTTP/1.1", "encoded slash"),
        (b"GET http://localhost/api%2Fv1/stats HTTP/1.1", "encoded slash"),
    ],
    ids=[
        "options *",
        "get *",
        "connect",
        "ftp",
        "userinfo",
        "no host",
        "only a port",
        "encoded slash",
        "encoded slashes",
        "absolute encoded slash",
    ],
)
def test_a_target_naming_no_resource_here_is_a_400_naming_why(
    request_line: bytes, problem: str
) -> None:
    app, _ = sidecar_app(host="127.0.0.1")
    with served_quietly(app) as (url, http):
        status, body = answer_to(url, request_line)
        assert status == b"HTTP/1.1 400 Bad Request", body[:200]
        detail = json.loads(body)["detail"]
        assert problem in detail
        assert not any(word in detail for word in ("ftp", "ann", ":80")), "it echoed the target"
        assert metric(http, REFUSED, reason="malformed_request") == 1
        assert http.get("/healthz").status_code == 200
