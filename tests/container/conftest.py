"""Fixtures for the container kit's tests: settings read the way the image reads them."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import pytest

from app.settings import SidecarSettings

SettingsFromEnv = Callable[[Mapping[str, str]], SidecarSettings]


@pytest.fixture
def settings_from_env(monkeypatch: pytest.MonkeyPatch) -> SettingsFromEnv:
    """The sidecar's settings from exactly these environment variables, as in its container.

    Through the environment rather than keyword arguments, so a value a
    manifest writes is parsed as the sidecar parses it (comma lists, numbers).
    """

    def read(env: Mapping[str, str]) -> SidecarSettings:
        for name in os.environ:
            if name.startswith("KVSCOPE_"):
                monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return SidecarSettings()

    return read
