"""metrics-data-source: parameters, URL, TLS, what it parses, and its lifecycle."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from epp.datalayer.api import EndpointEvent
from epp.datalayer.exposition import MetricFamilies
from epp.datalayer.http_client import ScrapeError
from epp.datalayer.sources.metrics_http import MetricsDataSourceParams, parse_duration
from tests.datalayer.conftest import FakeModelServer, make_endpoint, make_extractor, make_source


@pytest.mark.parametrize(
    ("params", "field", "value"),
    [
        pytest.param({}, "scheme", "http", id="default-scheme"),
        pytest.param({}, "path", "/metrics", id="default-path"),
        pytest.param({}, "insecure_skip_verify", True, id="default-insecure"),
        pytest.param({"timeout": "1m30s"}, "timeout", 90.0, id="go-duration"),
        pytest.param({"timeout": "250ms"}, "timeout", 0.25, id="millis"),
        pytest.param({"timeout": 2}, "timeout", 2.0, id="seconds-number"),
        pytest.param({"maxBodyBytes": 1024}, "max_body_bytes", 1024, id="max-body"),
        pytest.param({}, "port", None, id="default-port"),
        pytest.param({"port": 9090}, "port", 9090, id="port"),
        pytest.param({}, "interval", None, id="default-interval"),
        pytest.param({"interval": ""}, "interval", None, id="empty-interval"),
        pytest.param({"interval": "1s"}, "interval", 1.0, id="interval"),
        pytest.param({"caCertPath": "/ca.pem"}, "ca_cert_path", "/ca.pem", id="ca"),
        pytest.param({"clientCertPath": "/c.pem"}, "client_cert_path", "/c.pem", id="client-cert"),
        pytest.param({"clientKeyPath": "/k.pem"}, "client_key_path", "/k.pem", id="client-key"),
    ],
)
def test_params(params: dict[str, Any], field: str, value: Any) -> None:
    """llm-d-router's parameters with their defaults, plus our timeout and body bound."""
    assert getattr(MetricsDataSourceParams.model_validate(params), field) == value


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"scheme": "ftp"}, "unsupported scheme: ftp", id="scheme"),
        pytest.param({"timeout": "soon"}, 'time: invalid duration "soon"', id="duration"),
        pytest.param({"timeout": "0s"}, "greater than 0", id="zero-timeout"),
        pytest.param({"maxBodyBytes": 0}, "greater than 0", id="zero-body"),
        pytest.param({"port": 0}, "invalid port 0: must be between 1 and 65535", id="port-zero"),
        pytest.param({"port": 65536}, "invalid port 65536", id="port-high"),
        pytest.param({"interval": -1}, "greater than or equal to 0", id="negative-interval"),
        pytest.param({"interval": "often"}, 'time: invalid duration "often"', id="bad-interval"),
        pytest.param({"portt": 9000}, "Extra inputs are not permitted", id="unknown"),
    ],
)
def test_param_errors(params: dict[str, Any], message: str) -> None:
    """Invalid parameters are rejected at build time."""
    with pytest.raises(ValidationError, match=message):
        MetricsDataSourceParams.model_validate(params)


def test_parse_duration_passthrough() -> None:
    """Non-strings pass through to pydantic's own float validation."""
    assert parse_duration(1.5) == 1.5


def test_bind_narrows_parsing_to_the_extractors_families() -> None:
    """With extractors that name their families only those are parsed; otherwise everything."""
    source = make_source()
    unbound = source.wanted
    source.bind([make_extractor()])
    narrowed = source.wanted
    source.bind([make_extractor(), object()])  # type: ignore[list-item]
    assert unbound is None
    assert narrowed is not None
    assert "vllm:num_requests_waiting" in narrowed
    assert source.wanted is None


async def test_poll_uses_metrics_port_and_path(servers: Callable[[int], Any]) -> None:
    """The scrape goes to address:metrics_port (when set) and the configured path."""
    (srv,) = await servers(1)
    source = make_source(path="metrics")  # a missing leading slash is added, as Go's URL does
    source.bind([make_extractor()])
    await source.start()
    try:
        ep = make_endpoint(port=1, metrics_port=srv.port)
        fams = await source.poll(ep)
        assert isinstance(fams, MetricFamilies)
        assert fams["vllm:num_requests_waiting"][0].value == 3.0
        assert "vllm:e2e_request_latency_seconds_bucket" not in fams
        assert srv.behaviour.requests == 1
    finally:
        await source.stop()


async def test_poll_errors_and_connection_reuse(servers: Callable[[int], Any]) -> None:
    """Non-200 and oversized pages are errors; good polls reuse one connection; chunked bodies work."""
    (srv,) = await servers(1)
    source = make_source(maxBodyBytes=50_000)
    await source.start()
    ep = srv.endpoint()
    try:
        for _ in range(3):
            await source.poll(ep)
        assert len(srv.behaviour.connections) == 1
        srv.behaviour.chunked = True
        assert "vllm:num_requests_waiting" in await source.poll(ep)
        srv.behaviour.chunked = False
        srv.behaviour.status = 503
        with pytest.raises(ScrapeError, match="unexpected status code 503"):
            await source.poll(ep)
        srv.behaviour.status = 200
        srv.behaviour.body = b"x" * 60_000
        with pytest.raises(ScrapeError, match="exceeds the limit of 50000"):
            await source.poll(ep)
        assert source.idle_connections() == 0
        srv.behaviour.body = b"vllm:num_requests_waiting 1\n"
        await source.poll(ep)
        source.endpoint_event(EndpointEvent("Delete", ep))
        assert source.idle_connections() == 0
    finally:
        await source.stop()


async def test_poll_before_start_and_idempotent_lifecycle() -> None:
    """Polling needs start(); start and stop may be called twice (the runtime and run() may both)."""
    source = make_source()
    with pytest.raises(RuntimeError, match="poll before start"):
        await source.poll(make_endpoint())
    await source.start()
    await source.start()
    await source.stop()
    await source.stop()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "model-server")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "tls.crt", tmp / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


async def test_https_with_and_without_verification(tmp_path: Path) -> None:
    """https scrapes work with insecureSkipVerify; with verification a self-signed cert is refused."""
    cert, key = _self_signed(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    app = web.Application()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=b"vllm:num_requests_waiting 5\n")

    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port: int = runner.addresses[0][1]
    insecure, strict = make_source(scheme="https"), make_source(scheme="https", insecureSkipVerify=False)
    await insecure.start()
    await strict.start()
    try:
        ep = make_endpoint(port=port)
        assert (await insecure.poll(ep))["vllm:num_requests_waiting"][0].value == 5.0
        with pytest.raises(ScrapeError, match="CERTIFICATE_VERIFY_FAILED"):
            await strict.poll(ep)
    finally:
        await insecure.stop()
        await strict.stop()
        await runner.cleanup()


async def test_vanished_server(servers: Callable[[int], Any]) -> None:
    """A server that went away is a connect error, and polling works again once it is back."""
    (srv,) = await servers(1)
    source = make_source()
    await source.start()
    ep = srv.endpoint()
    try:
        await source.poll(ep)
        await srv.stop()
        with pytest.raises(ScrapeError):
            await source.poll(ep)
        revived = FakeModelServer()
        revived.port = srv.port
        app_started = await _restart_on(revived, srv.port)
        if not app_started:
            pytest.skip("port was taken by someone else in between")
        assert "vllm:num_requests_waiting" in await source.poll(ep)
        await revived.stop()
    finally:
        await source.stop()


async def _restart_on(server: FakeModelServer, port: int) -> bool:
    app = web.Application()
    app.router.add_get("/metrics", server._metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
    except OSError:
        await runner.cleanup()
        return False
    server._runner = runner
    return True
