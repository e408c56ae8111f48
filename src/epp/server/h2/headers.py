"""HPACK decoding of request header blocks, cached while the dynamic table stands still.

A proxy opens every ext_proc stream with the same headers; Envoy sends them as the same
bytes each time (indexed fields and literals without indexing), which leave the table
untouched.  A block's meaning depends only on its bytes and the table, so a decode that did
not change the table is cached until one that did; ``hpack`` in pure Python costs tens of µs
per block, this is a dict lookup.
"""

from __future__ import annotations

import hpack

from epp.server.h2.frames import COMPRESSION_ERROR, H2ConnectionError

HeaderList = list[tuple[bytes, bytes]]
CACHED_BLOCKS = 64


class HeaderDecoder:
    """One connection's HPACK decoder (its dynamic table is the connection's state)."""

    __slots__ = ("_cache", "_decoder")

    def __init__(self, max_header_list_bytes: int) -> None:
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 4 * max_header_list_bytes  # an HPACK bomb stops here
        self._cache: dict[bytes, tuple[HeaderList, int]] = {}

    def decode(self, block: bytes) -> tuple[HeaderList, int]:
        """The header list in ``block`` and its size as RFC 7541 counts it (32 more per field)."""
        cache = self._cache
        hit = cache.get(block)
        if hit is not None:
            return hit
        table = self._decoder.header_table
        entries = table.dynamic_entries
        before = (entries[0] if entries else None, len(entries), table.maxsize)  # holds the front entry
        try:
            headers = [(bytes(k), bytes(v)) for k, v in self._decoder.decode(block, raw=True)]
        except Exception as e:
            raise H2ConnectionError(COMPRESSION_ERROR, "HPACK") from e  # the HPACK state is lost
        decoded = (headers, sum(len(k) + len(v) + 32 for k, v in headers))
        front = entries[0] if entries else None
        if front is before[0] and len(entries) == before[1] and table.maxsize == before[2]:
            if len(cache) >= CACHED_BLOCKS:
                cache.clear()
            cache[block] = decoded
        else:
            cache.clear()  # entries moved: cached blocks may mean something else now
        return decoded
