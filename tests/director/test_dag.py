"""Producer ordering from PRODUCES/CONSUMES: topological, deterministic, and loud about bad graphs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from epp.datalayer.api import Endpoint
from epp.director.dag import order_producers, producer_timeout
from epp.errors import ConfigError
from epp.plugin.base import PluginBase, PluginParams
from epp.plugin.keys import AttributeKey
from epp.plugin.state import CycleState
from epp.request import InferenceRequest

A = AttributeKey("a", int)
B = AttributeKey("b", int)
C = AttributeKey("c", int)
A_AS_STR = AttributeKey("a", str)
KEYS: dict[str, AttributeKey[Any]] = {"a": A, "b": B, "c": C, "a:str": A_AS_STR}


class Producer(PluginBase):
    TYPE: ClassVar[str] = "p"
    PRODUCES: frozenset[AttributeKey[Any]]
    CONSUMES: frozenset[AttributeKey[Any]]

    def __init__(self, name: str, produces: str = "", consumes: str = "") -> None:
        super().__init__(name, PluginParams(), None)  # type: ignore[arg-type]
        # Per instance here; real plugins declare these as ClassVars.
        self.PRODUCES = frozenset(KEYS[k] for k in produces.split())
        self.CONSUMES = frozenset(KEYS[k] for k in consumes.split())

    async def prepare_request_data(
        self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> None:
        return None


class Consumer(PluginBase):
    """A scorer-like consumer: not a producer, so not ordered, but its keys are checked."""

    TYPE: ClassVar[str] = "c"

    def __init__(self, name: str, consumes: str) -> None:
        super().__init__(name, PluginParams(), None)  # type: ignore[arg-type]
        self.CONSUMES = frozenset(KEYS[k] for k in consumes.split())


def _plugins(spec: Sequence[tuple[str, str, str]]) -> list[object]:
    return [
        Consumer(name, consumes) if produces == "-" else Producer(name, produces, consumes)
        for name, produces, consumes in spec
    ]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param([("x", "a", ""), ("y", "b", "")], ["x", "y"], id="independent-keep-config-order"),
        pytest.param([("y", "b", "a"), ("x", "a", "")], ["x", "y"], id="dependency-first"),
        pytest.param(
            [("z", "c", "b"), ("y", "b", "a"), ("x", "a", ""), ("w", "", "")],
            ["x", "y", "z", "w"],
            id="chain",
        ),
        pytest.param(
            [("late", "", "a"), ("free1", "b", ""), ("src", "a", ""), ("free2", "c", "")],
            ["free1", "src", "late", "free2"],
            id="ready-nodes-by-config-order",
        ),
        pytest.param([("x", "a", "a")], ["x"], id="self-dependency-ignored"),
        pytest.param(
            [("x", "a", ""), ("y", "a", ""), ("z", "", "a")], ["x", "y", "z"], id="two-producers-one-key"
        ),
        pytest.param([("s", "-", "a"), ("x", "a", "")], ["x"], id="non-producer-consumer-not-ordered"),
        pytest.param([], [], id="empty"),
    ],
)
def test_order(spec: list[tuple[str, str, str]], expected: list[str]) -> None:
    """Each producer comes after the producers of what it consumes; otherwise config order holds."""
    order = order_producers(_plugins(spec))
    assert [p.typed_name.name for p in order] == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            [("x", "a", "b"), ("y", "b", "a")],
            "cycle detected among data producers: x/p -> y/p -> x/p",
            id="two-cycle",
        ),
        pytest.param(
            [("free", "", ""), ("z", "c", "b"), ("x", "a", "c"), ("y", "b", "a")],
            "cycle detected among data producers: z/p -> x/p -> y/p -> z/p",
            id="three-cycle-arrows-follow-data-from-first-in-config",
        ),
        pytest.param(
            [("x", "a", ""), ("s", "-", "a:str")],
            "data type mismatch between produced and consumed data for key: a "
            "(x/p produces int, s/c consumes str)",
            id="type-mismatch",
        ),
        pytest.param(
            [("x", "a", ""), ("y", "a:str", "")],
            "data type mismatch between produced and consumed data for key: a "
            "(x/p produces int, y/p produces str)",
            id="two-producers-disagree",
        ),
        pytest.param(
            [("x", "a", ""), ("s", "-", "b")],
            "plugin 's/c' consumes 'b' but no plugin produces it",
            id="missing-producer",
        ),
        pytest.param(
            [("x", "", "c")],
            "plugin 'x/p' consumes 'c' but no plugin produces it",
            id="producer-missing-its-input",
        ),
    ],
)
def test_invalid_graph(spec: list[tuple[str, str, str]], message: str) -> None:
    """Bad producer graphs fail at startup with a message naming the plugins involved."""
    with pytest.raises(ConfigError) as err:
        order_producers(_plugins(spec))
    assert str(err.value) == message


def test_order_is_stable_across_runs() -> None:
    """The same plugins always yield the same order (no set or hash iteration leaks through)."""
    spec = [(f"p{i}", "", "a" if i % 3 else "") for i in range(30)] + [("src", "a", "")]
    first = [p.typed_name.name for p in order_producers(_plugins(spec))]
    for _ in range(5):
        assert [p.typed_name.name for p in order_producers(_plugins(spec))] == first
    assert first.index("src") < first.index("p1")


def test_an_optional_read_orders_after_its_writer_and_needs_none() -> None:
    """READS orders a producer after whoever writes the key; with no writer it is no error."""
    reader, writer = Producer("reader", "b"), Producer("writer", "a")
    reader.READS = frozenset({A})  # type: ignore[attr-defined]
    assert [p.typed_name.name for p in order_producers([reader, writer])] == ["writer", "reader"]
    assert [p.typed_name.name for p in order_producers([reader])] == ["reader"]
    wrong = Producer("wrong", "c")
    wrong.READS = frozenset({A_AS_STR})  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="a \\(writer/p produces int, wrong/p reads str\\)"):
        order_producers([writer, wrong])


def test_a_snapshot_producer_runs_after_the_others_ready_with_it() -> None:
    """``RUN_LAST`` (the in-flight counters): listed first, it still runs after the producers
    that do not need it, here after ``slow`` and the ``reader`` of ``slow``'s key; one that
    consumes its key still follows it."""
    snapshot = Producer("snapshot", "a")
    snapshot.RUN_LAST = True  # type: ignore[attr-defined]
    plugins = [
        snapshot,
        Producer("needs-snapshot", "c", "a"),
        Producer("slow", "b"),
        Producer("reader", "", "b"),
    ]
    assert [p.typed_name.name for p in order_producers(plugins)] == [
        "slow",
        "reader",
        "snapshot",
        "needs-snapshot",
    ]


def test_the_inflight_producer_runs_last_wherever_it_is_listed() -> None:
    from epp.director.producers.inflight_load import InFlightLoadProducer
    from epp.testing.plugins import build

    inflight = build(InFlightLoadProducer)
    plugins = [inflight, Producer("tokenizing", "a"), Producer("other", "b")]
    assert [p.typed_name.name for p in order_producers(plugins)][-1] == inflight.typed_name.name


class _Declares:
    """A producer declaring its own timeout (upstream's timeoutAwareMockPlugin)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def produce_timeout(self) -> float:
        return self.timeout


@pytest.mark.parametrize(
    ("producer", "want"),
    [
        (object(), 0.4),  # not timeout-aware: the default
        (_Declares(30.0), 30.0),  # a declared timeout overrides the default
        (_Declares(0.0), 0.4),  # non-positive: the default
        (_Declares(-1.0), 0.4),
    ],
)
def test_producer_timeout(producer: object, want: float) -> None:
    assert producer_timeout(producer, 0.4) == want
