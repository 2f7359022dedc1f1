"""The ``kvscope`` console script's entry point: Ctrl-C while the command is still starting.

The script pip writes imports its entry point before anything of kvscope's runs, and
``app.cli`` brings the whole sidecar (pydantic, FastAPI, uvicorn, ZMQ): about half a
second in which Ctrl-C printed Python's KeyboardInterrupt traceback. Here it stops the
import instead, and the command exits 130 with nothing more, as it does once running.
"""

from __future__ import annotations

import signal

from app.stop_signals import stop_once


def main() -> int:
    """Import the command line with Ctrl-C as one quiet stop, then run it under the SIGINT
    handler the process started with (its commands install their own, or rely on Python's)."""
    started_with = signal.getsignal(signal.SIGINT)
    stop_once(frozenset({signal.SIGINT}))  # one KeyboardInterrupt however many come
    # (timeout -s INT sends two)
    try:
        from app.cli import main as command
    except KeyboardInterrupt:
        return 130
    signal.signal(signal.SIGINT, started_with)
    return command()
