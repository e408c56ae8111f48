"""The shared secrets a sync peer must present (``--peer-secret-file``, the syncer's ``secretFile``).

Why: a replica applies whatever a peer publishes to it (in-flight load, prefix entries, session
bindings), so anyone who reaches the peer port could steer its routing, and a snapshot hands out
the whole routing state.  With a secret file, a peer's Publish call must carry
``authorization: Bearer <secret>`` (checked once per call, not per message: the call lasts as long
as the connection) and a snapshot request must carry the secret; anything else is refused and
counted (``epp_sync_rejected_total{reason="unauthenticated"}``).

Rotation without a partition: the file holds several secrets, one a line, and a peer may present
any of them; the first is the one this replica presents.  Add the new secret as a second line
everywhere, then move it first everywhere, then drop the old line.  When the file changes, the
replica's peer connections are closed both ways, so every call is authenticated again against the
new set (a dropped secret stops working at once) and every link presents the new first secret.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Final

from epp.errors import ConfigError

MIN_CHARS: Final = 16
BEARER: Final = b"Bearer "


def parse_secrets(text: str, source: str) -> tuple[bytes, ...]:
    """The secrets in a secret file's ``text``: one a line, ``#`` comments and blank lines skipped;
    each at least ``MIN_CHARS`` visible ASCII characters (an HTTP/2 header value)."""
    found: list[bytes] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not (line.isascii() and line.isprintable()) or " " in line or "\t" in line:
            raise ConfigError(f"{source}: line {n}: a peer secret is visible ASCII without spaces")
        if len(line) < MIN_CHARS:
            raise ConfigError(
                f"{source}: line {n}: a peer secret needs at least {MIN_CHARS} characters, got {len(line)}"
            )
        found.append(line.encode("ascii"))
    if not found:
        raise ConfigError(
            f"{source}: no peer secret in the file (one a line, at least {MIN_CHARS} characters)"
        )
    return tuple(found)


class PeerSecret:
    """The secrets this replica accepts (any line) and presents (the first); ``set`` swaps them."""

    def __init__(self, secrets: tuple[bytes, ...]) -> None:
        if not secrets:
            raise ValueError("PeerSecret needs at least one secret")
        self._secrets = secrets
        self._listeners: list[Callable[[], None]] = []

    @property
    def presented(self) -> bytes:
        """What this replica presents to its peers."""
        return self._secrets[0]

    @property
    def authorization(self) -> bytes:
        """The ``authorization`` header value of a Publish call."""
        return BEARER + self._secrets[0]

    def accepts(self, presented: bytes) -> bool:
        """Whether ``presented`` is one of the secrets; every one is compared, in constant time."""
        ok = False
        for secret in self._secrets:
            ok |= hmac.compare_digest(secret, presented)
        return ok

    def accepts_authorization(self, value: bytes) -> bool:
        """Whether an ``authorization`` header value is ``Bearer <one of the secrets>``."""
        return value.startswith(BEARER) and self.accepts(value[len(BEARER) :])

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after the secrets change (the transport drops its connections)."""
        self._listeners.append(listener)

    def set(self, secrets: tuple[bytes, ...]) -> None:
        """Install a reloaded file's secrets; listeners run only when they differ."""
        if not secrets:
            raise ValueError("PeerSecret needs at least one secret")
        if secrets == self._secrets:
            return
        self._secrets = secrets
        for listener in list(self._listeners):
            listener()
