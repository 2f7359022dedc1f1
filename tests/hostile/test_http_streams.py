"""Slow, vanishing and greedy clients against real uvicorn on loopback (issue 15, items 3, 5, 13).

The event stream under readers that stop reading, go away or are too many;
a resume from id 0 over events of thousands of hashes; a request body sent
past the limit; the token in a URL, as the access log writes it. Each test
serves ``create_app`` over a state it feeds itself (tests/support/http_app.py)
and watches uvicorn's own logs: a limit that is hit must be counted and
quiet, never a traceback. Waits poll with a deadline; nothing asserts on time.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import ClientDisconnect

from app.api import http_connection
from app.api.guards.security_headers import HEADERS
from app.api.limits import KIB, HttpLimits
from app.api.schemas import MAX_EVENT_HASHES
from app.api.send_wait import SendWait
from app.settings import MiB
from app.state.history import Reading, SeriesKey
from app.state.sidecar import SidecarState
from tests.support.http_app import TOKEN, record, serving, sidecar_app, sse_events
from tests.support.polling import WAIT_S, wait_for, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
STREAM = "/api/v1/events/stream"


class _Keep(logging.Filter):
    """Keeps every record its logger emits (a filter: uvicorn's logging set-up drops handlers)."""

    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__()
        self.records = records

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return True


@contextmanager
def logged(name: str) -> Iterator[list[logging.LogRecord]]:
    """The records logger ``name`` emits while the block runs (at the level uvicorn set)."""
    records: list[logging.LogRecord] = []
    keep = _Keep(records)
    logger = logging.getLogger(name)
    logger.addFilter(keep)
    try:
        yield records
    finally:
        logger.removeFilter(keep)


@contextmanager
def served_quietly(
    app: FastAPI, send_buffer: int | None = None
) -> Iterator[tuple[str, httpx.Client]]:
    """``app`` served with a client on it, yielding (base URL, client); once the server has
    stopped, uvicorn must have logged nothing at warning or above while it ran."""
    with (
        logged("uvicorn.error") as records,
        serving(app, send_buffer=send_buffer) as url,
        httpx.Client(base_url=url, timeout=WAIT_S) as http,
    ):
        yield url, http
    assert errors_in(records) == []


def metric(http: httpx.Client, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise AssertionError(f"/metrics has no {name}{labels}")


def raw_connection(url: str, request: bytes, receive_buffer: int | None = None) -> socket.socket:
    """A socket that sent ``request`` and reads only when told (a small buffer, if given)."""
    address = urlsplit(url)
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect((address.hostname, address.port))
    sock.settimeout(WAIT_S)
    sock.sendall(request)
    return sock


def stream_request(url: str, last_event_id: int | None = None) -> bytes:
    resume = b"" if last_event_id is None else b"Last-Event-ID: %d\r\n" % last_event_id
    host = urlsplit(url).netloc.encode()
    return b"GET %b HTTP/1.1\r\nHost: %b\r\n%b\r\n" % (STREAM.encode(), host, resume)


def errors_in(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING]


# --- item 3: the stream under readers that share, stall, vanish or crowd ----------------


def test_every_reader_gets_each_event_once_in_order_backlog_then_live() -> None:
    app, state = sidecar_app()
    record(state, events=30)
    with served_quietly(app) as (_url, http):
        starts = [None, 0, 1, 15, 29, 30, 10**9]  # 10**9: an id from an earlier process
        with_streams = [
            http.stream("GET", STREAM, headers={} if s is None else {"Last-Event-ID": str(s)})
            for s in starts
        ]
        responses = [opened.__enter__() for opened in with_streams]
        assert all(r.status_code == 200 for r in responses)
        wait_for(lambda: metric(http, "kvscope_sidecar_sse_clients"), lambda n: n == 7, "joined")
        for batch in range(5):  # live, in batches the broadcaster may gather or not
            record(state, events=4, first_hash=1000 * (batch + 1))
        for start, response in zip(starts, responses, strict=True):
            first = 30 if start is None else 0 if start == 10**9 else start
            ids = [event["id"] for event in sse_events(response, 50 - first)]
            assert ids == list(range(first + 1, 51)), start
        for opened in with_streams:
            opened.__exit__(None, None, None)
        wait_until(lambda: metric(http, "kvscope_sidecar_sse_clients") == 0, "every reader gone")


def test_ids_given_to_events_the_log_shed_leave_the_broadcaster_waiting_not_polling() -> None:
    app, state = sidecar_app(event_batch_max=3)
    streams = app.state.streams
    with served_quietly(app) as (_url, http), http.stream("GET", STREAM) as stream:
        wait_for(lambda: metric(http, "kvscope_sidecar_sse_clients"), lambda n: n == 1, "joined")
        record(state, events=5)  # ids 1 to 5, of which the log keeps 1 to 3
        events = sse_events(stream, 10**9)  # one reader of the stream throughout
        assert [next(events)["id"] for _ in range(3)] == [1, 2, 3]
        # Past ids 4 and 5, which no reader will ever be sent, it sleeps until an event
        # comes; short of them, it found nothing after its cursor ten times a second.
        wait_until(lambda: streams.cursor == state.event_log.last_id, "past the shed ids")
        record(state, events=1)
        assert next(events)["id"] == 6


def test_a_reader_that_stops_reading_is_shed_counted_and_quietly_let_go() -> None:
    limits = HttpLimits(sse_client_queue_bytes=64 * KIB, sse_chunk_bytes=16 * KIB)
    app, state = sidecar_app(limits)
    # A fixed send buffer: Linux grew it to megabytes on loopback, all to be flooded first.
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        stalled = raw_connection(url, stream_request(url), receive_buffer=4096)
        wait_until(lambda: metric(http, "kvscope_sidecar_sse_clients") == 1, "the reader joins")
        with http.stream("GET", STREAM) as reading:  # one that keeps up, alongside
            events = sse_events(reading, 10**9)

            def flood() -> float:
                record(state, events=20, hashes=100)
                assert http.get("/healthz").status_code == 200
                for _ in range(20):
                    next(events)
                return metric(http, "kvscope_sidecar_sse_shed_total")

            wait_for(flood, lambda shed: shed == 1, "the stalled reader is shed", wait_s=60)
        stalled.close()  # it never read: the server lets the connection go once it is gone
        wait_until(lambda: metric(http, "kvscope_sidecar_sse_clients") == 0, "both streams end")
        with http.stream("GET", STREAM, headers={"Last-Event-ID": "0"}) as resumed:
            assert next(sse_events(resumed, 1))["id"] >= 1  # a shed reader resumes so


def test_readers_that_vanish_mid_stream_end_their_streams_without_a_word() -> None:
    app, state = sidecar_app()
    record(state, events=200, hashes=50)
    with served_quietly(app) as (url, http):
        for resume in (None, 0, 100):
            sockets = [raw_connection(url, stream_request(url, resume)) for _ in range(10)]
            for sock in sockets:
                assert sock.recv(64).startswith(b"HTTP/1.1 200")
            record(state, events=50, hashes=50)
            for sock in sockets:  # a reset, as a killed client leaves it
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                sock.close()
            record(state, events=50, hashes=50)
            wait_until(lambda: metric(http, "kvscope_sidecar_sse_clients") == 0, "streams end")
        assert http.get("/healthz").status_code == 200


def test_streams_past_the_cap_are_refused_with_a_503_and_counted() -> None:
    app, _ = sidecar_app(HttpLimits(max_sse_clients=2))
    with serving(app) as url, httpx.Client(base_url=url, timeout=WAIT_S) as http:
        with http.stream("GET", STREAM) as first, http.stream("GET", STREAM) as second:
            assert (first.status_code, second.status_code) == (200, 200)
            third = http.get(STREAM)
            assert third.status_code == 503 and third.headers["retry-after"] == "5"
            assert "2 event streams" in third.json()["detail"]
            reason = {"reason": "sse_clients_full"}
            assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1
        wait_until(lambda: metric(http, "kvscope_sidecar_sse_clients") == 0, "both end")
        with http.stream("GET", STREAM) as again:
            assert again.status_code == 200


def test_a_resume_from_zero_over_giant_events_is_served_a_bounded_piece_at_a_time() -> None:
    app, state = sidecar_app(HttpLimits(events_response_bytes=64 * KIB))
    giant = 20_000
    for batch in range(5):
        record(state, events=10, hashes=giant, first_hash=batch * 10 * giant)
    with serving(app) as url, httpx.Client(base_url=url, timeout=WAIT_S) as http:
        with http.stream("GET", STREAM, headers={"Last-Event-ID": "0"}) as stream:
            for expected, event in enumerate(sse_events(stream, 50), start=1):
                assert event["id"] == expected
                assert len(event["block_hashes"]) == MAX_EVENT_HASHES
                assert event["block_count"] == giant
                assert http.get("/healthz").status_code == 200
        since, pages = 0, 0
        while since < 50:
            page = http.get("/api/v1/events", params={"since": since, "limit": 1000})
            assert len(page.content) <= 64 * KIB + 100, "a page passed its budget"
            ids = [event["id"] for event in page.json()["events"]]
            assert ids and ids[0] == since + 1
            since, pages = ids[-1], pages + 1
        assert pages > 1


def test_stopping_the_server_ends_open_streams_cleanly() -> None:
    app, state = sidecar_app()
    record(state, events=3)
    with logged("uvicorn.error") as records:
        with serving(app) as url:
            sockets = [raw_connection(url, stream_request(url, 0)) for _ in range(3)]
            for sock in sockets:
                assert sock.recv(64).startswith(b"HTTP/1.1 200")
        for sock in sockets:  # the server stopped: each stream was ended, not cut
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
            assert received.endswith(b"0\r\n\r\n"), received[-200:]
            sock.close()
    assert errors_in(records) == []


def test_stopping_the_server_ends_a_backlog_at_the_chunk_being_written() -> None:
    """A stopping server ended the streams, but one still being sent its backlog was sent the
    rest of it first, a chunk at a time: a large backlog to a slow reader held up the stop
    until the server's grace cut it. Its backlog stops at the chunk being written, as a shed
    reader's does; what it got is a prefix of the log, so its resume loses nothing."""
    # No send deadline, no least rate: the stop is to end the stream, not a cut.
    limits = HttpLimits(sse_chunk_bytes=16 * KIB, send_timeout_s=3600.0, min_send_bytes_per_s=0)
    app, state = sidecar_app(limits)
    for batch in range(10):  # 500 events of 1,000 hashes: 4 MiB or so from id 0
        record(state, events=50, hashes=1000, first_hash=batch * 50_000)
    backlog = state.event_log.last_id
    with logged("uvicorn.error") as records, ThreadPoolExecutor(1) as reading:
        with serving(app, send_buffer=64 * KIB) as url:
            stalled = raw_connection(url, stream_request(url, 0), receive_buffer=4096)
            assert stalled.recv(12) == b"HTTP/1.1 200"  # its backlog has begun; it reads no more
            with httpx.Client(base_url=url, timeout=WAIT_S) as http:
                wait_until(  # past the transport's high-water mark: a chunk's write waits for it
                    lambda: metric(http, "kvscope_sidecar_http_response_buffer_bytes") > 0,
                    "the backlog waits on the unread socket",
                )

            def once_stopping() -> bytes:
                """Read the stream to its end once the server stops listening."""
                wait_until(lambda: not accepts(url), "the server stops listening")
                return read_all(stalled)

            received = reading.submit(once_stopping)
        # The server has stopped: its stream was ended, not cut, short of the backlog.
        stream = received.result(timeout=WAIT_S)
    assert stream.endswith(b"0\r\n\r\n"), stream[-200:]
    ids = [int(i) for i in re.findall(rb"^id: (\d+)$", stream, re.M)]
    assert ids == list(range(1, len(ids) + 1)) and len(ids) < backlog
    assert errors_in(records) == []  # no task cancelled at the end of the grace


def accepts(url: str) -> bool:
    """Whether a connection to ``url`` is accepted (a stopping server has closed its socket:
    refused, or reset where the connect was in its backlog as it closed)."""
    address = urlsplit(url)
    try:
        socket.create_connection((address.hostname, address.port), timeout=WAIT_S).close()
    except (ConnectionRefusedError, ConnectionResetError):
        return False
    return True


# --- item 5: the body limit stops the reading -----------------------------------------


def test_a_streamed_body_past_the_limit_is_refused_without_reading_the_rest() -> None:
    app, _ = sidecar_app()
    with serving(app) as url, logged("uvicorn.error") as records:
        host = urlsplit(url).netloc.encode()
        head = (b"POST /api/v1/lookup HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n") % host  # fmt: skip
        sock = raw_connection(url, head)
        chunk = b"%x\r\n%b\r\n" % (64 * KIB, b"1" * 64 * KIB)
        sent = 0
        try:
            while sent < 50 * 2**20:  # 50 MB, as in the report
                sock.sendall(chunk)
                sent += 64 * KIB
        except OSError:
            pass  # the server answered and closed: the rest was never read
        answer = b""
        try:
            while part := sock.recv(65536):
                answer += part
        except OSError:
            pass
        sock.close()
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"%d bytes" % HttpLimits().max_body_bytes in answer
        assert sent < 50 * 2**20, "the whole body was taken in"
        declared = raw_connection(
            url, head.replace(b"Transfer-Encoding: chunked", b"Content-Length: 50000000")
        )
        assert declared.recv(65536).startswith(b"HTTP/1.1 413")  # before a byte of the body
        declared.close()
    assert errors_in(records) == []


def test_a_stream_request_that_declares_a_body_is_refused_before_the_stream_starts() -> None:
    app, _ = sidecar_app()
    with served_quietly(app) as (url, http):
        head = stream_request(url)[:-2]
        for declared in (b"Transfer-Encoding: chunked", b"Content-Length: 5"):
            sock = raw_connection(url, head + declared + b"\r\n\r\n")
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 413"), (declared, answer[:200])
            while part := sock.recv(65536):  # it closes after the answer
                answer += part
            sock.close()
            assert b"takes no request body" in answer
        assert metric(http, "kvscope_sidecar_http_refused_total", reason="body_too_large") == 2
        assert metric(http, "kvscope_sidecar_sse_clients") == 0


@pytest.mark.parametrize("length", [b"00", b"000"])
def test_a_request_declaring_an_empty_body_in_more_zeros_has_none(length: bytes) -> None:
    """``Content-Length: 00`` declares no body, as ``0`` does (RFC 9110 8.6: any number of
    digits), but only ``0`` was read as none: an event stream was refused, a 413 saying it
    takes no request body, and a request asking for an Upgrade a 400 saying it has one."""
    app, state = sidecar_app()
    record(state, events=2)
    with served_quietly(app) as (url, _http):
        empty = b"Content-Length: " + length + b"\r\n\r\n"
        sock = raw_connection(url, stream_request(url, last_event_id=0)[:-2] + empty)
        answer = b""
        while b"\nid: 2\n" not in answer and (part := sock.recv(65536)):
            answer += part
        sock.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        host = urlsplit(url).netloc.encode()
        upgrade = b"GET /healthz HTTP/1.1\r\nHost: %b\r\nConnection: Upgrade, close\r\n" % host
        plain = read_all(raw_connection(url, upgrade + b"Upgrade: h2c\r\n" + empty))
        assert plain.startswith(b"HTTP/1.1 200"), plain[:200]


# --- item 13: the token never reaches the access log -----------------------------------


def test_the_access_log_shows_no_token_whatever_the_url_carries() -> None:
    app, _ = sidecar_app(token=TOKEN)
    with (
        serving(app, log_level="info") as url,
        logged("uvicorn.access") as records,  # after the server's redaction, as a handler is
        httpx.Client(base_url=url, timeout=WAIT_S) as http,
    ):
        login = http.get("/", params={"token": TOKEN}, follow_redirects=False)
        assert login.status_code == 303
        http.cookies.clear()  # the session cookie would let the rest in: they are to be 401s
        with http.stream("GET", STREAM, params={"token": TOKEN}) as stream:
            assert stream.status_code == 200
        assert http.get(f"/api/v1/stats?a=1&%74oken={TOKEN}").status_code == 401
        assert http.get("/api/v1/events?x=" + "y" * 5000).status_code == 401
        forged = {"X-Forwarded-For": f'1.2.3.4" 200 token={TOKEN} ' + "A" * 5000}
        assert http.get("/healthz", headers=forged).status_code == 200
        wait_until(lambda: len(records) >= 5, "five requests logged")
    lines = [record.getMessage() for record in records]
    assert lines and not [line for line in lines if TOKEN in line]
    for target in ("/?token=REDACTED", f"{STREAM}?token=REDACTED", "a=1&%74oken=REDACTED"):
        assert any(target in line for line in lines), target
    assert max(map(len, lines)) < 500, "a long target or a forwarded address was logged whole"
    assert "1.2.3.4" not in lines[-1], "a forwarded address was taken for the client's"


# --- connections: heads, stalled readers and their number, bounded ------------------------


def read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes (a reset ends it too)."""
    received = b""
    try:
        while part := sock.recv(65536):
            received += part
    except ConnectionResetError:
        pass
    sock.close()
    return received


def test_a_head_past_its_limit_is_a_431_without_reading_the_rest() -> None:
    app, _ = sidecar_app(HttpLimits(max_header_bytes=16 * KIB))
    with served_quietly(app) as (url, http):
        assert http.get("/healthz", headers={"X-Pad": "p" * 15 * KIB}).status_code == 200
        sock = raw_connection(url, stream_request(url)[:-2])
        headers = b"".join(b"X-Pad-%d: %b\r\n" % (n, b"p" * 1000) for n in range(64))
        sent = 0
        try:
            while sent < 4 * 2**20:
                sock.sendall(headers)
                sent += len(headers)
            sock.sendall(b"\r\n")
        except OSError:
            pass  # the server answered and closed: the rest was never read
        answer = read_all(sock)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
        assert b"larger than 16384 bytes" in answer
        assert sent < 4 * 2**20, "the whole head was taken in"
        assert metric(http, "kvscope_sidecar_http_refused_total", reason="headers_too_large") == 1


def test_a_head_of_more_header_fields_than_the_most_is_a_431() -> None:
    """64 KiB of four-byte fields is 16,000 of them, each a tuple of two bytes objects once
    parsed: sixteen such heads queued behind an event stream held 6.7 MB per connection
    (1 MB as bytes), so ``max_connections`` of them about 7 GB."""
    app, _ = sidecar_app()
    most = HttpLimits().max_header_fields
    with served_quietly(app) as (url, http):
        host = urlsplit(url).netloc.encode()

        def head(fields: int) -> bytes:
            """A GET of Host, ``fields`` more and Connection: close."""
            more = b"".join(b"x-%d:\r\n" % n for n in range(fields))
            return b"GET /healthz HTTP/1.1\r\nHost: %b\r\n%bConnection: close\r\n\r\n" % (
                host,
                more,
            )

        assert read_all(raw_connection(url, head(most - 2))).startswith(b"HTTP/1.1 200")
        for fields in (most - 1, 16_000):
            refused = read_all(raw_connection(url, head(fields)))
            assert refused.startswith(b"HTTP/1.1 431"), refused[:100]
            assert b"more than %d header fields" % most in refused
        reason = {"reason": "headers_too_large"}
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 2


def test_a_connection_that_sends_no_whole_head_in_time_is_closed_and_counted() -> None:
    app, _ = sidecar_app(HttpLimits(header_timeout_s=1.0))
    with served_quietly(app) as (url, http):
        silent = raw_connection(url, b"")
        unfinished = raw_connection(url, stream_request(url)[:-2])
        assert (read_all(silent), read_all(unfinished)) == (b"", b"")  # closed by the server
        # A blank line after a kept-alive request stops uvicorn's keep-alive timer and begins
        # no request: it held the connection open for good.
        host = urlsplit(url).netloc.encode()
        kept = raw_connection(url, b"GET /healthz HTTP/1.1\r\nHost: %b\r\n\r\n" % host)
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        kept.sendall(b"\r\n")
        assert read_all(kept) == b""
        reason = {"reason": "headers_timeout"}
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 3


def test_a_request_whose_body_does_not_come_in_time_is_closed_and_counted() -> None:
    """The head had a deadline, the body none: a lookup that declared 100 bytes and sent one
    held its connection, one of ``max_connections``, for good (its route waiting on the
    rest), and so did a body sent a chunk at a time to a route that never reads it, each
    chunk stopping uvicorn's keep-alive timer."""
    app, _ = sidecar_app(HttpLimits(max_connections=2, header_timeout_s=1.0))
    with served_quietly(app) as (url, http):
        host = urlsplit(url).netloc.encode()
        lookup = (b"POST /api/v1/lookup HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{") % host  # fmt: skip
        assert read_all(raw_connection(url, lookup)) == b""  # closed by the server
        chunked = b"GET /healthz HTTP/1.1\r\nHost: %b\r\nTransfer-Encoding: chunked\r\n\r\n" % host
        dribbling = raw_connection(url, chunked)
        assert dribbling.recv(12) == b"HTTP/1.1 200"

        def dribble() -> float:
            with suppress(OSError):  # closed: the last chunks were never read
                dribbling.sendall(b"1\r\nx\r\n")
            return metric(http, "kvscope_sidecar_http_refused_total", reason="body_timeout")

        wait_for(dribble, lambda closed: closed == 2, "the dribbled body's connection is closed")
        dribbling.close()
        assert http.get("/healthz").status_code == 200


def test_a_head_begun_behind_a_stream_that_never_ends_closes_only_after_the_stream() -> None:
    """A blank line (which some clients send after a request) or the start of a head sent
    behind an answer being written starts a head's deadline, which closed the connection
    under the answer: an event stream was cut ``header_timeout_s`` later."""
    app, state = sidecar_app(HttpLimits(header_timeout_s=0.5))
    with logged("uvicorn.error") as records:
        with serving(app) as url, httpx.Client(base_url=url, timeout=WAIT_S) as http:
            reader = raw_connection(url, stream_request(url))
            assert reader.recv(12) == b"HTTP/1.1 200"
            reader.sendall(b"\r\n")
            timeout = {"reason": "headers_timeout"}
            wait_until(lambda: metric(http, "kvscope_sidecar_http_refused_total", **timeout) == 1,
                       "the blank line's head deadline runs out")  # fmt: skip
            record(state, events=1)
            received = b""
            while b'"id":1' not in received:  # the stream goes on
                chunk = reader.recv(65536)
                assert chunk, received
                received += chunk
        rest = read_all(reader)  # the server stopped, ending the stream: then it closes
    assert rest.endswith(b"0\r\n\r\n") and b"HTTP/1.1" not in received + rest, rest
    assert errors_in(records) == []


def test_a_late_body_behind_an_unread_answer_frees_its_connection() -> None:
    """A body's deadline closed the connection, and a close waits for the buffer to drain:
    behind an answer its client never read, with the route waiting on the body (so no
    answer's end to start the send deadline), the connection stayed open for good."""
    app, state = sidecar_app(HttpLimits(max_connections=1, header_timeout_s=0.5))
    record(state, events=200, hashes=20)  # a page of about 60 KB, under the 64 KiB mark
    host = b"127.0.0.1"
    page = b"GET /api/v1/events?since=0&limit=1000 HTTP/1.1\r\nHost: %b\r\n\r\n" % host
    lookup = (b"POST /api/v1/lookup HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n{") % host  # fmt: skip
    healthz = b"GET /healthz HTTP/1.1\r\nHost: %b\r\nConnection: close\r\n\r\n" % host
    with logged("uvicorn.error") as records, serving(app, send_buffer=4096) as url:
        stalled = raw_connection(url, page + lookup, receive_buffer=4096)
        assert stalled.recv(12) == b"HTTP/1.1 200"
        wait_until(
            lambda: read_all(raw_connection(url, healthz)).startswith(b"HTTP/1.1 200"),
            "the late body's connection is closed, freeing its place",
        )
        read_all(stalled)
    assert errors_in(records) == []


def test_a_shed_reader_gives_up_its_slot_at_once_and_its_silent_socket_is_cut_later() -> None:
    # The send deadline starts once the stalled socket's buffers are full, and the flood must
    # fill its queue before it ends: at 1 s, a loaded machine's flood came second, the socket
    # was cut unshed and no shed ever followed. 10 s leaves the cut within a wait of the shed.
    limits = HttpLimits(
        max_sse_clients=2,
        sse_client_queue_bytes=64 * KIB,
        sse_chunk_bytes=16 * KIB,
        send_timeout_s=10.0,
    )
    app, state = sidecar_app(limits)
    # A fixed send buffer: Linux grew it to megabytes on loopback, all to be flooded first.
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        stalled = raw_connection(url, stream_request(url), receive_buffer=4096)
        wait_until(lambda: metric(http, "kvscope_sidecar_sse_clients") == 1, "the reader joins")
        with http.stream("GET", STREAM) as reading:
            events = sse_events(reading, 10**9)

            def flood() -> float:
                record(state, events=20, hashes=100)
                for _ in range(20):
                    next(events)
                return metric(http, "kvscope_sidecar_sse_shed_total")

            wait_for(flood, lambda shed: shed == 1, "the stalled reader is shed", wait_s=60)

            # At once: the shed reader's slot is free while its socket still holds a write.
            with http.stream("GET", STREAM) as joined:
                assert joined.status_code == 200
        reason = {"reason": "send_timeout"}
        wait_until(
            lambda: metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1,
            "the stalled connection is cut by its send deadline",
        )
        assert read_all(stalled).startswith(b"HTTP/1.1 200")  # cut short, then closed


def test_a_reader_shed_mid_backlog_gets_no_more_of_it_rendered_or_sent() -> None:
    """A resuming reader shed while its backlog was being written went on being sent the rest
    of it, each chunk rendered for it, until the backlog ended: work and bytes for a stream
    that was to end. Its backlog stops at the chunk being written; what it got is a prefix of
    the log, so its resume loses nothing."""
    # No send deadline, no least rate: the stalled reader is to be shed, not cut.
    limits = HttpLimits(
        sse_client_queue_bytes=64 * KIB,
        sse_chunk_bytes=16 * KIB,
        send_timeout_s=3600.0,
        min_send_bytes_per_s=0,
    )
    app, state = sidecar_app(limits)
    for batch in range(10):  # 500 events of 1,000 hashes: 4 MiB or so from id 0
        record(state, events=50, hashes=1000, first_hash=batch * 50_000)
    backlog = state.event_log.last_id
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        closing = stream_request(url, 0)[:-2] + b"Connection: close\r\n\r\n"
        stalled = raw_connection(url, closing, receive_buffer=4096)
        assert stalled.recv(12) == b"HTTP/1.1 200"  # its backlog has begun; it reads no more
        wait_until(  # past the transport's high-water mark: a chunk's write waits for it
            lambda: metric(http, "kvscope_sidecar_http_response_buffer_bytes") > 0,
            "the backlog waits on the unread socket",
        )

        def flood() -> float:  # live events queue behind the backlog it does not read
            record(state, events=20, hashes=100, first_hash=10**6)
            return metric(http, "kvscope_sidecar_sse_shed_total")

        wait_for(flood, lambda shed: shed == 1, "the stalled reader is shed", wait_s=60)
        rendered = metric(http, "kvscope_sidecar_sse_backlog_events_total")
        assert rendered < backlog
        received = read_all(stalled)  # now it reads, to the end of its stream
        assert received.endswith(b"0\r\n\r\n"), received[-200:]  # ended, not cut
        ids = [int(i) for i in re.findall(rb"^id: (\d+)$", received, re.M)]
        assert ids == list(range(1, len(ids) + 1)) and len(ids) <= rendered
        assert metric(http, "kvscope_sidecar_sse_backlog_events_total") == rendered
        assert metric(http, "kvscope_sidecar_sse_shed_total") == 1
        assert metric(http, "kvscope_sidecar_sse_clients") == 0


def test_an_answer_left_unread_below_the_high_water_mark_is_cut_too() -> None:
    """An answer under 64 KiB never paused the transport, so no send deadline ran, and once
    it was written whole nothing else did: uvicorn's keep-alive timeout closes the idle
    connection, but a close waits for the buffer to drain. A client that read nothing of
    such an answer held its connection, one of ``max_connections``, for good."""
    app, state = sidecar_app(HttpLimits(max_connections=1, send_timeout_s=1.0))
    record(state, events=200, hashes=20)  # a page of about 60 KB, under the 64 KiB mark
    assert stalled_until_cut(app, b"/api/v1/events?since=0&limit=1000") == []


def test_an_answer_its_route_fails_mid_body_left_unread_is_cut_too() -> None:
    """A route that raised after its answer began left uvicorn closing the connection behind
    what it had written, which a close waits to drain; the answer was never complete, so no
    send deadline ran below the high-water mark, and a client that read nothing of it held
    its connection, one of ``max_connections``, for good."""
    app, _ = sidecar_app(HttpLimits(max_connections=1, send_timeout_s=1.0))

    async def fails_midway() -> AsyncIterator[bytes]:
        for _ in range(3):  # 48 KiB, under the 64 KiB mark
            yield b"x" * (16 * KIB)
        raise RuntimeError("the route failed mid-answer")

    app.add_api_route("/test-fails-midway", lambda: StreamingResponse(fails_midway()))
    errors = stalled_until_cut(app, b"/test-fails-midway")
    assert errors == ["Exception in ASGI application\n"]  # the route's, alone


def stalled_until_cut(app: FastAPI, target: bytes) -> list[str]:
    """Serve ``app`` (one connection at most) to a client that asks for ``target`` and reads
    only its status line; once its send deadline cut it (a /healthz gets the freed place,
    ``send_timeout`` counted once), the errors uvicorn logged."""
    host = b"127.0.0.1"
    healthz = b"GET /healthz HTTP/1.1\r\nHost: %b\r\nConnection: close\r\n\r\n" % host
    with logged("uvicorn.error") as records, serving(app, send_buffer=4096) as url:
        request = b"GET %b HTTP/1.1\r\nHost: %b\r\n\r\n" % (target, host)
        stalled = raw_connection(url, request, receive_buffer=4096)
        assert stalled.recv(12) == b"HTTP/1.1 200"
        wait_until(
            lambda: read_all(raw_connection(url, healthz)).startswith(b"HTTP/1.1 200"),
            "the stalled connection is cut by its send deadline, freeing its place",
        )
        with httpx.Client(base_url=url, timeout=WAIT_S) as http:
            assert metric(http, "kvscope_sidecar_http_refused_total", reason="send_timeout") == 1
        read_all(stalled)
    return errors_in(records)


def test_connections_past_the_cap_are_a_503_before_their_request_is_read() -> None:
    app, _ = sidecar_app(HttpLimits(max_connections=2))
    with (
        served_quietly(app) as (url, http),
        httpx.Client(base_url=url, timeout=WAIT_S) as other,
    ):
        with other.stream("GET", STREAM) as stream:
            assert stream.status_code == 200
            assert http.get("/healthz").status_code == 200  # the second connection
            third = read_all(raw_connection(url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
            assert third.startswith(b"HTTP/1.1 503") and b"retry-after: 5" in third, third
            assert b"2 connections are open" in third
            reason = {"reason": "connections_full"}
            assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1
        wait_until(lambda: metric(http, "kvscope_sidecar_sse_clients") == 0, "the stream ends")
        assert http.get("/healthz").status_code == 200


def test_requests_pipelined_past_the_cap_are_not_read_and_the_connection_closes() -> None:
    """uvicorn parsed and queued every request a client sent ahead of its answers (200,000
    GETs in a row, all at once): past ``max_pipelined`` the connection reads no more."""
    app, _ = sidecar_app(HttpLimits(max_pipelined=4))
    with served_quietly(app) as (url, http):
        host = urlsplit(url).netloc.encode()
        healthz = b"GET /healthz HTTP/1.1\r\nHost: %b\r\n\r\n" % host
        answer = read_all(raw_connection(url, healthz * 40))  # ten times the cap
        heads = [part.split(b"\r\n\r\n")[0] for part in answer.split(b"HTTP/1.1 ")[1:]]
        # the one answered first, then the four queued behind it, the last closing
        assert [head.split(b"\r\n")[0] for head in heads] == [b"200 OK"] * 5, answer[:500]
        assert b"connection: close" in heads[-1] and b"connection: close" not in heads[0]
        reason = {"reason": "pipeline_full"}
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1
        kept = raw_connection(url, healthz * 5)  # one answered and four queued: all answered
        kept.settimeout(WAIT_S)
        received = b""
        while received.count(b"HTTP/1.1 200") < 5:
            received += kept.recv(65536)
        kept.close()
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1


def test_a_client_gone_while_requests_are_queued_is_no_error() -> None:
    """uvicorn marks only the newest request's cycle disconnected when a connection is lost,
    and that is a queued one while requests are pipelined: the request being answered (the
    second, once the first's answer let the server read the end of file) wrote on to the
    closed transport, which uvloop refuses: an error and traceback in the log that any
    client could make by sending three requests and closing its side."""
    app, _ = sidecar_app()
    with served_quietly(app) as (url, _http):
        host = urlsplit(url).netloc.encode()
        healthz = b"GET /healthz HTTP/1.1\r\nHost: %b\r\n\r\n" % host
        gone = raw_connection(url, healthz * 16)
        gone.shutdown(socket.SHUT_WR)  # the server closes at its end of file
        read_all(gone)


def test_a_stream_with_a_request_queued_behind_it_ends_when_its_reader_goes() -> None:
    """The stream is the request being answered, the one queued behind it the newest: told
    of nothing, the stream held its place among ``max_sse_clients`` until its next write
    (a keep-alive, up to 15 s later), which failed on the closed transport."""
    app, _ = sidecar_app()
    with served_quietly(app) as (url, http):
        host = urlsplit(url).netloc.encode()
        queued = b"GET /healthz HTTP/1.1\r\nHost: %b\r\n\r\n" % host
        reader = raw_connection(url, stream_request(url) + queued)
        assert reader.recv(12) == b"HTTP/1.1 200"
        wait_until(lambda: metric(http, "kvscope_sidecar_sse_clients") == 1, "the reader joins")
        reader.close()
        wait_until(lambda: metric(http, "kvscope_sidecar_sse_clients") == 0, "the reader gone")


@pytest.mark.parametrize(
    ("request_line", "problem"),
    [
        (b"GET /api/v1/stats?x=\xff HTTP/1.1", b"Invalid char in url query"),
        (b"G\x00T /api/v1/stats HTTP/1.1", b"Invalid method encountered"),
        (b"GET /api/v1/stats HTTP/9.9", b"Invalid HTTP version"),
    ],
    ids=["url byte", "method", "version"],
)
def test_a_request_the_parser_refuses_is_a_json_400_naming_why_counted_and_quiet(
    request_line: bytes, problem: bytes
) -> None:
    """uvicorn answered it in plain text ("Invalid HTTP request received.", naming nothing),
    counted nothing, and logged a warning per request: any client could fill the log."""
    app, _ = sidecar_app()
    with served_quietly(app) as (url, http):
        host = urlsplit(url).netloc.encode()
        answer = read_all(raw_connection(url, request_line + b"\r\nHost: %b\r\n\r\n" % host))
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), answer[:200]
        assert b"content-type: application/json" in head
        assert json.loads(body) == {"detail": "malformed HTTP request: " + problem.decode()}
        reason = {"reason": "malformed_request"}
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1
        assert http.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("codings", "status"),
    [
        (b"Transfer-Encoding: gzip, chunked", b"501"),
        (b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked", b"501"),
        (b"Transfer-Encoding: gzip", b"400"),
        (b"Transfer-Encoding: chunked, gzip", b"400"),
        (b"Transfer-Encoding: chunked, chunked", b"400"),
        (b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked", b"400"),
    ],
    ids=["one field", "two fields", "no chunked", "chunked first", "chunked twice", "two chunked"],
)
def test_a_body_in_a_transfer_coding_beside_chunked_is_a_501_naming_why(
    codings: bytes, status: bytes
) -> None:
    """The parser takes the chunks off and hands on what is inside them, still in the other
    coding: a lookup whose JSON was gzipped was a 400 saying the body is not UTF-8. RFC 9112
    (6.1) has a server answer a transfer coding it does not decode with a 501, and (6.3) one
    whose last coding is not chunked, whose length cannot be known, with a 400."""
    app, _ = sidecar_app()
    with served_quietly(app) as (url, http):
        host = urlsplit(url).netloc.encode()
        inside = gzip.compress(b'{"block_hashes": [1]}')
        head = (
            b"POST /api/v1/lookup HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n" % host
        )
        chunks = b"%x\r\n%b\r\n0\r\n\r\n" % (len(inside), inside)
        answer = read_all(raw_connection(url, head + codings + b"\r\n\r\n" + chunks))
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 " + status), answer[:300]
        assert any(words in body for words in (b"Transfer-Encoding", b"coding", b"chunked"))
        reason = {"reason": "malformed_request"}
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1


@pytest.mark.parametrize(
    "refused",
    [
        b"GET /api/v1/stats HTTP/9.9\r\nHost: %b\r\n\r\n",
        b"POST /api/v1/lookup HTTP/1.1\r\nHost: %b\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n"
        b"Content-Length: 2\r\n\r\n{}",
        b"OPTIONS * HTTP/1.1\r\nHost: %b\r\n\r\n",
    ],
    ids=["parser", "upgrade with a body", "asterisk-form target"],
)
def test_a_refusal_behind_pipelined_requests_is_answered_after_theirs(refused: bytes) -> None:
    """The 400 was written the moment the request was refused, ahead of the answers owed to
    the requests sent before it, and the connection closed at once: those were never
    answered (answers must come in the order of their requests, RFC 9112 9.3.2)."""
    app, _ = sidecar_app()
    with served_quietly(app) as (url, http):
        host = urlsplit(url).netloc.encode()
        healthz = b"GET /healthz HTTP/1.1\r\nHost: %b\r\n\r\n" % host
        answer = read_all(raw_connection(url, healthz * 2 + refused.replace(b"%b", host)))
        statuses = [part.split(b"\r\n")[0] for part in answer.split(b"HTTP/1.1 ")[1:]]
        assert statuses == [b"200 OK", b"200 OK", b"400 Bad Request"], answer[:500]
        assert b"connection: close" not in answer.partition(b"HTTP/1.1 400")[0]
        reason = {"reason": "malformed_request"}
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1


@pytest.mark.parametrize(
    ("tail", "status"),
    [
        (b'5\r\n{"blo\r\nZZ\r\n', b"400"),
        (b"2\r\n{}\r\n0\r\n" + b"t:\r\n" * 200 + b"\r\n", b"431"),
    ],
    ids=["malformed chunk", "trailer fields past the most"],
)
def test_a_body_refused_while_its_route_reads_it_is_answered_at_once(
    tail: bytes, status: bytes
) -> None:
    """A refusal waits for the answers owed to the requests before it, but not for its own:
    its route waits on a body that will never come."""
    app, _ = sidecar_app()
    with served_quietly(app) as (url, _http):
        host = urlsplit(url).netloc.encode()
        head = (b"POST /api/v1/lookup HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n") % host  # fmt: skip
        answer = read_all(raw_connection(url, head + tail))
        assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]


def test_a_refused_head_behind_a_stream_waits_for_it_without_cutting_it() -> None:
    """A head past its limit sent behind an event stream waits to be refused until the stream
    ends (the 431 was written into it, ahead of its end), and its deadline, running from
    when it began, no longer closes the connection under the stream meanwhile."""
    app, state = sidecar_app(HttpLimits(max_header_bytes=16 * KIB, header_timeout_s=0.5))
    with logged("uvicorn.error") as records:
        with serving(app) as url, httpx.Client(base_url=url, timeout=WAIT_S) as http:
            huge = b"GET /healthz HTTP/1.1\r\nX-Pad: %b" % (b"p" * 32 * KIB)
            reader = raw_connection(url, stream_request(url) + huge)
            assert reader.recv(12) == b"HTTP/1.1 200"
            refused = {"reason": "headers_too_large"}
            wait_until(lambda: metric(http, "kvscope_sidecar_http_refused_total", **refused) == 1,
                       "the head is refused")  # fmt: skip
            # A head deadline that starts after the refused head's: once it has run out, so
            # had the refused head's.
            silent = raw_connection(url, b"")
            timeout = {"reason": "headers_timeout"}
            wait_until(lambda: metric(http, "kvscope_sidecar_http_refused_total", **timeout) > 0,
                       "the silent connection's head deadline runs out")  # fmt: skip
            assert read_all(silent) == b""
            assert metric(http, "kvscope_sidecar_http_refused_total", **timeout) == 1
            record(state, events=1)
            received = b""
            while b'"id":1' not in received:  # the stream goes on
                received += reader.recv(65536)
        # The server stopped, ending the stream, and closing: the refusal goes unwritten.
        rest = read_all(reader)
    assert rest.endswith(b"0\r\n\r\n") and b"HTTP/1.1" not in received + rest, rest
    assert errors_in(records) == []


def test_a_request_asking_for_an_upgrade_is_served_quietly_or_refused_when_it_has_a_body() -> None:
    """The parser skips the body of a request that asks for an Upgrade (the bytes after its
    head belong to the new protocol): a lookup sent so was answered as if it had no body,
    and each such request logged two warnings, one telling the operator to install a
    WebSocket library."""
    app, _ = sidecar_app()
    with served_quietly(app) as (url, http):
        host = urlsplit(url).netloc.encode()
        upgrade = b"Host: %b\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n" % host
        plain = read_all(
            raw_connection(url, b"GET /healthz HTTP/1.1\r\n%bConnection: close\r\n\r\n" % upgrade)
        )
        assert plain.startswith(b"HTTP/1.1 200"), plain[:200]
        body = b'{"block_hashes": [1]}'
        post = b"POST /api/v1/lookup HTTP/1.1\r\n%bContent-Type: application/json\r\n" % upgrade
        answer = read_all(
            raw_connection(url, post + b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        )
        head, _, detail = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), answer[:200]
        assert "Upgrade" in json.loads(detail)["detail"]
        reason = {"reason": "malformed_request"}
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1


def test_requests_sent_right_behind_one_asking_for_an_upgrade_are_answered_too() -> None:
    """The parser stops at the end of a request that asks for an Upgrade (what follows would
    be the new protocol's), and uvicorn dropped the rest of what it had read: the requests
    sent behind it in one write were never answered, their connection left to its keep-alive
    timeout."""
    app, _ = sidecar_app()
    with served_quietly(app) as (url, _http):
        host = urlsplit(url).netloc.encode()
        asks = b"Connection: Upgrade\r\nUpgrade: h2c\r\n"
        upgrade = b"GET /healthz HTTP/1.1\r\nHost: %b\r\n" + asks + b"\r\n"
        last = b"GET /readyz HTTP/1.1\r\nHost: %b\r\nConnection: close\r\n\r\n"
        answer = read_all(raw_connection(url, (upgrade * 2 + last) % (host, host, host)))
        statuses = [part.split(b"\r\n")[0] for part in answer.split(b"HTTP/1.1 ")[1:]]
        assert statuses == [b"200 OK"] * 3, answer[:500]
        assert answer.endswith(b'"unseen":[]}'), answer[-200:]  # /readyz's, the last


def test_the_refusals_the_connection_answers_itself_carry_the_security_headers() -> None:
    """Every response carries them (README), but the 400, 431 and 503 that
    ``BoundedConnection`` writes itself, below the guards, carried none."""
    app, _ = sidecar_app(HttpLimits(max_connections=1, max_header_bytes=KIB))
    with serving(app) as url:
        host = urlsplit(url).netloc.encode()
        malformed = b"GET /healthz HTTP/9.9\r\nHost: %b\r\n\r\n" % host
        too_large = b"GET /healthz HTTP/1.1\r\nHost: %b\r\nX-Pad: %b\r\n\r\n" % (host, b"p" * KIB)
        heads = [read_all(raw_connection(url, request)) for request in (malformed, too_large)]
        holding = raw_connection(url, b"")  # the one connection allowed: the next is refused
        heads.append(read_all(raw_connection(url, malformed)))
        holding.close()
    statuses = [head.split(b"\r\n")[0] for head in heads]
    assert statuses == [
        b"HTTP/1.1 400 Bad Request",
        b"HTTP/1.1 431 Request Header Fields Too Large",
        b"HTTP/1.1 503 Service Unavailable",
    ]
    for head in heads:
        fields = head.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]
        for name, value in HEADERS:
            assert name + b": " + value in fields, (head[:20], name)


# --- responses held for slow readers, bounded all together ---------------------------------

HISTORY = "/api/v1/history?since=1000"


def fill_history(state: SidecarState) -> None:
    """About 3 MB of ``HISTORY``: 200 series of 900 one-second points, 16 digits or so each."""
    for second in range(900):
        readings = [Reading(SeriesKey("p", f"m{n}"), "gauge", second / 7 + n) for n in range(200)]
        state.history.add(1000.0 + second, readings)


def unread(url: str, path: str) -> tuple[bytes, socket.socket]:
    """The status line of a GET of ``path``, from a client that reads no more of it."""
    host = urlsplit(url).netloc.encode()
    request = b"GET %b HTTP/1.1\r\nHost: %b\r\n\r\n" % (path.encode(), host)
    sock = raw_connection(url, request, receive_buffer=4096)
    line = b""
    while not line.endswith(b"\r\n"):
        line += sock.recv(1)
    return line, sock


def read_answer(sock: socket.socket, status_line: bytes) -> bytes:
    """The head of a kept-alive answer whose status line was read, once its whole body is."""
    received = status_line
    while b"\r\n\r\n" not in received:
        received += sock.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    (length,) = re.findall(rb"\r\ncontent-length: (\d+)", head)
    while len(body) < int(length):
        body += sock.recv(65536)
    return head


def test_answers_left_unread_are_shown_held_until_their_readers_read_or_go() -> None:
    """uvicorn keeps each answer whole until its client reads it: 1,024 clients reading a
    20 MiB history slowly held 20 GiB, and nothing showed it."""
    app, state = sidecar_app()
    fill_history(state)
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        size = len(http.get(HISTORY).content)
        assert metric(http, "kvscope_sidecar_http_response_buffer_bytes") == 0
        (status_line, reader), (_, leaver) = unread(url, HISTORY), unread(url, HISTORY)
        held = metric(http, "kvscope_sidecar_http_response_buffer_bytes")
        assert size < held <= 2 * size  # both answers, less what the sockets took
        assert read_answer(reader, status_line).startswith(b"HTTP/1.1 200")  # one reads it all
        wait_for(
            lambda: metric(http, "kvscope_sidecar_http_response_buffer_bytes"),
            lambda now: 0 < now <= size,
            "one answer held once its reader read it",
        )
        leaver.close()  # the other goes without reading
        wait_until(
            lambda: metric(http, "kvscope_sidecar_http_response_buffer_bytes") == 0,
            "nothing held once the readers read or went",
        )
        reader.close()


def test_answers_past_the_response_budget_are_a_503_until_their_readers_read() -> None:
    """Past ``response_buffer_bytes`` (less its scrape reserve) held for clients still
    reading, an answer is a 503 with Retry-After, counted, and answered again once a reader
    has read."""
    app, state = sidecar_app(HttpLimits(response_buffer_bytes=8 * MiB))
    fill_history(state)
    assert app.state.response_buffers.room(scrape=False) == 7 * MiB  # an eighth kept
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        size = len(http.get(HISTORY).content)
        assert 2 * size <= 7 * MiB < 3 * size - MiB, size  # two fit, not three
        (status_line, reader), (second, leaver) = unread(url, HISTORY), unread(url, HISTORY)
        assert status_line == second == b"HTTP/1.1 200 OK\r\n"
        third, refused = unread(url, HISTORY)
        assert third == b"HTTP/1.1 503 Service Unavailable\r\n"
        head, _, body = read_all(refused).partition(b"\r\n\r\n")
        assert b"\r\nretry-after: 5\r" in head, head
        detail = json.loads(body)["detail"]
        assert f"would pass {7 * MiB}, the sidecar's most less its scrape reserve" in detail
        reason = {"reason": "response_buffer_full"}
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1
        assert read_answer(reader, status_line).startswith(b"HTTP/1.1 200")
        wait_until(lambda: http.get(HISTORY).status_code == 200, "a large answer again")
        reader.close()
        leaver.close()


def test_scrapes_are_answered_from_the_reserve_that_other_answers_cannot_take() -> None:
    """Slow readers of large answers held the whole budget, and the /metrics scrape that
    would have shown it (kvscope_sidecar_http_response_buffer_bytes at the budget, the
    refusals counted) was itself a 503: Prometheus saw the sidecar down, not why."""
    probe, state = sidecar_app()
    fill_history(state)
    with served_quietly(probe) as (_, http):
        size = len(http.get(HISTORY).content)
    room = size - 256 * KIB  # one unread answer passes it, by less than its sockets take
    app, state = sidecar_app(HttpLimits(response_buffer_bytes=room * 8 // 7))
    fill_history(state)
    buffers = app.state.response_buffers
    assert buffers.room(scrape=False) == room  # and a scrape fits beside the unread answer:
    assert buffers.room(scrape=True) - size > 64 * KIB
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        status, holding = unread(url, HISTORY)  # alone, so served though past the room
        assert status == b"HTTP/1.1 200 OK\r\n"
        assert http.get("/api/v1/stats").status_code == 503  # other answers: no room left
        scraped = http.get("/metrics")
        assert scraped.status_code == 200, scraped.text  # the reserve answers the scrape
        shown = {
            sample.name: sample.value
            for family in text_string_to_metric_families(scraped.text)
            for sample in family.samples
        }
        assert shown["kvscope_sidecar_http_response_buffer_bytes"] > room
        reason = {"reason": "response_buffer_full"}
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1
        holding.close()


def test_an_answer_larger_than_the_budget_is_served_while_nothing_else_is_held() -> None:
    app, state = sidecar_app(HttpLimits(response_buffer_bytes=MiB))
    fill_history(state)
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        status, holding = unread(url, HISTORY)
        assert status == b"HTTP/1.1 200 OK\r\n"  # alone: served though past the budget
        refused = http.get(HISTORY)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        assert http.get("/api/v1/stats").status_code == 503  # nothing fits beside it
        # Not checked: the probes, a HEAD (no body) and the event stream (no length)
        assert http.get("/healthz").status_code == http.get("/readyz").status_code == 200
        assert http.head(HISTORY).status_code == 200
        with http.stream("GET", STREAM) as stream:
            assert stream.status_code == 200
        holding.close()
        buffers = app.state.response_buffers  # /metrics too is refused until it is gone
        wait_until(lambda: buffers.held() == 0, "the server lets the unread answer go")
        assert http.get(HISTORY).status_code == 200
        reason = {"reason": "response_buffer_full"}
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 2


def read_slowly(sock: socket.socket, most: int | None = None) -> int:
    """Bytes read a KiB at a time with a pause after each (at most 100 KiB a second), until
    the server ends the connection or ``most`` are read."""
    received = 0
    try:
        while (most is None or received < most) and (part := sock.recv(KIB)):
            received += len(part)
            time.sleep(0.01)
    except ConnectionResetError:
        pass
    sock.close()
    return received


def test_a_reader_below_the_least_rate_is_cut_counted_and_its_bytes_let_go() -> None:
    """Reading a byte now and then once kept an answer held for good: a dozen clients so
    reading a 20 MiB history held the whole response budget. Below ``min_send_bytes_per_s``,
    after a first window's grace, the answer is cut; a reader of the same answer at its own
    pace, and an event stream with nothing to send, go on."""
    limits = HttpLimits(send_timeout_s=2.0, min_send_bytes_per_s=MiB)
    app, state = sidecar_app(limits)
    fill_history(state)
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        with http.stream("GET", STREAM) as idle:
            events = sse_events(idle, 10**9)
            wait_until(lambda: metric(http, "kvscope_sidecar_sse_clients") == 1, "it joins")
            size = len(http.get(HISTORY).content)
            status, slow = unread(url, HISTORY)
            assert status == b"HTTP/1.1 200 OK\r\n"
            assert metric(http, "kvscope_sidecar_http_response_buffer_bytes") > MiB
            assert read_slowly(slow) < size  # cut short
            assert metric(http, "kvscope_sidecar_http_refused_total", reason="send_too_slow") == 1
            assert metric(http, "kvscope_sidecar_http_refused_total", reason="send_timeout") == 0
            wait_until(
                lambda: metric(http, "kvscope_sidecar_http_response_buffer_bytes") == 0,
                "the slow reader's answer is let go",
            )
            assert len(http.get(HISTORY).content) == size
            assert metric(http, "kvscope_sidecar_sse_clients") == 1  # the idle stream goes on
            record(state, events=1)
            assert next(events)["id"] == state.event_log.last_id
        assert metric(http, "kvscope_sidecar_http_refused_total", reason="send_too_slow") == 1


def test_a_reader_that_drains_the_buffer_now_and_then_is_held_to_the_rate_all_along() -> None:
    """Each drain below the low-water mark began a new window, with a new grace: an answer
    written in pieces (here a resume from id 0, a chunk at a time) to a client that drained
    the 48 KiB between the marks once a window was held to that, about 1.6 KiB/s at the
    defaults. The rate holds over all the time the client keeps the server waiting."""
    limits = HttpLimits(send_timeout_s=2.0, min_send_bytes_per_s=MiB, sse_chunk_bytes=16 * KIB)
    app, state = sidecar_app(limits)
    for batch in range(10):  # 500 events of 1,000 hashes: 4 MiB or so from id 0
        record(state, events=50, hashes=1000, first_hash=batch * 50_000)
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        sock = raw_connection(url, stream_request(url, 0), receive_buffer=4096)
        # At most 100 KiB/s: a drain below the mark each second or so, a tenth of the rate
        assert read_slowly(sock, most=3 * MiB) < 3 * MiB  # cut short
        assert metric(http, "kvscope_sidecar_http_refused_total", reason="send_too_slow") == 1
        assert metric(http, "kvscope_sidecar_http_refused_total", reason="send_timeout") == 0
        wait_until(lambda: metric(http, "kvscope_sidecar_sse_clients") == 0, "the stream ends")


def recorded_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """What each stretch of every send wait takes for bytes its client read, from now on:
    where the client reads nothing, only bytes the server wrote into a stretch make one
    negative."""
    reads: list[int] = []

    class Recorded(SendWait):
        """The send wait, recording what each stretch took for bytes its client read."""

        began: int | None = None

        def measure(self, now: float, size: int) -> float:
            left = super().measure(now, size)
            self.began = size
            return left

        def pause(self, now: float, size: int) -> None:
            if self.began is not None:
                reads.append(self.began - size)
                self.began = None
            super().pause(now, size)

    monkeypatch.setattr(http_connection, "SendWait", Recorded)
    return reads


def test_a_refusal_written_while_a_wait_is_measured_is_not_taken_for_bytes_left_unread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 400 for a request pipelined behind a history was written the moment the history's
    answer ended, while the wait on its reader was measured: the buffer grew by the 400's
    bytes, which the wait took for bytes the reader had not read (a stretch read less than
    nothing), so a reader above the least rate by less than that was cut. Each stretch now
    sees only the client's reading: the buffer never grows in one."""
    reads = recorded_reads(monkeypatch)
    app, state = sidecar_app()
    fill_history(state)
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        host = urlsplit(url).netloc.encode()
        refused = b"GET /api/v1/stats HTTP/9.9\r\nHost: %b\r\n\r\n" % host
        answers = read_all(behind_an_unread_answer(url, refused))
        assert statuses_and_last_head(answers)[0] == [b"200 OK", b"400 Bad Request"]
        assert reads and min(reads) >= 0, reads
        for reason in ("send_timeout", "send_too_slow"):
            assert metric(http, "kvscope_sidecar_http_refused_total", reason=reason) == 0


def test_a_100_continue_written_while_a_wait_is_measured_is_not_taken_for_bytes_left_unread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """uvicorn writes ``100 Continue`` when a route first reads the body of a request that
    expects one, whatever its buffer holds: a route that starts behind an answer its client
    left unread (the buffer past the high-water mark, the wait measured) had those 25 bytes
    taken for bytes the client had not read. The route's own answer waits for the buffer to
    drain; its ``100 Continue`` does not."""
    reads = recorded_reads(monkeypatch)
    app, state = sidecar_app()
    fill_history(state)
    reading = threading.Event()

    async def reads_its_body(request: Request) -> Response:
        with suppress(ClientDisconnect):  # its body is refused, the connection closed
            async for _ in request.stream():
                reading.set()
        return Response()

    app.add_api_route("/test-reads-body", reads_its_body, methods=["POST"])
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        host = urlsplit(url).netloc.encode()
        head = (b"POST /test-reads-body HTTP/1.1\r\nHost: %b\r\nExpect: 100-continue\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n") % host  # fmt: skip
        sock = behind_an_unread_answer(url, head + b"1\r\nx\r\n")
        wait_until(reading.is_set, "the route reads its body, once the history is written")
        sock.sendall(b"ZZ\r\n")  # a malformed chunk, refused at once: the stretch ends
        answers = read_all(sock)
        statuses = statuses_and_last_head(answers)[0]
        assert statuses == [b"200 OK", b"100 Continue", b"400 Bad Request"], statuses
        assert reads and min(reads) >= 0, reads
        for reason in ("send_timeout", "send_too_slow"):
            assert metric(http, "kvscope_sidecar_http_refused_total", reason=reason) == 0


def test_only_an_http_11_request_expecting_100_continue_gets_the_interim_answer() -> None:
    """RFC 9110 (10.1.1): a server must ignore an HTTP/1.0 request's ``100-continue``
    expectation, as such a client knows no interim answer; uvicorn wrote it all the same.
    An HTTP/1.1 request that expects one still has it before its answer."""
    app, _ = sidecar_app()
    with served_quietly(app) as (url, _):
        host = urlsplit(url).netloc.encode()
        body = b'{"block_hashes": []}'
        for version, interim in ((b"1.0", []), (b"1.1", [b"100 Continue"])):
            head = (b"POST /api/v1/lookup HTTP/%b\r\nHost: %b\r\nExpect: 100-continue\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n"
                    b"Connection: close\r\n\r\n") % (version, host, len(body))  # fmt: skip
            request = head + body
            statuses = statuses_and_last_head(read_all(raw_connection(url, request)))[0]
            assert statuses == [*interim, b"200 OK"], (version, statuses)


# --- requests queued behind an answer, bounded in bytes ------------------------------------


def behind_an_unread_answer(url: str, requests: bytes) -> socket.socket:
    """A socket that sent a GET of ``HISTORY`` and ``requests`` behind it, reading nothing: the
    requests wait in the queue until it reads the answer."""
    host = urlsplit(url).netloc.encode()
    history = b"GET %b HTTP/1.1\r\nHost: %b\r\n\r\n" % (HISTORY.encode(), host)
    return raw_connection(url, history + requests, receive_buffer=4096)


def statuses_and_last_head(answer: bytes) -> tuple[list[bytes], bytes]:
    heads = [part.split(b"\r\n\r\n")[0] for part in answer.split(b"HTTP/1.1 ")[1:]]
    return [head.split(b"\r\n")[0] for head in heads], heads[-1]


def test_heads_queued_past_the_head_limit_together_are_not_read() -> None:
    """Sixteen heads of 64 KiB each could wait behind an answer, parsed: a megabyte held per
    connection for requests not yet answered. Together they may take ``max_header_bytes``:
    the head that would pass it is a 503 after the answers before it, and the connection
    reads no more."""
    app, state = sidecar_app(HttpLimits(max_header_bytes=16 * KIB))
    fill_history(state)
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        host = urlsplit(url).netloc.encode()
        padded = b"GET /healthz HTTP/1.1\r\nHost: %b\r\nX-Pad: %b\r\n\r\n" % (host, b"p" * 4000)
        reason = {"reason": "pipeline_too_large"}
        closing = padded.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
        # four fit (the one answered after the history is no longer queued): all answered
        fitting = behind_an_unread_answer(url, padded * 3 + closing)
        assert statuses_and_last_head(read_all(fitting))[0] == [b"200 OK"] * 5
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 0
        flooding = behind_an_unread_answer(url, padded * 12)
        wait_until(
            lambda: metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1,
            "the queue passes its bytes",
        )
        statuses, last = statuses_and_last_head(read_all(flooding))
        # the history, the four queued (and the one answered behind it, if it had begun),
        # then the head that passed the bound, refused
        assert statuses[:-1] in ([b"200 OK"] * 5, [b"200 OK"] * 6), statuses
        assert statuses[-1] == b"503 Service Unavailable" and b"connection: close" in last
        assert metric(http, "kvscope_sidecar_http_refused_total", reason="pipeline_full") == 0


def test_a_queued_body_past_the_head_limit_is_a_503_after_the_answers_before_it() -> None:
    """A queued request's body is held with its head until its turn, and the bound on what
    waits counts it. The request it takes past the bound was dropped unanswered and the
    connection closed: a pipelined POST lost without a word, which its client may not send
    again unasked. It is a 503 naming the limit, after the answers before it; its body is
    let go, and nothing after it is read (a request the parser would refuse is not)."""
    app, state = sidecar_app(HttpLimits(max_header_bytes=16 * KIB))
    fill_history(state)
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        host = urlsplit(url).netloc.encode()
        healthz = b"GET /healthz HTTP/1.1\r\nHost: %b\r\n\r\n" % host
        sock = behind_an_unread_answer(
            url, healthz * 2 + padded_lookup(host) + healthz + unparsable(host)
        )
        reason = {"reason": "pipeline_too_large"}
        wait_until(
            lambda: metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1,
            "the queued body passes the bound",
        )
        answers = read_all(sock)
        statuses, last = statuses_and_last_head(answers)
        assert statuses == [b"200 OK"] * 3 + [b"503 Service Unavailable"], statuses
        assert b"connection: close" in last
        assert b"connection: close" not in answers.partition(b"HTTP/1.1 503")[0]
        refusal = json.loads(answers[answers.index(b"HTTP/1.1 503") :].partition(b"\r\n\r\n")[2])
        assert f"may hold {16 * KIB} bytes together" in refusal["detail"]
        for other in ("body_timeout", "malformed_request"):
            assert metric(http, "kvscope_sidecar_http_refused_total", reason=other) == 0
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1


def padded_lookup(host: bytes) -> bytes:
    """A lookup whose 20 KiB body takes the queue past a 16 KiB ``max_header_bytes``."""
    body = b'{"pad": "%b"}' % (b"p" * 20 * KIB)
    return (b"POST /api/v1/lookup HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n%b") % (host, len(body), body)  # fmt: skip


def malformed_chunk(host: bytes) -> bytes:
    """A chunked lookup whose second chunk's size the parser refuses."""
    head = (b"POST /api/v1/lookup HTTP/1.1\r\nHost: %b\r\nContent-Type: application/json"
            b"\r\nTransfer-Encoding: chunked\r\n\r\n") % host  # fmt: skip
    return head + b'5\r\n{"blo\r\nZZ\r\n'


def unparsable(host: bytes) -> bytes:
    """A request the parser refuses (``malformed_request``), were it parsed."""
    return b"GET /healthz HTTP/9.9\r\nHost: %b\r\n\r\n" % host


def test_a_malformed_body_queued_behind_an_answer_is_refused_after_it() -> None:
    """A refused body was answered at once, as its route may wait on it; but a queued
    request's route has not begun, and its 400 was written ahead of the answer owed before
    it, the connection closed: that answer was never written. It comes after the answers to
    every request queued before it, and nothing after it is parsed (a request the parser
    would refuse is not counted) or answered."""
    app, state = sidecar_app()
    fill_history(state)
    with served_quietly(app, send_buffer=64 * KIB) as (url, http):
        host = urlsplit(url).netloc.encode()
        healthz = b"GET /healthz HTTP/1.1\r\nHost: %b\r\n\r\n" % host
        requests = healthz * 2 + malformed_chunk(host) + healthz + unparsable(host)
        answers = read_all(behind_an_unread_answer(url, requests))
        statuses = statuses_and_last_head(answers)[0]
        assert statuses == [b"200 OK"] * 3 + [b"400 Bad Request"], statuses
        assert b"connection: close" not in answers.partition(b"HTTP/1.1 400")[0]
        reason = {"reason": "malformed_request"}
        assert metric(http, "kvscope_sidecar_http_refused_total", **reason) == 1


@pytest.mark.parametrize(
    ("refused", "reason"),
    [(padded_lookup, "pipeline_too_large"), (malformed_chunk, "malformed_request")],
    ids=["past the bound", "malformed"],
)
def test_a_body_refused_while_queued_behind_a_stream_waits_for_it_without_cutting_it(
    refused: Callable[[bytes], bytes], reason: str
) -> None:
    """Behind an event stream, the answer owed first never ends while it has readers: the
    refusal of a queued body waits (nothing of it is written into the stream), counted once,
    and the stream goes on. At shutdown the request queued before it is answered, the last
    (uvicorn marks the newest request kept to close it, the refused one no longer), and
    neither the refusal nor anything after it is."""
    app, state = sidecar_app(HttpLimits(max_header_bytes=16 * KIB))
    with logged("uvicorn.error") as records:
        with serving(app) as url, httpx.Client(base_url=url, timeout=WAIT_S) as http:
            host = urlsplit(url).netloc.encode()
            healthz = b"GET /healthz HTTP/1.1\r\nHost: %b\r\n\r\n" % host
            requests = stream_request(url) + healthz + refused(host) + healthz
            reader = raw_connection(url, requests)
            assert reader.recv(12) == b"HTTP/1.1 200"
            counted = {"reason": reason}
            wait_until(
                lambda: metric(http, "kvscope_sidecar_http_refused_total", **counted) == 1,
                "the queued body is refused",
            )
            record(state, events=1)
            received = b""
            while b'"id":1' not in received:  # the stream goes on
                received += reader.recv(65536)
            assert metric(http, "kvscope_sidecar_http_refused_total", **counted) == 1
        rest = read_all(reader)  # the server stopped, ending the stream
    assert b"HTTP/1.1" not in received
    stream_end, _, after = rest.partition(b"0\r\n\r\n")
    assert b"HTTP/1.1" not in stream_end
    statuses, last = statuses_and_last_head(after)
    assert statuses == [b"200 OK"] and b"connection: close" in last, after
    assert errors_in(records) == []
