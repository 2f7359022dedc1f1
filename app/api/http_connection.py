"""One HTTP connection under uvicorn's httptools parser, bounded in bytes, time and number.

httptools (chosen for speed) buffers a request's head without limit, and
uvicorn gives a head no deadline nor a stalled reader any: one connection took
256 MiB of headers, one that never finished its head stayed open for good, and
an event-stream reader that stopped reading held its stream (and its slot in
``max_sse_clients``) while its socket stayed open. ``BoundedConnection`` adds
what uvicorn lacks, each counted in ``HttpCounts``:

- a head over ``max_header_bytes`` is a 431 (``headers_too_large``). Bytes are
  counted as they arrive and parsed in pieces no larger than the room left, so
  parsing stops at the limit; a head that begins in the same piece as the end
  of the request before it is counted from the next piece on (so at most twice
  the limit is parsed). So is a head of more than ``max_header_fields`` fields:
  each is a tuple of two bytes objects once parsed, and within the byte limit
  a head of four-byte fields held 25 times its size.
- a head not complete ``header_timeout_s`` after it began (or after the
  connection opened, for the first) closes the connection (``headers_timeout``)
  once the answers owed to the requests before it are written (a blank line
  sent behind an event stream cut the stream). A body not complete
  ``header_timeout_s`` after its head cuts the connection at once
  (``body_timeout``), unless the server stopped reading it (requests queued
  before it, or a route not reading yet): a lookup that declared 100 bytes and
  sent one held its connection for good, its route waiting on the rest, and so
  did a body sent a chunk at a time to a route that never reads it, each chunk
  stopping uvicorn's keep-alive timer.
- a response its client reads nothing of for ``send_timeout_s`` while the
  server's write buffer is full is cut, dropping what is buffered
  (``send_timeout``): the response's ``send`` returns, as for a client gone.
  So is one its client reads less than ``min_send_bytes_per_s`` of, averaged
  over all the time it kept the server waiting since its first such window
  (its grace), until nothing is left to send (``send_too_slow``): a client
  that read a byte every 29 s held its buffer, a 20 MiB answer, for good, and
  a dozen such held ``response_buffer_bytes``; one that drained the buffer
  below the low-water mark once a window was given a new grace each time
  (app/api/send_wait.py). The same deadline runs once an answer is written
  whole with some of it unsent, however little: an answer under the
  high-water mark never filled the buffer, and a close (at uvicorn's
  keep-alive timeout, or after a ``connection: close``) waits for the buffer
  to drain, so a client that read nothing of it held its connection for good.
  So it runs once an app ends without finishing its answer (a route raised
  mid-body): uvicorn closes the connection behind what was written, an
  answer that will never grow, and nothing else ended that wait.
  Neither runs while nothing waits to be sent (an idle event stream) nor
  while an answer is being written below the mark, where the server adds to
  the buffer as the client reads it. A refusal the connection writes while
  it runs (a 400 for a request pipelined behind the answer), or the
  ``100 Continue`` uvicorn writes when a route started behind it first reads
  a body that expects one, is the server's bytes, not ones the client left
  unread: the wait is paused around it.
- past ``max_connections`` open connections a new one is answered 503 and
  closed before its request is read (``connections_full``).
- past ``max_pipelined`` requests queued behind the one being answered
  (HTTP/1.1 pipelining), the connection reads no further: the newest queued
  request is answered with ``connection: close``, the ones after it never
  (``pipeline_full``), as a server may close any keep-alive connection.
  uvicorn parses every request a client sends ahead and queues each until
  the ones before it are answered, and reads on whenever one is: a client
  that sent 200,000 ``GET``s in a row had them all queued at once. A
  connection lost meanwhile ends the request being answered as a client gone
  (uvicorn told only the newest, queued one, and the answered one wrote on to
  the closed transport: an error and traceback in the log).
- the requests so queued hold at most ``max_header_bytes`` together, counted
  as uvicorn holds them (URLs, header fields, bodies so far): the request
  whose head or body would pass it is a 503 naming the limit once the
  answers before it are written, its body so far let go, and nothing after
  it is read (``pipeline_too_large``). Each head was bounded alone: sixteen
  queued heads held sixteen times the limit, their bodies beside; and the
  request past the bound was dropped unanswered, which a client cannot tell
  from a server gone mid-request.
- a connection's buffer past the transport's high-water mark counts toward
  ``response_buffer_bytes`` until it drains (``ResponseBuffers``; the guard
  that refuses answers past it is app/api/guards/response_budget.py).
- bytes the parser refuses (a byte a URL cannot hold, an unknown method or
  version, a malformed Content-Length or chunk) are a 400 naming the parser's
  reason, in JSON (``malformed_request``). uvicorn answered "Invalid HTTP
  request received." in plain text, naming nothing, and logged a warning per
  request, so any client could fill the log; the reasons are llhttp's fixed
  texts, never the client's bytes. So is a request with a body that asks for a
  protocol ``Upgrade`` (the server upgrades nothing: ``ws="none"``): the parser
  skips the body of such a request, which was answered as if it had none.
  One without a body is served as any other, without the two warnings uvicorn
  logged for it (one telling the operator to install a WebSocket library).
- a request target in absolute form (``GET http://host/path``) is served by its
  path, its host put in the Host field for the Host check to read, as RFC 9112
  (3.2.2) has a server ignore the Host header for such a target: uvicorn kept
  the path alone, so the host the client named was never checked. A target in
  authority form (``CONNECT host:port``) or asterisk form (``OPTIONS *``), or
  an absolute one of another scheme than http(s), with user information or
  with no host, is a 400 naming the problem (``malformed_request``), and so is
  a path holding an encoded slash (``%2F``); see app/api/request_target.py.
- a header field's value is given to the app without the white space after it,
  as RFC 9112 (5) has a parser drop it like that before it: httptools dropped
  only the leading, so ``Last-Event-ID: 3`` with a space after it was a 400
  saying the id has white space, and every reader of a header had to strip it.
- a body whose ``Transfer-Encoding`` names a coding before a last ``chunked``
  (``gzip, chunked``) is a 501 saying so (``malformed_request``), as RFC 9112
  (6.1) has it (without ``chunked`` last, the parser's 400 stands): the parser
  took the chunks off and handed on what they held, still gzipped, so a
  lookup's JSON was a 400 saying the body is not UTF-8.
- a refusal of a request's head (a 400, a 431), or of the body of one queued
  behind an answer, comes after the answers owed to the requests sent before
  it, and nothing after it is read: uvicorn wrote its 400 the moment the
  parser refused, ahead of those answers, and closed the connection, so they
  were never written. A refused body of the request being answered is
  answered at once: its route may be waiting on it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar, Final

import httptools
from uvicorn._types import (
    ASGI3Application,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    Scope,
)
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from app.api.declared_body import declares_body
from app.api.guards.security_headers import HEADERS
from app.api.http_counts import HttpCounts, Refusal
from app.api.limits import HttpLimits
from app.api.request_target import TargetRefused, read_target
from app.api.response_buffers import ResponseBuffers
from app.api.send_wait import SendWait

_SECURITY_HEADERS: Final = b"".join(name + b": " + value + b"\r\n" for name, value in HEADERS)
"""What the guards add to every response (app/api/guards/security_headers.py), for the refusals
written below them."""

_CONTINUE: Final = STATUS_LINE[100] + b"\r\n"
"""The interim answer uvicorn writes for a request that expects one (``Expect: 100-continue``)
once its route first reads the body."""


class _StopParsing(Exception):
    """Raised from a parser callback to stop it parsing what follows (a request refused in its
    head, or ``max_pipelined``)."""


class BoundedConnection(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds above; ``over`` binds it to an app's."""

    limits: ClassVar[HttpLimits]
    counts: ClassVar[HttpCounts]
    buffers: ClassVar[ResponseBuffers]

    @classmethod
    def over(
        cls, limits: HttpLimits, counts: HttpCounts, buffers: ResponseBuffers
    ) -> type[BoundedConnection]:
        """This protocol with an app's ``limits``, ``counts`` and ``buffers`` (uvicorn makes
        one per connection)."""
        attributes = {"limits": limits, "counts": counts, "buffers": buffers}
        return type(cls.__name__, (cls,), attributes)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._head_deadline: asyncio.TimerHandle | None = None
        self._body_deadline: asyncio.TimerHandle | None = None
        self._send_deadline: asyncio.TimerHandle | None = None
        """When the send wait's window ends, or, while the server writes below the mark with
        bytes of a wait unsent, when to look whether they drained (ending the wait)."""
        self._send_wait: SendWait | None = None
        """The wait on the client to read what is held (app/api/send_wait.py), until nothing
        is left to send (``_watch_sending``)."""
        self._ignoring = False
        """Whether the pipeline filled or a request was refused: what the client sends from
        then on is dropped."""
        self._last_words: bytes | None = None
        """What to write (a refusal, or nothing) before closing, once no answer is owed."""
        self._answering: RequestResponseCycle | None = None
        """The request being answered: uvicorn's ``cycle`` is the newest, maybe a queued one."""
        self._message_bytes = 0
        """The URL and header fields of the request being parsed, in bytes."""
        self._queued_bytes: dict[RequestResponseCycle, int] = {}
        """Each request queued behind the one being answered: its URL, header fields and body
        so far, in bytes (uvicorn holds them, parsed, until its turn)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                "connections_full",
                503,
                f"{self.limits.max_connections} connections are open, the sidecar's most",
                b"retry-after: 5\r\n",
            )
            return
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        for deadline in (self._head_deadline, self._body_deadline, self._send_deadline):
            if deadline is not None:
                deadline.cancel()
        self.buffers.resumed(self.transport)
        answering = self._answering
        if answering is not None and not answering.response_complete:
            # uvicorn marks only the newest request's cycle, a queued one while requests are
            # pipelined: the one being answered wrote on to the closed transport, which
            # uvloop refuses with an error and traceback in the log, for any client to make.
            answering.disconnected = True
            answering.message_event.set()
        super().connection_lost(exc)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._answering = cycle  # uvicorn starts one at a time, each once the last is answered
        self._queued_bytes.pop(cycle, None)
        self._watch_sending()
        super()._start_asgi_task(cycle, self._abandoning(cycle, self._continuing(cycle, app)))

    def _continuing(self, cycle: RequestResponseCycle, app: ASGI3Application) -> ASGI3Application:
        """``app``, with the ``100 Continue`` owed to ``cycle`` (its request expects one)
        written when uvicorn writes it, as its route first reads the body, but outside the
        send wait's stretches (``_write_unwaited``).

        uvicorn writes it from ``receive`` whatever the buffer holds, while the route's own
        answer waits for the buffer to drain: a route started behind an answer its client
        left unread (the buffer past the mark, the wait measured) had it taken for bytes the
        client had not read. An HTTP/1.0 request's expectation is ignored, as RFC 9110
        (10.1.1) requires: such a client knows no interim answer, which uvicorn wrote all the
        same.
        """
        if not cycle.waiting_for_100_continue:
            return app
        if cycle.scope["http_version"] == "1.0":
            cycle.waiting_for_100_continue = False
            return app

        async def answer(
            scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
        ) -> None:
            async def continued() -> ASGIReceiveEvent:
                if cycle.waiting_for_100_continue and not self.transport.is_closing():
                    cycle.waiting_for_100_continue = False  # uvicorn's receive writes it no more
                    self._write_unwaited(_CONTINUE)
                return await receive()

            await app(scope, continued, send)

        return answer

    def _abandoning(self, cycle: RequestResponseCycle, app: ASGI3Application) -> ASGI3Application:
        """``app``, and once it ends with ``cycle``'s answer begun but not finished (it raised,
        or returned early), no answer is being written: uvicorn closes the connection behind
        what was written (a close waits for it to drain), so what is unsent is waited on as
        the end of an answer written whole (``_watch_sending``)."""

        async def answer(
            scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
        ) -> None:
            try:
                await app(scope, receive, send)
            finally:
                started = cycle.response_started and not cycle.response_complete
                if started and not cycle.disconnected and cycle is self._answering:
                    self._answering = None
                    self._watch_sending()

        return answer

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._last_words is not None and not self._owes_answer():
            self._close_with(self._last_words)
        self._watch_sending()

    def _owes_answer(self) -> bool:
        """Whether a request is being answered (any queued wait behind it)."""
        return self._answering is not None and not self._answering.response_complete

    def data_received(self, data: bytes) -> None:
        if self._ignoring:
            return
        limit = self.limits.max_header_bytes
        if len(data) <= limit - self._head_bytes:  # the common case: feed it whole
            self._fed(data)
            return
        # In pieces no larger than the room left: a head stops being parsed at its limit.
        view = memoryview(data)
        while view and not (self._ignoring or self.transport.is_closing()):
            room = limit - self._head_bytes
            if room <= 0:
                detail = f"request head larger than {limit} bytes, the sidecar's limit"
                self._refuse("headers_too_large", 431, detail)
                return
            self._fed(bytes(view[:room]))
            view = view[room:]

    def _fed(self, data: bytes) -> None:
        """``data`` parsed, and counted against the head it belongs to (if any).

        Bytes between requests start the head's deadline: uvicorn stops its keep-alive
        timer on any bytes, and blank lines, which the parser skips, begin no message.
        """
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_deadline is None:
                self._arm_head_deadline()
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        """uvicorn's ``data_received``, but a parser error is refused by ``_refuse`` (a JSON
        400 naming the parser's reason, counted, not logged) rather than by uvicorn's
        plain-text 400 and a warning per request, and what follows a request that asks for
        an Upgrade is parsed on.

        The parser stops at the end of such a request (what follows would be the new
        protocol's) and says where; the server upgrades nothing (``ws="none"``), so what
        follows is the next request. uvicorn dropped it, and logged two warnings.
        """
        self._unset_keepalive_if_required()
        while data and not (self._ignoring or self.transport.is_closing()):
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade as upgrade:
                data = data[upgrade.args[0] :]
                continue
            except httptools.HttpParserError as exc:  # or a callback stopped it: _StopParsing
                self._refuse("malformed_request", 400, f"malformed HTTP request: {exc}")
            return

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._message_bytes = 0
        if self._head_deadline is None:
            self._arm_head_deadline()

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) == self.limits.max_header_fields:
            most = self.limits.max_header_fields
            detail = f"request head of more than {most} header fields, the sidecar's most"
            self._refuse("headers_too_large", 431, detail)
            raise _StopParsing
        self._held(len(name) + len(value))
        super().on_header(name, value.rstrip(b" \t"))  # RFC 9112 (5): OWS is no part of it

    def on_url(self, url: bytes) -> None:
        self._held(len(url))
        super().on_url(url)

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade() and declares_body(self.headers):
            self._refuse(
                "malformed_request",
                400,
                "a request with a body cannot ask for an Upgrade (the sidecar upgrades no "
                "connection): send it without the Upgrade header",
            )
            raise _StopParsing  # its body is no request's
        refusal = self._transfer_coding_refusal()
        if refusal is not None:
            self._refuse("malformed_request", *refusal)
            raise _StopParsing  # what its chunks hold is no request's body as sent
        try:
            target = read_target(self.url)
        except TargetRefused as refused:
            self._refuse("malformed_request", 400, str(refused))
            raise _StopParsing from None
        self.url = target.path  # uvicorn reads the path and query from it
        if target.host is not None:
            self._name_host(target.host)
        self._head_bytes = 0
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        queued = self._queuing()
        if queued and len(self.pipeline) >= self.limits.max_pipelined:
            self._stop_reading("pipeline_full")
            raise _StopParsing  # the parser stops here, mid-feed: no later request is parsed
        if queued and self._queue_passed(self._message_bytes):
            self._refuse_queue_passed()  # still in its head: no cycle of its own is queued
            raise _StopParsing
        self._in_head = False
        super().on_headers_complete()
        if queued:
            self._queued_bytes[self.cycle] = self._message_bytes
        if declares_body(self.headers):
            self._arm_body_deadline()

    def _name_host(self, host: bytes) -> None:
        """Put ``host``, an absolute-form target's, in each Host field (RFC 9112 3.2.2), so
        that the Host check (app/api/guards/allowed_hosts.py) reads the host the request
        line named; the fields stay as many as were sent (a second is refused all the same).

        In place: the request's scope holds this very list.
        """
        for index, (name, _) in enumerate(self.headers):
            if name == b"host":
                self.headers[index] = (name, host)

    def _queuing(self) -> bool:
        """Whether a request whose head ends now waits behind one being answered (``cycle``
        is the newest request's: uvicorn makes one at each head, queued or not)."""
        return self.cycle is not None and not self.cycle.response_complete

    def _queue_passed(self, more: int) -> bool:
        """Whether ``more`` bytes would take the queued requests past ``max_header_bytes``."""
        return sum(self._queued_bytes.values()) + more > self.limits.max_header_bytes

    def on_body(self, body: bytes) -> None:
        self._held(len(body))
        super().on_body(body)

    def _held(self, size: int) -> None:
        """Count ``size`` bytes more of the request being parsed: of its head while it lasts,
        then (its body, its trailer fields) of its place in the queue, if it waits in one;
        past the queue's bound, that request is refused (``_refuse_queue_passed``)."""
        if self._in_head:
            self._message_bytes += size
            return
        queued = self._queued_bytes.get(self.cycle)
        if queued is None:  # the request being answered: its body is its route's to bound
            return
        if self._queue_passed(size):
            self._refuse_queue_passed()
            raise _StopParsing
        self._queued_bytes[self.cycle] = queued + size

    def _refuse_queue_passed(self) -> None:
        """Refuse the request whose head or body would take the queue past its bound: a 503
        once the answers owed to the requests before it are written, its body so far let go,
        nothing after it read.

        It was dropped unanswered and the connection closed, which a client cannot tell
        from a server gone mid-request: a pipelined POST, which it may not send again
        unasked (RFC 9112 9.3.1), was lost without a word.
        """
        most = self.limits.max_header_bytes
        self._refuse(
            "pipeline_too_large",
            503,
            f"requests sent ahead of their answers may hold {most} bytes together, the "
            "sidecar's most: send this one again once the answers before it are read",
        )

    def _unqueued(self) -> bool:
        """Whether the request being parsed (past its head) waits in the queue; if so, it is
        taken out, never to be started, and the one before it is the newest."""
        if self.cycle not in self._queued_bytes:
            return False
        self.pipeline.popleft()  # uvicorn queues the newest on the left
        del self._queued_bytes[self.cycle]
        self.cycle = self.pipeline[0][0] if self.pipeline else self._answering
        self._stop_body_deadline()
        return True

    def _stop_reading(self, reason: Refusal) -> None:
        """Read no more: the newest request is the last answered, then the connection closes
        (uvicorn closes it after a response that is not kept alive)."""
        self.counts.refuse(reason)
        self._ignoring = True
        self.cycle.keep_alive = False
        self.flow.pause_reading()

    def on_message_complete(self) -> None:
        self._stop_body_deadline()
        super().on_message_complete()
        self._in_head = True

    def _stop_body_deadline(self) -> None:
        if self._body_deadline is not None:
            self._body_deadline.cancel()
            self._body_deadline = None

    def pause_writing(self) -> None:
        super().pause_writing()
        self.buffers.paused(self.transport)
        self._watch_sending()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.buffers.resumed(self.transport)
        self._watch_sending()

    def _watch_sending(self) -> None:
        """Measure the send wait where only the client's reading can shrink the buffer: while
        it is full (uvicorn writes no more until it drains), or while no answer is being
        written and some of the last is unsent. An answer being written below the mark adds
        to the buffer as the client reads it, so there the wait is not measured (it is again
        at the mark or at the answer's end) but looked at (``_look_at_wait``).

        The wait ends, and the next one has its grace, once nothing is left to send: the
        buffer found empty at an answer's end, at a window's, or at a look. A drain below the
        low-water mark that empties it mid-answer does not: the kernel took the rest into its
        own buffers, read or not, and uvicorn writes on at once (a client reading 100 KiB/s
        emptied it so every time).
        """
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None
        size = self.transport.get_write_buffer_size()
        now = self.loop.time()
        wait = self._send_wait
        if wait is not None:
            wait.pause(now, size)
        answering = self._answering
        idle = answering is None or answering.response_complete
        timeout = self.limits.send_timeout_s
        if size and (self.flow.write_paused or idle):
            if wait is None:
                wait = self._send_wait = SendWait(timeout, self.limits.min_send_bytes_per_s)
            left = wait.measure(now, size)
            self._send_deadline = self.loop.call_later(left, self._send_late, wait)
        elif idle:
            self._send_wait = None
        elif wait is not None:
            self._send_deadline = self.loop.call_later(timeout, self._look_at_wait)

    def _look_at_wait(self) -> None:
        """End the send wait if its buffer is empty ``send_timeout_s`` into an answer being
        written below the mark (an event stream with nothing to send: the next wait has its
        grace), else look again as long."""
        self._send_deadline = None
        if self.transport.get_write_buffer_size():
            timeout = self.limits.send_timeout_s
            self._send_deadline = self.loop.call_later(timeout, self._look_at_wait)
        else:
            self._send_wait = None

    def _arm_head_deadline(self) -> None:
        self._head_deadline = self.loop.call_later(self.limits.header_timeout_s, self._head_late)

    def _head_late(self) -> None:
        """Close the connection of a head not whole in time, once the answers owed to the
        requests before it are written (a blank line or a head begun behind an event stream
        cut the stream); one refused, or never to be read since the pipeline filled, waits
        for them already."""
        self._head_deadline = None
        if not (self._ignoring or self.transport.is_closing()):
            self.counts.refuse("headers_timeout")
            self._close_after_answers(b"")

    def _arm_body_deadline(self) -> None:
        self._body_deadline = self.loop.call_later(self.limits.header_timeout_s, self._body_late)

    def _body_late(self) -> None:
        """Cut the connection of a body not whole in time, unless the server is not reading
        it (uvicorn pauses reading behind an answer, and while a route leaves 64 KiB of its
        body unread): then the client is given the time again.

        Cut, not closed: a close waits for the buffer to drain, and behind an answer its
        client never read, with the route waiting on the body (no answer's end to start
        the send deadline), that was for ever."""
        self._body_deadline = None
        if self.flow.read_paused:
            self._arm_body_deadline()
        elif not (self._ignoring or self.transport.is_closing()):
            self.counts.refuse("body_timeout")
            self.transport.abort()

    def _send_late(self, wait: SendWait) -> None:
        """End ``wait``'s window: cut the response of a client that read too little
        (``SendWait.window_end``), unless it read all that waited."""
        self._send_deadline = None
        size = self.transport.get_write_buffer_size()
        if not size:
            self._send_wait = None
            return
        refusal = wait.window_end(self.loop.time(), size)
        if refusal is None:
            timeout = self.limits.send_timeout_s
            self._send_deadline = self.loop.call_later(timeout, self._send_late, wait)
            return
        self.counts.refuse(refusal)
        self.transport.abort()  # close() would wait for the buffer to drain: for ever

    def _transfer_coding_refusal(self) -> tuple[int, str] | None:
        """The status and words for a Transfer-Encoding that names codings before a last
        ``chunked``, or None: chunked given twice is a 400 (RFC 9112 6.1 forbids it), another
        coding a 501 (the parser takes only the chunks off). Without ``chunked`` last the
        body's length cannot be known, which the parser refuses itself with the 400 RFC 9112
        (6.3) asks."""
        codings = [
            coding.strip()
            for name, value in self.headers
            if name == b"transfer-encoding"
            for coding in value.lower().split(b",")
            if coding.strip()
        ]
        if len(codings) < 2 or codings[-1] != b"chunked":
            return None
        if b"chunked" in codings[:-1]:
            return 400, "the request's body is chunked twice, which HTTP/1.1 forbids"
        return (
            501,
            "the request's body has a transfer coding besides chunked, which the sidecar "
            "does not decode: send it chunked alone, or with a Content-Length",
        )

    def _refuse(self, reason: Refusal, status: int, detail: str, headers: bytes = b"") -> None:
        """Answer ``status`` with ``{"detail": detail}`` and close, as the guards answer, with
        the headers they add to every response; nothing more is read.

        Answers go in the order of their requests (RFC 9112 9.3.2): while requests sent
        before this one are owed theirs, a refused head waits for them (uvicorn's 400 was
        written at once, ahead of them, and the connection closed: they were never
        answered), and so does a refused body of a request queued behind them, taken out
        of the queue (its 400 too was written at once, ahead of them). The body of the
        request being answered (a malformed chunk, a trailer too many) is refused at once:
        its route may be waiting on it, and would wait for ever. Once: a connection already
        closing, or reading no more, was answered.
        """
        if self._ignoring or self.transport.is_closing():
            return
        self.counts.refuse(reason)
        body = json.dumps({"detail": detail}).encode()
        defaults = self.server_state.default_headers  # date and server, as uvicorn sends
        head = b"".join(name + b": " + value + b"\r\n" for name, value in defaults)
        refusal = (
            STATUS_LINE[status]
            + head
            + b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
            + b"connection: close\r\n"
            + _SECURITY_HEADERS
            + headers
            + b"\r\n"
            + body
        )
        if self._in_head or self._unqueued():
            self._close_after_answers(refusal)
        else:
            self._close_with(refusal)

    def _close_after_answers(self, last_words: bytes) -> None:
        """Read no more, and once no answer is owed, write ``last_words`` and close."""
        self._ignoring = True
        self._last_words = last_words
        if self._owes_answer():
            self.flow.pause_reading()
        else:
            self._close_with(last_words)

    def _close_with(self, last_words: bytes) -> None:
        """Write ``last_words`` and close, unless the last answer closed the connection.

        They are the server's bytes, not the client's to have read (``_write_unwaited``).
        """
        if not self.transport.is_closing():
            self._write_unwaited(last_words)
            self.transport.close()

    def _write_unwaited(self, data: bytes) -> None:
        """Write ``data``, the server's own bytes (a refusal, a ``100 Continue``), outside the
        send wait's stretches: the stretch being measured ends before they are written and the
        next begins after (``_watch_sending``). Written into a stretch, they were taken for
        bytes the client left unread, held against its window and its rate."""
        if self._send_wait is not None:
            self._send_wait.pause(self.loop.time(), self.transport.get_write_buffer_size())
        self.transport.write(data)
        self._watch_sending()
