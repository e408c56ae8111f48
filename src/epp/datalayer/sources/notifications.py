"""``endpoint-notification-source`` and ``k8s-notification-source``: events pushed to extractors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import structlog

from epp.datalayer.api import (
    EndpointEvent,
    Extractor,
    GroupVersionKind,
    NotificationEvent,
    NotificationExtractor,
)
from epp.errors import ConfigError
from epp.plugin.base import Handle, NoParams, Plugin, PluginBase, PluginParams

log = structlog.get_logger(__name__)


def _accepts(input_type: type, output_type: type) -> bool:
    return input_type is object or issubclass(output_type, input_type)


class EndpointNotificationSource(PluginBase):
    """Passes endpoint add/delete events to its extractors.  Type ``endpoint-notification-source``.

    The data-layer runtime hands it every endpoint that enters (``AddOrUpdate``) or leaves
    (``Delete``) the datastore; each extractor's ``extract(event, endpoint)`` is called in
    config order.  An extractor that raises is logged and does not stop the others.

    Output: ``EndpointEvent``; extractors must accept it as ``INPUT``.
    Parameters: none.
    """

    TYPE: ClassVar[str] = "endpoint-notification-source"
    PARAMS: ClassVar[type[PluginParams]] = NoParams
    OUTPUT: ClassVar[type[EndpointEvent]] = EndpointEvent

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self._extractors: tuple[Extractor, ...] = ()

    def bind(self, extractors: Sequence[Plugin]) -> None:
        bound: list[Extractor] = []
        for ext in extractors:
            if not isinstance(ext, Extractor) or not _accepts(ext.INPUT, EndpointEvent):
                raise ConfigError(
                    f"extractor {ext.typed_name} cannot consume the EndpointEvents of {self.typed_name}"
                )
            bound.append(ext)
        self._extractors = tuple(bound)

    def endpoint_event(self, event: EndpointEvent) -> None:
        for ext in self._extractors:
            try:
                ext.extract(event, event.endpoint)
            except Exception as e:
                log.exception(
                    "endpoint_event_extractor_failed",
                    source=str(self.typed_name),
                    extractor=str(ext.typed_name),
                    endpoint=event.endpoint.name,
                    error=str(e),
                )


class K8sNotificationSourceParams(PluginParams):
    group: str = ""
    version: str = ""
    kind: str = ""


class K8sNotificationSource(PluginBase):
    """Delivers changes of one Kubernetes object type to its extractors.  Type ``k8s-notification-source``.

    The Kubernetes layer watches ``gvk`` and calls ``notify`` with an ``AddOrUpdate``
    (object included) or ``Delete`` (name and namespace only) event; extractors (each a
    ``NotificationExtractor`` of the same GVK) run synchronously, in order, so they see
    events in the order they happened.  An extractor that raises is logged and skipped.
    At most one source per GVK.

    Output: ``NotificationEvent``.
    Parameters: ``group`` ("" for core objects), ``version`` (required), ``kind`` (required).
    Unnamed, the plugin is named after its GVK (``group/version, Kind=kind``).
    """

    TYPE: ClassVar[str] = "k8s-notification-source"
    PARAMS: ClassVar[type[PluginParams]] = K8sNotificationSourceParams
    OUTPUT: ClassVar[type[NotificationEvent]] = NotificationEvent

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        assert isinstance(params, K8sNotificationSourceParams)
        if not params.version or not params.kind:
            raise ConfigError("version and kind are required for k8s-notification-source")
        self._gvk = GroupVersionKind(params.group, params.version, params.kind)
        super().__init__(str(self._gvk) if name in ("", self.TYPE) else name, params, handle)
        self._extractors: tuple[NotificationExtractor, ...] = ()

    @property
    def gvk(self) -> GroupVersionKind:
        return self._gvk

    def bind(self, extractors: Sequence[Plugin]) -> None:
        bound: list[NotificationExtractor] = []
        seen: set[str] = set()
        for ext in extractors:
            if not isinstance(ext, NotificationExtractor):
                raise ConfigError(f"extractor {ext.typed_name} does not implement NotificationExtractor")
            if ext.gvk != self._gvk:
                raise ConfigError(
                    f"extractor {ext.typed_name} GVK {ext.gvk} does not match "
                    f"source {self.typed_name} GVK {self._gvk}"
                )
            if ext.typed_name.name in seen:
                raise ConfigError(
                    f"duplicate extractor {ext.typed_name} on notification source {self.typed_name}"
                )
            seen.add(ext.typed_name.name)
            bound.append(ext)
        self._extractors = tuple(bound)

    def notify(self, event: NotificationEvent) -> None:
        """Called by the Kubernetes watch for every change of an object of ``gvk``."""
        for ext in self._extractors:
            try:
                ext.extract_notification(event)
            except Exception as e:
                log.exception(
                    "notification_extractor_failed",
                    source=str(self.typed_name),
                    extractor=str(ext.typed_name),
                    event_type=event.type,
                    object=f"{event.namespace}/{event.name}",
                    error=str(e),
                )
