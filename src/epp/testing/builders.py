"""Builders for endpoints and requests, for tests and plugin authors."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from epp.datalayer.api import Endpoint, EndpointMetadata, Metrics
from epp.request import ApiKind, InferenceRequest, RequestBody


def make_endpoint(
    index: int = 0,
    *,
    queue: int = 0,
    kv: float = 0.0,
    running: int = 0,
    active: Iterable[str] = (),
    waiting: Iterable[str] = (),
    max_loras: int = 0,
    address: str | None = None,
    port: int = 8000,
    fresh: bool = True,
    labels: Mapping[str, str] | None = None,
    **metrics: Any,
) -> Endpoint:
    """An endpoint like GIE's test fixture: ``pod-<i>`` at ``192.168.1.<i+1>:8000``."""
    md = EndpointMetadata(
        name=f"default/pod-{index}-rank-0",
        address=address or f"192.168.1.{index + 1}",
        port=port,
        pod_name=f"pod-{index}",
        namespace="default",
        labels=dict(labels or {}),
    )
    m = Metrics(
        waiting_queue_size=queue,
        kv_cache_usage_percent=kv,
        running_requests_size=running,
        active_models=frozenset(active),
        waiting_models=frozenset(waiting),
        max_active_models=max_loras,
        update_time=time.monotonic() if fresh else 0.0,
        **metrics,
    )
    return Endpoint(md, m)


def make_request(
    model: str = "my-model",
    prompt: str = "hello",
    *,
    api: ApiKind = ApiKind.COMPLETIONS,
    headers: Mapping[str, str] | None = None,
    priority: int = 0,
    request_id: str = "test-request-id",
    body: dict[str, Any] | None = None,
) -> InferenceRequest:
    """A parsed request as the director hands it to plugins."""
    json_body = body if body is not None else {"model": model, "prompt": prompt}
    rb = RequestBody(
        api=api,
        raw=b"",
        json=json_body,
        prompt_text=prompt if api == ApiKind.COMPLETIONS else None,
    )
    return InferenceRequest(
        request_id=request_id,
        headers=dict(headers or {}),
        body=rb,
        incoming_model=model,
        target_model=model,
        priority=priority,
        received_at=time.monotonic(),
    )


def chat_body(
    messages: list[dict[str, Any]], *, cache_salt: str = "", model: str = "my-model"
) -> RequestBody:
    """A parsed chat-completions body."""
    doc = {"model": model, "messages": messages}
    return RequestBody(api=ApiKind.CHAT_COMPLETIONS, raw=b"", json=doc, cache_salt=cache_salt)


def completions_body(prompt: Any, *, model: str = "my-model") -> RequestBody:
    """A parsed completions body; ``prompt`` may be a string, a token list or a list of either."""
    return RequestBody(api=ApiKind.COMPLETIONS, raw=b"", json={"model": model, "prompt": prompt})
