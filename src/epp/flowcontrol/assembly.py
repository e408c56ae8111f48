"""Flow control assembles itself: the resolved ``flowControl`` section + plugins → ``FlowControlPlan``.

Why here: which plugin may serve as a band's ordering or fairness policy, or as the usage
limit policy, is flow control's knowledge (gie-inventory §8.2 step 10, §5.3).  The config
layer adds the default policies, resolves its section's defaults and hands both over; the
plan it gets back becomes a ``FlowController`` once the pool (the datastore) exists, which
is the admission assembly's business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epp.config.schema import FlowControlConfig
from epp.datalayer.api import Endpoint
from epp.errors import ConfigError
from epp.flowcontrol import api as flowcontrol_api
from epp.flowcontrol.api import SaturationDetector, UsageLimitPolicy
from epp.plugin.assembly import PluginSet
from epp.plugin.base import Plugin

if TYPE_CHECKING:  # the controller is imported only when the flowControl gate is on
    from epp.flowcontrol.controller import FlowController


@dataclass(frozen=True, slots=True)
class FlowControlPlan:
    """Validated settings and the plugins a ``FlowController`` is made of; nothing runs yet."""

    settings: FlowControlConfig  # resolved: every default explicit
    detector: SaturationDetector
    plugins: Mapping[str, Plugin]

    def controller(self, *, endpoints: Callable[[], Sequence[Endpoint]], **kwargs: Any) -> FlowController:
        """The controller; ``endpoints`` is the pool (``Datastore.endpoints``)."""
        from epp.flowcontrol.controller import FlowController

        return FlowController.from_plan(self, endpoints=endpoints, **kwargs)


def check_policies(settings: FlowControlConfig, plugins: PluginSet) -> FlowControlConfig:
    """Step 10: every band's policy references and the usage limit policy; returns ``settings``."""
    bands = []
    if settings.default_priority_band is not None:
        bands.append(("flowControl.defaultPriorityBand", settings.default_priority_band))
    bands += [(f"flowControl.priorityBands[{i}]", band) for i, band in enumerate(settings.priority_bands)]
    for path, band in bands:
        _policy(plugins, f"{path}.orderingPolicyRef", band.ordering_policy_ref, "ordering", "OrderingPolicy")
        _policy(plugins, f"{path}.fairnessPolicyRef", band.fairness_policy_ref, "fairness", "FairnessPolicy")
    ref = settings.usage_limit_policy_plugin_ref
    policy = plugins.get(ref)
    if policy is None:
        raise ConfigError(
            f"flowControl.usageLimitPolicyPluginRef: usage limit policy plugin '{ref}' not found"
        )
    if not isinstance(policy, UsageLimitPolicy):
        raise ConfigError(
            f"flowControl.usageLimitPolicyPluginRef: plugin '{ref}' does not implement UsageLimitPolicy"
        )
    return settings


def _policy(plugins: PluginSet, path: str, ref: str, kind: str, protocol_name: str) -> None:
    plugin = plugins.get(ref)
    if plugin is None:
        raise ConfigError(f'{path}: no {kind} policy registered for name "{ref}"')
    # The flow-control concept declares these Protocols with its policies; until it does,
    # only the reference is checked.
    protocol = getattr(flowcontrol_api, protocol_name, None)
    if protocol is not None and not isinstance(plugin, protocol):
        kind_name = plugin.typed_name.type
        raise ConfigError(f'{path}: plugin "{ref}" is not a flowcontrol.{protocol_name} (type: {kind_name})')


def saturation_detector(ref: str, default: str, plugins: PluginSet) -> SaturationDetector:
    """Steps 6, 7 and 12: the detector ``ref`` names (``default`` is added when it is missing)."""
    if ref not in plugins:
        if ref != default:
            raise ConfigError(
                f"saturationDetector.pluginRef: saturation detector references undefined plugin '{ref}'"
            )
        plugins.ensure(default, "saturationDetector")
    plugin = plugins.get(ref)
    if not isinstance(plugin, SaturationDetector):
        raise ConfigError(
            f"saturationDetector.pluginRef: plugin '{ref}' is not a fwkflowcontrol.SaturationDetector"
        )
    return plugin
