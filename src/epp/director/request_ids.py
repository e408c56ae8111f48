"""Ids for requests that arrive without ``x-request-id``: UUID version 4 strings, as GIE's
``uuid.NewString()``, from the OS's random source read in blocks.

``str(uuid.uuid4())`` costs a ``getrandom`` system call (made with the GIL released) and a ``UUID``
object a request: py-spy put 9% of the loop's samples in it at capacity when the EPP is driven
directly over ext_proc with no request ids (Envoy sets one on every request by default; other
gateways and direct clients may not), and an A/B of the live process measured about 1% of its CPU.
Here one ``os.urandom`` call serves ``BLOCK`` ids and the string is formatted from the integer.
The ids are the same kind: 122 random bits from the same source, the version-4 and RFC 4122
variant bits set as ``uuid.UUID(version=4)`` sets them (tests/director/test_request_ids.py checks
them against the ``uuid`` module).

A forked child starts on a fresh block, so parent and child never hand out the same ids.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import ClassVar, Final

BLOCK: Final = 256  # ids per read of the random source (4 KiB)
_ID_BYTES: Final = 16
# uuid.UUID(int=..., version=4): version nibble 4 in bits 76-79, variant 0b10 in bits 62-63
_CLEAR: Final = ((1 << 128) - 1) & ~((0xF000 << 64) | (0xC000 << 48))
_SET: Final = (4 << 76) | (0x8000 << 48)


class RequestIds:
    """A source of request ids (one per director: no state shared between pipelines)."""

    # Forks of this process so far, as children count them: one hook for the process, not one
    # per instance (a director is made per config reload; hooks cannot be unregistered).
    forks: ClassVar[int] = 0

    __slots__ = ("_at", "_buf", "_forks", "_urandom")

    def __init__(self, urandom: Callable[[int], bytes] = os.urandom) -> None:
        self._urandom = urandom
        self._buf = b""
        self._at = 0
        self._forks = RequestIds.forks  # the fork the block was read in

    def new(self) -> str:
        """A fresh ``xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx`` id."""
        at = self._at
        buf = self._buf
        if at >= len(buf) or self._forks != RequestIds.forks:
            buf = self._buf = self._urandom(_ID_BYTES * BLOCK)
            self._forks = RequestIds.forks
            at = 0
        self._at = at + _ID_BYTES
        h = f"{int.from_bytes(buf[at : at + _ID_BYTES]) & _CLEAR | _SET:032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _forked() -> None:
    RequestIds.forks += 1


os.register_at_fork(after_in_child=_forked)
