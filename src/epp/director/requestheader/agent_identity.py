"""``agent-identity`` (llm-d-router): the agent session a request belongs to, from its headers.

Coding agents (Claude Code, OpenCode, Codex) send a session header on every turn.  Publishing
it as the request's agent identity before admission lets the director make it the fairness id
when the client sent no explicit one, so flow control queues all turns of one session
together instead of in the shared ``default-flow``.  The plugin never sets the fairness id
itself (upstream keeps the two apart so other subsystems can read the identity too).
"""

from __future__ import annotations

from typing import ClassVar, Final

from epp.director.api import AGENT_IDENTITY
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

CLAUDE_CODE_SESSION_HEADER: Final = "x-claude-code-session-id"
OPENCODE_SESSION_HEADER: Final = "x-session-affinity"
CODEX_SESSION_HEADER: Final = "session-id"  # Codex >= 0.131.0
CODEX_SESSION_HEADER_LEGACY: Final = "session_id"  # Codex 0.130.x

# Always checked, in this order, after the configured ones.
DEFAULT_PRIORITY_HEADERS: Final = (
    CLAUDE_CODE_SESSION_HEADER,
    OPENCODE_SESSION_HEADER,
    CODEX_SESSION_HEADER,
    CODEX_SESSION_HEADER_LEGACY,
)


class AgentIdentityParams(PluginParams):
    # Checked before the built-in headers, in order: a new agent or a renamed header needs
    # no code change.
    additional_session_headers: tuple[str, ...] = ()


class AgentIdentity(PluginBase):
    """Type ``agent-identity``.  Parameter ``additionalSessionHeaders`` (names checked first).

    Puts the first non-empty value among the session headers under ``AGENT_IDENTITY``;
    nothing when none matches (the request then stays in the default fairness queue).
    Header names are lower-cased (request header keys are); duplicates and empty names are
    kept, as upstream: the lookup stops at the first match.
    """

    TYPE: ClassVar[str] = "agent-identity"
    PARAMS: ClassVar[type[PluginParams]] = AgentIdentityParams

    def __init__(self, name: str, params: AgentIdentityParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.priority_headers: tuple[str, ...] = tuple(
            h.lower() for h in (*params.additional_session_headers, *DEFAULT_PRIORITY_HEADERS)
        )

    def request_header(self, state: CycleState, request: InferenceRequest) -> None:
        headers = request.headers
        for header in self.priority_headers:
            identity = headers.get(header)
            if identity:
                state.put(AGENT_IDENTITY, identity)
                return
