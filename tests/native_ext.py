"""What the C extensions' tests share: the traced memory their calls leave behind, and what a
fresh interpreter reports with the pure-Python switch set."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable

# One leaked small object a call over ~100k calls would be megabytes; this is the allocator's own
# bookkeeping.
TOLERANCE = 64 * 1024


def traced_growth(exercise: Callable[[int], None], *, settle: int, measured: int) -> int:
    """Bytes of traced memory grown by ``exercise(measured)``, after ``exercise(settle)`` traced
    (the tracer's own start-up).  The caller warms up first (caches, interned objects)."""
    tracemalloc.start()
    try:
        exercise(settle)
        gc.collect()
        before, _ = tracemalloc.get_traced_memory()
        exercise(measured)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return after - before


def printed_with(code: str, variable: str, value: str) -> list[str]:
    """The words ``code`` prints in a fresh interpreter with the environment ``variable`` set to
    ``value`` (an extension's choice of implementation is made at import)."""
    env = {**os.environ, variable: value}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()
