"""What every picker shares: the ``maxNumOfEndpoints`` parameter and a per-instance RNG."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar, Final

from epp.datalayer.api import Endpoint
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.scheduling.api import ProfileRunResult

DEFAULT_MAX_NUM_OF_ENDPOINTS: Final = 1


class PickerParams(PluginParams):
    """``maxNumOfEndpoints``: how many endpoints to return (primary first, then fallbacks)."""

    max_num_of_endpoints: int = DEFAULT_MAX_NUM_OF_ENDPOINTS


class PickerBase(PluginBase):
    """Normalises ``maxNumOfEndpoints`` (``<= 0`` means 1, as in GIE) and owns the RNG.

    ``rng`` is a plain attribute so tests can replace it with a seeded ``random.Random``.
    It is seeded from OS entropy per instance, never from a fixed seed: active-active replicas
    and ``--workers`` processes (exec'd, not forked) share one view of the endpoints, and pickers
    seeded alike would send simultaneous tied decisions to the same endpoint.
    """

    PARAMS: ClassVar[type[PluginParams]] = PickerParams

    def __init__(self, name: str, params: PickerParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        n = params.max_num_of_endpoints
        self.max_num_of_endpoints = n if n > 0 else DEFAULT_MAX_NUM_OF_ENDPOINTS
        self.rng = random.Random()


def pick_uniform(endpoints: Sequence[Endpoint], k: int, rng: random.Random) -> ProfileRunResult:
    """``k`` distinct endpoints in random order: a shuffle's first ``k``, without the shuffle."""
    n = len(endpoints)
    if k == 1:
        return ProfileRunResult((endpoints[rng.randrange(n)],))
    return ProfileRunResult(tuple(endpoints[i] for i in rng.sample(range(n), min(k, n))))
