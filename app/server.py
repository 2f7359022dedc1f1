"""Running the sidecar: the ingest thread plus uvicorn, started and stopped together.

``run_server`` serves in the foreground (the ``serve`` command, the container);
``Sidecar`` serves from a background thread, for tests and the in-process
demo, which need the bound address (port 0 picks a free one) and a clean stop.
Both build the same parts the same way, and both close the ingestor (its
thread and ZMQ sockets) when serving ends, whatever ends it.
"""

from __future__ import annotations

import threading
import time

import uvicorn

from app.api import create_app
from app.ingest import Ingestor
from app.settings import SidecarSettings
from app.state.sidecar import SidecarState
from offload.base import Closeable

SHUTDOWN_GRACE_S = 3.0
"""How long a stop waits for open requests; event streams never end on their own."""

START_TIMEOUT_S = 30.0


def build_server(
    settings: SidecarSettings, log_level: str = "info"
) -> tuple[uvicorn.Server, Ingestor]:
    """The uvicorn server over the API, and the (not yet started) ingestor that feeds it."""
    state = SidecarState.from_settings(settings)
    ingestor = Ingestor(state)
    config = uvicorn.Config(
        create_app(settings, state),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    return uvicorn.Server(config), ingestor


def run_server(settings: SidecarSettings) -> None:
    """Ingest and serve until interrupted (uvicorn handles SIGINT and SIGTERM)."""
    server, ingestor = build_server(settings)
    ingestor.start()
    try:
        server.run()
    finally:
        ingestor.close()


class Sidecar(Closeable):
    """A sidecar serving from a background thread while the ``with`` block runs.

    ``url`` is the bound base URL (``http://127.0.0.1:PORT``), known once entered.
    """

    def __init__(self, settings: SidecarSettings, log_level: str = "warning") -> None:
        self.settings = settings
        self._log_level = log_level
        self._server: uvicorn.Server | None = None
        self._ingestor: Ingestor | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def __enter__(self) -> Sidecar:
        self._server, self._ingestor = build_server(self.settings, self._log_level)
        self._ingestor.start()
        self._thread = threading.Thread(target=self._server.run, name="kvscope-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(
                    f"the sidecar did not start serving on {self.settings.host}:"
                    f"{self.settings.port} (see uvicorn's log above)"
                )
            time.sleep(0.01)
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        return self

    def close(self) -> None:
        """Stop serving, then ingesting; idempotent."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join()
        if self._ingestor is not None:
            self._ingestor.close()
