"""Small fake plugins, registered under GIE's default type names where the builder auto-adds them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from epp.datalayer.api import Endpoint
from epp.datalayer.attributes import LATENCY_PREDICTION, PREFIX_MATCH
from epp.flowcontrol.api import FairnessState, QueueCapability, QueuedItem
from epp.plugin.base import Handle, Plugin, PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest, RequestBody, ResponseInfo
from epp.scheduling.api import ProfileRunResult, SchedulerProfileView, SchedulingResult, ScorerCategory

UNPRODUCED = AttributeKey("test-unproduced", int)  # no default producer


class Filter(PluginBase):
    TYPE: ClassVar[str] = "test-filter"

    def filter(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        return endpoints


class ScorerParams(PluginParams):
    threshold: int = 1


class Scorer(PluginBase):
    TYPE: ClassVar[str] = "test-scorer"
    PARAMS: ClassVar[type[PluginParams]] = ScorerParams
    CATEGORY: ClassVar[ScorerCategory] = ScorerCategory.BALANCE

    def score(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]:
        return [0.5] * len(endpoints)


class PrefixScorer(Scorer):
    TYPE: ClassVar[str] = "test-prefix-scorer"
    PARAMS: ClassVar[type[PluginParams]] = ScorerParams
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})


class LatencyScorer(Scorer):
    TYPE: ClassVar[str] = "test-latency-scorer"
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({LATENCY_PREDICTION})


class OrphanConsumer(Scorer):
    TYPE: ClassVar[str] = "test-orphan-consumer"
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({UNPRODUCED})


class MaxScorePicker(PluginBase):
    TYPE: ClassVar[str] = "max-score-picker"

    def pick(
        self,
        state: CycleState,
        request: InferenceRequest,
        endpoints: Sequence[Endpoint],
        scores: Sequence[float],
    ) -> ProfileRunResult:
        return ProfileRunResult(tuple(endpoints[:1]))


class OtherPicker(MaxScorePicker):
    TYPE: ClassVar[str] = "test-picker"


class SingleProfileHandler(PluginBase):
    TYPE: ClassVar[str] = "single-profile-handler"
    MAX_PROFILES: ClassVar[int | None] = 1

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, SchedulerProfileView],
        results: Mapping[str, ProfileRunResult | None],
    ) -> Sequence[str]:
        return () if results else tuple(profiles)

    def process_results(
        self, state: CycleState, request: InferenceRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        return SchedulingResult(profile_results=results, primary_profile_name=next(iter(results)))


class MultiProfileHandler(SingleProfileHandler):
    """No MAX_PROFILES: unlimited."""

    TYPE: ClassVar[str] = "test-multi-handler"
    MAX_PROFILES: ClassVar[int | None] = None


class OpenAIParser(PluginBase):
    TYPE: ClassVar[str] = "openai-parser"
    APP_PROTOCOLS: ClassVar[frozenset[str]] = frozenset({"http", "kubernetes.io/h2c"})

    def parse_request(self, body: bytes, headers: Mapping[str, str]) -> RequestBody:
        raise NotImplementedError

    def serialize_request(self, body: RequestBody) -> bytes:
        return body.raw

    def usage_parser(self, headers: Mapping[str, str]) -> None:
        return None


class PassthroughParser(OpenAIParser):
    TYPE: ClassVar[str] = "passthrough-parser"
    APP_PROTOCOLS: ClassVar[frozenset[str]] = frozenset()


class UtilizationDetector(Filter):
    """Like GIE's: a saturation detector that is also a Filter."""

    TYPE: ClassVar[str] = "utilization-detector"

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return 0.0


class MetricsSourceParams(PluginParams):
    scheme: str = "http"
    path: str = "/metrics"
    insecure_skip_verify: bool = True


class MetricsSource(PluginBase):
    """A DataSource with a Lifecycle, like the real metrics-data-source."""

    TYPE: ClassVar[str] = "metrics-data-source"
    PARAMS: ClassVar[type[PluginParams]] = MetricsSourceParams
    OUTPUT: ClassVar[type[Any]] = str

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        super().__init__(name, params, handle)
        self.params = params

    async def poll(self, endpoint: Endpoint) -> Any:
        return ""

    async def start(self) -> None:
        raise AssertionError("the builder must not start anything")

    async def stop(self) -> None:
        raise AssertionError("the builder must not stop anything")


class PushSource(PluginBase):
    """A NotificationSource: pushes events and vets its extractors itself when bound."""

    TYPE: ClassVar[str] = "test-push-source"
    OUTPUT: ClassVar[type[Any]] = dict

    def bind(self, extractors: Sequence[Plugin]) -> None:
        raise AssertionError("binding is the data-layer runtime's job")


class CoreMetricsExtractor(PluginBase):
    TYPE: ClassVar[str] = "core-metrics-extractor"
    INPUT: ClassVar[type[Any]] = str

    def extract(self, data: Any, endpoint: Endpoint) -> None:
        return None


class BytesExtractor(CoreMetricsExtractor):
    TYPE: ClassVar[str] = "test-bytes-extractor"
    INPUT: ClassVar[type[Any]] = bytes


class ApproxPrefixProducer(PluginBase):
    TYPE: ClassVar[str] = "approx-prefix-cache-producer"
    PRODUCES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset({PREFIX_MATCH})
    CONSUMES: ClassVar[frozenset[AttributeKey[Any]]] = frozenset()

    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        return None

    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        return None

    def endpoint_added(self, endpoint: Endpoint) -> None:
        return None

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        return None


class Hooks(PluginBase):
    """Every request-control hook and a Lifecycle: lands in several Components tuples."""

    TYPE: ClassVar[str] = "test-hooks"

    def admit_request(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        return None

    def pre_request(self, state: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        return None

    def response_header(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        return None

    def response_body(
        self,
        state: CycleState,
        request: InferenceRequest,
        response: ResponseInfo,
        chunk: bytes,
        target: Endpoint | None,
    ) -> None:
        return None

    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        return None

    async def start(self) -> None:
        raise AssertionError("the builder must not start anything")

    async def stop(self) -> None:
        raise AssertionError("the builder must not stop anything")


class Reporter(PluginBase):
    """Not a scheduling plugin: ignored (with a warning) when placed in a profile."""

    TYPE: ClassVar[str] = "test-reporter"

    def response_complete(
        self, state: CycleState, request: InferenceRequest, response: ResponseInfo, target: Endpoint | None
    ) -> None:
        return None


class Exploding(PluginBase):
    TYPE: ClassVar[str] = "test-exploding"

    def __init__(self, name: str, params: PluginParams, handle: Handle) -> None:
        raise RuntimeError("boom")


class FcfsOrdering(PluginBase):
    TYPE: ClassVar[str] = "fcfs-ordering-policy"
    REQUIRED_CAPABILITIES: ClassVar[frozenset[QueueCapability]] = frozenset()

    def order_key(self, item: QueuedItem) -> tuple[float, float]:
        return (item.enqueued_at, 0.0)


class GlobalStrictFairness(PluginBase):
    TYPE: ClassVar[str] = "global-strict-fairness-policy"

    def new_state(self) -> FairnessState:
        raise NotImplementedError


class StaticUsageLimit(PluginBase):
    TYPE: ClassVar[str] = "static-usage-limit-policy"

    def compute_limits(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        return [1.0] * len(priorities)


FAKES: tuple[type[Plugin], ...] = (
    Filter,
    Scorer,
    PrefixScorer,
    LatencyScorer,
    OrphanConsumer,
    MaxScorePicker,
    OtherPicker,
    SingleProfileHandler,
    MultiProfileHandler,
    OpenAIParser,
    PassthroughParser,
    UtilizationDetector,
    MetricsSource,
    PushSource,
    CoreMetricsExtractor,
    BytesExtractor,
    ApproxPrefixProducer,
    Hooks,
    Reporter,
    Exploding,
    FcfsOrdering,
    GlobalStrictFairness,
    StaticUsageLimit,
)
