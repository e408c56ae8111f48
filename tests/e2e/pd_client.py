"""The client side of the P/D end-to-end tests: a chat request through Envoy and the JSON state
pages of the proxies, simulators and EPP."""

from __future__ import annotations

from typing import Any

import aiohttp

LONG = "prefill and decode are different phases of inference " * 30  # ~400 tokens: disaggregated


async def chat(http: aiohttp.ClientSession, url: str, prompt: str) -> tuple[int, dict[str, str]]:
    body = {"model": "mock-model", "messages": [{"role": "user", "content": prompt}], "max_tokens": 3}
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        await r.read()
        return r.status, dict(r.headers)


async def get(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as r:
        return await r.json()
