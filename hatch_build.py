"""Hatch build hook: generate the private Envoy ext_proc stubs and compile the C extensions
before packaging.

The extensions are optional: when the machine has no C compiler or Python headers, or compiling
fails, a warning is printed, the install succeeds and the module that loads it uses its Python
path (each says which at start):

* ``src/epp/director/prefix/_native.c``: the prefix loops (``epp.director.prefix.native``);
* ``src/epp/server/_incoming.c``: ext_proc requests decoded (``epp.server.incoming``);
* ``src/epp/scheduling/_kernel.c``: the fused plan's scoring (``epp.scheduling.kernel``), built
  with ``-ffp-contract=off`` (no fused multiply-adds: its floats must be Python's, bit for bit);
* ``COMPILED_MODULES``: the session's and the director's per-request Python, compiled by mypyc
  from the same source (without it Python runs the ``.py`` files).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
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


# Python modules compiled with mypyc (issue 31): the per-request path of the session and the
# director, where the EPP's own work beyond the no-op ext_proc server runs as interpreted Python
# (bench.hotpath: ~40% less of it compiled; docs/decisions.md, "The per-request path compiled").
# Same source, same behaviour: the tests run on the compiled modules; without a compiler (or mypy)
# the install keeps the .py files, which Python imports instead.
COMPILED_MODULES = (
    Path("src/epp/server/session.py"),
    Path("src/epp/director/director.py"),
    Path("src/epp/director/lifecycle.py"),
    Path("src/epp/director/response.py"),
    Path("src/epp/director/after_reply.py"),
    Path("src/epp/director/candidates.py"),
    Path("src/epp/director/producers/inflight_load.py"),
    Path("src/epp/scheduling/scorers/prefill_load.py"),
    Path("src/epp/health/state.py"),
    # the sync hub's batches (issue 30): each costs a replica per peer, whatever it carries
    Path("src/epp/sync/hub.py"),
    Path("src/epp/plugin/origin_shares.py"),
)
COMPILED_GROUP = "epp.compiled"  # mypyc's shared library: src/epp/compiled__mypyc.<suffix>
# each compiled module's source SHA-256 (tests/test_compiled.py tells a stale build)
COMPILED_MANIFEST = Path("src/epp/_compiled.json")
# Run in a child so mypy's state stays out of the hook.  Third-party imports are Any to mypyc (the
# build environment has only the build requirements); the EPP's own modules are read for types.
# The generated protobuf stubs (epp/_pb) are skipped: Any to mypyc, as they are run through upb.
_MYPYC_CONFIG = """[mypy]
ignore_missing_imports = True
follow_imports = silent
incremental = False

[mypy-epp._pb.*]
follow_imports = skip
follow_imports_for_stubs = True
"""
_MYPYC_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
tmp, group, *paths = sys.argv[1:]
options = ["--config-file", tmp + "/mypy.ini"]
setup(
    name="epp-compiled",
    ext_modules=mypycify([*options, *paths], opt_level="3", group_name=group, target_dir=tmp + "/c"),
    script_args=["build_ext", "--inplace", "--build-temp", tmp + "/o", "--build-lib", tmp + "/lib"],
)
"""


def compiled_targets(root: Path) -> list[Path]:
    """Each compiled module's extension, then the group's shared library."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    shared = root / "src" / (COMPILED_GROUP.replace(".", "/") + "__mypyc" + suffix)
    return [root / m.with_suffix(suffix) for m in COMPILED_MODULES] + [shared]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shadowing(root: Path) -> list[Path]:
    """Extensions beside a ``.py`` of the same name under src/epp: mypyc's builds, of this list or
    of an earlier one (the C extensions have ``.c`` sources)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    found = (root / "src" / "epp").rglob(f"*{suffix}")
    return sorted(p for p in found if p.with_name(p.name.removesuffix(suffix) + ".py").is_file())


def compile_python(root: Path) -> list[Path]:
    """Compile ``COMPILED_MODULES`` with mypyc next to their sources; write the manifest."""
    targets = compiled_targets(root)
    manifest = root / COMPILED_MANIFEST
    # a failed build must not leave an older one importable, nor a module no longer listed
    for t in {*targets, *shadowing(root), manifest}:
        t.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="epp-mypyc-") as tmp:
        (Path(tmp) / "mypy.ini").write_text(_MYPYC_CONFIG)
        paths = [str(m.relative_to("src")) for m in COMPILED_MODULES]
        cmd = [sys.executable, "-c", _MYPYC_SETUP, tmp, COMPILED_GROUP, *paths]
        subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=root / "src")
    missing = [t for t in targets if not t.exists()]
    if missing:
        raise OSError(f"mypyc built no {', '.join(map(str, missing))}")
    digests = {str(m.relative_to("src")): _sha256(root / m) for m in COMPILED_MODULES}
    manifest.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    return targets


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
        self._compiled(root, build_data)

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

    def _compiled(self, root: Path, build_data: dict[str, Any]) -> None:
        try:
            targets = compile_python(root)
        except (OSError, subprocess.CalledProcessError) as e:
            detail = f"{getattr(e, 'stdout', '')}{getattr(e, 'stderr', '')}" or str(e)
            self.app.display_warning(
                f"epp: mypyc did not compile {len(COMPILED_MODULES)} modules; their Python source "
                f"will run (slower, same results):\n{detail[-4000:]}"
            )
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        build_data["artifacts"] += [str(t.relative_to(root)) for t in (*targets, root / COMPILED_MANIFEST)]
