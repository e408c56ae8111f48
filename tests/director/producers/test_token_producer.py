"""token-producer: llm-d-router's backends and parameters (estimate, vllm render, UDS tokenizer
service, local / hf tokenizer.json) and its older type name ``tokenizer``; the vLLM backend and
the precise scorer's ordering against the simulator."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from epp.app.build import build
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.director.dag import order_producers, producer_timeout
from epp.director.producers.token_producer import LegacyTokenizer, TokenProducer
from epp.errors import ConfigError
from epp.plugin.state import CycleState
from epp.request import ApiKind
from epp.testing.builders import chat_body, make_request
from epp_sim.config import FleetConfig
from epp_sim.fleet import Fleet
from epp_sim.tokens import render_chat, token_ids
from tests.datalayer.servers import serving
from tests.epp_sim.helpers import engine_config

CONFIG = """
apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
plugins:
- type: TYPE
  parameters: PARAMS
- type: decode-filter
"""


def load(params: dict[str, Any], plugin_type: str = "token-producer") -> Any:
    config = CONFIG.replace("TYPE", plugin_type).replace("PARAMS", repr(params))
    components = build(load_config(config), default_registry())
    return components.plugins[plugin_type]


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"estimate": {"image": {"mode": "static", "static": {"staticToken": 256}}}},
        {"estimate": {"video": {"tokensPerFrame": {"mode": "dynamic"}, "frames": {"mode": "strided"}}}},
    ],
)
def test_estimate_backend_loads(params: dict[str, Any]) -> None:
    plugin = load(params)
    assert plugin.backend == "estimate" and plugin.tokens is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"estimate": {}, "vllm": {"url": "http://x"}}, "only one of"),
        ({"vllm": {"url": "http://x"}, "udsTokenizerConfig": {"socketFile": "/s"}}, "only one of"),
        ({"vllm": {"url": "http://x"}}, "'modelName' must be specified"),
        ({"udsTokenizerConfig": {"socketFile": "/s"}}, "'modelName' must be specified"),
        ({"estimate": {"image": {"mode": "guess"}}}, "estimate.image.mode"),
        ({"estimate": {"video": {"frames": {"mode": "all"}}}}, "estimate.video.frames.mode"),
        ({"modelName": "m", "vllm": {"timeout": "5 seconds"}}, "vllm.timeout"),
        ({"modelName": "m", "vllm": {"url": "unix:///x"}}, "vllm.url"),
        (
            {"modelName": "m", "udsTokenizerConfig": {"socketFile": "/s", "modelTokenizerMap": {"o": "/t"}}},
            "modelTokenizerMap",
        ),
        (
            {"modelName": "m", "local": {"autoDiscoveryDir": "/nonexistent"}},
            "no tokenizer.json for modelName 'm'",
        ),
    ],
)
def test_bad_configurations_name_the_field(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(params)


def test_backend_selection_follows_upstream() -> None:
    # modelName alone selects vllm with upstream's default URL; an empty udsTokenizerConfig is off
    plugin = load({"modelName": "m", "udsTokenizerConfig": {}})
    assert plugin.backend == "vllm" and plugin.tokens.url == "http://localhost:8000"
    assert (plugin.tokens.timeout, plugin.tokens.mm_timeout) == (5.0, 30.0)
    plugin = load(
        {"modelName": "m", "vllm": {"url": "http://render:9000/", "timeout": "1m30s", "mmTimeout": "250ms"}}
    )
    assert (plugin.tokens.url, plugin.tokens.timeout, plugin.tokens.mm_timeout) == (
        "http://render:9000",
        90.0,
        0.25,
    )
    uds = load({"modelName": "m", "udsTokenizerConfig": {"socketFile": "127.0.0.1:1", "useTCP": True}})
    assert uds.backend == "uds" and uds.tokens.target == "127.0.0.1:1"


def test_render_backend_declares_its_worst_case_timeout() -> None:
    """Upstream's vllmHTTPRenderer.produceTimeout: the larger of timeout and mmTimeout, so the
    director waits for a render past its default; in-memory backends keep the default."""
    assert producer_timeout(load({"modelName": "m"}), 0.4) == 30.0
    slow_text = load({"modelName": "m", "vllm": {"timeout": "1m30s", "mmTimeout": "250ms"}})
    assert producer_timeout(slow_text, 0.4) == 90.0
    assert producer_timeout(load({}), 0.4) == 0.4  # estimate


def test_legacy_type_name_warns_and_loads(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    plugin = load({"modelName": "m"}, "tokenizer")
    assert isinstance(plugin, LegacyTokenizer) and isinstance(plugin, TokenProducer)
    assert plugin.backend == "vllm"
    out = capsys.readouterr().out + caplog.text
    assert "deprecated_plugin_type" in out and "token-producer" in out


@pytest.fixture
def tokenizer_json(tmp_path: Path) -> Path:
    words = ["[UNK]", "the", "cat", "sat"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def place(tokenizer: Path, directory: Path) -> Path:
    directory.mkdir(parents=True)
    shutil.copy(tokenizer, directory / "tokenizer.json")
    return directory


async def test_local_and_hf_tokenizer_files(tmp_path: Path, tokenizer_json: Path) -> None:
    """llm-d-kv-cache's discovery: the HuggingFace cache layout names org/name, any other directory
    its path; modelTokenizerMap first; hf reads tokenizersCacheDir."""
    hub = place(tokenizer_json, tmp_path / "models" / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc123")
    custom = place(tokenizer_json, tmp_path / "models" / "org" / "team" / "model")
    root = str(tmp_path / "models")
    plugin = load({"modelName": "Qwen/Qwen3-0.6B", "local": {"autoDiscoveryDir": root}})
    assert plugin.backend == "local" and plugin.tokenizer_path == str(hub / "tokenizer.json")
    assert load({"modelName": "org/team/model", "local": {"autoDiscoveryDir": root}}).tokenizer_path == str(
        custom / "tokenizer.json"
    )
    mapped = load({"modelName": "x", "local": {"modelTokenizerMap": {"x": str(tokenizer_json)}}})
    assert mapped.tokenizer_path == str(tokenizer_json)
    hf = load({"modelName": "Qwen/Qwen3-0.6B", "hf": {"tokenizersCacheDir": root}})
    assert hf.backend == "hf" and hf.tokenizer_path == str(hub / "tokenizer.json")
    with pytest.raises(ConfigError, match="does not download"):
        load({"modelName": "meta/llama", "hf": {"tokenizersCacheDir": root, "huggingFaceToken": "t"}})
    # producing: the ids go on the body, and a request that came tokenised is left alone
    request = make_request(prompt="the cat sat")
    await plugin.prepare_request_data(CycleState(), request, [])
    assert request.body is not None and list(request.body.token_ids or []) == [1, 2, 3]
    await plugin.prepare_request_data(CycleState(), request, [])
    assert (plugin.produced, plugin.skipped) == (1, 1)


async def test_vllm_render_backend_against_the_simulator() -> None:
    """The simulator serves vLLM's render API: completions and chat get the engine's own ids."""
    async with Fleet(FleetConfig(engine=engine_config())) as fleet:
        rank = fleet.rank(0)
        plugin = load({"modelName": "mock-model", "vllm": {"url": rank.url}})
        await plugin.start()
        try:
            completion = make_request(prompt="The quick brown fox")
            await plugin.prepare_request_data(CycleState(), completion, [])
            assert completion.body is not None
            assert list(completion.body.token_ids or []) == token_ids("The quick brown fox").tolist()
            messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
            chat = make_request(api=ApiKind.CHAT_COMPLETIONS)
            chat.body = chat_body(messages)
            await plugin.prepare_request_data(CycleState(), chat, [])
            assert list(chat.body.token_ids or []) == token_ids(render_chat(messages)).tolist()
            assert plugin.debug_state()["client"] == {
                "backend": "vllm", "url": rank.url, "api": "render", "calls": 2, "failures": 0,
            }  # fmt: skip
        finally:
            await plugin.stop()


async def test_vllm_without_render_api_uses_tokenize() -> None:
    """An older vLLM answers 404 on the render paths: /tokenize from then on."""
    from aiohttp import web

    seen: list[str] = []

    async def tokenize(request: web.Request) -> web.Response:
        doc = await request.json()
        seen.append(doc["model"])
        return web.json_response({"count": 2, "max_model_len": 100, "tokens": [7, 8], "token_strs": None})

    async with serving({"/tokenize": tokenize}) as port:
        plugin = load({"modelName": "base", "vllm": {"url": f"http://127.0.0.1:{port}"}})
        request = make_request(prompt="anything", model="served-alias")
        await plugin.prepare_request_data(CycleState(), request, [])
        await plugin.stop()
    assert request.body is not None and list(request.body.token_ids or []) == [7, 8]
    assert plugin.tokens.legacy and seen == ["base"]  # upstream sends modelName, not the alias


async def test_unreachable_render_url_is_a_logged_fallback(capsys: pytest.CaptureFixture[str]) -> None:
    """As upstream: the EPP starts, each request goes on untokenised (its length estimated)."""
    async with serving({}) as port:
        pass  # the port is closed again: nothing listens there
    plugin = load({"modelName": "m", "vllm": {"url": f"http://127.0.0.1:{port}", "timeout": "500ms"}})
    await plugin.start()
    request = make_request(prompt="hello there")
    await plugin.prepare_request_data(CycleState(), request, [])
    await plugin.stop()
    assert request.body is not None and request.body.token_ids is None
    assert plugin.failed == 1 and plugin.debug_state()["client"]["failures"] == 1
    assert "token_producer_unreachable" in capsys.readouterr().out


async def test_a_failing_backend_is_skipped_for_a_while() -> None:
    """Three failures in a row: the next requests go on at once, untokenised, for 1 s (doubling
    while the backend keeps failing), instead of each spending the producer budget waiting."""
    async with serving({}) as port:
        pass  # nothing listens there
    plugin = load({"modelName": "m", "vllm": {"url": f"http://127.0.0.1:{port}"}})
    for _ in range(5):
        await plugin.prepare_request_data(CycleState(), make_request(prompt="x"), [])
    await plugin.stop()
    assert (plugin.failed, plugin.bypassed, plugin.tokens.calls) == (3, 2, 3)
    state = plugin.debug_state()
    assert 0 < state["backingOffSeconds"] <= 1.0 and plugin.backoff == 2.0


def test_precise_scorer_runs_after_the_token_producer() -> None:
    config = """
apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
  parameters: {kvEventsConfig: {discoverPods: false, endpoints: {a: "tcp://127.0.0.1:1"}}}
- type: token-producer
  parameters: {modelName: m}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: precise-prefix-cache-scorer}]
"""
    components = build(load_config(config), default_registry())
    order = [p.typed_name.type for p in order_producers(list(components.plugins.values()))]
    assert order.index("token-producer") < order.index("precise-prefix-cache-scorer")
