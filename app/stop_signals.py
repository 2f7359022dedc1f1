"""Ctrl-C and SIGTERM as the end of a wait on the main thread, with nothing done in a handler.

A Python signal handler runs on the main thread between two bytecodes, inside another
handler too. One that takes a lock (setting a ``threading.Event`` does) deadlocks when a
second signal comes while the first handler holds it: ``timeout`` sends SIGTERM to the
command and then to its process group, microseconds apart, and ``kvscope demo`` then hung
for ever. So the handlers here do nothing: the interpreter writes each signal's number to
a wakeup pipe before it runs them, and the main thread waits on that pipe.

The handlers are installed, not left to KeyboardInterrupt: a process started in the
background of a shell (or by some supervisors) inherits SIGINT ignored, and Python then
never raises it.

``stop_once`` is for work the main thread does itself, which only an exception stops:
Ctrl-C raises one KeyboardInterrupt, SIGTERM one ``Terminated``, and the handler ignores
every stop signal after the first.
"""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Final

STOP_SIGNALS: Final = frozenset((signal.SIGINT, signal.SIGTERM))
_WAKE: Final = b"\0"
"""What ``wake`` writes to the pipe: no signal's number (the interpreter writes those)."""


def _noted(signum: int, frame: object) -> None:
    """The handler: the signal is already in the wakeup pipe, and a handler that did anything
    more could be re-entered mid-way by the next one."""


class StopSignals:
    """Ctrl-C and SIGTERM, caught from now on for the rest of the process, and waited for.

    Made on the main thread (``signal.set_wakeup_fd`` refuses any other); the pipe is kept
    as long as the process, since a signal may come at any time up to its exit.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        for signum in STOP_SIGNALS:
            signal.signal(signum, _noted)

    def wake(self) -> None:
        """End the wait now, from any thread, as if its time had passed: a thread the main
        one waits beside (``demo``'s worker) says so when it stops early."""
        with suppress(BlockingIOError):  # the pipe is full: the wait has plenty to read
            os.write(self._write, _WAKE)

    def wait(self, timeout: float | None = None) -> frozenset[signal.Signals]:
        """Block until Ctrl-C or SIGTERM comes, ``wake`` is called or ``timeout`` seconds pass
        (None: no limit); the stop signals that came (every one waiting is read), none if
        they did not. Other signals with a Python handler also reach the pipe and are
        passed over."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self._read], [], [], left)
            if not readable:
                return frozenset()
            numbers = os.read(self._read, 512)
            stops = frozenset(signal.Signals(n) for n in numbers if n in STOP_SIGNALS)
            if stops or _WAKE[0] in numbers:
                return stops


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt: not an
    ``Exception``, so that no ``except Exception`` takes a stop for a failure."""


_RAISED: Final = {signal.SIGINT: KeyboardInterrupt, signal.SIGTERM: Terminated}


def _stop_once(signum: int, frame: object) -> None:
    """The handler: ignore every later stop signal, then raise this one's exception
    (re-entered before the first line, the inner call's raise is the one that propagates:
    still one)."""
    for stop in STOP_SIGNALS:
        signal.signal(stop, signal.SIG_IGN)
    raise _RAISED[signal.Signals(signum)]


def stop_once(signums: frozenset[signal.Signals] = STOP_SIGNALS) -> None:
    """From now on the first of ``signums`` to come raises one exception in the main thread
    (KeyboardInterrupt for Ctrl-C, ``Terminated`` for SIGTERM), and Ctrl-C and SIGTERM are
    ignored after it, however many come.

    For work the main thread does itself (``replay``), which only an exception can stop.
    With Python's own handler, a second SIGINT microseconds after the first (``timeout -s
    INT`` signals the command and its group) raised again in the middle of the first's
    unwinding or at exit: a traceback, or death by the signal, 1 run in 2; and SIGTERM's
    default action ended the process where it was, nothing at exit run. A signal the
    process was started ignoring stays ignored, as Python leaves it.
    """
    for signum in signums:
        if signal.getsignal(signum) in (signal.default_int_handler, signal.SIG_DFL):
            signal.signal(signum, _stop_once)


def quiet_start(command: Callable[[], int]) -> int:
    """Run ``command``, which imports what it runs, with Ctrl-C as one quiet stop (exit 130)
    until a command takes the signal over: ``serve``'s uvicorn and ``demo``'s StopSignals
    install their own handlers, and ``replay`` adds SIGTERM to this one.

    The sidecar's modules take about half a second to import, and the arguments a few
    milliseconds to parse: Python's handler printed a KeyboardInterrupt traceback there.
    One KeyboardInterrupt however many Ctrl-Cs come (``timeout -s INT`` sends two).
    """
    stop_once(frozenset({signal.SIGINT}))
    try:
        return command()
    except KeyboardInterrupt:
        return 130
