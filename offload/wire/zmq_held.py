"""What ZMQ still holds of the payloads a publisher handed it, in bytes.

ZMQ's high-water marks count messages, whatever their size, so they bound
nothing in bytes: a subscriber that stopped reading let a worker's PUB queue
grow, and every replay answer was a copy of the replay buffer queued for its
peer. The publisher therefore hands payloads to ZMQ without copying them
(``copy=False``), so queues share the buffer's bytes, and asks ZMQ to say
when it is done with each (``track=True``). ``ZmqHeld`` adds those up: every
payload counted once however many messages share it, and released once ZMQ
has written out (or dropped) every message that holds it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

import zmq

PayloadKey = Hashable
"""What identifies one payload: messages that share a payload share its key."""


class ZmqHeld:
    """Payload bytes ZMQ holds, each distinct payload once. One thread uses an instance.

    An entry is what one tracker covers (one message, or a whole answer whose
    last message's tracker is given: a peer's messages go out in order). With
    ``ordered`` entries are released oldest first only (a PUB socket's
    messages leave in order, so checking the oldest is enough); without it
    every entry is checked (replay answers to different peers leave in any order).
    """

    def __init__(self, *, ordered: bool = False) -> None:
        self.bytes = 0
        self._ordered = ordered
        self._refs: dict[PayloadKey, list[int]] = {}  # key -> [size, entries holding it]
        self._entries: deque[tuple[int, zmq.MessageTracker, list[PayloadKey]]] = deque()
        self._live: set[int] = set()
        self._next_entry = 0

    def add(self, tracker: zmq.MessageTracker, payloads: Sequence[tuple[PayloadKey, int]]) -> int:
        """Count the payloads (key, size) as held until ``tracker`` is done; the entry's id."""
        for key, size in payloads:
            ref = self._refs.get(key)
            if ref is None:
                self._refs[key] = [size, 1]
                self.bytes += size
            else:
                ref[1] += 1
        self._next_entry += 1
        self._entries.append((self._next_entry, tracker, [key for key, _ in payloads]))
        self._live.add(self._next_entry)
        return self._next_entry

    def cost(self, key: PayloadKey, size: int) -> int:
        """The bytes holding one more message of this payload would add: 0 if already held."""
        return 0 if key in self._refs else size

    def holds(self, entry: int | None) -> bool:
        """Whether ZMQ still holds that entry (as of the last ``release_done``)."""
        return entry in self._live

    def has_room(self, size: int, limit: int) -> bool:
        """Whether ``size`` more bytes stay within ``limit`` (always, when nothing is held:
        a payload larger than the limit goes alone rather than never)."""
        self.release_done()
        return self.bytes == 0 or self.bytes + size <= limit

    def release_done(self) -> None:
        """Forget the entries ZMQ is done with, and the payloads no entry holds any more."""
        entries = self._entries
        if self._ordered:
            while entries and entries[0][1].done:
                self._release(*entries.popleft())
            return
        for entry in [entry for entry in entries if entry[1].done]:
            entries.remove(entry)
            self._release(*entry)

    def _release(self, entry_id: int, _tracker: zmq.MessageTracker, keys: list[PayloadKey]) -> None:
        self._live.discard(entry_id)
        for key in keys:
            ref = self._refs[key]
            ref[1] -= 1
            if not ref[1]:
                del self._refs[key]
                self.bytes -= ref[0]
