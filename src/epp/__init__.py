"""A Python Endpoint Picker for LLM inference behind Envoy's ext_proc filter."""

import os

__version__ = "0.1.0"

if os.environ.get("EPP_PURE_PYTHON", "") not in ("", "0"):  # the compiled modules from source
    from epp.compiled import run_from_source

    run_from_source()
