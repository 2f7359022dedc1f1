"""Running the sidecar: the ingest thread plus uvicorn, started and stopped together.

``run_server`` serves in the foreground (the ``serve`` command, the container);
``Sidecar`` serves from a background thread, for tests and the in-process
demo, which need the bound address (port 0 picks a free one) and a clean stop.
Both build the same parts the same way, and both close the ingestor (its
thread and ZMQ sockets) when serving ends, whatever ends it. ``HttpServer``
is the background-thread server alone, for any app (tests build apps over a
state they feed themselves).
"""

from __future__ import annotations

import gc
import logging
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI

from app.api import create_app
from app.api.access_log import redact_access_log
from app.api.http_connection import BoundedConnection
from app.http_socket import base_url, bind_http, local_url, remove_url_file, write_url_file
from app.ingest import Ingestor
from app.settings import SidecarSettings
from app.state.sidecar import SidecarState
from offload.base import Closeable

ANNOUNCER = logging.getLogger("uvicorn.error")
"""uvicorn's own logger, so the line reads as uvicorn's announcement does, wherever it is sent."""

SHUTDOWN_GRACE_S = 3.0
"""How long a stop waits for open requests once the event streams are told to end."""

START_TIMEOUT_S = 30.0

GIL_SWITCH_S = 0.001
"""How long one thread may keep the interpreter while another waits for it (CPython's
default is 5 ms). While events flow the ingest thread always wants it, so each time the
event loop needed it back, to read a request or to answer one, it could wait the whole
interval: a millisecond of work became several. Hand-overs cost microseconds, and the
ingest thread pays for them only while requests are being served."""


class _Server(uvicorn.Server):
    """uvicorn on sockets bound when it is built, ending the app's event streams as it starts
    to shut down.

    Bound when built, so that a taken port or an unknown host is a ``SettingError`` raised
    where the server is made (app/http_socket.py), not a log line from uvicorn's thread.
    Streams never end on their own: without the ending each would be cancelled after the
    grace period, and uvicorn logs a traceback per cancelled request.
    """

    def __init__(self, config: uvicorn.Config, url_file: Path | None) -> None:
        super().__init__(config)
        self.bound = bind_http(config.host, config.port)
        self.url_file = url_file
        self.interrupted = False
        """Whether a SIGINT stopped it: uvicorn raises the signal again once shut down, but
        asyncio's own handler, back in place by then, swallows it when the server's task
        has already ended, and Ctrl-C then exited 0 now and then instead of 130."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.interrupted = self.interrupted or sig == signal.SIGINT
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=self.bound)
        # uvicorn announces only the sockets it binds itself; tools read the line (bench/).
        url = base_url(self.config.host, self.bound[0].getsockname()[1])
        ANNOUNCER.info("Uvicorn running on %s (Press CTRL+C to quit)", url)
        if self.url_file is not None:
            write_url_file(self.url_file, self.bound[0])

    async def shutdown(self, sockets: list | None = None) -> None:
        if self.url_file is not None:
            remove_url_file(self.url_file, self.bound[0])
        app = self.config.app
        if isinstance(app, FastAPI):
            app.state.streams.end_all()
        await super().shutdown(sockets)
        if self.force_exit and not self.lifespan.shutdown_event.is_set():
            # A second Ctrl-C makes uvicorn skip the app's shutdown, lest an app's hang; ours
            # cannot (app/api: it ends the streams). Skipped, the lifespan task was left
            # waiting, cancelled as the event loop closed, and logged as a traceback.
            await self.lifespan.shutdown()


def http_server(
    app: FastAPI, host: str, port: int, log_level: str = "info", url_file: Path | None = None
) -> _Server:
    """uvicorn over ``app`` (from ``create_app``), each connection bounded by the app's limits
    (app/api/http_connection.py), with the access log's targets redacted (app/api/access_log.py);
    once listening it writes its URL to ``url_file``, when given (app/http_socket.py)."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=BoundedConnection.over(app.state.limits, app.state.counts, app.state.response_buffers),
        ws="none",  # no route is a WebSocket: an Upgrade header is a plain request's
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        # The client's address is the socket's: forwarded headers would let any local client
        # write the access log's address field, unredacted and uncut.
        proxy_headers=False,
    )
    redact_access_log()  # after uvicorn.Config, which configures logging
    return _Server(config, url_file)


def build_server(settings: SidecarSettings, log_level: str = "info") -> tuple[_Server, Ingestor]:
    """The uvicorn server over the API, and the (not yet started) ingestor that feeds it;
    sets the interpreter's switch interval for the process (``GIL_SWITCH_S``)."""
    sys.setswitchinterval(GIL_SWITCH_S)
    state = SidecarState.from_settings(settings)
    ingestor = Ingestor(state)
    try:
        app = create_app(settings, state)
        server = http_server(app, settings.host, settings.port, log_level, settings.url_file)
    except BaseException:
        ingestor.close()
        raise
    return server, ingestor


def run_server(settings: SidecarSettings) -> None:
    """Ingest and serve until Ctrl-C (then KeyboardInterrupt) or SIGTERM (then a return, the
    ingestor closed either way)."""
    server, ingestor = build_server(settings)
    # SIGTERM stops the server from here on, before, while and after it serves. uvicorn
    # handles it while serving, then puts back the handler it found and raises the signal
    # again: with the default action that killed the process there, before the ingestor
    # was closed and before anything at exit ran (the OpenTelemetry SDK's export of the
    # spans it holds). Calling this handler again is harmless.
    signal.signal(signal.SIGTERM, server.handle_exit)
    # What exists now (the modules, classes and routes of every library: most of the heap)
    # lives as long as the process, so full collections need not walk it again; they pause
    # every request and ingest for tens of milliseconds when they do.
    gc.collect()
    gc.freeze()
    ingestor.start()
    try:
        server.run()
    finally:
        ingestor.close()
    if server.interrupted:
        raise KeyboardInterrupt  # whether or not uvicorn's own raise of it got through


class HttpServer(Closeable):
    """A uvicorn server running from a background thread while the ``with`` block runs.

    ``url`` is the base URL this machine reaches it at (``http://127.0.0.1:PORT``, also when it
    binds every address), known once entered.
    """

    def __init__(self, server: uvicorn.Server) -> None:
        self.server = server
        self._thread: threading.Thread | None = None
        self.url = ""

    def __enter__(self) -> HttpServer:
        self._thread = threading.Thread(target=self.server.run, name="kvscope-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                config = self.server.config
                raise RuntimeError(
                    f"the sidecar did not start serving on {config.host}:{config.port} "
                    "(see uvicorn's log above)"
                )
            time.sleep(0.01)
        self.url = local_url(self.server.servers[0].sockets[0])
        return self

    def close(self) -> None:
        """Stop serving; idempotent."""
        if self._thread is not None:
            self.server.should_exit = True
            self._thread.join()


class Sidecar(Closeable):
    """A sidecar (ingest and HTTP) serving from a background thread while the ``with`` block runs.

    ``url`` is the bound base URL (``http://127.0.0.1:PORT``), known once entered.
    """

    def __init__(self, settings: SidecarSettings, log_level: str = "warning") -> None:
        self.settings = settings
        self._log_level = log_level
        self._http: HttpServer | None = None
        self._ingestor: Ingestor | None = None
        self.url = ""

    def __enter__(self) -> Sidecar:
        server, self._ingestor = build_server(self.settings, self._log_level)
        self._ingestor.start()
        self._http = HttpServer(server)
        try:
            self.url = self._http.__enter__().url
        except BaseException:
            self._ingestor.close()
            raise
        return self

    def close(self) -> None:
        """Stop serving, then ingesting; idempotent."""
        if self._http is not None:
            self._http.close()
        if self._ingestor is not None:
            self._ingestor.close()
