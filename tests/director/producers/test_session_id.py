"""session-id-producer: llm-d-router's header / cookie extraction and its parameter rules."""

from __future__ import annotations

from typing import Any

import pytest

from epp.app.build import build as build_config
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.director.producers.session_id import SESSION_ID, SessionIdProducer, cookie_value
from epp.plugin.state import CycleState
from epp.testing.builders import make_request
from epp.testing.plugins import build


async def _produce(headers: dict[str, str], **params: Any) -> str | None:
    producer = build(SessionIdProducer, **params)
    state = CycleState()
    await producer.prepare_request_data(state, make_request(headers=headers), [])
    value: str | None = state.get(SESSION_ID)
    return value


async def test_header_and_cookie_sources() -> None:
    assert await _produce({"x-session-id": " s1 "}, headerName="X-Session-ID") == "s1"
    assert await _produce({}, headerName="x-session-id") is None
    assert await _produce({"cookie": "a=1; llm-d-session=abc; b=2"}, cookieName="llm-d-session") == "abc"
    assert await _produce({"cookie": "a=1"}, cookieName="llm-d-session") is None


def test_cookie_parsing() -> None:
    assert cookie_value("x=1;y=2", "y") == "2"
    assert cookie_value("novalue; y=", "y") == ""
    assert cookie_value("", "y") == ""


@pytest.mark.parametrize("params", [{}, {"headerName": "h", "cookieName": "c"}, {"headerName": "  "}])
def test_exactly_one_source(params: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="exactly one of headerName or cookieName"):
        build(SessionIdProducer, **params)


def test_declared_producer_runs_with_the_others() -> None:
    text = (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: session-id-producer\n  parameters: {headerName: x-session-id}\n"
        "- type: queue-scorer\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
    )
    components = build_config(load_config(text), default_registry())
    assert any(isinstance(p, SessionIdProducer) for p in components.producers)
