"""No-Kubernetes endpoints: the --endpoints flag, the endpoints file and its reload."""

from __future__ import annotations

import pathlib

import pytest

from epp.datastore.static import endpoints_from_flag, load_endpoints_file
from epp.datastore.store import Datastore
from epp.datastore.watch import WatchedFile
from epp.errors import ConfigError


def test_flag_parses_ipv4_and_ipv6() -> None:
    """Host:port pairs, IPv6 in brackets; the name defaults to the host:port."""
    eps = endpoints_from_flag("127.0.0.1:8000, [::1]:8001", "default")
    assert [(e.address, e.port, e.hostport) for e in eps] == [
        ("127.0.0.1", 8000, "127.0.0.1:8000"),
        ("::1", 8001, "[::1]:8001"),
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param("localhost", "missing port", id="no-port"),
        pytest.param("h:99999", "invalid port", id="port-range"),
        pytest.param("::1:80", r"IPv6 addresses must be written \[addr\]:port", id="bare-ipv6"),
        pytest.param("10.0.0.1:1,10.0.0.1:1", "duplicate endpoint", id="duplicate"),
        pytest.param("no-such-host.invalid:80", "cannot resolve endpoint host", id="unresolvable"),
        pytest.param(" , ", "at least one", id="empty"),
    ],
)
def test_flag_errors_name_the_entry(value: str, message: str) -> None:
    """Each bad entry is rejected with the reason."""
    with pytest.raises(ConfigError, match=message):
        endpoints_from_flag(value, "default")


def test_dns_names_resolve_to_ips_but_keep_their_name() -> None:
    """Envoy's ORIGINAL_DST needs an IP: names resolve once; the endpoint keeps the given name."""
    (ep,) = endpoints_from_flag("localhost:8000", "default")
    assert ep.name == "localhost:8000"
    assert ep.address in ("127.0.0.1", "::1")


def test_file_accepts_mapping_or_list_with_labels() -> None:
    """Both shapes load; names, labels and metrics ports are kept."""
    a = load_endpoints_file(
        "endpoints:\n- {address: 10.0.0.1, port: 8000, name: vllm-0, labels: {k: v}, metricsPort: 9000}\n",
        "ns",
    )
    b = load_endpoints_file("- {address: 10.0.0.2, port: 8001}\n", "ns")
    assert (a[0].name, a[0].labels, a[0].metrics_host) == ("vllm-0", {"k": "v"}, "10.0.0.1:9000")
    assert b[0].name == "10.0.0.2:8001"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("endpoints:\n- {address: a, port: 70000}\n", r"endpoints\[0\]\.port", id="port-range"),
        pytest.param(
            "endpoints:\n- {address: a}\n", r"endpoints\[0\]\.port: Field required", id="missing-port"
        ),
        pytest.param(
            "endpoints:\n- {address: a, port: 1, colour: red}\n", r"endpoints\[0\]\.colour", id="unknown"
        ),
        pytest.param("endpoints: [\n", "invalid YAML", id="yaml"),
        pytest.param(
            "- {address: 10.0.0.1, port: 1, name: x}\n- {address: 10.0.0.2, port: 2, name: x}\n",
            "duplicate",
            id="dup",
        ),
    ],
)
def test_file_errors_name_the_field(text: str, message: str) -> None:
    """A bad file is rejected with the entry and field at fault."""
    with pytest.raises(ConfigError, match=message):
        load_endpoints_file(text, "ns")


async def test_reload_applies_good_edits_and_keeps_last_good(tmp_path: pathlib.Path) -> None:
    """A valid edit replaces the endpoint set; a broken edit keeps the previous set."""
    path = tmp_path / "eps.yaml"
    path.write_text("- {address: 10.0.0.1, port: 8000}\n")
    ds = Datastore()
    watched = WatchedFile(
        str(path), lambda t: load_endpoints_file(t, "ns"), ds.replace_all, what="endpoints file"
    )
    watched.load_now()
    assert [e.name for e in ds.endpoints()] == ["10.0.0.1:8000"]

    path.write_text("- {address: 10.0.0.1, port: 8000}\n- {address: 10.0.0.2, port: 8000}\n")
    assert await watched.check()
    assert [e.name for e in ds.endpoints()] == ["10.0.0.1:8000", "10.0.0.2:8000"]

    path.write_text("- {address: 10.0.0.3, port: not-a-port}\n")
    assert not await watched.check()
    assert watched.failures == 1
    assert [e.name for e in ds.endpoints()] == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert not await watched.check()  # the same bad version is not retried
    assert watched.failures == 1


def test_missing_file_fails_startup(tmp_path: pathlib.Path) -> None:
    """A file that cannot be read is a startup error naming it."""
    watched = WatchedFile(str(tmp_path / "nope.yaml"), lambda t: t, lambda v: None, what="endpoints file")
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read"):
        watched.load_now()
