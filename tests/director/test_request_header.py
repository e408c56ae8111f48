"""The director's request-header point: plugins run after parsing and before admission, and an
agent identity becomes the fairness id flow control queues the request under."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import orjson
import pytest

from epp.admission.flow_control import FlowControlAdmission
from epp.admission.shedding import AlwaysAdmit
from epp.app.build import Components, build
from epp.app.registry import default_registry
from epp.config.load import load_config, load_config_file
from epp.datalayer.api import Endpoint, EndpointMetadata
from epp.datastore.store import Datastore
from epp.director.director import Director
from epp.errors import Internal
from epp.flowcontrol.fairness.program_aware import ProgramAwareFairness
from epp.plugin.base import NoParams, PluginParams, TypedName
from epp.plugin.state import CycleState
from epp.request import FAIRNESS_HEADER, InferenceRequest

AGENTIC = Path(__file__).resolve().parents[1] / "config" / "corpus" / "llmd-guides--agentic-serving.yaml"
BODY = orjson.dumps({"model": "m", "prompt": "write a function " * 20, "max_tokens": 5})

# (request headers, the fairness id the request must be queued under)
CASES: tuple[tuple[dict[str, str], str], ...] = (
    ({"x-claude-code-session-id": "sess-a"}, "sess-a"),
    ({"session-id": "sess-b"}, "sess-b"),
    ({"x-claude-code-session-id": "sess-a", FAIRNESS_HEADER: "tenant-x"}, "tenant-x"),  # explicit wins
    # GIE's name is llm-d's deprecated alias: explicit too, and llm-d's wins when both are sent.
    ({"x-claude-code-session-id": "sess-a", "x-gateway-inference-fairness-id": "gie"}, "gie"),
    ({"x-gateway-inference-fairness-id": "gie", FAIRNESS_HEADER: "llmd"}, "llmd"),
    ({"x-unrelated": "v"}, "default-flow"),
)


def _datastore() -> Datastore:
    ds = Datastore()
    for i in range(2):
        ds.upsert(
            EndpointMetadata(
                name=f"default/pod-{i}", address=f"10.0.0.{i + 1}", port=8000, pod_name=f"pod-{i}"
            )
        )
    return ds


class RecordingAdmission(AlwaysAdmit):
    """Admits everything at once (``admit_now``), noting the fairness id each request arrives
    at admission with."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: list[str] = []

    def admit_now(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> bool:
        self.seen.append(request.fairness_id)
        return True


class WaitingAdmission(RecordingAdmission):
    """Answers nothing at once (``admit_now`` False): every request goes through ``admit``."""

    __slots__ = ()

    def admit_now(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> bool:
        return False

    async def admit(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        self.seen.append(request.fairness_id)


@pytest.mark.parametrize("admission_type", [RecordingAdmission, WaitingAdmission])
async def test_fairness_id_is_settled_before_admission(admission_type: type[RecordingAdmission]) -> None:
    """At once or awaited, admission sees the settled fairness id."""
    components = build(load_config_file(AGENTIC), default_registry())
    admission = admission_type()
    pipeline = components.request_control.pipeline(scheduler=components.scheduler, admission=admission)
    director = Director(_datastore(), pipeline)
    for headers, _ in CASES:
        await director.start(dict(headers), {}).route(BODY)
    assert admission.seen == [fairness for _, fairness in CASES]


def _program_aware(components: Components) -> ProgramAwareFairness:
    plugin = components.plugins.get("program-aware-fairness")
    assert isinstance(plugin, ProgramAwareFairness)
    return plugin


async def test_agent_sessions_are_separate_programs_under_real_flow_control() -> None:
    """The guide's config end to end: flow control queues each session under its own flow, and
    program-aware fairness accounts each session as its own program."""
    components = build(load_config_file(AGENTIC), default_registry())
    ds = _datastore()
    admission = components.admission.controller(ds)
    assert isinstance(admission, FlowControlAdmission)  # the config's flowControl gate is on
    async with admission:
        pipeline = components.request_control.pipeline(scheduler=components.scheduler, admission=admission)
        director = Director(ds, pipeline)
        for headers, _ in CASES:
            await director.start(dict(headers), {}).route(BODY)
    in_flight = {k: p.in_flight for k, p in _program_aware(components).programs.items()}
    assert in_flight == {fairness: 1 for _, fairness in CASES}


class Failing:
    TYPE: ClassVar[str] = "failing"
    PARAMS: ClassVar[type[PluginParams]] = NoParams
    typed_name = TypedName("failing", "boom")

    def request_header(self, state: CycleState, request: InferenceRequest) -> None:
        raise RuntimeError("cannot read headers")


async def test_failing_plugin_fails_the_request_before_admission() -> None:
    text = (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
    )
    components = build(load_config(text), default_registry())
    assert components.request_control.request_header == ()  # nothing configured: the hook is empty
    admission = RecordingAdmission()
    pipeline = components.request_control.pipeline(scheduler=components.scheduler, admission=admission)
    hooked = dataclasses.replace(pipeline, request_header=(Failing(),))
    with pytest.raises(Internal, match="boom/failing"):
        await Director(_datastore(), hooked).start({}, {}).route(BODY)
    assert admission.seen == []
