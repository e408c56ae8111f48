"""The modules mypyc compiles at install (hatch_build.py ``COMPILED_MODULES``): built here, and
from the source in the tree.

Python imports a module's extension before its ``.py``, so an edited module whose build is older
would run the old code: this test says so.  A failed build falls back to the source at install
(a warning pip hides): this test does not let that pass either.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"


def _listed() -> list[str]:
    """``COMPILED_MODULES`` read from hatch_build.py (importing it needs hatchling)."""
    tree = ast.parse((ROOT / "hatch_build.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "COMPILED_MODULES" for t in node.targets
        ):
            assert isinstance(node.value, ast.Tuple)
            paths = [ast.literal_eval(call.args[0]) for call in node.value.elts if isinstance(call, ast.Call)]
            return [str(Path(p).relative_to("src")) for p in paths]
    raise AssertionError("hatch_build.py has no COMPILED_MODULES")


def test_every_listed_module_is_compiled_from_the_current_source() -> None:
    listed = _listed()
    assert len(listed) >= 5
    manifest_path = SRC / "epp" / "_compiled.json"
    assert manifest_path.exists(), "mypyc did not build the per-request modules: run make install"
    built = json.loads(manifest_path.read_text())
    assert sorted(built) == sorted(listed)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    # no other module shadowed by an extension (one dropped from the list and left built)
    shadowed = {
        str(p.relative_to(SRC)).removesuffix(suffix) + ".py"
        for p in (SRC / "epp").rglob(f"*{suffix}")
        if p.with_name(p.name.removesuffix(suffix) + ".py").is_file()
    }
    assert shadowed == set(listed)
    for path in listed:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert module.__file__ is not None
        assert module.__file__.endswith(suffix), f"{path} runs as Python: run make install"
        digest = hashlib.sha256((SRC / path).read_bytes()).hexdigest()
        assert built[path] == digest, f"the compiled {path} is older than its source: run make install"


# Routes the same 300 requests (64 prompts, each seen several times: prefix hits, in-flight load)
# through the whole in-process path (bench.hotpath's Envoy side of one connection) and prints,
# per request, where it went and how many bytes the EPP wrote.
_ROUTE = """
import asyncio, json, re, sys
from pathlib import Path
import epp.director.director as director
from bench.hotpath import Client, epp_server, request_messages
from epp.datastore.store import Datastore
from epp.testing.builders import make_endpoint

async def main() -> None:
    store = Datastore()
    server = epp_server(Path(sys.argv[1]).read_text(), 4, datastore=store)
    client = Client(server, [request_messages(i) for i in range(64)])
    out: list[bytes] = []
    client.transport.write = out.append
    rows = []
    for i in range(300):
        for j in range(4):  # the scraped load moves, so the picks do
            live = store.get(f"default/pod-{j}-rank-0")
            live.metrics = make_endpoint(j, queue=(i + j) % 4, kv=((3 * i + j) % 5) / 10).metrics
        out.clear()
        await client.one()
        data = b"".join(out)
        rows.append([m.decode() for m in re.findall(rb"192\\.168\\.1\\.[0-9]+:8000", data)] + [len(data)])
    print(json.dumps({"source": director.__file__.endswith(".py"), "rows": rows}))

asyncio.run(main())
"""


def _route(config: Path, *, pure: bool) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "EPP_PURE_PYTHON"}
    if pure:
        env["EPP_PURE_PYTHON"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", _ROUTE, str(config)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("config", ["config/default.yaml", "bench/configs/prefix-heavy.yaml"])
def test_the_compiled_and_the_source_route_every_request_alike(config: str) -> None:
    """``EPP_PURE_PYTHON=1`` runs the source (``epp.compiled``): the same destinations and the same
    reply bytes a request, request by request, as the compiled build."""
    compiled, source = _route(ROOT / config, pure=False), _route(ROOT / config, pure=True)
    assert compiled["source"] is False
    assert source["source"] is True
    rows = compiled["rows"]
    assert isinstance(rows, list)
    assert len({row[0] for row in rows if len(row) > 1}) >= 2  # the picks vary: a real comparison
    assert rows == source["rows"]
