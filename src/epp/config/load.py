"""YAML or JSON text to an EndpointPickerConfig; every error is a ConfigError naming its field path."""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import ValidationError

from epp.config.compat import upgrade, upgrade_raw
from epp.config.features import validate_gates
from epp.config.llmd import LLMD_API_VERSIONS, LLMD_ONLY_FIELDS, LlmdEndpointPickerConfig
from epp.config.schema import EndpointPickerConfig
from epp.errors import ConfigError

# GIE's built-in default (gie:pkg/epp/config/loader/defaults.go), used when no config is given.
# The builder adds the rest: single-profile-handler, max-score-picker, openai-parser,
# utilization-detector and approx-prefix-cache-producer.  Mirrored in config/default.yaml.
DEFAULT_CONFIG_YAML: Final = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: []
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
"""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, as Kubernetes' strict decoder does."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Hashable] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, Hashable) and key in seen:
            mark = key_node.start_mark
            raise ConfigError(
                f"failed to parse config: line {mark.line + 1}, column {mark.column + 1}: "
                f"duplicate field {key!r}"
            )
        if isinstance(key, Hashable):
            seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def field_path(loc: tuple[int | str, ...]) -> str:
    """``("plugins", 3, "parameters")`` → ``plugins[3].parameters``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _format(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        path = field_path(tuple(e["loc"]))
        lines.append(f"{path}: {e['msg']}" if path else str(e["msg"]))
    return "; ".join(lines)


def parse_text(text: str | bytes) -> Any:
    """YAML (or JSON, a subset of it) to plain data; syntax errors name the line and column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # _StrictLoader derives SafeLoader
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = " ".join(p for p in (e.context, e.problem) if p)
        raise ConfigError(f"failed to parse config: {where}{problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"failed to parse config: {e}") from None


def check_structure(cfg: EndpointPickerConfig) -> None:
    """Cross-field rules that need no plugin registry (GIE §8.2 steps 3, 5 and 7, with paths)."""
    validate_gates(cfg.feature_gates)
    names: set[str] = set()
    for i, spec in enumerate(cfg.plugins):
        if not spec.type:
            raise ConfigError(f"plugins[{i}].type: plugin '{spec.name}' is missing a type")
        if spec.name in names:
            raise ConfigError(f"plugins[{i}].name: duplicate plugin name '{spec.name}'")
        names.add(spec.name)
    profiles: set[str] = set()
    for i, profile in enumerate(cfg.scheduling_profiles):
        if not profile.name:
            raise ConfigError(f"schedulingProfiles[{i}].name: schedulingProfiles[{i}] is missing a name")
        if profile.name in profiles:
            raise ConfigError(
                f"schedulingProfiles[{i}].name: schedulingProfiles[{i}] has duplicate name '{profile.name}'"
            )
        profiles.add(profile.name)
        for j, ref in enumerate(profile.plugins):
            if not ref.plugin_ref:
                raise ConfigError(
                    f"schedulingProfiles[{i}].plugins[{j}].pluginRef: "
                    f"schedulingProfiles[{profile.name}].plugins[{j}] is missing a 'pluginRef'"
                )
    if cfg.parser is not None and not cfg.parser.plugin_ref:
        raise ConfigError("parser.pluginRef: parser is missing a 'pluginRef'")
    if cfg.data_layer is not None:
        for i, source in enumerate(cfg.data_layer.sources):
            if not source.plugin_ref:
                raise ConfigError(f"dataLayer.sources[{i}].pluginRef: source is missing a 'pluginRef'")
            for j, ext in enumerate(source.extractors):
                if not ext.plugin_ref:
                    path = f"dataLayer.sources[{i}].extractors[{j}].pluginRef"
                    raise ConfigError(f"{path}: extractor is missing a 'pluginRef'")
    if cfg.flow_control is not None:
        priorities: set[int] = set()
        for i, band in enumerate(cfg.flow_control.priority_bands):
            if band.priority in priorities:
                raise ConfigError(
                    f"flowControl.priorityBands[{i}].priority: duplicate priority level {band.priority}"
                )
            priorities.add(band.priority)


def load_config(text: str | bytes) -> EndpointPickerConfig:
    """Parse and validate config text; blank text means GIE's built-in default."""
    if not text.strip():
        text = DEFAULT_CONFIG_YAML
    data = parse_text(text)
    if not isinstance(data, dict):
        raise ConfigError(
            f"failed to parse config: expected a mapping (an EndpointPickerConfig), got {type(data).__name__}"
        )
    data = upgrade_raw(data)
    try:
        if data.get("apiVersion") in LLMD_API_VERSIONS or LLMD_ONLY_FIELDS & data.keys():  # config/llmd.py
            cfg = LlmdEndpointPickerConfig.model_validate(data).to_gie()
        else:
            cfg = EndpointPickerConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format(e)) from None
    check_structure(cfg)
    return upgrade(cfg)


def load_config_file(path: str | Path) -> EndpointPickerConfig:
    try:
        text = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"failed to read config file '{path}': {e.strerror or e}") from None
    try:
        return load_config(text)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def load(*, config_file: str = "", config_text: str = "") -> EndpointPickerConfig:
    """What ``--config-file`` / ``--config-text`` select; neither means the built-in default."""
    if config_file and config_text:
        raise ConfigError('both the "configText" and "configFile" flags can not be set at the same time')
    if config_file:
        return load_config_file(config_file)
    return load_config(config_text)


def default_config() -> EndpointPickerConfig:
    return load_config(DEFAULT_CONFIG_YAML)
