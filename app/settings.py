"""The sidecar's settings: keyword arguments, or ``KVSCOPE_*`` environment variables.

One settings object serves the command line, the container image (where
environment variables are the natural interface) and tests, so every knob is
validated once, here, with an error that names the setting rather than a
failure deep inside ZMQ or uvicorn.

Endpoint lists (``KVSCOPE_CONNECT``, ``KVSCOPE_REPLAY``, ``KVSCOPE_LISTEN``,
``KVSCOPE_LISTEN_REPLAY``) are read from the environment either as a JSON list
or, more conveniently in a shell, as a comma-separated string. ``replay[i]`` is
the replay socket of ``connect[i]``; a shorter ``replay`` list leaves the
remaining publishers without replay. Listen mode has no positions to match, so
``listen_replay`` names each publisher's stream (app/streams.py):
``STREAM=ENDPOINT``. An integer is read from text by one rule
(app/decimal_text.py: ASCII digits, no sign, space, underscore or leading
zero), as the HTTP API reads one, so ``KVSCOPE_PORT=1_0`` is refused rather
than taken for 10.
"""

from __future__ import annotations

import ipaddress
import json
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.decimal_text import DecimalFloat, DecimalInt
from app.streams import MAX_TOPIC_BYTES, ListenStream, parse_stream_name
from offload.cpu.policies.registry import policy_names
from offload.shown import shown, shown_repr
from offload.wire.endpoint_host import (
    Address,
    connect_reaches,
    families_of,
    interface_refusal,
    listened_addresses,
    resolved_addresses,
    source_refusal,
    unbindable_host,
)
from offload.wire.endpoints import Family, connect_target, endpoint_refusal
from offload.wire.framing import DEFAULT_KV_TOPIC, DEFAULT_SAMPLE_TOPIC, DEFAULT_STATS_TOPIC

MAX_PAGE_LIMIT: Final = 1000
"""The most entries (blocks or events) one page holds, whatever limit is asked."""

KiB: Final = 2**10
MiB: Final = 2**20

_TOPIC: Final = re.compile(r"[A-Za-z0-9._/-]*")
"""Topics the settings take: the characters a stream name shows as they are (app/streams.py)."""


@dataclass(frozen=True, slots=True)
class IngestConfig:
    """How the ingest thread reads its sockets: the topics and the bounds on what peers send.

    Built from the settings (``SidecarSettings.ingest_config``); the defaults
    are the settings' defaults, for tests and embedders that build a state by hand.
    """

    kv_topic: bytes = DEFAULT_KV_TOPIC
    stats_topic: bytes = DEFAULT_STATS_TOPIC
    sample_topic: bytes = DEFAULT_SAMPLE_TOPIC
    max_message_bytes: int = 16 * MiB
    receive_buffer_bytes: int = 64 * MiB
    replay_timeout_s: float = 2.0
    replay_deadline_s: float = 30.0
    replay_max_bytes: int = 256 * MiB
    replay_hold_bytes: int = 64 * MiB
    peer_timeout_s: float = 60.0

    @property
    def receive_hwm(self) -> int:
        """Messages ZMQ may queue from one peer of a receiving socket (its RCVHWM): as many
        of the largest as ``receive_buffer_bytes`` holds, and at least one."""
        return max(1, self.receive_buffer_bytes // self.max_message_bytes)


MIN_INSIGHT_CPU_SHARE: Final = 0.001
"""The least CPU share the shadow thread may be given: below it, the wait it owes after one
item of a few milliseconds runs to hours (and past 1e-9 overflowed the clock and stopped it)."""

INSIGHT_POLICIES: Final = ("lru", "arc")
"""The policies a live curve simulates unless told otherwise: those whose sampled curve
was checked against the exact sweep (README, "The hit-ratio curve")."""


@dataclass(frozen=True, slots=True)
class InsightConfig:
    """The bounds of the live hit-ratio curves (app/state/insight.py), from the settings.

    ``max_bytes``: the estimated memory one publisher's curve simulations may
    hold (a tier that would need more is sampled further, at a lower rate, to
    fit); ``policies``: the policies simulated (each policy's sampled curve
    must have been checked against a sweep: bench/insight_accuracy.py);
    ``queue_bytes``: sampled requests waiting for the shadow thread, all
    publishers together (past it they are shed, counted); ``cpu_share``: the
    share of one core the shadow thread may take from the ingest thread (the
    interpreter runs one thread at a time).
    """

    max_bytes: int = 64 * MiB
    policies: tuple[str, ...] = INSIGHT_POLICIES
    queue_bytes: int = 16 * MiB
    cpu_share: float = 0.1


@dataclass(frozen=True, slots=True)
class PublisherEndpoints:
    """Where one publisher can be reached: its PUB socket and, optionally, its replay socket."""

    endpoint: str
    replay_endpoint: str | None = None
    family: Family | None = None
    """The address family ``endpoint``'s host resolved to as the settings were read
    (``resolved_families``; None: a name with no address then, connected over IPv4 until
    a look-up finds one), so that the ingest thread sets its socket's IPv6 option without
    looking the name up again."""
    replay_family: Family | None = None
    """The same of ``replay_endpoint``."""

    mode: ClassVar[Literal["connect"]] = "connect"

    @property
    def name(self) -> str:
        return self.endpoint


EndpointList = Annotated[list[str], NoDecode]
"""Decoded by ``_split_endpoints`` rather than as JSON only, to accept comma lists
(endpoints, and the allowed host names)."""

_UNSENDABLE_TOKEN_CHAR: Final = re.compile(r"[^ -~]")
"""What a token may not hold: anything but printable ASCII (RFC 6750's bearer tokens are
ASCII; a space inside one is carried as it is)."""

_HOST_NAME: Final = re.compile(r"[A-Za-z0-9.-]{1,253}|\[?[0-9A-Fa-f:.]{2,45}\]?")
"""A DNS name or an IPv4/IPv6 address, as a Host header names it (without the port)."""


class SettingError(Exception):
    """A setting valid in form that fails in use (an address taken, a host name that resolves
    to nothing), found only when the sidecar binds; ``setting`` is its field, so the command
    line names the flag and variable as it does for a validation error."""

    setting: ClassVar[str] = "settings"


def _special_file_kind(path: Path) -> str | None:
    """What ``path`` is where it is there and no regular file (a link followed); else None."""
    try:
        mode = path.stat().st_mode
    except OSError:  # not there (yet), or in a folder that is not: written, or warned of
        return None
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return None


class SidecarSettings(BaseSettings):
    """Where to read KV events from, where to serve, and how much to keep in memory."""

    model_config = SettingsConfigDict(env_prefix="KVSCOPE_", extra="forbid")

    _addresses: dict[str, Address | None] = PrivateAttr(default_factory=dict)
    """What each endpoint the sidecar connects to (``connect``, ``replay``, the endpoints of
    ``listen_replay``) stood for as the settings were read (``_sources_can_connect``), the
    address ZMQ connects to; ``_listen_is_not_connect`` compares it, and ``publishers`` and
    ``listen_streams`` pass on its family (``families_of``)."""

    connect: EndpointList = Field(
        default_factory=list,
        description="ZMQ PUB endpoints of the workers (kvscope or vLLM) to subscribe to.",
    )
    replay: EndpointList = Field(
        default_factory=list,
        description="Replay (ROUTER) endpoints, matched to `connect` by position; may be shorter.",
    )
    listen: EndpointList = Field(
        default_factory=list,
        description="Endpoints one SUB socket binds for publishers that connect (listen mode).",
    )
    listen_replay: EndpointList = Field(
        default_factory=list,
        description="STREAM=ENDPOINT: the replay (ROUTER) endpoint of a listen-mode stream.",
    )
    listen_max_publishers: DecimalInt = Field(
        default=64,
        ge=1,
        le=4096,
        description="Most listen-mode publishers tracked; frames of further streams are counted.",
    )
    listen_max_connections: DecimalInt = Field(
        default=128,
        ge=1,
        le=65_536,
        description="Most peers admitted to the listen socket at once (each has a receive "
        "queue of its own); a further handshake is refused (counted) and its peer connects "
        "again every 5 s until a place is free.",
    )
    listen_max_connections_per_host: DecimalInt = Field(
        default=32,
        ge=1,
        le=65_536,
        description="Most peers admitted to the listen socket at once from one IP address, so "
        "that one host cannot take every place; a further handshake from it is refused "
        "(counted) and its peer connects again every 5 s. ipc:// peers are held to "
        "listen_max_connections only.",
    )
    listen_max_media_per_host: DecimalInt = Field(
        default=4,
        ge=1,
        le=256,
        description="Most distinct media the listen-mode streams from one IP address name "
        "together (its engines share GPU and CPU), so that one host's streams cannot take "
        "max_media from the others; events naming others are refused, counted. ipc:// peers' "
        "streams are held to max_media only.",
    )
    listen_max_locations_per_host: DecimalInt = Field(
        default=256,
        ge=1,
        le=1024,
        description="Most locations (a stream's medium and KV cache group) the listen-mode "
        "streams from one IP address hold together, of the index's 1,024, so that one "
        "host's streams cannot take them from the others; events naming others are refused, "
        "counted. ipc:// peers' streams are held to the 1,024 only.",
    )
    listen_allow: EndpointList = Field(
        default_factory=list,
        description="Networks (ADDRESS or ADDRESS/PREFIX, comma-separated) a peer of the "
        "listen socket must connect from; empty: any. A peer from elsewhere is refused at its "
        "handshake (counted) and not admitted again.",
    )
    host: str = Field(default="127.0.0.1", description="Address the HTTP server binds.")
    port: DecimalInt = Field(
        default=8000, ge=0, le=65535, description="HTTP port; 0 picks a free one."
    )
    url_file: Path | None = Field(
        default=None,
        description="A file to write the HTTP server's base URL to once it listens (the "
        "container image's healthcheck reads it: the port may come from the command line, or "
        "from port 0); empty: none; a file that cannot be written is a warning.",
    )
    token: SecretStr | None = Field(
        default=None,
        description="When set, every route but /healthz and /readyz needs `Bearer <token>`.",
    )
    max_blocks: DecimalInt = Field(
        default=1_000_000, ge=1, description="Most blocks the index holds."
    )
    event_buffer: DecimalInt = Field(
        default=10_000, ge=1, description="Recent events kept for replay."
    )
    page_limit: DecimalInt = Field(
        default=MAX_PAGE_LIMIT,
        ge=1,
        le=MAX_PAGE_LIMIT,
        description="Largest page (blocks or events) one request may ask for.",
    )
    event_buffer_bytes: DecimalInt = Field(
        default=64 * MiB,
        ge=MiB,
        description="Most memory the recent events may take (estimated); the oldest go first.",
    )
    event_batch_max: DecimalInt = Field(
        default=1000,
        ge=1,
        description="Most events of one batch the event log keeps; the rest are counted as shed.",
    )
    history_max_series: DecimalInt = Field(
        default=512,
        ge=1,
        le=65_536,
        description="Most time series /api/v1/history keeps (a series: one publisher's metric, "
        "by medium, reason or direction); each takes at most 8 bytes per point.",
    )
    history_retention_s: DecimalInt = Field(
        default=6 * 3600,
        ge=60,
        le=7 * 24 * 3600,
        description="How far back /api/v1/history's 10 s points go (the 1 s points: 15 min).",
    )
    max_media: DecimalInt = Field(
        default=16,
        ge=1,
        le=256,
        description="Most distinct media the index tracks, one place of them (of two or more) "
        "held for vLLM's GPU medium until it is named, at most 4 named by one publisher; "
        "events naming others are refused, counted. A medium that holds no block any more is "
        "released when a new one finds no place.",
    )
    kv_topic: str = Field(
        default=DEFAULT_KV_TOPIC.decode(),
        max_length=MAX_TOPIC_BYTES,
        description="The KV-event topic of the publishers --connect names (vLLM's `topic`); "
        "frames of other topics are counted as malformed.",
    )
    stats_topic: str = Field(
        default=DEFAULT_STATS_TOPIC.decode(),
        min_length=1,
        max_length=MAX_TOPIC_BYTES,
        description="The topic stats frames travel on (EventPublisher's `stats_topic`).",
    )
    sample_topic: str = Field(
        default=DEFAULT_SAMPLE_TOPIC.decode(),
        min_length=1,
        max_length=MAX_TOPIC_BYTES,
        description="The topic sampled access streams travel on (EventPublisher's "
        "`sample_topic`); they feed /api/v1/insight's hit-ratio curves.",
    )
    insight_max_bytes: DecimalInt = Field(
        default=64 * MiB,
        ge=MiB,
        le=64 * 1024 * MiB,
        description="Estimated memory one publisher's hit-ratio curve simulations may hold; a "
        "tier that needs more is sampled further (a lower rate) to fit.",
    )
    insight_policies: EndpointList = Field(
        default_factory=lambda: list(INSIGHT_POLICIES),
        min_length=1,
        description="Policies the hit-ratio curves simulate (comma-separated); a policy whose "
        "sizes do not scale with its capacity has no trustworthy sampled curve.",
    )
    insight_queue_bytes: DecimalInt = Field(
        default=16 * MiB,
        ge=64 * KiB,
        le=1024 * MiB,
        description="Sampled requests waiting for the curve's shadow tiers (all publishers, "
        "each at most an equal share among those sending); past it they are shed, counted.",
    )
    insight_cpu_share: DecimalFloat = Field(
        default=0.1,
        ge=MIN_INSIGHT_CPU_SHARE,
        le=1,
        description="Share of one core the shadow tiers' thread may take; past it its queue "
        "fills and sheds rather than slowing ingest.",
    )
    max_message_bytes: DecimalInt = Field(
        default=16 * MiB,
        ge=MiB,
        le=2**31 - 1,  # ZMQ's MAXMSGSIZE is a 64-bit int, but no frame needs 2 GiB
        description="Largest message taken from any socket; ZMQ disconnects a peer that sends "
        "more.",
    )
    receive_buffer_bytes: DecimalInt = Field(
        default=64 * MiB,
        ge=MiB,
        le=2**40,  # its high-water mark (over max_message_bytes at least 1 MiB) fits ZMQ's int
        description="Messages queued per connection of a receiving socket, in bytes: its "
        "high-water mark is this over max_message_bytes (at least 1); past it the peer waits "
        "or drops, seen as a gap.",
    )
    peer_timeout_s: DecimalFloat = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="A peer that answers none of ZMQ's pings for this long is disconnected "
        "(and, in connect mode, connected again), so a worker whose host vanished without "
        "closing the connection is not waited on forever.",
    )
    replay_timeout_s: DecimalFloat = Field(
        default=2.0,
        gt=0,
        le=60,
        description="A replay that answers nothing for this long ends; the rest is missed.",
    )
    replay_deadline_s: DecimalFloat = Field(
        default=30.0,
        gt=0,
        le=600,
        description="Longest a whole replay may take; what it has not sent by then is missed.",
    )
    replay_max_bytes: DecimalInt = Field(
        default=256 * MiB,
        ge=MiB,
        description="Most bytes of answers one replay may send before it is ended.",
    )
    replay_hold_bytes: DecimalInt = Field(
        default=64 * MiB,
        ge=MiB,
        description="Live frames held per publisher while its replay runs, each charged its "
        "bytes and its overhead; past it, later frames are dropped (counted) and replayed "
        "afterwards.",
    )
    max_body_bytes: DecimalInt = Field(
        default=2 * MiB,
        ge=KiB,
        le=1024 * MiB,
        description="Largest request body; a larger one is a 413, refused while it is read.",
    )
    max_sse_clients: DecimalInt = Field(
        default=256,
        ge=1,
        le=65536,
        description="Most event streams open at once; one more is a 503 (counted).",
    )
    sse_client_queue_bytes: DecimalInt = Field(
        default=MiB,
        ge=64 * KiB,
        description="Rendered events waiting for one slow stream reader; past it the reader "
        "is shed (counted) and resumes with Last-Event-ID.",
    )
    events_response_bytes: DecimalInt = Field(
        default=MiB,
        ge=64 * KiB,
        description="Most event bytes in one /api/v1/events page (at least one event).",
    )
    max_header_bytes: DecimalInt = Field(
        default=64 * KiB,
        ge=KiB,
        le=16 * MiB,
        description="Largest request head (request line and headers); a larger one is a 431 "
        "(counted). Also the most the requests pipelined behind an answer may hold together; "
        "the one that would pass it is a 503 and the connection reads no more (counted).",
    )
    header_timeout_s: DecimalFloat = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Longest a connection may take to send a request's head, from when the "
        "head (or the connection) began, and its body, from the end of its head; then it is "
        "closed (counted).",
    )
    send_timeout_s: DecimalFloat = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Longest a client may read nothing while the server's write buffer for it "
        "is full, or holds the unsent end of an answer written whole; then its response is "
        "cut and the connection closed (counted).",
    )
    min_send_bytes_per_s: DecimalInt = Field(
        default=4 * KiB,
        ge=0,
        le=1024 * MiB,
        description="Fewest bytes a second a client must read while the server holds bytes "
        "of its response unsent (an idle event stream holds none), averaged over all that "
        "time from the end of its first send_timeout_s (its grace) until nothing is left to "
        "send; a slower reader's response is cut and the connection closed (counted). 0: "
        "only a client that reads nothing is cut.",
    )
    max_connections: DecimalInt = Field(
        default=1024,
        ge=1,
        le=65536,
        description="Most HTTP connections open at once (event streams included); one more is "
        "a 503 before its request is read (counted).",
    )
    response_buffer_bytes: DecimalInt = Field(
        default=256 * MiB,
        ge=MiB,
        description="Response bytes held for clients still reading them, all connections "
        "together; an answer that would pass it is a 503 (counted), unless nothing else is "
        "held. Its last eighth is kept for /metrics scrapes.",
    )
    allowed_hosts: EndpointList = Field(
        default_factory=list,
        description="Host header names the HTTP server answers (any port); unset: the "
        "loopback names and the bound address, or every name when bound to all addresses.",
    )

    @field_validator(
        "connect",
        "replay",
        "listen",
        "listen_replay",
        "listen_allow",
        "allowed_hosts",
        "insight_policies",
        mode="before",
    )
    @classmethod
    def _split_endpoints(cls, value: Any) -> Any:
        """A JSON list or a comma-separated string, as environment variables carry lists."""
        if not isinstance(value, str):
            return value
        if value.lstrip().startswith("["):
            try:
                return json.loads(value)
            except RecursionError:  # not a ValueError: it would escape as a traceback
                raise ValueError("a JSON list nested too deeply") from None
            except json.JSONDecodeError as exc:  # json's own words name neither JSON nor a list
                raise ValueError(
                    f"starts with '[' but is not a JSON list ({exc.msg} at character "
                    f"{exc.pos + 1}); give a JSON list of strings or comma-separated values"
                ) from None
        return [part.strip() for part in value.split(",") if part.strip()]

    @field_validator("connect", "replay")
    @classmethod
    def _endpoints_are_zmq(cls, endpoints: list[str]) -> list[str]:
        for endpoint in endpoints:
            _check_endpoint(endpoint, bind=False)
        return endpoints

    @field_validator("connect")
    @classmethod
    def _connect_once(cls, endpoints: list[str]) -> list[str]:
        """Publishers are known by their endpoint: a second ``--connect`` of one was merged
        into the first in silence, and its ``--replay`` took the place of the first's. One
        listed with two source addresses (or with one and without), or with its port written
        two ways (``5557``, ``05557``), is one publisher too, which two sockets would read
        as two, every block of it held twice."""
        _no_repeats(endpoints, "is listed twice")
        first_of: dict[str, str] = {}
        for endpoint in endpoints:
            target = connect_target(endpoint)
            first = first_of.setdefault(target, endpoint)
            if first != endpoint:
                raise ValueError(
                    f"{shown_repr(endpoint)} is listed twice, as {shown_repr(first)} too: both "
                    f"reach {shown_repr(target)} (a source address and a port's leading zeros "
                    "aside)"
                )
        return endpoints

    @field_validator("listen")
    @classmethod
    def _listen_is_bindable(cls, endpoints: list[str]) -> list[str]:
        """Caught here, by name, rather than as an error from inside ZMQ at start-up."""
        for endpoint in endpoints:
            _check_endpoint(endpoint, bind=True)
        _no_repeats(endpoints, "is listed twice")
        return endpoints

    @field_validator("listen_allow")
    @classmethod
    def _allow_is_networks(cls, networks: list[str]) -> list[str]:
        """Each network in its canonical text, an IPv4-mapped one as the IPv4 network it
        names (the gate matches an IPv4 peer by its IPv4 address, whichever socket it
        reached); a scope id is refused, as containment ignores it and would admit the
        network on every interface."""
        return [_allowed_network(network) for network in networks]

    @field_validator("listen_replay")
    @classmethod
    def _listen_replay_declares_streams(cls, pairs: list[str]) -> list[str]:
        """Each endpoint checked here, once: ``listen_streams`` reads them as checked."""
        names = [_declared_stream(pair, {}).name for pair in pairs]
        for pair in pairs:  # each STREAM=ENDPOINT, as _declared_stream found it
            _check_endpoint(pair.partition("=")[2], bind=False)
        _no_repeats(names, "is given more than one replay endpoint")
        return pairs

    @field_validator("insight_policies")
    @classmethod
    def _policies_are_registered(cls, names: list[str]) -> list[str]:
        known = policy_names()
        for name in names:
            if name not in known:
                raise ValueError(
                    f"{shown_repr(name)} is not a cache policy (known: {', '.join(known)})"
                )
        return list(dict.fromkeys(names))

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_are_names(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            if not _HOST_NAME.fullmatch(host):
                raise ValueError(f"{shown_repr(host)} is not a host name or address")
        return hosts

    @field_validator("kv_topic", "stats_topic", "sample_topic")
    @classmethod
    def _topic_is_plain(cls, topic: str) -> str:
        if not _TOPIC.fullmatch(topic):
            raise ValueError(f"{topic!r} is not a topic: letters, digits and ._/- only")
        return topic

    @field_validator("url_file", mode="before")
    @classmethod
    def _url_file_names_a_file(cls, value: Any) -> Any:
        """Empty is none (an image's ``KVSCOPE_URL_FILE`` is unset so, as its healthcheck
        reads it). A path that names a directory (``/``, ``.``, a trailing ``/``) is refused
        here: once listening, the sidecar stopped with a traceback on one, or wrote
        ``.NAME.partial`` beside the directory. So is a path that is there and is no regular
        file: the URL is moved over the path and removed as serving ends, which replaced and
        then deleted a FIFO, or /dev/null where the sidecar ran as root."""
        if not isinstance(value, str):
            return value
        if not value:
            return None
        if value.rpartition("/")[2] in ("", ".", ".."):
            raise ValueError(f"{shown_repr(value)} names a directory, not a file to write")
        kind = _special_file_kind(Path(value))
        if kind is not None:
            raise ValueError(f"{shown_repr(value)} names a {kind}, not a file to write")
        return value

    @field_validator("token")
    @classmethod
    def _token_is_sendable(cls, token: SecretStr | None) -> SecretStr | None:
        """A token no ``Authorization`` header carries as it is locked every client out with
        401s: HTTP strips the whitespace around a header's value (a secret file's trailing
        newline), refuses control characters in it, and clients encode other characters
        than ASCII each their own way. The error says where, never what the token is."""
        if token is None:
            return None
        text = token.get_secret_value()
        if not text.strip():
            raise ValueError("token must not be blank (unset it to disable authentication)")
        if text != text.strip():
            raise ValueError(
                "token starts or ends with whitespace, which HTTP strips from a header: no "
                "Authorization header can carry it (a trailing newline from a secret file?)"
            )
        bad = _UNSENDABLE_TOKEN_CHAR.search(text)
        if bad is not None:
            raise ValueError(
                f"token has a character no Authorization header carries as it is (character "
                f"{bad.start() + 1}, U+{ord(bad.group()):04X}): use printable ASCII only"
            )
        return token

    @model_validator(mode="after")
    def _replay_matches_connect(self) -> SidecarSettings:
        if len(self.replay) > len(self.connect):
            raise ValueError(
                f"replay (KVSCOPE_REPLAY) names {len(self.replay)} endpoints but connect "
                f"(KVSCOPE_CONNECT) only {len(self.connect)}; replay[i] belongs to connect[i]"
            )
        return self

    @model_validator(mode="after")
    def _allow_can_guard_listen(self) -> SidecarSettings:
        """An abstract ipc socket (``ipc://@name``) has no file whose permissions say who
        connects, and its peers no IP address for ``listen_allow`` to match: with both set,
        any local process of any user would pass a gate the settings say is closed."""
        if self.listen_allow:
            for endpoint in self.listen:
                if endpoint.startswith("ipc://@"):
                    raise ValueError(
                        "listen_allow (KVSCOPE_LISTEN_ALLOW) cannot guard "
                        f"{shown_repr(endpoint)}: an abstract socket has no file whose "
                        "permissions say who connects, and its peers no IP address to match; "
                        "listen on ipc://PATH instead"
                    )
        return self

    @model_validator(mode="after")
    def _topics_differ(self) -> SidecarSettings:
        if self.kv_topic == self.stats_topic:
            raise ValueError(f"kv_topic and stats_topic must differ, both are {self.kv_topic!r}")
        if self.sample_topic in (self.kv_topic, self.stats_topic):
            raise ValueError(
                f"sample_topic must differ from kv_topic and stats_topic, got {self.sample_topic!r}"
            )
        return self

    @model_validator(mode="after")
    def _something_to_read(self) -> SidecarSettings:
        if not self.connect and not self.listen:
            raise ValueError(
                "no publisher to read: give connect (--connect / KVSCOPE_CONNECT, a worker's PUB "
                "endpoint) or listen (--listen / KVSCOPE_LISTEN, an endpoint publishers connect "
                "to), or both"
            )
        if self.listen_replay and not self.listen:
            raise ValueError("listen_replay (KVSCOPE_LISTEN_REPLAY) needs listen (KVSCOPE_LISTEN)")
        if len(self.listen_replay) > self.listen_max_publishers:
            raise ValueError(
                f"listen_replay (KVSCOPE_LISTEN_REPLAY) declares {len(self.listen_replay)} "
                f"streams, more than listen_max_publishers ({self.listen_max_publishers})"
            )
        return self

    @model_validator(mode="after")
    def _sources_can_connect(self) -> SidecarSettings:
        """Each host the sidecar connects to looked up once, as it starts, and the answer
        kept for the ingest thread (``publishers``, ``listen_streams``), which looks no name
        up as it starts, and for ``_listen_is_not_connect``, next: a DNS server that does not
        answer holds up the start once, not once per check. A source address is checked
        against it here (``source_refusal``), after the checks that need no look-up, and
        refused at its setting as a field's validator would refuse it."""
        connected = {
            "connect": self.connect,
            "replay": self.replay,
            "listen_replay": [pair.partition("=")[2] for pair in self.listen_replay],
        }
        self._addresses = resolved_addresses(
            e for endpoints in connected.values() for e in endpoints
        )
        families = families_of(self._addresses)
        refused: list[InitErrorDetails] = []
        for setting, endpoints in connected.items():
            for endpoint in endpoints:
                refusal = source_refusal(endpoint, families[endpoint])
                if refusal is not None:
                    refused.append(self._refused(setting, f"{shown_repr(endpoint)} {refusal}"))
                    break
        if refused:
            raise ValidationError.from_exception_data(type(self).__name__, refused)
        return self

    @model_validator(mode="after")
    def _listen_is_not_connect(self) -> SidecarSettings:
        """Compared as ZMQ reads them (``connect_reaches``): ``tcp://*:5557`` is reached by
        ``tcp://127.0.0.1:05557`` as surely as by its own text, and by
        ``tcp://localhost:5557``; ``tcp://lo:5557`` by ``tcp://127.0.0.1:5557``. After the
        look-up (``_sources_can_connect``), whose answer for each name it compares: a DNS
        server that does not answer holds up the start once, not a second time here. A
        listen host ZMQ binds nothing for (``listened_addresses``) is refused at its setting,
        in ZMQ's words, rather than as the sidecar binds it."""
        listened: dict[str, Address] = {}
        for listen, found in listened_addresses(self.listen).items():
            if isinstance(found, str):
                problem = f"{shown_repr(listen)} {unbindable_host(found)}"
                refused = [self._refused("listen", problem)]
                raise ValidationError.from_exception_data(type(self).__name__, refused)
            listened[listen] = found
        for connect in self.connect:
            for listen in self.listen:
                reaches = connect_reaches(
                    connect, self._addresses[connect], listen, listened.get(listen)
                )
                if reaches:
                    raise ValueError(  # two values shown: a line of at most 500 characters
                        f"{shown(connect, 100)} (KVSCOPE_CONNECT) reaches {shown(listen, 100)}"
                        " (KVSCOPE_LISTEN): the sidecar would read its own socket; connect "
                        "names a worker's endpoint, listen one the sidecar binds for publishers"
                    )
        return self

    def _refused(self, setting: str, problem: str) -> InitErrorDetails:
        """A refusal of ``setting`` found by a model validator, reported at the setting as a
        field's validator reports one (the command line names its flag and variable)."""
        return InitErrorDetails(
            type="value_error",
            loc=(setting,),
            input=getattr(self, setting),
            ctx={"error": ValueError(problem)},
        )

    def publishers(self) -> list[PublisherEndpoints]:
        """Each PUB endpoint paired with its replay endpoint, where one was given, and what
        each resolved to as the settings were read."""
        replays = self.replay + [None] * (len(self.connect) - len(self.replay))
        families = families_of(self._addresses)
        return [
            PublisherEndpoints(
                endpoint,
                replay,
                families.get(endpoint),
                None if replay is None else families.get(replay),
            )
            for endpoint, replay in zip(self.connect, replays, strict=True)
        ]

    def ingest_config(self) -> IngestConfig:
        """What the ingest thread needs of these settings."""
        return IngestConfig(
            kv_topic=self.kv_topic.encode(),
            stats_topic=self.stats_topic.encode(),
            sample_topic=self.sample_topic.encode(),
            max_message_bytes=self.max_message_bytes,
            receive_buffer_bytes=self.receive_buffer_bytes,
            replay_timeout_s=self.replay_timeout_s,
            replay_deadline_s=self.replay_deadline_s,
            replay_max_bytes=self.replay_max_bytes,
            replay_hold_bytes=self.replay_hold_bytes,
            peer_timeout_s=self.peer_timeout_s,
        )

    def insight_config(self) -> InsightConfig:
        """The bounds of the live hit-ratio curves."""
        return InsightConfig(
            self.insight_max_bytes,
            tuple(self.insight_policies),
            self.insight_queue_bytes,
            self.insight_cpu_share,
        )

    def listen_streams(self) -> list[ListenStream]:
        """The listen-mode streams declared with a replay endpoint, and what it resolved to as
        the settings were read; others appear as they send."""
        families = families_of(self._addresses)
        return [_declared_stream(pair, families) for pair in self.listen_replay]


def _allowed_network(text: str) -> str:
    """One ``listen_allow`` entry as canonical network text (``_allow_is_networks``)."""
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ValueError(
            f"{shown_repr(text)} is not an IP network (expected an address or "
            "ADDRESS/PREFIX, e.g. 10.0.0.0/8 or fd00::/8)"
        ) from None
    if isinstance(network, ipaddress.IPv6Network):
        if "%" in text.partition("/")[0]:  # the network's own address has lost it to the mask
            raise ValueError(
                f"{shown_repr(text)} names a scope id, which a peer's address is not matched "
                "on: name the network without it (e.g. fe80::/64)"
            )
        mapped = network.network_address.ipv4_mapped
        if mapped is not None and network.prefixlen >= 96:
            return str(ipaddress.IPv4Network((mapped, network.prefixlen - 96)))
    return str(network)


def _declared_stream(pair: str, families: dict[str, Family | None]) -> ListenStream:
    """A ``listen_replay`` value, ``STREAM=ENDPOINT``, as the stream it declares, with what
    its endpoint resolved to in ``families`` (None where it holds no answer). Its endpoint
    is not checked here: the check binds a socket and may wait on DNS, so the settings'
    validator makes it once, and the sidecar, reading the streams as it starts, not again."""
    name, separator, endpoint = pair.partition("=")
    if not separator or not endpoint:
        raise ValueError(
            f"{shown_repr(pair)} is not STREAM=ENDPOINT (e.g. vllm-gpu@0=tcp://engine:5558)"
        )
    return ListenStream(
        *parse_stream_name(name), replay_endpoint=endpoint, replay_family=families.get(endpoint)
    )


def _check_endpoint(endpoint: str, *, bind: bool) -> None:
    """Every endpoint setting, refused by one rule (offload/wire/endpoints.py); pydantic
    names the setting. The sidecar uses its endpoints on the host it validates them on, so
    a zone naming no interface of this host is refused too (``interface_refusal``); a
    connect's source address once its host is looked up (``_sources_can_connect``)."""
    refusal = endpoint_refusal(endpoint, bind=bind) or interface_refusal(endpoint)
    if refusal is not None:
        raise ValueError(f"{shown_repr(endpoint)} {refusal}")


def _no_repeats(values: list[str], complaint: str) -> None:
    """Settings that would bind or declare one thing twice are refused, naming it."""
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"{shown_repr(value)} {complaint}")
        seen.add(value)
