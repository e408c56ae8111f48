"""Scheduling assembles itself: ``schedulingProfiles`` + instantiated plugins → a ``Scheduler``.

Why here and not in ``epp.app``: which plugin is a filter, scorer, picker or profile
handler, what a profile without a picker gets and how weights apply is scheduling's
knowledge (gie-inventory §8.2 steps 6-8).  The builder (``epp.app.build``) hands over the
file's ``schedulingProfiles`` section (``epp.config.schema``'s models, a layer below) and a
``PluginSet``; nothing here knows the registry.

Two steps, as in GIE's loader: ``plan`` runs with the other system defaults (step 6), so a
default profile sees only the configured plugins and other concepts may still add theirs;
``SchedulingPlan.build`` then resolves references and builds the scheduler (steps 7-8).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import structlog

from epp.config.schema import SchedulingProfile
from epp.errors import ConfigError
from epp.plugin.assembly import PluginSet, label
from epp.scheduling.api import Filter, Picker, ProfileHandler, Scorer
from epp.scheduling.scheduler import Scheduler, SchedulerProfile, SchedulingError

log = structlog.get_logger(__name__)

DEFAULT_PROFILE: Final = "default"
DEFAULT_SCORER_WEIGHT: Final = 1.0
SINGLE_PROFILE_HANDLER: Final = "single-profile-handler"
MAX_SCORE_PICKER: Final = "max-score-picker"


@dataclass(frozen=True, slots=True)
class _Ref:
    plugin: str
    weight: float | None
    path: str  # config path, for errors


@dataclass(frozen=True, slots=True)
class SchedulingPlan:
    """The profiles to build, by reference, and the picker of profiles that name none."""

    profiles: tuple[tuple[str, tuple[_Ref, ...]], ...]
    default_picker: Picker

    def build(self, plugins: PluginSet) -> Scheduler:
        """Steps 7-8: profile references, the one profile handler, then the scheduler."""
        for name, refs in self.profiles:
            for ref in refs:
                if ref.plugin not in plugins:
                    raise ConfigError(
                        f"{ref.path}: schedulingProfiles[{name}] references undefined plugin '{ref.plugin}'"
                    )
        handlers = [p for p in plugins.values() if isinstance(p, ProfileHandler)]
        if len(handlers) > 1:
            names = ", ".join(f"'{h.typed_name.name}'" for h in handlers)
            raise ConfigError(f"plugins: multiple profile handlers found ({names}); only one is allowed")
        if not handlers:
            raise ConfigError("schedulingProfiles: no profile handler configured")
        handler = handlers[0]
        limit = getattr(handler, "MAX_PROFILES", None)
        if limit is not None and len(self.profiles) > limit:
            if limit == 1:
                msg = "SingleProfileHandler cannot support multiple scheduling profiles"
            else:
                msg = f"profile handler '{label(handler)}' supports at most {limit} scheduling profiles"
            raise ConfigError(f"schedulingProfiles: {msg} (got {len(self.profiles)})")

        bind = getattr(handler, "bind_plugins", None)  # handlers that name other plugins (P/D deciders)
        if bind is not None:
            try:
                bind(plugins.get)
                check = getattr(handler, "check_profiles", None)  # handlers that name profiles
                if check is not None:
                    check([name for name, _ in self.profiles])
            except (ValueError, TypeError) as e:
                raise ConfigError(f"plugins ({label(handler)}): {e}") from None
        built = [self._profile(name, refs, plugins) for name, refs in self.profiles]
        try:
            return Scheduler(handler, built)
        except (SchedulingError, ValueError, TypeError) as e:
            raise ConfigError(f"schedulingProfiles: {e}") from None

    def _profile(self, name: str, refs: Sequence[_Ref], plugins: PluginSet) -> SchedulerProfile:
        filters: list[Filter] = []
        scorers: list[tuple[Scorer, float]] = []
        picker: Picker | None = None
        for ref in refs:
            plugin = plugins.get(ref.plugin)
            used = False
            if isinstance(plugin, Filter):
                filters.append(plugin)
                used = True
            if isinstance(plugin, Scorer):
                used = True
                w = DEFAULT_SCORER_WEIGHT if ref.weight is None else ref.weight
                if w == 0:
                    # Contributes nothing to any total; skipping it saves its cost per request.
                    log.warning(
                        "zero_weight_scorer_skipped", profile=name, plugin=label(plugin), path=ref.path
                    )
                else:
                    scorers.append((plugin, w))
            elif ref.weight is not None:
                log.warning("weight_ignored_not_a_scorer", profile=name, plugin=label(plugin), path=ref.path)
            if isinstance(plugin, Picker):
                used = True
                if picker is not None:
                    raise ConfigError(
                        f"{ref.path}: failed to set '{ref.plugin}' as picker, already have a registered "
                        f"picker plugin '{picker.typed_name.name}'"
                    )
                picker = plugin
            if not used:
                log.warning("profile_plugin_ignored", profile=name, plugin=label(plugin), path=ref.path)
        try:
            return SchedulerProfile(
                name, filters=filters, scorers=scorers, picker=picker or self.default_picker
            )
        except (SchedulingError, ValueError, TypeError) as e:
            raise ConfigError(f"schedulingProfiles[{name}]: {e}") from None


def plan(sections: Sequence[SchedulingProfile], plugins: PluginSet) -> SchedulingPlan:
    """Step 6 for scheduling: the default profile, profile handler and picker.

    Without ``schedulingProfiles`` the one profile holds every filter, scorer and picker
    built so far (GIE: in map order; here in config order).
    """
    profiles: list[tuple[str, tuple[_Ref, ...]]] = []
    if sections:
        for i, prof in enumerate(sections):
            refs = tuple(
                _Ref(ref.plugin_ref, ref.weight, f"schedulingProfiles[{i}].plugins[{j}].pluginRef")
                for j, ref in enumerate(prof.plugins)
            )
            profiles.append((prof.name, refs))
    else:
        default_refs = tuple(
            _Ref(name, None, f"plugins[{i}] (default profile)")
            for i, name in enumerate(plugins)
            if isinstance(plugins.get(name), (Filter, Scorer, Picker))
        )
        profiles.append((DEFAULT_PROFILE, default_refs))

    if len(profiles) == 1 and not any(isinstance(p, ProfileHandler) for p in plugins.values()):
        plugins.ensure(SINGLE_PROFILE_HANDLER, "schedulingProfiles")
    pickers = [p for p in plugins.values() if isinstance(p, Picker)]
    if not pickers:
        default_plugin = plugins.ensure(MAX_SCORE_PICKER, "schedulingProfiles")
        if not isinstance(default_plugin, Picker):
            raise ConfigError(f"schedulingProfiles: default plugin '{label(default_plugin)}' is not a picker")
        pickers.append(default_plugin)
    return SchedulingPlan(tuple(profiles), pickers[0])
