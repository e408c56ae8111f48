"""``prompt_tokens``: GIE's SimpleTokenEstimator, computed once a request once the body size is known."""

from __future__ import annotations

import dataclasses
from typing import Any

from epp.request import ApiKind, InferenceRequest, RequestBody, ResponseInfo, estimate_tokens, prompt_tokens


def test_size_based_estimate_is_kept_on_the_request() -> None:
    req = InferenceRequest(request_id="r", headers={}, request_size_bytes=1030)
    assert req.prompt_token_count == -1
    assert prompt_tokens(req) == 257  # 1030 // 4
    assert req.prompt_token_count == 257  # the next reader takes the field
    assert estimate_tokens(req) == 257 + 386  # + round(1.5 * 257), half up


def test_tiny_body_counts_one_token() -> None:
    req = InferenceRequest(request_id="r", headers={}, request_size_bytes=3)
    assert prompt_tokens(req) == 1  # max(3 // 4, 1)
    assert req.prompt_token_count == 1


def test_estimate_without_a_size_is_not_kept() -> None:
    """Before the size is known the estimate comes from the body, which a plugin may still change
    (a tokenizer sets token ids): nothing is kept, so a later call sees the change."""
    body = RequestBody(api=ApiKind.COMPLETIONS, raw=b"", prompt_text="x" * 40)
    req = InferenceRequest(request_id="r", headers={}, body=body)
    assert prompt_tokens(req) == 10
    assert req.prompt_token_count == -1
    body.token_ids = [1, 2, 3]
    assert prompt_tokens(req) == 3
    assert estimate_tokens(req) == 3 + 5
    assert prompt_tokens(InferenceRequest(request_id="r", headers={})) == 0  # no body


def test_received_equals_the_keyword_constructor() -> None:
    """``InferenceRequest.received`` sets every field (an unset slot would raise here) to what the
    keyword constructor gives for the same arguments."""
    headers = {"x-request-id": "r"}
    metadata: dict[str, Any] = {"envoy.lb": {}}
    fast = InferenceRequest.received("r", headers, metadata, 1.5, "obj", "flow", "m")
    slow = InferenceRequest(
        request_id="r",
        headers=headers,
        metadata=metadata,
        received_at=1.5,
        objective="obj",
        fairness_id="flow",
        target_model="m",
    )
    assert [getattr(fast, f.name) for f in dataclasses.fields(InferenceRequest)] == [
        getattr(slow, f.name) for f in dataclasses.fields(InferenceRequest)
    ]
    assert fast == slow


def test_response_started_equals_the_keyword_constructor() -> None:
    """``ResponseInfo.started`` sets every field, each as the keyword constructor does."""
    headers = {":status": "200"}
    fast = ResponseInfo.started("r", headers)
    slow = ResponseInfo(request_id="r", headers=headers)
    assert [getattr(fast, f.name) for f in dataclasses.fields(ResponseInfo)] == [
        getattr(slow, f.name) for f in dataclasses.fields(ResponseInfo)
    ]
    assert fast == slow
    assert fast.dynamic_metadata is not ResponseInfo.started("r", headers).dynamic_metadata  # one each
