"""The block index's locations: (publisher, medium, KV cache group) -> a bit of every mask.

A location gets a bit number the first time an event names it, within shares: of each
publisher (``MEDIA_PER_PUBLISHER`` media, ``MAX_GROUPS`` groups on each), of each listen
host (``media_per_host``, ``locations_per_host``) and of the index (``max_media``, one place
held for the GPU, ``MAX_LOCATIONS``). The network names locations, so none of those may
take them all; a location that holds no block keeps its bit until a new one finds no
place, then it is released and its bit reused, the lowest first. The index
(app/state/block_index.py) keeps the blocks; this keeps what each bit stands for, the
blocks held there, and who may have one more. How the shares were chosen:
docs/ARCHITECTURE.md ("The block index").
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Final, Literal

from app.decode import DEFAULT_MEDIUM

MAX_GROUPS: Final = 16
"""Most KV cache groups tracked per publisher and medium: each is a location bit of its
own, and the network names them (vLLM's hybrid models have a handful)."""
MEDIA_PER_PUBLISHER: Final = 4
"""Most media one publisher names at once: a vLLM engine stores on its GPU and a CPU tier,
perhaps a disk tier, and one more (a remote store) is spare. Media and locations are shared
by every publisher, so one publisher alone names at most 4 of the 16 media (the default
``max_media``) and 64 of the ``MAX_LOCATIONS`` (4 media of ``MAX_GROUPS`` groups): naming
them first, one took every place, and the engines met after it had none."""
MAX_LOCATIONS: Final = 1024
"""Most locations (publisher, medium, group) in all: every held block's mask is as wide as
the highest bit, so its memory and the walks over it grow with them (64 publishers on
16 media, the worst case before groups). A publisher names at most 64 of them
(``MEDIA_PER_PUBLISHER``), so 16 publishers holding a block in every one fill them."""
MediaRefusal = Literal["publisher", "host", "max_media"]
MEDIA_REFUSALS: Final[tuple[MediaRefusal, ...]] = ("publisher", "host", "max_media")
"""Why an event naming a new medium was refused: its publisher names ``MEDIA_PER_PUBLISHER``
media already, or its host's publishers ``media_per_host``, or the index tracks ``max_media``
(one of them held for the GPU until it is named); the reason labels the refusal's count."""
LOCATIONS_PER_HOST: Final = MAX_LOCATIONS // 4
"""The default of ``Locations.locations_per_host``: room for 16 engine ranks of a hybrid
model of 8 KV cache groups on the GPU and the CPU, and for three more hosts' as many."""
_LOCATIONS: Final = "locations"
"""Why a new location has no place, when it is not a medium's: ``MAX_GROUPS``,
``locations_per_host`` or ``MAX_LOCATIONS`` (``Locations.number``)."""
_Refusal = MediaRefusal | Literal["locations"]


class Locations:
    """Every location's bit number, blocks held and largest block size, shared out by caps.

    The index's one writer changes it: the counts of blocks held as its per-block loops
    end, the rest through these methods.
    """

    def __init__(
        self,
        max_media: int,
        media_per_host: int,
        locations_per_host: int,
        forget: Callable[[int], None],
    ) -> None:
        """``forget`` is called with each bit number released, for the index to drop what it
        keeps per location (its extra copies, its stranded count)."""
        if max_media < 1:
            raise ValueError(f"max_media must be at least 1, got {max_media}")
        if media_per_host < 1:
            raise ValueError(f"media_per_host must be at least 1, got {media_per_host}")
        if not 1 <= locations_per_host <= MAX_LOCATIONS:
            raise ValueError(
                f"locations_per_host must be from 1 to {MAX_LOCATIONS}, got {locations_per_host}"
            )
        self.max_media = max_media
        """Most distinct media tracked: each is a bit of every block's location mask per
        publisher and a key of every answer, so a peer naming thousands would slow them all."""
        self.media_per_host = media_per_host
        """Most distinct media the publishers of one host (``BlockIndex.set_host``) name together: a
        listen socket's peer opens streams at will, each a publisher, and four of them named
        all 16 media, so that every other engine's, its GPU's included, were refused."""
        self.locations_per_host = locations_per_host
        """Most locations the publishers of one host hold together: within its media a
        listen socket's peer opening stream after stream held every location, and an
        honest engine's GPU stores were refused."""
        self._forget = forget
        self.refused_media: dict[MediaRefusal, int] = dict.fromkeys(MEDIA_REFUSALS, 0)
        """Events refused for naming a new medium, by why (``MEDIA_REFUSALS``); under
        ``max_media`` too, the media past it that a stats frame gave block sizes for."""
        self.refused_location_events = 0
        """Events refused because they named a KV cache group past ``MAX_GROUPS`` for their
        publisher and medium, or a location past their host's ``locations_per_host`` or
        ``MAX_LOCATIONS``."""
        self._media: dict[str, int] = {}  # medium -> the locations on it
        self._hosts: dict[str, str] = {}
        """Publisher -> the host its share is (``BlockIndex.set_host``)."""
        self.host_media: dict[str, dict[str, int]] = {}
        """Host -> medium -> the locations of its publishers there: the media it names."""
        self.pair_bits: dict[str, dict[str, int]] = {}
        """Publisher -> medium -> the bits of its groups, to tell a pair's first copy."""
        self._numbers: dict[tuple[str, str, int | None], int] = {}
        self.names: dict[int, tuple[str, str, int | None]] = {}
        """Bit number -> (publisher, medium, group), in order of first sight."""
        self.counts: list[int] = []
        """Bit number -> blocks held there (copies beyond the first included)."""
        self.empty: dict[str, set[int]] = {}
        """Publisher -> the bit numbers of its locations that hold no block (their count is
        0), for publishers that have some: released once a new location has no place
        (``_has_room``)."""
        self._free: list[int] = []  # released bit numbers, a heap: the lowest is reused first
        self.sizes: list[int] = []
        """Bit number -> the largest block size it stored (0 before any), its group's (a
        partial block's store names a smaller one): a coarse block covers fine positions
        only on the locations of its coarse group (``BlockIndex._cover``)."""
        self.lower_tier_bits = 0
        """The bits of every location whose medium is not the GPU."""

    def number(self, publisher: str, medium: str, group: int | None) -> int | None:
        """The bit number of a (publisher, medium, group), allocated on first sight.

        None for a medium past the publisher's ``MEDIA_PER_PUBLISHER``, its host's
        ``media_per_host`` or ``max_media`` (the event counted in ``refused_media``), or a
        group past ``MAX_GROUPS`` or a location past its host's ``locations_per_host`` or
        ``MAX_LOCATIONS`` (counted in ``refused_location_events``): see ``_has_room``.
        """
        key = (publisher, medium, group)
        number = self._numbers.get(key)
        if number is None:
            if not self._has_room(publisher, medium):
                return None
            number = heappop(self._free) if self._free else len(self.names)
            if number == len(self.counts):
                self.counts.append(0)
                self.sizes.append(0)
            media = self.pair_bits.setdefault(publisher, {})
            media[medium] = media.get(medium, 0) | 1 << number
            self._media[medium] = self._media.get(medium, 0) + 1
            host = self._hosts.get(publisher)
            if host is not None:
                named = self.host_media.setdefault(host, {})
                named[medium] = named.get(medium, 0) + 1
            self._numbers[key] = number
            self.names[number] = key
            self.empty.setdefault(publisher, set()).add(number)
            if medium != DEFAULT_MEDIUM:
                self.lower_tier_bits |= 1 << number
        return number

    def _has_room(self, publisher: str, medium: str) -> bool:
        """Whether a new location of ``publisher`` on ``medium`` has a place; the event is
        counted as refused when it has none.

        Where the publisher's share is full (``MEDIA_PER_PUBLISHER``, ``MAX_GROUPS``), its
        own locations that hold no block are released first; where its host's is
        (``media_per_host``, ``locations_per_host``), those of its host's publishers; where
        the index's is
        (``max_media``, ``MAX_LOCATIONS``), every publisher's. A place went to whoever named
        it first, for good: removals of blocks never stored name a location and leave it
        empty, and one publisher's frames took every place from the engines met after it.
        """
        refused = self._share_full(publisher, medium)
        if refused is not None:
            self.release_empty([publisher])
            refused = self._share_full(publisher, medium)
        host = self._hosts.get(publisher)
        if refused is None and host is not None and self._host_full(host, medium) is not None:
            self._release_host_empty(host)
            refused = self._host_full(host, medium)
        if refused is None and self._index_full(medium) is not None:
            self.release_empty(list(self.empty))
            refused = self._index_full(medium)
        if refused == _LOCATIONS:
            self.refused_location_events += 1
        elif refused is not None:
            self.refused_media[refused] += 1
        return refused is None

    def _share_full(self, publisher: str, medium: str) -> _Refusal | None:
        """What of ``publisher``'s share a new location on ``medium`` would pass
        (``"publisher"``, ``_LOCATIONS``), or None."""
        media = self.pair_bits.get(publisher, {})
        bits = media.get(medium)
        if bits is None:
            return "publisher" if len(media) >= MEDIA_PER_PUBLISHER else None
        return _LOCATIONS if bits.bit_count() >= MAX_GROUPS else None

    def _host_full(self, host: str, medium: str) -> _Refusal | None:
        """What of ``host``'s share a new location on ``medium`` would pass (``"host"``:
        ``media_per_host`` media named, ``medium`` not one; ``_LOCATIONS``), or None."""
        named = self.host_media.get(host, {})
        if medium not in named and len(named) >= self.media_per_host:
            return "host"
        return _LOCATIONS if sum(named.values()) >= self.locations_per_host else None

    def _index_full(self, medium: str) -> _Refusal | None:
        """What of the index's caps a new location on ``medium`` would pass
        (``"max_media"``, ``_LOCATIONS``), or None.

        One place of ``max_media`` is held for the GPU (``DEFAULT_MEDIUM``) while no
        location is on it: every vLLM engine's prefix cache names it, and other media,
        named first, left an honest engine's GPU stores no place. Not the only place: a
        sidecar told to track one medium tracks the first named, as before."""
        media = self._media
        if medium not in media:
            held_for_gpu = (
                self.max_media > 1 and medium != DEFAULT_MEDIUM and DEFAULT_MEDIUM not in media
            )
            if len(media) + held_for_gpu >= self.max_media:
                return "max_media"
        return _LOCATIONS if len(self.names) >= MAX_LOCATIONS else None

    def hold(self, publisher: str, number: int) -> None:
        """Location ``number`` of ``publisher`` holds a block again: it is no longer empty."""
        empty = self.empty[publisher]
        empty.discard(number)
        if not empty:
            del self.empty[publisher]

    def emptied(self, number: int) -> None:
        """Location ``number`` holds no block now: it may be released (``release_empty``)."""
        self.empty.setdefault(self.names[number][0], set()).add(number)

    def _release_host_empty(self, host: str) -> None:
        """Release the locations that hold no block of the publishers in ``host``'s share."""
        self.release_empty([owner for owner in self.empty if self._hosts.get(owner) == host])

    def release_empty(self, owners: list[str]) -> None:
        """Release every location of ``owners`` (publishers) that holds no block: no mask
        has its bit, so the bit (the lowest first) and its medium, once no location is on
        it, are free to reuse. Each location is released once per allocation, so this
        costs no more than the allocations before it."""
        for owner in owners:
            for number in self.empty.pop(owner, ()):
                key = self.names.pop(number)
                del self._numbers[key]
                _owner, medium, _group = key
                media = self.pair_bits[owner]
                media[medium] &= ~(1 << number)
                if not media[medium]:
                    del media[medium]
                    if not media:
                        del self.pair_bits[owner]
                _discount(self._media, medium)
                host = self._hosts.get(owner)
                if host is not None:
                    named = self.host_media[host]
                    _discount(named, medium)
                    if not named:
                        del self.host_media[host]
                self.lower_tier_bits &= ~(1 << number)
                self.sizes[number] = 0
                self._forget(number)
                heappush(self._free, number)

    def leave_host(self, publisher: str, host: str | None) -> bool:
        """Take ``publisher``'s locations out of the share of the host it had, its empty ones
        released, unless that host is ``host``; whether it was another (``BlockIndex.set_host``)."""
        known = self._hosts.get(publisher)
        if known == host:
            return False
        self.release_empty([publisher])  # from ``known``'s share: only held ones move
        if known is not None:
            for medium, bits in self.pair_bits.get(publisher, {}).items():
                named = self.host_media[known]
                named[medium] -= bits.bit_count()
                if not named[medium]:
                    del named[medium]
                if not named:
                    del self.host_media[known]
            del self._hosts[publisher]
        return True

    def room_in(self, publisher: str, host: str) -> bool:
        """Whether the locations of ``publisher`` (of no host) fit in ``host``'s share, its
        host's publishers' empty locations released first where they do not."""
        if not self._fits(publisher, host):
            self._release_host_empty(host)
        return self._fits(publisher, host)

    def _fits(self, publisher: str, host: str) -> bool:
        """Whether the locations of ``publisher`` (of no host) fit in ``host``'s share; none
        always do."""
        media = self.pair_bits.get(publisher)
        if not media:
            return True
        named = self.host_media.get(host, {})
        locations = sum(bits.bit_count() for bits in media.values())
        return (
            len(named.keys() | media.keys()) <= self.media_per_host
            and sum(named.values()) + locations <= self.locations_per_host
        )

    def join_host(self, publisher: str, host: str) -> None:
        """Count ``publisher``'s locations (of no host) in ``host``'s share from now on."""
        self._hosts[publisher] = host
        for medium, bits in self.pair_bits.get(publisher, {}).items():
            named = self.host_media.setdefault(host, {})
            named[medium] = named.get(medium, 0) + bits.bit_count()

    def holds_any(self, publisher: str) -> bool:
        """Whether some location of ``publisher`` holds a block (or a copy of one)."""
        return any(
            self.counts[number]
            for number, (owner, _medium, _group) in self.names.items()
            if owner == publisher
        )

    def bits(self, medium: str | None = None, publisher: str | None = None) -> int:
        """The bits of every location matching both filters (all locations without filters)."""
        bits = 0
        for number, (owner, held_on, _group) in self.names.items():
            if medium in (None, held_on) and publisher in (None, owner):
                bits |= 1 << number
        return bits

    def bits_by_medium(self) -> dict[str, int]:
        """Medium -> the bits of the locations on it."""
        bits: dict[str, int] = {}
        for number, (_owner, medium, _group) in self.names.items():
            bits[medium] = bits.get(medium, 0) | 1 << number
        return bits

    def bits_by_size(self) -> dict[int, int]:
        """Block size -> the bits of the locations whose largest store was of that size."""
        bits: dict[int, int] = {}
        for number, size in enumerate(self.sizes):
            bits[size] = bits.get(size, 0) | 1 << number
        return bits


def _discount(counts: dict[str, int], key: str) -> None:
    """One fewer of ``key`` in ``counts``, a key at none forgotten."""
    counts[key] -= 1
    if not counts[key]:
        del counts[key]
