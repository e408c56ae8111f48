"""``EPP_PURE_PYTHON=1`` runs the modules mypyc compiled (hatch_build.py ``COMPILED_MODULES``) from
their source.

Python imports a module's extension before its ``.py``, so a compiled build runs the extension
whatever the environment says.  A profiler sees no frame inside a compiled function (py-spy,
cProfile), and comparing the two builds needs both in one tree: with the variable set, ``epp``
installs this finder before any of its modules is imported, and a module that has both an
extension and its source beside it loads from the source.  The C extensions read the same
variable themselves (``epp.scheduling.kernel``, ``epp.server.incoming``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from pathlib import Path
from types import ModuleType


class SourceFirst(MetaPathFinder):
    """Finds ``epp.*`` modules that were compiled and returns their source's spec instead."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if path is None or not fullname.startswith("epp."):
            return None
        name = fullname.rpartition(".")[2]
        for entry in path:
            source = Path(entry) / f"{name}.py"
            if source.is_file() and any((Path(entry) / f"{name}{s}").is_file() for s in EXTENSION_SUFFIXES):
                return importlib.util.spec_from_file_location(fullname, source)
        return None


def run_from_source() -> None:
    """Put ``SourceFirst`` ahead of the default finders (once)."""
    if not any(isinstance(f, SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceFirst())
