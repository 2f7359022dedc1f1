"""A connection's wait on its client to read what the server has written: the send deadline's rule.

The server waits on a client while bytes of its response are held that only
its reading can send: the write buffer is full past the high-water mark
(uvicorn writes no more until it drains), or holds the unsent end of an answer
written whole. Between such stretches the server may add to the buffer as the
client reads it (an answer written in pieces, below the mark), and what the
client read then cannot be told from what was added: those times are left out.
A refusal the connection writes behind an answer (a 400 for a request
pipelined after it), or a ``100 Continue`` for the request answered next,
ends the stretch before it is written, and the next begins after: its bytes
are the server's, not ones the client left unread.

``SendWait`` follows one wait, from its first stretch until nothing is left
to send (the connection tells, app/api/http_connection.py), in windows of
``window_s`` seconds of waited time. A client that read nothing in a window is
cut (``send_timeout``). The first window is its grace: one busy with what it
read before has had no time to show a rate, and in that window the kernel
still takes bytes into its buffers whether the client reads or not. From the
end of the grace on, the client must have read ``min_bytes_per_s`` over all
the time waited since, judged at each window's end (``send_too_slow``).

The windows used to start over, grace and all, at each drain below the
low-water mark: an answer written in pieces near the mark, to a client that
drained the 48 KiB between the marks once a window, asked for about 1.6 KiB/s
whatever the rate.
"""

from __future__ import annotations

from app.api.http_counts import Refusal


class SendWait:
    """One wait, measured from its first stretch; once nothing is left to send the connection
    drops it (the next has a grace of its own). Times are the event loop's clock, sizes the
    write buffer's."""

    def __init__(self, window_s: float, min_bytes_per_s: int) -> None:
        self._window_s = window_s
        self._min_bytes_per_s = min_bytes_per_s
        self._since: float | None = None
        """When the stretch being measured began; None between stretches."""
        self._size = 0
        """The buffer's size when that stretch began."""
        self._window_left_s = window_s
        self._window_read = 0
        self._graced = False
        """Whether the first window (the grace) is over."""
        self._read = 0
        self._waited_s = 0.0
        """Bytes read, and seconds waited, from the end of the grace to the window's start."""

    def measure(self, now: float, size: int) -> float:
        """Begin a stretch at ``now``, the buffer holding ``size`` bytes; the seconds of it
        left in the window, when ``window_end`` is due."""
        self.pause(now, size)
        self._since, self._size = now, size
        return self._window_left_s

    def pause(self, now: float, size: int) -> None:
        """End the stretch being measured (if one is), the buffer holding ``size`` bytes: what
        the client read in it, and the time, count toward the window."""
        if self._since is not None:
            self._window_left_s -= now - self._since
            self._window_read += self._size - size
            self._since = None

    def window_end(self, now: float, size: int) -> Refusal | None:
        """Judge the window ending ``now`` (the buffer holding ``size`` bytes, some): why the
        client is cut, or None and the next window begins."""
        self.pause(now, size)
        read, waited_s = self._window_read, self._window_s - self._window_left_s
        self._window_read, self._window_left_s = 0, self._window_s
        if read <= 0:
            return "send_timeout"
        if self._graced:
            self._read += read
            self._waited_s += waited_s
            if self._read < self._min_bytes_per_s * self._waited_s:
                return "send_too_slow"
        self._graced = True
        self.measure(now, size)
        return None
