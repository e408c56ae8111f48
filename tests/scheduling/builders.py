"""Endpoint, request and handle builders shared by the scheduling, producer and detector tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.datalayer.api import Endpoint
from epp.plugin.base import PluginParams
from epp.request import ApiKind, InferenceRequest, RequestBody
from epp.testing.builders import make_endpoint


def endpoint(
    i: int,
    *,
    queue: int = 0,
    kv: float = 0.0,
    running: int = 0,
    active: Sequence[str] = (),
    waiting: Sequence[str] = (),
    max_active: int = 0,
    block_size: int = 0,
    num_blocks: int = 0,
    address: str = "",
    port: int = 8000,
    fresh: bool = True,
) -> Endpoint:
    """``pod-<i>`` at 192.168.1.<i+1>:8000 with the given metrics (fresh unless told otherwise)."""
    return make_endpoint(
        i,
        queue=queue,
        kv=kv,
        running=running,
        active=active,
        waiting=waiting,
        max_loras=max_active,
        address=address or None,
        port=port,
        fresh=fresh,
        cache_block_size=block_size,
        cache_num_blocks=num_blocks,
    )


def request(
    *,
    model: str = "my-model",
    headers: dict[str, str] | None = None,
    body: RequestBody | None = None,
    request_id: str = "test-request-id",
) -> InferenceRequest:
    return InferenceRequest(request_id=request_id, headers=headers or {}, body=body, target_model=model)


def chat_body(
    messages: list[dict[str, Any]], *, cache_salt: str = "", model: str = "my-model"
) -> RequestBody:
    doc = {"model": model, "messages": messages}
    return RequestBody(api=ApiKind.CHAT_COMPLETIONS, raw=b"", json=doc, cache_salt=cache_salt)


def completions_body(prompt: Any, *, model: str = "my-model") -> RequestBody:
    return RequestBody(api=ApiKind.COMPLETIONS, raw=b"", json={"model": model, "prompt": prompt})


class FakeHandle:
    """A Handle over a fixed list of plugins."""

    def __init__(self, plugins: Sequence[Any] = ()) -> None:
        self._plugins = list(plugins)

    def plugin(self, name: str) -> Any:
        for p in self._plugins:
            if p.typed_name.name == name:
                return p
        raise KeyError(name)

    def plugins(self) -> Sequence[Any]:
        return self._plugins


def build(cls: Any, name: str = "", handle: FakeHandle | None = None, **params: Any) -> Any:
    """Instantiate plugin ``cls`` from camelCase ``params`` validated by its PARAMS model."""
    p: PluginParams = cls.PARAMS.model_validate(params)
    return cls(name or cls.TYPE, p, handle or FakeHandle())
