"""The ``kvscope`` console script's entry point: the command line imported and run with
Ctrl-C a quiet stop from the start (``stop_signals.quiet_start``).

The script pip writes imports its entry point before anything of kvscope's runs, so this
module imports nothing heavy: ``app.cli`` brings the whole sidecar (pydantic, FastAPI,
uvicorn, ZMQ), and is imported only inside ``quiet_start``.
"""

from __future__ import annotations

from app.stop_signals import quiet_start


def main() -> int:
    """Run the ``kvscope`` command; its exit status."""
    return quiet_start(_command)


def _command() -> int:
    from app.cli import main as command

    return command()
