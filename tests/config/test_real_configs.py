"""Real public EndpointPickerConfig files (tests/config/corpus/, each naming its source) load and route.

Each file is loaded unchanged, built with the production registry, and one request is routed
through the real director and scheduler over four static endpoints (two prefill-capable, two
decode-capable, topology labels on every pod), as ``epp --config-file F --endpoints ...`` would.
Files this EPP still refuses are listed in ``REFUSED`` with the text the refusal must contain
(the field and what to do instead); the count of files that load is asserted, so a fix that
makes one load has to move it out of the list.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from epp.admission.shedding import AlwaysAdmit
from epp.app.build import Components, build
from epp.app.registry import default_registry
from epp.config.load import load_config_file
from epp.datalayer.api import EndpointMetadata
from epp.datalayer.roles import ROLE_LABEL
from epp.datalayer.topology import HOSTNAME_LABEL, ZONE_LABEL
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.errors import ConfigError
from epp.plugin.replicated import Replicated

CORPUS = Path(__file__).resolve().parent / "corpus"
FILES = sorted(CORPUS.glob("*.yaml"))

# file name -> what its refusal must say (the field, and what replaced it or why).
REFUSED: dict[str, str] = {
    # llm-d <= v0.2's prefix-cache-scorer `mode: cache_tracking` loads as precise-prefix-cache-scorer
    # (config/compat_modes.py); then, as v0.7.0's below, its tokenizer is not in this environment
    # (tests/config/test_compat_modes.py loads and routes it with one)
    "llmd-router-v0.5.0--sim-epp-kvcache-config.yaml": "indexerConfig.tokenizersPoolConfig: no tokenizer.json",
    # the tokenizer is read from the pod's cache directory, never downloaded: the file is not in this test's
    # environment, and the error names the field and the paths searched
    "llmd-router-v0.7.0--sim-epp-kvcache-config.yaml": "indexerConfig.tokenizersPoolConfig: no tokenizer.json",
    # upstream's test-only plugin (its integration harness registers it; no EPP binary has it)
    "gie-v1.5.0--integration-datalayer-config.yaml": "plugin type 'mock-metrics-source' is not registered",
    "llmd-router-v0.10.0--integration-datalayer-config.yaml": "plugin type 'mock-metrics-source'",
    "llmd-router-v0.10.0--integration-request-attribute-reporter-config.yaml": "plugin type 'mock-metrics-source'",
    # a deploy template: ${PRIMARY_PORT} is replaced by envsubst before the Go EPP reads it
    "llmd-router-v0.5.0--sim-pd-epp-config.yaml": "plugins[5].parameters.primaryPort",
    # broken upstream too: llm-d-router refuses a profile reference to an undeclared plugin
    "llmd-guides--agentic-serving-gpu.yaml": "schedulingProfiles[1].plugins[1].pluginRef: schedulingProfiles[decode] "
    "references undefined plugin 'active-request-scorer'",
    # not built yet (docs/compatibility.md says why)
    "gie-v1.4.0--chart-latency-predictor.yaml": "plugins[3].type: plugin type 'predicted-latency-scorer' was "
    "removed in GIE 1.5: declare predicted-latency-producer",
}

ROLES = ("prefill", "decode", "prefill", "decode")
HOSTS = ("node-a", "node-a", "node-b", "node-b")
ADDRESSES = {f"10.0.0.{i + 1}" for i in range(len(ROLES))}


def _director(components: Components) -> Director:
    ds = Datastore()
    for i, (role, host) in enumerate(zip(ROLES, HOSTS, strict=True)):
        ds.upsert(
            EndpointMetadata(
                name=f"default/pod-{i}-rank-0",
                address=f"10.0.0.{i + 1}",
                port=8000,
                pod_name=f"pod-{i}",
                namespace="default",
                labels={ROLE_LABEL: role, HOSTNAME_LABEL: host, ZONE_LABEL: "zone-1"},
            )
        )
    for plugin in components.plugins.values():  # what the datastore tells the observers
        for ep in ds.endpoints():
            if hasattr(plugin, "endpoint_added"):
                plugin.endpoint_added(ep)
    pipeline = components.request_control.pipeline(scheduler=components.scheduler, admission=AlwaysAdmit())
    return Director(ds, pipeline)


def test_corpus_sources_are_named() -> None:
    for path in FILES:
        head = path.read_text().splitlines()[:2]
        assert head[0].startswith("# source: https://github.com/"), path.name
        assert "commit " in head[1], path.name


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_real_config_loads_and_routes(path: Path) -> None:
    if path.name in REFUSED:
        with pytest.raises(ConfigError, match=re.escape(REFUSED[path.name])):
            build(load_config_file(path), default_registry())
        return
    components = build(load_config_file(path), default_registry())
    d = _director(components)
    body = orjson.dumps({"model": "m", "prompt": "a new prompt about routing " * 40, "max_tokens": 5})
    try:
        decision = await d.start({}, {}).route(body)
    finally:  # what the server does on shutdown: plugins with clients (tokenizer backends) close them
        for plugin in components.lifecycle:
            await plugin.stop()
    host, _, port = decision.destination.split(",")[0].rpartition(":")
    assert host in ADDRESSES
    assert port.isdigit()


def test_how_many_load() -> None:
    """The corpus's score: update it with REFUSED on every compatibility fix."""
    assert set(REFUSED) <= {p.name for p in FILES}
    assert (len(FILES), len(FILES) - len(REFUSED)) == (62, 54)


def test_every_shared_plugin_of_the_corpus_says_when_it_changed() -> None:
    """The sync hub drains a ``Replicated`` plugin only when it calls ``sync_dirty``; one that
    does not is put on the 5 ms poll, a wake and a drain of every plugin 200 times a second
    on every replica.  Every shared plugin a real config (or a benchmark's) builds must say
    when it changed."""
    shared: set[str] = set()
    bench = sorted((CORPUS.parents[2] / "bench" / "configs").glob("prefix-heavy*.yaml"))
    for path in [*FILES, *bench]:
        if path.name in REFUSED:
            continue
        for plugin in build(load_config_file(path), default_registry()).plugins.values():
            if isinstance(plugin, Replicated) and getattr(plugin, "replicated", True) is not False:
                assert hasattr(plugin, "sync_dirty"), f"{path.name}: {plugin.typed_name} is polled"
                shared.add(type(plugin).__name__)
    assert {"InFlightLoadProducer", "ApproxPrefixCacheProducer", "PrefillLoadScorer"} <= shared
