"""Token ids as the engine sees them: a local tokenizer.json, or the engine's own POST /tokenize."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from epp.datalayer.kvevents.tokens import LocalTokenizer, ServerTokenizer, render_chatml
from epp.request import ApiKind
from epp.testing.builders import chat_body, completions_body, make_endpoint, make_request
from epp_sim.config import FleetConfig
from epp_sim.fleet import Fleet
from epp_sim.tokens import render_chat, token_ids
from tests.datalayer.servers import Handler, serving
from tests.epp_sim.helpers import engine_config

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "hi"}]},
]


@pytest.fixture
def tokenizer_json(tmp_path: Path) -> str:
    words = ["[UNK]", "<|im_start|>system", "<|im_start|>user", "<|im_start|>assistant", "be", "brief", "hi"]
    words += ["<|im_end|>", "the", "cat"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_chatml_is_the_simulators_template() -> None:
    assert render_chatml(MESSAGES) == render_chat(MESSAGES)


async def test_local_tokenizer(tokenizer_json: str) -> None:
    local = LocalTokenizer(tokenizer_json)
    ep = [make_endpoint(0)]
    assert await local.token_ids(make_request(prompt="the cat"), ep) == [8, 9]
    chat = make_request(api=ApiKind.CHAT_COMPLETIONS, body={"model": "m", "messages": MESSAGES})
    chat.body = chat_body(MESSAGES)
    assert await local.token_ids(chat, ep) == local.encode(render_chatml(MESSAGES), add_special_tokens=False)
    given = make_request()
    given.body = completions_body([5, 6, 7])
    assert await local.token_ids(given, ep) == [5, 6, 7]  # pre-tokenized prompts are used as they are


async def test_server_tokenizer_returns_the_engines_ids() -> None:
    async with Fleet(FleetConfig(engine=engine_config())) as fleet:
        rank = fleet.rank(0)
        ep = [make_endpoint(0, address="127.0.0.1", port=rank.port)]
        server = ServerTokenizer()
        try:
            prompt = make_request(model="mock-model", prompt="a shared system prompt, then a question")
            assert (
                await server.token_ids(prompt, ep)
                == token_ids("a shared system prompt, then a question").tolist()
            )
            chat = make_request(model="mock-model")
            chat.body = chat_body(MESSAGES, model="mock-model")
            assert await server.token_ids(chat, ep) == token_ids(render_chat(MESSAGES)).tolist()
            assert await server.token_ids(prompt, []) is None
        finally:
            await server.close()


async def test_server_tokenizer_passes_template_fields_and_takes_turns() -> None:
    """Fields that change the engine's chat rendering reach /tokenize; candidates take turns."""
    from aiohttp import web

    seen: list[tuple[int, dict[str, Any]]] = []

    def engine(index: int) -> Handler:
        async def tokenize(request: web.Request) -> web.Response:
            seen.append((index, await request.json()))
            return web.json_response({"count": 1, "max_model_len": 10, "tokens": [index], "token_strs": None})

        return tokenize

    server = ServerTokenizer()
    async with serving({"/tokenize": engine(0)}) as p0, serving({"/tokenize": engine(1)}) as p1:
        eps = [make_endpoint(i, address="127.0.0.1", port=p) for i, p in enumerate((p0, p1))]
        try:
            chat = make_request(model="m")
            body = {
                "model": "m",
                "messages": MESSAGES,
                "tools": [{"type": "function"}],
                "chat_template_kwargs": {"x": 1},
            }
            chat.body = chat_body(MESSAGES, model="m")
            assert chat.body.json is not None
            chat.body.json.update(body)
            got = [await server.token_ids(chat, eps) for _ in range(2)]
        finally:
            await server.close()
    assert sorted(g[0] for g in got if g) == [0, 1]  # each endpoint tokenised once
    sent = seen[0][1]
    assert sent["tools"] == [{"type": "function"}] and sent["chat_template_kwargs"] == {"x": 1}
    assert sent["messages"] == MESSAGES and sent["add_generation_prompt"] is True and sent["model"] == "m"


async def test_server_tokenizer_fails_cleanly_on_a_bad_status_a_hang_and_a_dead_port() -> None:
    """A non-200 reply gives no ids (None); an engine that never answers raises TimeoutError after
    the configured timeout, and a dead port a connection error: the scorer counts both as failures
    and scores that request from the approximate index."""
    from aiohttp import web

    from epp.datalayer.http_client import ScrapeError

    release = asyncio.Event()

    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500, text="no")

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"tokens": [1]})

    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    dead = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    server = ServerTokenizer(timeout=0.2)
    prompt = make_request(model="m", prompt="hello")
    async with serving({"/tokenize": broken}) as p_broken, serving({"/tokenize": hang}) as p_hang:
        try:
            assert (
                await server.token_ids(prompt, [make_endpoint(0, address="127.0.0.1", port=p_broken)]) is None
            )
            with pytest.raises(TimeoutError):
                await server.token_ids(prompt, [make_endpoint(0, address="127.0.0.1", port=p_hang)])
            with pytest.raises(ScrapeError):
                await server.token_ids(prompt, [make_endpoint(0, address="127.0.0.1", port=dead)])
        finally:
            release.set()
            await server.close()


async def test_server_tokenizer_bounds_its_calls_in_flight() -> None:
    """Ten requests at once with room for three: three calls reach the engines, the other seven
    wait for a slot (not a connection each); all ten get their ids."""
    from aiohttp import web

    arrived, release = asyncio.Event(), asyncio.Event()
    inflight = 0

    async def tokenize(request: web.Request) -> web.Response:
        nonlocal inflight
        inflight += 1
        if inflight == 3:
            arrived.set()
        await release.wait()
        inflight -= 1
        return web.json_response({"tokens": [7]})

    server = ServerTokenizer(timeout=30, max_concurrent=3)
    posted = 0
    client = server._client

    class Counting:
        """The tokenizer's client, counting the calls that got past the bound."""

        async def post(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
            nonlocal posted
            posted += 1
            return await client.post(*args, **kwargs)

        async def close(self) -> None:
            await client.close()

    server._client = Counting()  # type: ignore[assignment]
    async with serving({"/tokenize": tokenize}) as port:
        ep = [make_endpoint(0, address="127.0.0.1", port=port)]
        try:
            calls = [
                asyncio.create_task(server.token_ids(make_request(model="m", prompt="x"), ep))
                for _ in range(10)
            ]
            await arrived.wait()  # every task ran to its first wait long before three calls arrived
            assert posted == 3
            release.set()
            assert await asyncio.gather(*calls) == [[7]] * 10
            assert posted == 10
        finally:
            release.set()
            await server.close()
