"""The ``kvscope`` console script's entry point: Ctrl-C before a command takes it over.

The script pip writes imports its entry point before anything of kvscope's runs, and
``app.cli`` brings the whole sidecar (pydantic, FastAPI, uvicorn, ZMQ): about half a
second in which Ctrl-C printed Python's KeyboardInterrupt traceback, and so it did in the
few milliseconds the arguments are then parsed. Here Ctrl-C stops either quietly, and the
command exits 130 with nothing more, as it does once running. ``python -m app.cli`` comes
here too (the top of app/cli.py).
"""

from __future__ import annotations

import signal

from app.stop_signals import stop_once


def main() -> int:
    """Import and run the command line with Ctrl-C as one quiet stop (one KeyboardInterrupt
    however many come: ``timeout -s INT`` sends two) until a command takes the signal over:
    ``serve``'s uvicorn and ``demo``'s StopSignals install their own handlers, and ``replay``
    adds SIGTERM to this one."""
    stop_once(frozenset({signal.SIGINT}))
    try:
        from app.cli import main as command

        return command()
    except KeyboardInterrupt:
        return 130
