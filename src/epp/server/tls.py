"""TLS for the ext_proc port: tls.crt/tls.key from --cert-path (optionally hot-reloaded) or self-signed."""

from __future__ import annotations

import ipaddress
import os
import secrets
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Final

import grpc
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from epp.errors import ConfigError

log = structlog.get_logger(__name__)

CERT_FILE: Final = "tls.crt"
KEY_FILE: Final = "tls.key"
RELOAD_DEBOUNCE: Final = 0.25  # seconds the files must sit unchanged before a reload (GIE's debounce)
SELF_SIGNED_ORG: Final = "Inference Ext"
SELF_SIGNED_KEY_BITS: Final = 4096
SELF_SIGNED_VALIDITY: Final = timedelta(days=3650)
# How far before "now" a generated certificate becomes valid. A peer whose clock is a little
# behind ours (or a clock stepped back by NTP between generation and handshake) would otherwise
# reject the certificate as "not yet valid"; client-go's self-signed certificates backdate the
# same hour.
SELF_SIGNED_BACKDATE: Final = timedelta(hours=1)

_Signature = tuple[tuple[int, int, int], tuple[int, int, int]]  # (mtime_ns, size, inode) of crt and key


def server_credentials(cert_path: str, enable_reload: bool) -> grpc.ServerCredentials:
    """``grpc.ServerCredentials`` for ``--secure-serving`` (ALPN h2 is grpc's default).

    With ``cert_path`` empty, a self-signed RSA-4096 certificate is generated in memory:
    that takes 0.3-2 s of CPU, so call this once at startup (off the event loop), never per
    connection.  Nothing is written to disk.  ``enable_reload`` only applies to ``cert_path``.
    """
    if not cert_path:
        cert_pem, key_pem = generate_self_signed()
        return grpc.ssl_server_credentials([(key_pem, cert_pem)])
    if not enable_reload:
        cert_pem, key_pem = load_key_pair(cert_path)
        return grpc.ssl_server_credentials([(key_pem, cert_pem)])
    reloader = CertReloader(cert_path)
    return grpc.dynamic_ssl_server_credentials(reloader.initial, reloader.fetch)


def generate_self_signed(
    *,
    key_bits: int = SELF_SIGNED_KEY_BITS,
    organization: str = SELF_SIGNED_ORG,
    validity: timedelta = SELF_SIGNED_VALIDITY,
    hosts: Sequence[str] = (),
) -> tuple[bytes, bytes]:
    """A self-signed server certificate and its key, PEM: GIE's (org, 10 years, no SAN by default).

    It is valid from ``SELF_SIGNED_BACKDATE`` before now, so clock skew cannot make it "not yet valid".

    ``hosts`` adds subjectAltName entries (IP literals or DNS names), for clients that verify.
    """
    key = rsa.generate_private_key(public_exponent=65537, key_size=key_bits)
    now = datetime.now(UTC)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(secrets.randbits(127) + 1)
        .not_valid_before(now - SELF_SIGNED_BACKDATE)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=True,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def load_key_pair(cert_path: str) -> tuple[bytes, bytes]:
    """``tls.crt`` and ``tls.key`` from ``cert_path``, checked to parse and to belong together.

    grpc would otherwise accept garbage here and fail every handshake later.
    """
    directory = Path(cert_path)
    try:
        cert_pem = (directory / CERT_FILE).read_bytes()
        key_pem = (directory / KEY_FILE).read_bytes()
    except OSError as e:
        raise ConfigError(f"failed to load TLS certificate from {cert_path!r}: {e}") from None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except ValueError as e:
        raise ConfigError(f"failed to load TLS certificate from {cert_path!r}: {e}") from None
    spki = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise ConfigError(
            f"failed to load TLS certificate from {cert_path!r}: private key does not match public key"
        )
    return cert_pem, key_pem


class CertReloader:
    """Certificate fetcher for ``grpc.dynamic_ssl_server_credentials``.

    grpc calls ``fetch`` before every TLS handshake, from its own threads.  It stats the two
    files (a few microseconds) and reloads once they have changed (mtime, size or inode: a
    Kubernetes secret update swaps a symlink) and have sat unchanged for ``debounce``
    seconds, so a half-written pair is never loaded.  Until then, and if the new pair is
    invalid (logged once), the current certificate keeps being served.
    """

    def __init__(
        self,
        cert_path: str,
        *,
        debounce: float = RELOAD_DEBOUNCE,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._cert_dir = self.path = cert_path
        self._debounce = debounce
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._seen_signature = self._signature()
        cert_pem, key_pem = load_key_pair(cert_path)
        self.initial = grpc.ssl_server_certificate_configuration([(key_pem, cert_pem)])

    def _signature(self) -> _Signature | None:
        try:
            crt = os.stat(os.path.join(self._cert_dir, CERT_FILE))
            key = os.stat(os.path.join(self._cert_dir, KEY_FILE))
        except OSError:
            return None  # mid-swap; try again at the next handshake
        return (crt.st_mtime_ns, crt.st_size, crt.st_ino), (key.st_mtime_ns, key.st_size, key.st_ino)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """A new ``ServerCertificateConfiguration`` when the files changed, else None (keep serving)."""
        pair = self.changed_pair()
        if pair is None:
            return None
        cert_pem, key_pem = pair
        return grpc.ssl_server_certificate_configuration([(key_pem, cert_pem)])

    def changed_pair(self) -> tuple[bytes, bytes] | None:
        """The new (cert, key) PEM pair once the files changed and settled and it is valid, else None."""
        sig = self._signature()
        if sig is None or sig == self._seen_signature:
            return None
        newest = max(sig[0][0], sig[1][0]) / 1e9
        if self._wall_clock() - newest < self._debounce:
            return None
        with self._lock:
            if sig == self._seen_signature:  # another handshake thread got here first
                return None
            self._seen_signature = sig
            try:
                pair = load_key_pair(self._cert_dir)
            except ConfigError as e:
                failure = str(e)
            else:
                log.info("tls_certificate_reloaded", path=self._cert_dir)
                return pair
        log.error("tls_certificate_reload_failed", path=self._cert_dir, error=failure)
        return None


def ssl_context(cert_path: str) -> ssl.SSLContext:
    """An ``ssl.SSLContext`` (ALPN h2) for the transports on the event loop (h2).

    Same sources as ``server_credentials``: ``tls.crt``/``tls.key`` from ``cert_path``, or a
    self-signed certificate generated in memory.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.set_alpn_protocols(["h2"])
    if cert_path:
        cert_pem, key_pem = load_key_pair(cert_path)
    else:
        cert_pem, key_pem = generate_self_signed()
    load_into(ctx, cert_pem, key_pem)
    return ctx


def load_into(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Install a PEM pair in ``ctx``; later handshakes use it.

    ``ssl`` loads keys only from files, so the pair is written to a private temporary
    directory and removed at once.
    """
    with tempfile.TemporaryDirectory(prefix="epp-tls-") as d:
        crt, key = Path(d) / CERT_FILE, Path(d) / KEY_FILE
        crt.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        ctx.load_cert_chain(crt, key)
