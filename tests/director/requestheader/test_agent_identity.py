"""agent-identity: llm-d-router's header priority, its parameter and its test vectors."""

from __future__ import annotations

from typing import Any

import pytest

from epp.app.build import build as build_config
from epp.app.registry import default_registry
from epp.config.load import load_config
from epp.director.api import AGENT_IDENTITY, RequestHeaderProcessor
from epp.director.requestheader.agent_identity import (
    CLAUDE_CODE_SESSION_HEADER,
    CODEX_SESSION_HEADER,
    CODEX_SESSION_HEADER_LEGACY,
    DEFAULT_PRIORITY_HEADERS,
    OPENCODE_SESSION_HEADER,
    AgentIdentity,
)
from epp.errors import ConfigError
from epp.plugin.state import CycleState
from epp.testing.builders import make_request
from epp.testing.plugins import build


def _identity(plugin: AgentIdentity, headers: dict[str, str], **body: Any) -> str | None:
    state = CycleState()
    request = make_request(headers=headers, body=body or None)
    plugin.request_header(state, request)
    assert request.fairness_id == "default-flow"  # the plugin never sets the fairness id itself
    value: str | None = state.get(AGENT_IDENTITY)
    return value


# upstream's TestRequestHeader, case for case (a missing attribute is None here)
@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({CLAUDE_CODE_SESSION_HEADER: "session-abc"}, "session-abc", id="claude-code"),
        pytest.param({OPENCODE_SESSION_HEADER: "oc-session-1"}, "oc-session-1", id="opencode"),
        pytest.param({CODEX_SESSION_HEADER: "codex-session-1"}, "codex-session-1", id="codex"),
        pytest.param({CODEX_SESSION_HEADER_LEGACY: "codex-legacy-1"}, "codex-legacy-1", id="codex-legacy"),
        pytest.param(
            {CODEX_SESSION_HEADER: "codex-new", CODEX_SESSION_HEADER_LEGACY: "codex-old"},
            "codex-new",
            id="codex-hyphenated-wins-over-underscored",
        ),
        pytest.param(
            {CLAUDE_CODE_SESSION_HEADER: "session-abc", OPENCODE_SESSION_HEADER: "oc-session-1"},
            "session-abc",
            id="claude-code-wins-over-opencode",
        ),
        pytest.param(
            {OPENCODE_SESSION_HEADER: "oc-session-1", CODEX_SESSION_HEADER: "codex-session-1"},
            "oc-session-1",
            id="opencode-wins-over-codex",
        ),
        pytest.param({"x-unrelated": "value"}, None, id="no-matching-header"),
        pytest.param({}, None, id="no-headers"),
        pytest.param(
            {CLAUDE_CODE_SESSION_HEADER: "", OPENCODE_SESSION_HEADER: "oc"}, "oc", id="empty-skipped"
        ),
    ],
)
def test_request_header(headers: dict[str, str], expected: str | None) -> None:
    assert _identity(build(AgentIdentity), headers) == expected


def test_previous_response_id_in_the_body_is_ignored() -> None:
    """Codex's previous_response_id names the prior turn, not the session: not an identity."""
    assert _identity(build(AgentIdentity), {}, model="m", previous_response_id="resp-456") is None


# upstream's TestPluginFactory_PriorityHeaders
@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({}, DEFAULT_PRIORITY_HEADERS, id="no-parameters"),
        pytest.param({"additionalSessionHeaders": []}, DEFAULT_PRIORITY_HEADERS, id="empty-list"),
        pytest.param(
            {"additionalSessionHeaders": ["x-custom-1", "x-custom-2"]},
            ("x-custom-1", "x-custom-2", *DEFAULT_PRIORITY_HEADERS),
            id="extras-first",
        ),
        pytest.param(
            {"additionalSessionHeaders": ["X-Tenant-ID", "X-User-Session"]},
            ("x-tenant-id", "x-user-session", *DEFAULT_PRIORITY_HEADERS),
            id="lower-cased",
        ),
    ],
)
def test_priority_headers(params: dict[str, Any], expected: tuple[str, ...]) -> None:
    assert build(AgentIdentity, **params).priority_headers == expected


def test_default_headers_in_upstream_order() -> None:
    assert DEFAULT_PRIORITY_HEADERS == (
        "x-claude-code-session-id",
        "x-session-affinity",
        "session-id",
        "session_id",
    )


def test_custom_header_is_honoured_and_wins_over_the_defaults() -> None:
    """Upstream's TestRequestHeader_CustomHeader."""
    plugin = build(AgentIdentity, additionalSessionHeaders=["x-tenant-id"])
    assert _identity(plugin, {"x-tenant-id": "tenant-42"}) == "tenant-42"
    assert (
        _identity(plugin, {"x-tenant-id": "tenant-42", CLAUDE_CODE_SESSION_HEADER: "claude"}) == "tenant-42"
    )


def test_identity_key_is_named_as_configs_name_it() -> None:
    """Upstream's TestAgentIdentityKeyMatchesDocumentedConfig: the attribute is `agent-identity`."""
    assert AGENT_IDENTITY.name == "agent-identity"


CONFIG = (
    "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
    "- type: agent-identity\n{params}- type: queue-scorer\n"
    "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
)


def test_declared_plugin_runs_at_the_request_header_point() -> None:
    components = build_config(load_config(CONFIG.format(params="")), default_registry())
    hooks = components.request_control.request_header
    assert [type(p) for p in hooks] == [AgentIdentity]
    assert isinstance(hooks[0], RequestHeaderProcessor)


@pytest.mark.parametrize(
    "params",
    [
        pytest.param("  parameters: {additionalSessionHeaders: x-one}\n", id="not-a-list"),
        pytest.param("  parameters: {additionalSessionHeaders: [1]}\n", id="not-a-string"),
        pytest.param("  parameters: {sessionHeaders: [x-one]}\n", id="unknown-field"),
    ],
)
def test_bad_parameters_name_the_field(params: str) -> None:
    with pytest.raises(ConfigError, match=r"plugins\[0\].*(additionalSessionHeaders|sessionHeaders)"):
        build_config(load_config(CONFIG.format(params=params)), default_registry())
