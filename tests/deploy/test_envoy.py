"""deploy/envoy/active-active.yaml: the real Envoy accepts it, and its ext_proc cluster drops a dead
EPP fast, by asking the health service the EPP actually serves (tests/e2e/test_epp_failover_envoy.py
kills one under load)."""

from __future__ import annotations

import pytest
import yaml

from epp.server import health
from tests.deploy.envoy import ENVOY_DIR, active_active, cluster, validate

ACTIVE_ACTIVE = ENVOY_DIR / "active-active.yaml"


def shipped() -> dict[str, object]:
    config: dict[str, object] = yaml.safe_load(ACTIVE_ACTIVE.read_text())
    return config


def test_envoy_validates_the_shipped_file() -> None:
    out = validate(ACTIVE_ACTIVE)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK" in out.stdout


def test_envoy_validates_it_with_moved_addresses() -> None:
    """What the e2e test runs: the same file with its EPPs on other ports."""
    out = validate(active_active([(19002, 19003), (19012, 19013), (19022, 19023)]))
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_broken_config_is_caught() -> None:
    """The validation is not vacuous: Envoy refuses a bad health check."""
    config = active_active([(19002, 19003)])
    cluster(config, "ext_proc")["health_checks"][0]["interval"] = "soon"
    assert validate(config).returncode != 0
    config = active_active([(19002, 19003)])
    del cluster(config, "ext_proc")["health_checks"][0]["grpc_health_check"]
    assert validate(config).returncode != 0


def test_every_epp_is_checked_on_its_health_port_fast() -> None:
    ext_proc = cluster(shipped(), "ext_proc")
    (group,) = ext_proc["load_assignment"]["endpoints"]
    endpoints = [e["endpoint"] for e in group["lb_endpoints"]]
    assert len(endpoints) >= 2
    for e in endpoints:  # the health port, not the ext_proc one (the EPP serves health there)
        assert e["health_check_config"]["port_value"] != e["address"]["socket_address"]["port_value"]
    (check,) = ext_proc["health_checks"]
    seconds = {k: float(check[k].rstrip("s")) for k in ("interval", "no_traffic_interval", "timeout")}
    assert 0.25 <= seconds["interval"] <= 0.5
    assert seconds["no_traffic_interval"] <= 0.5  # an idle gateway's view is as fresh
    assert seconds["timeout"] <= seconds["interval"]
    assert 1 <= check["unhealthy_threshold"] <= 2
    # interval x threshold: a replica that stops answering is out within a second
    assert seconds["interval"] * check["unhealthy_threshold"] + seconds["timeout"] <= 1.0
    outliers = ext_proc["outlier_detection"]
    assert outliers["consecutive_gateway_failure"] == 1
    assert outliers["enforcing_consecutive_gateway_failure"] == 100
    assert outliers["max_ejection_percent"] < 100  # errors alone never empty the cluster


def test_the_checked_service_is_the_epps_readiness() -> None:
    """Envoy asks ``readiness``: every ready replica passes without leader election, only the
    leader with it, and a draining EPP (after SIGTERM) fails it, so it leaves before it closes."""
    (check,) = cluster(shipped(), "ext_proc")["health_checks"]
    service = check["grpc_health_check"]["service_name"]
    assert service == health.READINESS

    def status(*, ready: bool, leader_election: bool, leader: bool) -> object:
        servicer = health.HealthServicer(
            lambda: ready, leader_election=leader_election, leader=lambda: leader
        )
        return servicer.status(service)

    assert status(ready=True, leader_election=False, leader=False) == health.SERVING
    assert status(ready=False, leader_election=False, leader=False) == health.NOT_SERVING
    assert status(ready=True, leader_election=True, leader=False) == health.NOT_SERVING
    assert status(ready=True, leader_election=True, leader=True) == health.SERVING


@pytest.mark.parametrize(
    "key", ["processing_mode", "failure_mode_allow", "message_timeout", "metadata_options"]
)
def test_the_ext_proc_filter_is_gies(key: str) -> None:
    """The listener is gie.yaml's: only the ext_proc cluster (and the stream retry) differ."""

    def ext_proc_filter(config: dict[str, object]) -> dict[str, object]:
        (listener,) = config["static_resources"]["listeners"]  # type: ignore[index]
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        (f,) = [f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc"]
        typed: dict[str, object] = f["typed_config"]
        return typed

    gie = yaml.safe_load((ENVOY_DIR / "gie.yaml").read_text())
    assert ext_proc_filter(shipped())[key] == ext_proc_filter(gie)[key]
