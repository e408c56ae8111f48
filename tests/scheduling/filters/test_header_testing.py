"""header-based-testing-filter: the conformance endpoint-selection header."""

from __future__ import annotations

import pytest

from epp.datalayer.api import Endpoint
from epp.plugin.state import CycleState
from epp.scheduling.api import Filter
from epp.scheduling.filters.header_testing import HEADER, HeaderBasedTestingFilter, split_host_port
from epp.testing.plugins import build
from tests.scheduling.builders import endpoint, request


def _candidates() -> list[Endpoint]:
    return [
        endpoint(0),  # 192.168.1.1:8000
        endpoint(1),  # 192.168.1.2:8000
        endpoint(2),  # 192.168.1.3:8000
        endpoint(3, address="fd00::1", port=8000),
        endpoint(4, address="10.0.0.9", port=8000),
        endpoint(5, address="10.0.0.9", port=8001),  # a second rank of the same pod
    ]


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        pytest.param(None, [], id="missing-header-keeps-nothing"),
        pytest.param("   ", [], id="blank-header-keeps-nothing"),
        pytest.param("192.168.1.2", [1], id="bare-ip"),
        pytest.param("192.168.1.2:8000", [1], id="ip-port-exact"),
        pytest.param("192.168.1.2:9000", [], id="ip-port-wrong-port"),
        pytest.param("192.168.1.3,192.168.1.1", [2, 0], id="header-order"),
        pytest.param("192.168.1.1,192.168.1.1:8000", [0], id="dedup-by-ip"),
        pytest.param(" 192.168.1.1 , ,", [0], id="spaces-and-empty-items"),
        pytest.param("192.168.1.99", [], id="unknown-ip"),
        pytest.param("fd00::1", [3], id="ipv6-bare"),
        pytest.param("[fd00::1]", [3], id="ipv6-bracketed"),
        pytest.param("[fd00::1]:8000", [3], id="ipv6-bracketed-port"),
        pytest.param("[fd00::1]:9000", [], id="ipv6-wrong-port"),
        pytest.param("10.0.0.9", [5], id="shared-ip-last-rank-wins"),
        pytest.param("10.0.0.9:8000", [4], id="shared-ip-exact-rank"),
        pytest.param("10.0.0.9:8000,10.0.0.9:8001", [4, 5], id="shared-ip-ranks-stay-distinct"),
        pytest.param("10.0.0.9:8000,10.0.0.9:8000", [4], id="same-endpoint-once"),
        pytest.param("192.168.1.1:", [0], id="empty-port-is-ip-only"),
    ],
)
def test_header_filter(header: str | None, expected: list[int]) -> None:
    """Keeps endpoints named in the header, in header order, once per IP; exact port when given."""
    f = build(HeaderBasedTestingFilter)
    assert isinstance(f, Filter)
    eps = _candidates()
    headers = {} if header is None else {HEADER: header}
    got = f.filter(CycleState(), request(headers=headers), eps)
    assert [eps.index(e) for e in got] == expected


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        pytest.param("1.2.3.4:80", ("1.2.3.4", "80"), id="v4"),
        pytest.param("[::1]:80", ("::1", "80"), id="v6"),
        pytest.param("1.2.3.4", None, id="missing-port"),
        pytest.param("::1", None, id="too-many-colons"),
        pytest.param("[::1]", None, id="bracket-missing-port"),
        pytest.param("[::1", None, id="missing-bracket"),
        pytest.param("[::1]x:80", None, id="junk-after-bracket"),
        pytest.param("a]:80", None, id="unexpected-bracket"),
        pytest.param("host:", ("host", ""), id="empty-port"),
    ],
)
def test_split_host_port(item: str, expected: tuple[str, str] | None) -> None:
    """Mirrors Go's net.SplitHostPort success and failure cases."""
    assert split_host_port(item) == expected
