"""models-data-source and models-data-extractor: the ``/v1/models`` poller against the simulator.

Vectors from llm-d-router's source/models and extractor/models tests at ebab68792: an empty
response stores an empty list, ``food-review`` with the adapter ``lora1`` (parent
``food-review``) is stored whole, and the TLS files are read at construction.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from epp.app.build import BuildOptions, build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.datalayer.extractors.models import ModelsDataExtractor
from epp.datalayer.runtime import DataLayerRuntime
from epp.datalayer.served_models import ModelData, ModelList, ModelsResponseError, parse_models
from epp.datalayer.sources.models import ModelsDataSource, ModelsDataSourceParams
from epp.datastore.store import Datastore
from epp.errors import ConfigError
from epp.testing.plugins import FakeHandle
from epp.testing.waiting import until
from epp_sim.config import FleetConfig
from epp_sim.fleet import Fleet
from tests.datalayer.conftest import make_endpoint
from tests.epp_sim.helpers import engine_config


def _source(**params: Any) -> ModelsDataSource:
    return ModelsDataSource("models-data-source", ModelsDataSourceParams.model_validate(params), FakeHandle())


def _extractor() -> ModelsDataExtractor:
    return ModelsDataExtractor("models-data-extractor", ModelsDataSourceParams(), FakeHandle())


@pytest.mark.parametrize(
    ("params", "field", "value"),
    [
        pytest.param({}, "scheme", "http", id="scheme"),
        pytest.param({}, "path", "/v1/models", id="path"),
        pytest.param({}, "insecure_skip_verify", True, id="insecure"),
        pytest.param({"interval": "5s"}, "interval", 5.0, id="interval"),
    ],
)
def test_params(params: dict[str, Any], field: str, value: Any) -> None:
    """Upstream's defaults."""
    assert getattr(ModelsDataSourceParams.model_validate(params), field) == value


def test_param_errors() -> None:
    with pytest.raises(ValidationError, match="unsupported scheme: ftp"):
        ModelsDataSourceParams.model_validate({"scheme": "ftp"})
    with pytest.raises(ValidationError, match="Extra inputs"):
        ModelsDataSourceParams.model_validate({"port": 8000})  # upstream's models source has none


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param(
            {"scheme": "https", "clientCertPath": "/nope/c.pem", "clientKeyPath": "/nope/k.pem"},
            "loading client cert",
            id="client-cert",
        ),
        pytest.param(
            {"scheme": "https", "insecureSkipVerify": False, "caCertPath": "/nope/ca.pem"},
            "reading CA cert",
            id="ca",
        ),
    ],
)
def test_tls_files_are_read_at_construction(params: dict[str, Any], message: str) -> None:
    """Upstream's TestModelDataSourceFactory_TLS."""
    with pytest.raises(ConfigError, match=message):
        _source(**params)


def test_parse_vectors() -> None:
    """Upstream's extractor vectors: an empty response and a model with one adapter."""
    assert parse_models(b"{}") == ModelList()
    body = b'{"object":"list","data":[{"id":"food-review"},{"id":"lora1","parent":"food-review"}]}'
    assert parse_models(body) == ModelList(
        object="list", data=(ModelData(id="food-review"), ModelData(id="lora1", parent="food-review"))
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(b"not json", "invalid JSON", id="not-json"),
        pytest.param(b"[]", "expected an object", id="not-object"),
        pytest.param(b'{"data": {}}', "data: expected a list", id="data-not-list"),
        pytest.param(b'{"data": [{"id": 3}]}', r"data\[0\]\.id: expected a string", id="id-type"),
        pytest.param(b'{"data": [{"id": "m", "created": "x"}]}', r"data\[0\]\.created", id="created-type"),
    ],
)
def test_parse_errors(body: bytes, message: str) -> None:
    with pytest.raises(ModelsResponseError, match=message):
        parse_models(body)


def test_extractor_stores_replaces_and_forgets() -> None:
    """Each successful poll replaces the endpoint's list; an empty response stores an empty one."""
    ext = _extractor()
    ep = make_endpoint()
    assert ext.models(ep) == ()
    ext.extract(parse_models(b'{"data":[{"id":"food-review"},{"id":"lora1","parent":"food-review"}]}'), ep)
    assert [m.id for m in ext.models(ep)] == ["food-review", "lora1"]
    assert ext.adapters(ep) == ("lora1",)
    ext.extract(parse_models(b"{}"), ep)
    assert ext.models(ep) == ()
    ext.extract(parse_models(b'{"data":[{"id":"m"}]}'), ep)
    ext.endpoint_removed(ep)
    assert ext.models(ep) == ()


async def test_polls_the_simulators_models_and_adapters() -> None:
    """The simulator answers vLLM's /v1/models: the base model and, with a parent, each adapter,
    including one loaded at run time."""
    config = FleetConfig(
        replicas=1, engine=engine_config(model="base-model", lora_modules=("sql-lora=/p/sql",))
    )
    source, ext = _source(), _extractor()
    await source.start()
    try:
        async with Fleet(config) as fleet:
            rank = fleet.rank(0)
            ep = make_endpoint(port=rank.port)
            ext.extract(await source.poll(ep), ep)
            assert [(m.id, m.parent) for m in ext.models(ep)] == [
                ("base-model", ""),
                ("sql-lora", "base-model"),
            ]
            async with aiohttp.ClientSession() as http:
                url = f"http://127.0.0.1:{rank.port}/v1/load_lora_adapter"
                async with http.post(url, json={"lora_name": "tweet-lora", "lora_path": "/p/tweet"}) as r:
                    assert r.status == 200
            ext.extract(await source.poll(ep), ep)
            assert ext.adapters(ep) == ("sql-lora", "tweet-lora")
    finally:
        await source.stop()


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: models-data-source
  name: vllm-models-source
  parameters:
    interval: "20ms"
- type: models-data-extractor
  name: vllm-models-extractor
dataLayer:
  sources:
  - pluginRef: vllm-models-source
    extractors:
    - pluginRef: vllm-models-extractor
"""


async def test_config_wired_source_feeds_the_extractor() -> None:
    """As the config wires them (upstream's README example): the runtime polls, the extractor keeps."""
    components = build(load_config(CONFIG), default_registry(entry_points=False), BuildOptions())
    ext = components.plugins["vllm-models-extractor"]
    assert isinstance(ext, ModelsDataExtractor)
    config = FleetConfig(replicas=1, engine=engine_config(model="base-model", lora_modules=("a1",)))
    async with Fleet(config) as fleet:
        ds = Datastore()
        async with DataLayerRuntime(ds, components.data_sources, refresh_interval=0.02):
            ep = ds.upsert(make_endpoint(port=fleet.rank(0).port).metadata)
            await until(lambda: ext.adapters(ep) == ("a1",), what="the adapters polled")
