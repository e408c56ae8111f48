"""``request-attribute-reporter``: report a CEL function of the response usage as Envoy dynamic metadata."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Final

import structlog
from pydantic import Field

from epp.datalayer.api import Endpoint
from epp.errors import ConfigError
from epp.log import is_enabled_for
from epp.plugin.base import Handle, PluginBase, PluginParams
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, ResponseInfo

if TYPE_CHECKING:
    from epp.cel import CelProgram, UsageValue

log = structlog.get_logger(__name__)

DEFAULT_NAMESPACE: Final = "envoy.lb"


class AttributeKeyParams(PluginParams):
    """Where the value goes: ``dynamic_metadata[namespace][name]``."""

    namespace: str = DEFAULT_NAMESPACE
    name: str = ""


class AttributeParams(PluginParams):
    key: AttributeKeyParams = Field(default_factory=AttributeKeyParams)
    expression: str = ""  # CEL; must evaluate to an int or a double
    condition: str | None = None  # CEL; the attribute is reported only when it is true


class RequestAttributeReporterParams(PluginParams):
    """GIE's shape: ``{"attributes": [{"key": {...}, "expression": ..., "condition": ...}]}``."""

    attributes: tuple[AttributeParams, ...] = ()


class RequestAttributeReporter(PluginBase):
    """Report a number computed from the response usage.  Type ``request-attribute-reporter``.

    When a response ends normally with a parsed usage, ``condition`` (if any) and then
    ``expression`` are evaluated with the CEL variable ``usage``, a map shaped like GIE's
    Struct of the Go Usage: ``prompt_tokens``, ``completion_tokens``, ``total_tokens``
    (doubles, always present) and ``prompt_token_details.cached_tokens`` (only when the
    server reported cached tokens).  An int or double result is truncated to an int64
    and written to ``response.dynamic_metadata[namespace][name]``, which rides on the
    final ext_proc message to Envoy (e.g. ``envoy.lb`` /
    ``x-gateway-inference-request-cost``).  Nothing is written when the condition is not
    true, the result is 0 or not a number, or evaluation fails (logged at debug).
    Responses that end abnormally report nothing: no final message carries metadata.

    Expressions are compiled once at startup; a syntax error, an undeclared variable or
    function, or a ``has()`` on anything but a field selection is a ConfigError naming
    the parameter.  See ``epp.cel`` for how evaluation stays in the tens of microseconds.
    Consumes: nothing.
    Parameters: ``attributes`` (exactly one entry): ``key.namespace`` (``envoy.lb``),
    ``key.name`` (required), ``expression`` (required), ``condition`` (optional).
    """

    TYPE: ClassVar[str] = "request-attribute-reporter"
    PARAMS: ClassVar[type[PluginParams]] = RequestAttributeReporterParams

    def __init__(self, name: str, params: RequestAttributeReporterParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        if len(params.attributes) != 1:
            n = len(params.attributes)
            raise ConfigError(f"parameters.attributes: attributes must contain exactly one entry, got {n}")
        attr = params.attributes[0]
        if not attr.key.name:
            raise ConfigError("parameters.attributes[0].key.name: attributeKey.name cannot be empty")
        if not attr.expression.strip():
            raise ConfigError("parameters.attributes[0].expression: attributes[0].expression cannot be empty")
        self.namespace = attr.key.namespace or DEFAULT_NAMESPACE
        self.key = attr.key.name
        # Imported here: celpy takes half a second to import, paid only when configured.
        from epp.cel import as_int64, is_true, usage_value

        self._usage_value: Callable[[int, int, int, int | None], UsageValue] = usage_value
        self._is_true: Callable[[object], bool] = is_true
        self._as_int64: Callable[[object], int | None] = as_int64
        self.expression = _compile(attr.expression, "expression")
        self.condition = _compile(attr.condition, "condition") if attr.condition else None

    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        usage = response.usage
        if usage is None or not response.end_of_stream:
            return
        data = self._usage_value(
            usage.prompt_tokens, usage.completion_tokens, usage.total_tokens, usage.cached_tokens
        )
        condition = self.condition
        if condition is not None:
            ok = condition.evaluate(data)
            if not self._is_true(ok):
                if isinstance(ok, Exception):
                    self._not_reported("condition_failed", request, ok)
                return
        result = self.expression.evaluate(data)
        value = self._as_int64(result)
        if value is None:
            self._not_reported("expression_not_a_number", request, result)
            return
        if value == 0:
            return
        ns = response.dynamic_metadata.get(self.namespace)
        if ns is None:
            ns = response.dynamic_metadata[self.namespace] = {}
        ns[self.key] = value

    def _not_reported(self, event: str, request: InferenceRequest, result: object) -> None:
        if is_enabled_for(logging.DEBUG):
            log.debug(event, plugin=str(self.typed_name), request_id=request.request_id, result=repr(result))


def _compile(source: str, field: str) -> CelProgram:
    from epp.cel import CelCompileError, CelProgram

    try:
        return CelProgram(source)
    except CelCompileError as e:
        raise ConfigError(f"parameters.attributes[0].{field}: failed to compile {field}: {e}") from None
