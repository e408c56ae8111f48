"""Hatch build hook: generate the private Envoy ext_proc stubs and compile the C extensions
before packaging.

The extensions are optional: when the machine has no C compiler or Python headers, or compiling
fails, a warning is printed, the install succeeds and the module that loads it uses its Python
path (each says which at start):

* ``src/epp/director/prefix/_native.c``: the prefix loops (``epp.director.prefix.native``);
* ``src/epp/server/_incoming.c``: ext_proc requests decoded (``epp.server.incoming``);
* ``src/epp/scheduling/_kernel.c``: the fused plan's scoring (``epp.scheduling.kernel``), built
  with ``-ffp-contract=off`` (no fused multiply-adds: its floats must be Python's, bit for bit).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

NATIVE_SOURCE = Path("src/epp/director/prefix/_native.c")
INCOMING_SOURCE = Path("src/epp/server/_incoming.c")
KERNEL_SOURCE = Path("src/epp/scheduling/_kernel.c")
NATIVE_SOURCES = (NATIVE_SOURCE, INCOMING_SOURCE, KERNEL_SOURCE)
FALLBACKS = {
    NATIVE_SOURCE: "the pure-Python prefix loops",
    INCOMING_SOURCE: "upb for every ext_proc message",
    KERNEL_SOURCE: "the fused plan's Python scorers",
}
# Flags a source needs beyond this Python's own (its floats must round as Python's do).
EXTRA_FLAGS = {KERNEL_SOURCE: ("-ffp-contract=off",)}


def native_target(root: Path, source: Path = NATIVE_SOURCE) -> Path:
    """Where the compiled module goes: next to its source, named for this interpreter."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return root / source.with_suffix(suffix)


def compile_native(root: Path, source_path: Path = NATIVE_SOURCE) -> Path:
    """Compile an extension with the compiler and flags this Python was built with (sysconfig).

    The source's SHA-256 is compiled in (``SOURCE_SHA256``) so a test can tell a stale build."""
    source = root / source_path
    target = native_target(root, source_path)
    target.unlink(missing_ok=True)  # a failed build must not leave an older one importable
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    var = sysconfig.get_config_var
    cc = shlex.split(os.environ.get("CC") or var("CC") or "cc")
    ldshared = shlex.split(var("LDSHARED") or "cc -shared")[1:]  # its flags, with our compiler
    cmd = [
        *cc,
        *shlex.split(var("CFLAGS") or ""),
        *shlex.split(var("CCSHARED") or "-fPIC"),
        f"-I{sysconfig.get_paths()['include']}",
        *EXTRA_FLAGS.get(source_path, ()),
        f'-DEPP_NATIVE_SOURCE_SHA256="{digest}"',
        str(source),
        *ldshared,
        "-o",
        str(target),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return target


class ProtoStubsHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "epp-protos"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        stubs = root / "protos" / "gen_envoy_stubs.py"
        spec = importlib.util.spec_from_file_location("gen_envoy_stubs", stubs)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.generate(root / "src")
        self._native(root, build_data)

    def _native(self, root: Path, build_data: dict[str, Any]) -> None:
        for source in NATIVE_SOURCES:
            try:
                target = compile_native(root, source)
            except (OSError, subprocess.CalledProcessError) as e:
                detail = getattr(e, "stderr", "") or str(e)
                self.app.display_warning(
                    f"epp: the C extension {source} did not compile; {FALLBACKS[source]} "
                    f"will be used (slower, same results):\n{detail}"
                )
                continue
            # a platform wheel: the module is a build artifact (gitignored), shipped with the package
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            build_data["artifacts"].append(str(target.relative_to(root)))
