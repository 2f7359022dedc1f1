"""The sidecar's settings: keyword arguments, or ``KVSCOPE_*`` environment variables.

One settings object serves the command line, the container image (where
environment variables are the natural interface) and tests, so every knob is
validated once, here, with an error that names the setting rather than a
failure deep inside ZMQ or uvicorn.

Endpoint lists (``KVSCOPE_CONNECT``, ``KVSCOPE_REPLAY``) are read from the
environment either as a JSON list or, more conveniently in a shell, as a
comma-separated string. ``replay[i]`` is the replay socket of ``connect[i]``;
a shorter ``replay`` list leaves the remaining publishers without replay.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Final

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MAX_PAGE_LIMIT: Final = 1000
"""The most entries (blocks or events) one page holds, whatever limit is asked."""


@dataclass(frozen=True, slots=True)
class PublisherEndpoints:
    """Where one publisher can be reached: its PUB socket and, optionally, its replay socket."""

    endpoint: str
    replay_endpoint: str | None = None

    @property
    def name(self) -> str:
        return self.endpoint


EndpointList = Annotated[list[str], NoDecode]
"""Decoded by ``_split_endpoints`` rather than as JSON only, to accept comma lists."""


class SidecarSettings(BaseSettings):
    """Where to read KV events from, where to serve, and how much to keep in memory."""

    model_config = SettingsConfigDict(env_prefix="KVSCOPE_", extra="forbid")

    connect: EndpointList = Field(
        min_length=1,
        description="ZMQ PUB endpoints of the workers (kvscope or vLLM) to subscribe to.",
    )
    replay: EndpointList = Field(
        default_factory=list,
        description="Replay (ROUTER) endpoints, matched to `connect` by position; may be shorter.",
    )
    host: str = Field(default="127.0.0.1", description="Address the HTTP server binds.")
    port: int = Field(default=8000, ge=0, le=65535, description="HTTP port; 0 picks a free one.")
    token: SecretStr | None = Field(
        default=None,
        description="When set, every route but /healthz and /readyz needs `Bearer <token>`.",
    )
    max_blocks: int = Field(default=1_000_000, ge=1, description="Most blocks the index holds.")
    event_buffer: int = Field(default=10_000, ge=1, description="Recent events kept for replay.")
    page_limit: int = Field(
        default=MAX_PAGE_LIMIT,
        ge=1,
        le=MAX_PAGE_LIMIT,
        description="Largest page (blocks or events) one request may ask for.",
    )

    @field_validator("connect", "replay", mode="before")
    @classmethod
    def _split_endpoints(cls, value: Any) -> Any:
        """A JSON list or a comma-separated string, as environment variables carry lists."""
        if not isinstance(value, str):
            return value
        if value.lstrip().startswith("["):
            return json.loads(value)
        return [part.strip() for part in value.split(",") if part.strip()]

    @field_validator("connect", "replay")
    @classmethod
    def _endpoints_are_zmq(cls, endpoints: list[str]) -> list[str]:
        for endpoint in endpoints:
            if "://" not in endpoint:
                raise ValueError(
                    f"{endpoint!r} is not a ZMQ endpoint (expected transport://address, "
                    "e.g. tcp://127.0.0.1:5557)"
                )
        return endpoints

    @field_validator("token")
    @classmethod
    def _token_not_blank(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and not token.get_secret_value().strip():
            raise ValueError("token must not be blank (unset it to disable authentication)")
        return token

    @model_validator(mode="after")
    def _replay_matches_connect(self) -> SidecarSettings:
        if len(self.replay) > len(self.connect):
            raise ValueError(
                f"replay (KVSCOPE_REPLAY) names {len(self.replay)} endpoints but connect "
                f"(KVSCOPE_CONNECT) only {len(self.connect)}; replay[i] belongs to connect[i]"
            )
        return self

    def publishers(self) -> list[PublisherEndpoints]:
        """Each PUB endpoint paired with its replay endpoint, where one was given."""
        replays = self.replay + [None] * (len(self.connect) - len(self.replay))
        return [
            PublisherEndpoints(endpoint, replay)
            for endpoint, replay in zip(self.connect, replays, strict=True)
        ]
