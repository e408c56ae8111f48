"""The director's plugins put in place: instantiated plugins → ``RequestControl`` → ``Pipeline``.

Why here: which plugins run at which extension point, in which order (data producers as a
DAG over the attribute keys they produce and consume), and which default producer a
consumed key gets is the director's knowledge (gie-inventory §8.2 steps 11 and 13).  The
config layer hands over the parser reference and a ``PluginSet``; the ``RequestControl`` it
gets back becomes a ``Pipeline`` once the scheduler and the admission controller exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.director.api import (
    Admitter,
    DataProducer,
    PreRequest,
    RequestHeaderProcessor,
    ResponseBodyProcessor,
    ResponseCompleteProcessor,
    ResponseHeaderProcessor,
    Screener,
)
from epp.director.dag import missing_producers, order_producers
from epp.director.pipeline import RequestControl
from epp.errors import ConfigError
from epp.parsers.api import Parser
from epp.parsers.registry import ParserRegistry
from epp.plugin.assembly import PluginSet, label
from epp.plugin.keys import AttributeKey


def parser(ref: str, default: str, plugins: PluginSet) -> Parser:
    """Steps 6 and 11: the parser ``ref`` names (``default`` is added when it is missing)."""
    if ref not in plugins:
        if ref != default:
            raise ConfigError(
                f"parser.pluginRef: the configured parser is not loaded (no plugin named '{ref}')"
            )
        plugins.ensure(default, "parser")
    plugin = plugins.get(ref)
    if not isinstance(plugin, Parser):
        raise ConfigError(
            f"parser.pluginRef: the specified plugin is not a parser plugin in the config ('{label(plugin)}')"
        )
    return plugin


def parsers(refs: Sequence[str], default: str, plugins: PluginSet) -> Parser | ParserRegistry:
    """``requestHandler.parsers``: one parser as is; several behind a per-path ``ParserRegistry``."""
    found = [parser(ref, default, plugins) for ref in refs]
    return found[0] if len(found) == 1 else ParserRegistry(found)


def producers(plugins: PluginSet) -> tuple[DataProducer, ...]:
    """Step 13: a default producer for every consumed key nobody produces; then the DAG."""
    while missing := missing_producers(plugins.values()):
        consumer, key = missing[0]
        type_name = key.default_producer
        if not type_name:
            raise ConfigError(
                f"plugins: plugin '{label(consumer)}' consumes '{key.name}' but no plugin produces it"
            )
        existing = plugins.get(type_name)
        if existing is not None:
            raise ConfigError(
                f"plugins: plugin '{label(consumer)}' consumes '{key.name}'; its default producer "
                f"'{type_name}' cannot be added because '{label(existing)}' has that name"
            )
        if not plugins.registered(type_name):
            raise ConfigError(
                f"plugins: plugin '{label(consumer)}' consumes '{key.name}' but its default producer "
                f"type '{type_name}' is not registered"
            )
        producer = plugins.create(type_name, f"plugins (default producer {type_name})")
        produced: frozenset[AttributeKey[Any]] = getattr(producer, "PRODUCES", frozenset())
        if not isinstance(producer, DataProducer) or all(k.name != key.name for k in produced):
            raise ConfigError(
                f"plugins: default producer '{label(producer)}' of key '{key.name}' "
                f"(consumed by '{label(consumer)}') does not produce it"
            )
    try:
        return order_producers(plugins.values())
    except ConfigError as e:
        raise ConfigError(f"plugins: {e}") from None


def request_control(
    parser: Parser | ParserRegistry, producers: tuple[DataProducer, ...], plugins: PluginSet
) -> RequestControl:
    """Every plugin at its extension points, in creation order."""
    all_plugins = plugins.values()
    return RequestControl(
        parser=parser,
        request_header=tuple(p for p in all_plugins if isinstance(p, RequestHeaderProcessor)),
        screeners=tuple(p for p in all_plugins if isinstance(p, Screener)),
        producers=producers,
        admitters=tuple(p for p in all_plugins if isinstance(p, Admitter)),
        pre_request=tuple(p for p in all_plugins if isinstance(p, PreRequest)),
        response_header=tuple(p for p in all_plugins if isinstance(p, ResponseHeaderProcessor)),
        response_body=tuple(p for p in all_plugins if isinstance(p, ResponseBodyProcessor)),
        response_complete=tuple(p for p in all_plugins if isinstance(p, ResponseCompleteProcessor)),
    )
