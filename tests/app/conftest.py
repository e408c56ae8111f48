"""The build tests use the config tests' fixtures: a registry of fakes and a config factory."""

from __future__ import annotations

from tests.config.conftest import make_config, registry

__all__ = ["make_config", "registry"]
