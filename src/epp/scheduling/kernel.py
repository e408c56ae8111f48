"""The fused plan's scoring in C, when the extension was built: a fenced leaf.

Per request the fused plan (``epp.scheduling.fused``) adds the score cache's lists and runs the
request-dependent scorers in Python; with prefix-heavy's five scorers that is ~57k instructions
a request (docs/decisions.md, "Eleventh pass"), almost all of it Python's cost per step.
``_kernel.c`` computes the same totals in one call, for profiles made only of the cached metrics
scorers, ``prefix-cache-scorer`` (``matchLengthWeight`` 0), ``token-load-scorer`` and
``prefill-load-scorer``: ``Plan(ops)`` is compiled once per profile, ``Plan.totals(...)`` runs
per request over the same Python containers the scorers read (the cycle state's attribute
dicts, the prefill backlog dict, the score cache's lists).  It returns None, having changed
nothing, when an input is outside what it computes exactly (an int above 2**53, a value that is
not an exact int or float, a container that is not a plain list, tuple or dict): the caller then
runs the Python path.

This module is a leaf (it imports nothing of the EPP; ``_kernel.c`` includes nothing of it).
Reference: the EPP's Python scorers and ``combine`` (epp.scheduling.weighting), which stay the
Python path; tests/scheduling/test_kernel.py compares the totals bit for bit on hypothesis input.

The extension is compiled by ``hatch_build.py`` at install (``pip install -e .`` or a wheel)
with the machine's C compiler and ``-ffp-contract=off``; when that failed, or
``EPP_PURE_PYTHON=1`` is set, ``Plan`` is None and every plan takes the Python path.
``IMPLEMENTATION`` is "c" or "python", ``REASON`` why Python, ``NATIVE`` the compiled module
(None only when not built), ``BUILT_FROM`` the SHA-256 of the ``_kernel.c`` it was built from.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, Final

PURE_PYTHON_ENV: Final = "EPP_PURE_PYTHON"

# The op kinds ``Plan`` takes, as ``(kind, slot, weight, cap)``: a cached list (slot: the score
# cache's list), prefix-cache-scorer, token-load-scorer (cap: its threshold), prefill-load-scorer.
CACHED: Final = 0
PREFIX: Final = 1
TOKEN: Final = 2
PREFILL: Final = 3


def _load() -> tuple[ModuleType | None, str]:
    """The compiled module, or None and why not."""
    try:
        # by name, not ``from . import``: the extension is part of this leaf, not an EPP module
        return importlib.import_module(f"{__package__}._kernel"), ""
    except ImportError as e:
        return None, f"the C extension is not built ({e}); reinstall with a C compiler: pip install -e ."


NATIVE, _why = _load()
_forced = os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")
Plan: Final[Any] = None if NATIVE is None or _forced else NATIVE.Plan
# the SHA-256 of the _kernel.c compiled
BUILT_FROM: Final[str | None] = getattr(NATIVE, "SOURCE_SHA256", None)
REASON: Final = f"{PURE_PYTHON_ENV} is set" if _forced else _why
IMPLEMENTATION: Final = "python" if Plan is None else "c"
