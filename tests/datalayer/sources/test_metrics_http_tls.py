"""metrics-data-source over mTLS (``caCertPath``, ``clientCertPath``, ``clientKeyPath``), ``port``
and ``interval``: a real TLS server that requires a client certificate signed by its CA.

Upstream's cases (source/http/datasource_catls_test.go, source/metrics/datasource_config_test.go
at ebab68792): a CA bundle verifies a private server cert, a client cert is presented for mTLS,
an unreadable CA or key pair fails construction, ``port`` must be 1..65535 and overrides the
endpoint's port, ``interval`` is the scrape period.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from epp.datalayer.http_client import ScrapeError
from epp.datalayer.runtime import period_ticks
from epp.errors import ConfigError
from tests.datalayer.conftest import make_endpoint, make_source

PAGE = b"vllm:num_requests_waiting 5\n"


@dataclass(frozen=True)
class PKI:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client cert from another CA
    stranger_key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    usage: x509.ObjectIdentifier | None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer if issuer is not None else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=usage is None, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if usage == ExtendedKeyUsageOID.SERVER_AUTH:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(
    tmp: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_key_pem(key))
    return cert_path, key_path


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    ca_key, other_ca_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = _cert("test-ca", ca_key, None, None)
    ca, _ = _write(tmp_path, "ca", ca_cert, ca_key)
    keys = [ec.generate_private_key(ec.SECP256R1()) for _ in range(3)]
    server = _write(
        tmp_path,
        "server",
        _cert("model-server", keys[0], ("test-ca", ca_key), ExtendedKeyUsageOID.SERVER_AUTH),
        keys[0],
    )
    client = _write(
        tmp_path,
        "client",
        _cert("epp", keys[1], ("test-ca", ca_key), ExtendedKeyUsageOID.CLIENT_AUTH),
        keys[1],
    )
    stranger = _write(
        tmp_path,
        "stranger",
        _cert("epp", keys[2], ("other-ca", other_ca_key), ExtendedKeyUsageOID.CLIENT_AUTH),
        keys[2],
    )
    return PKI(ca, *server, *client, *stranger)


@pytest.fixture
async def mtls_port(pki: PKI) -> AsyncIterator[int]:
    """A metrics server that requires a client certificate signed by the test CA."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    ctx.load_verify_locations(cafile=pki.ca)
    ctx.verify_mode = ssl.CERT_REQUIRED

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=PAGE)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def _waiting(pki: PKI, endpoint_port: int, **params: object) -> float:
    source = make_source(scheme="https", insecureSkipVerify=False, caCertPath=str(pki.ca), **params)
    await source.start()
    try:
        fams = await source.poll(make_endpoint(port=endpoint_port))
        return fams["vllm:num_requests_waiting"][0].value
    finally:
        await source.stop()


async def test_client_certificate_is_presented(pki: PKI, mtls_port: int) -> None:
    """With the CA bundle and a client cert from the server's CA, the scrape succeeds."""
    value = await _waiting(
        pki, mtls_port, clientCertPath=str(pki.client_cert), clientKeyPath=str(pki.client_key)
    )
    assert value == 5.0


async def test_without_or_with_a_foreign_client_certificate_the_server_refuses(
    pki: PKI, mtls_port: int
) -> None:
    """The server really requires the certificate: none, or one of another CA, fails the poll."""
    with pytest.raises(ScrapeError):
        await _waiting(pki, mtls_port)
    with pytest.raises(ScrapeError):
        await _waiting(
            pki, mtls_port, clientCertPath=str(pki.stranger_cert), clientKeyPath=str(pki.stranger_key)
        )


async def test_ca_bundle_is_what_verifies_the_server(pki: PKI, mtls_port: int) -> None:
    """Without caCertPath the private server cert is not trusted (system pool); with it, it is."""
    source = make_source(
        scheme="https",
        insecureSkipVerify=False,
        clientCertPath=str(pki.client_cert),
        clientKeyPath=str(pki.client_key),
    )
    await source.start()
    try:
        with pytest.raises(ScrapeError, match="CERTIFICATE_VERIFY_FAILED"):
            await source.poll(make_endpoint(port=mtls_port))
    finally:
        await source.stop()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param(
            {"caCertPath": "/nonexistent/ca.pem"},
            "caCertPath: reading CA cert /nonexistent/ca.pem",
            id="ca-missing",
        ),
        pytest.param(
            {"clientCertPath": "CERT"},
            "clientKeyPath: clientCertPath and clientKeyPath must be set together",
            id="no-key",
        ),
        pytest.param(
            {"clientKeyPath": "KEY"},
            "clientCertPath: clientCertPath and clientKeyPath must be set together",
            id="no-cert",
        ),
        pytest.param(
            {"clientCertPath": "CERT", "clientKeyPath": "CA"},
            "clientCertPath/clientKeyPath: loading client cert",
            id="mismatch",
        ),
    ],
)
def test_unusable_tls_files_fail_at_startup(pki: PKI, params: dict[str, str], message: str) -> None:
    """A bad path or key pair is a config error naming the parameter, not a failure on every poll."""
    files = {"CERT": str(pki.client_cert), "KEY": str(pki.client_key), "CA": str(pki.ca)}
    resolved = {k: files.get(v, v) for k, v in params.items()}
    with pytest.raises(ConfigError, match=message):
        make_source(scheme="https", insecureSkipVerify=False, **resolved)


def test_ca_file_without_certificates(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="caCertPath: no valid CA certs in"):
        make_source(scheme="https", insecureSkipVerify=False, caCertPath=str(empty))


def test_tls_files_are_ignored_for_http() -> None:
    """As upstream, the TLS options matter only for https: an http source never reads them."""
    make_source(caCertPath="/nonexistent", clientCertPath="/nonexistent")


async def test_port_overrides_every_endpoints_port(pki: PKI, mtls_port: int) -> None:
    """``port`` replaces the endpoint's serving and metrics port (a metrics sidecar's port)."""
    source = make_source(port=mtls_port)
    ep = make_endpoint(port=1, metrics_port=2)
    assert source.target(ep) == ("127.0.0.1", mtls_port)
    assert make_source().target(ep) == ("127.0.0.1", 2)
    assert (
        await _waiting(
            pki, 1, port=mtls_port, clientCertPath=str(pki.client_cert), clientKeyPath=str(pki.client_key)
        )
        == 5.0
    )


def test_interval_is_the_runtimes_period() -> None:
    """``interval`` reaches the runtime as the source's poll period, in base ticks."""
    source = make_source(interval="1s")
    assert source.poll_interval == 1.0
    assert period_ticks(source.poll_interval, 0.05) == 20
    assert make_source().poll_interval is None
