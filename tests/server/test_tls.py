"""TLS for the ext_proc port: certificate loading, self-signed generation and hot reload."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from epp.errors import ConfigError
from epp.server import tls
from epp.server.tls import (
    CERT_FILE,
    KEY_FILE,
    SELF_SIGNED_BACKDATE,
    CertReloader,
    generate_self_signed,
    load_key_pair,
    server_credentials,
)

HOSTS = ("127.0.0.1", "localhost")
Pair = tuple[bytes, bytes]
Serve = Callable[[grpc.ServerCredentials], Awaitable[int]]


@pytest.fixture(scope="module")
def pair_a() -> Pair:
    return generate_self_signed(key_bits=2048, hosts=HOSTS)


@pytest.fixture(scope="module")
def pair_b() -> Pair:
    return generate_self_signed(key_bits=2048, hosts=HOSTS)


def write_pair(directory: Path, pair: Pair, *, age: float = 10.0) -> None:
    """Write tls.crt/tls.key with an mtime ``age`` seconds in the past (past the reload debounce)."""
    cert_pem, key_pem = pair
    for name, data in ((CERT_FILE, cert_pem), (KEY_FILE, key_pem)):
        tmp = directory / f".{name}.tmp"
        tmp.write_bytes(data)
        past = time.time() - age
        os.utime(tmp, (past, past))
        tmp.replace(directory / name)  # a new inode, as a Kubernetes secret update produces


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[grpc.aio.Server] = []

    async def start(creds: grpc.ServerCredentials) -> int:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
        )
        server.add_generic_rpc_handlers((handler,))
        port = server.add_secure_port("127.0.0.1:0", creds)
        await server.start()
        servers.append(server)
        return int(port)

    yield start
    for server in servers:
        await server.stop(None)


async def call(port: int, trusted_cert_pem: bytes) -> bytes:
    """One RPC over a fresh connection from a client that trusts only ``trusted_cert_pem``."""
    creds = grpc.ssl_channel_credentials(root_certificates=trusted_cert_pem)
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=options) as channel:
        reply: bytes = await channel.unary_unary("/test.Echo/Echo")(b"ping", timeout=10)
        return reply


@pytest.mark.parametrize("reload", [pytest.param(False, id="static"), pytest.param(True, id="reloadable")])
async def test_serves_client_that_trusts_the_cert(
    tmp_path: Path, pair_a: Pair, pair_b: Pair, serve: Serve, reload: bool
) -> None:
    """A grpc.aio server with these credentials completes TLS with a client trusting the cert, not another."""
    write_pair(tmp_path, pair_a)
    port = await serve(server_credentials(str(tmp_path), reload))
    assert await call(port, pair_a[0]) == b"ping"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(port, pair_b[0])
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_reload_serves_the_new_cert(tmp_path: Path, pair_a: Pair, pair_b: Pair, serve: Serve) -> None:
    """With reload on, the next handshake after the files are replaced presents the new certificate."""
    write_pair(tmp_path, pair_a)
    port = await serve(server_credentials(str(tmp_path), enable_reload=True))
    assert await call(port, pair_a[0]) == b"ping"
    write_pair(tmp_path, pair_b)
    assert await call(port, pair_b[0]) == b"ping"
    with pytest.raises(grpc.aio.AioRpcError):
        await call(port, pair_a[0])


async def test_without_reload_the_old_cert_stays(
    tmp_path: Path, pair_a: Pair, pair_b: Pair, serve: Serve
) -> None:
    """Without --enable-cert-reload a replaced certificate is not picked up."""
    write_pair(tmp_path, pair_a)
    port = await serve(server_credentials(str(tmp_path), enable_reload=False))
    write_pair(tmp_path, pair_b)
    assert await call(port, pair_a[0]) == b"ping"


def test_reloader_debounces_fresh_files(tmp_path: Path, pair_a: Pair, pair_b: Pair) -> None:
    """Files younger than the debounce are not loaded; once they are old enough they are, once."""
    write_pair(tmp_path, pair_a)
    now = [time.time()]
    reloader = CertReloader(str(tmp_path), debounce=0.25, wall_clock=lambda: now[0])
    assert reloader.fetch() is None  # unchanged
    write_pair(tmp_path, pair_b, age=0.0)
    now[0] = time.time() + 0.1
    assert reloader.fetch() is None  # changed 0.1 s ago: still settling
    now[0] += 0.2
    assert reloader.fetch() is not None  # 0.3 s of quiet: reload
    assert reloader.fetch() is None  # and only once


def test_reloader_keeps_serving_when_new_pair_is_broken(tmp_path: Path, pair_a: Pair, pair_b: Pair) -> None:
    """A mismatched new pair is rejected (the old cert stays) and not retried until the files change."""
    write_pair(tmp_path, pair_a)
    reloader = CertReloader(str(tmp_path))
    write_pair(tmp_path, (pair_b[0], pair_a[1]))
    assert reloader.fetch() is None
    assert reloader.fetch() is None
    write_pair(tmp_path, pair_b)
    assert reloader.fetch() is not None


@pytest.mark.parametrize(
    ("files", "message"),
    [
        pytest.param({}, "No such file", id="missing"),
        pytest.param({CERT_FILE: b"junk", KEY_FILE: b"junk"}, "failed to load TLS certificate", id="garbage"),
        pytest.param("mismatch", "private key does not match public key", id="mismatched-key"),
    ],
)
def test_load_key_pair_rejects(
    tmp_path: Path, pair_a: Pair, pair_b: Pair, files: dict[str, bytes] | str, message: str
) -> None:
    """Unusable certificate directories fail at startup with a ConfigError naming the problem."""
    if files == "mismatch":
        write_pair(tmp_path, (pair_a[0], pair_b[1]))
    else:
        assert isinstance(files, dict)
        for name, data in files.items():
            (tmp_path / name).write_bytes(data)
    with pytest.raises(ConfigError, match=message):
        load_key_pair(str(tmp_path))


def test_self_signed_matches_gie() -> None:
    """The default self-signed cert is GIE's: RSA-4096, org "Inference Ext", 10 years, server auth, no SAN."""
    cert_pem, key_pem = generate_self_signed()
    cert = x509.load_pem_x509_certificate(cert_pem)
    public = cert.public_key()
    assert isinstance(public, rsa.RSAPublicKey)
    assert public.key_size == 4096
    orgs = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [a.value for a in orgs] == ["Inference Ext"]
    assert cert.issuer == cert.subject
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == timedelta(days=3650) + SELF_SIGNED_BACKDATE
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert b"PRIVATE KEY" in key_pem


def test_self_signed_is_valid_for_a_peer_whose_clock_is_behind() -> None:
    """A verifier whose clock is up to the backdate behind ours still finds the cert valid.

    CI saw "certificate is not yet valid" on a cert made valid from the second it was made.
    """
    before = datetime.now(UTC)
    cert_pem, _ = generate_self_signed(key_bits=2048)
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert cert.not_valid_before_utc <= before - timedelta(minutes=59)
    assert cert.not_valid_after_utc >= before + timedelta(days=3650) - timedelta(seconds=1)


async def test_empty_cert_path_serves_a_generated_cert(monkeypatch: pytest.MonkeyPatch, serve: Serve) -> None:
    """--secure-serving without --cert-path serves a certificate generated in memory at startup."""
    generated: list[Pair] = []

    def fast_self_signed() -> Pair:  # 2048 bits and a SAN, so the test client can verify it
        generated.append(generate_self_signed(key_bits=2048, hosts=HOSTS))
        return generated[-1]

    monkeypatch.setattr(tls, "generate_self_signed", fast_self_signed)
    port = await serve(server_credentials("", enable_reload=True))
    assert len(generated) == 1
    assert await call(port, generated[0][0]) == b"ping"


async def test_ssl_context_for_the_event_loop_transport_negotiates_h2(tmp_path: Path) -> None:
    """The SSLContext built for the h2 transport serves the cert from --cert-path with ALPN h2."""
    import asyncio
    import ssl

    from epp.server.tls import ssl_context

    cert_pem, key_pem = generate_self_signed(hosts=["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(cert_pem)
    (tmp_path / "tls.key").write_bytes(key_pem)
    server_ctx = ssl_context(str(tmp_path))
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    client_ctx = ssl.create_default_context(cadata=cert_pem.decode())
    client_ctx.set_alpn_protocols(["h2"])
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="127.0.0.1")
    assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
    writer.close()
    server.close()
    await server.wait_closed()
