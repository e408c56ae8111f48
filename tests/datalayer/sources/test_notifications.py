"""endpoint-notification-source and k8s-notification-source: validation, binding, dispatch."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from structlog.testing import capture_logs

from epp.datalayer.api import EndpointEvent, GroupVersionKind, NotificationEvent
from epp.datalayer.builtin import BUILTINS
from epp.datalayer.sources.notifications import (
    EndpointNotificationSource,
    K8sNotificationSource,
    K8sNotificationSourceParams,
)
from epp.errors import ConfigError
from epp.plugin.base import NoParams, PluginBase
from epp.plugin.registry import Registry
from tests.datalayer.conftest import HANDLE, make_endpoint, make_extractor

POD = GroupVersionKind("", "v1", "Pod")


class EndpointRecorder(PluginBase):
    TYPE: ClassVar[str] = "endpoint-recorder"
    INPUT: ClassVar[type] = EndpointEvent

    def __init__(self, name: str, fail: bool = False) -> None:
        super().__init__(name, NoParams(), HANDLE)
        self.events: list[tuple[str, str]] = []
        self.fail = fail

    def extract(self, data: Any, endpoint: Any) -> None:
        self.events.append((data.type, endpoint.name))
        if self.fail:
            raise RuntimeError("boom")


class PodRecorder(PluginBase):
    TYPE: ClassVar[str] = "pod-recorder"

    def __init__(self, name: str, gvk: GroupVersionKind = POD, fail: bool = False) -> None:
        super().__init__(name, NoParams(), HANDLE)
        self._gvk = gvk
        self.events: list[NotificationEvent] = []
        self.fail = fail

    @property
    def gvk(self) -> GroupVersionKind:
        return self._gvk

    def extract_notification(self, event: NotificationEvent) -> None:
        self.events.append(event)
        if self.fail:
            raise RuntimeError("boom")


def k8s(name: str = "k8s-notification-source", **params: Any) -> K8sNotificationSource:
    return K8sNotificationSource(name, K8sNotificationSourceParams.model_validate(params), HANDLE)


def test_endpoint_source_dispatches_in_order_and_isolates_failures() -> None:
    """Each extractor sees every event in order; one that raises is logged and skipped."""
    source = EndpointNotificationSource("ens", NoParams(), HANDLE)
    bad, good = EndpointRecorder("bad", fail=True), EndpointRecorder("good")
    source.bind([bad, good])
    ep = make_endpoint("ns/a-rank-0")
    with capture_logs() as logs:
        source.endpoint_event(EndpointEvent("AddOrUpdate", ep))
        source.endpoint_event(EndpointEvent("Delete", ep))
    assert good.events == [("AddOrUpdate", "ns/a-rank-0"), ("Delete", "ns/a-rank-0")]
    assert len(bad.events) == 2
    assert [e["event"] for e in logs] == ["endpoint_event_extractor_failed"] * 2


def test_endpoint_source_rejects_extractors_of_other_data() -> None:
    """An extractor that cannot consume EndpointEvents is a config error."""
    source = EndpointNotificationSource("ens", NoParams(), HANDLE)
    with pytest.raises(ConfigError, match="cannot consume the EndpointEvents"):
        source.bind([make_extractor()])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({}, "version and kind are required for k8s-notification-source", id="nothing"),
        pytest.param(
            {"group": "apps", "kind": "Deployment"}, "version and kind are required", id="no-version"
        ),
        pytest.param({"version": "v1"}, "version and kind are required", id="no-kind"),
    ],
)
def test_k8s_source_params(params: dict[str, Any], message: str) -> None:
    """version and kind are required, with GIE's message."""
    with pytest.raises(ConfigError, match=message):
        k8s(**params)


def test_k8s_source_name_defaults_to_gvk() -> None:
    """Unnamed (named after its type) the source is named after its GVK, like GIE."""
    assert k8s(group="apps", version="v1", kind="Deployment").typed_name.name == "apps/v1, Kind=Deployment"
    assert k8s("mine", version="v1", kind="Pod").typed_name.name == "mine"
    assert str(POD) == "/v1, Kind=Pod"


def test_k8s_source_through_registry() -> None:
    """Registered; its params are validated by the registry (unknown keys rejected)."""
    reg = Registry(BUILTINS)
    src = reg.build(
        name="pods",
        type_name="k8s-notification-source",
        parameters={"version": "v1", "kind": "Pod"},
        handle=HANDLE,
        path="plugins[0]",
    )
    assert src.gvk == POD  # type: ignore[attr-defined]
    with pytest.raises(
        ConfigError, match="plugins\\[0\\] \\(pods/k8s-notification-source\\): version and kind"
    ):
        reg.build(
            name="pods", type_name="k8s-notification-source", parameters={}, handle=HANDLE, path="plugins[0]"
        )


@pytest.mark.parametrize(
    ("extractors", "message"),
    [
        pytest.param(lambda: [make_extractor()], "does not implement NotificationExtractor", id="wrong-kind"),
        pytest.param(
            lambda: [PodRecorder("x", GroupVersionKind("apps", "v1", "Deployment"))],
            "GVK apps/v1, Kind=Deployment does not match source",
            id="gvk-mismatch",
        ),
        pytest.param(lambda: [PodRecorder("x"), PodRecorder("x")], "duplicate extractor", id="duplicate"),
    ],
)
def test_k8s_source_bind_errors(extractors: Any, message: str) -> None:
    """Extractors must be NotificationExtractors of the same GVK, each once."""
    with pytest.raises(ConfigError, match=message):
        k8s(version="v1", kind="Pod").bind(extractors())


def test_k8s_source_notify() -> None:
    """Events reach every extractor in order; a failing extractor does not stop the others."""
    source = k8s(version="v1", kind="Pod")
    bad, good = PodRecorder("bad", fail=True), PodRecorder("good")
    source.bind([bad, good])
    add = NotificationEvent("AddOrUpdate", POD, "ns", "p", {"metadata": {"name": "p"}})
    delete = NotificationEvent("Delete", POD, "ns", "p")
    with capture_logs() as logs:
        source.notify(add)
        source.notify(delete)
    assert good.events == [add, delete]
    assert [e["object"] for e in logs] == ["ns/p", "ns/p"]
