"""Fixtures for the config tests: a registry of fakes and a config factory."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from epp.config.load import load_config
from epp.config.schema import EndpointPickerConfig
from epp.plugin.registry import Registry
from tests.config.fakes import FAKES

API: dict[str, Any] = {"apiVersion": "inference.networking.x-k8s.io/v1alpha1", "kind": "EndpointPickerConfig"}

ConfigFactory = Callable[..., EndpointPickerConfig]


@pytest.fixture
def registry() -> Registry:
    return Registry(FAKES)


@pytest.fixture
def make_config() -> ConfigFactory:
    """``make_config(plugins=[...], schedulingProfiles=[...])`` → a loaded config (via JSON text)."""

    def make(**sections: Any) -> EndpointPickerConfig:
        return load_config(json.dumps({**API, **sections}))

    return make
