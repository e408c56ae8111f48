"""A Prometheus text-format parser that reads only the metric families it is asked for."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from itertools import chain
from types import MappingProxyType
from typing import Final, NamedTuple, Protocol, runtime_checkable

DEFAULT_MAX_BYTES: Final = 16 << 20  # a vLLM page is 10-100 KiB; 16 MiB is clearly broken
DEFAULT_MAX_LABEL_VALUE: Final = 64 << 10  # characters: long LoRA adapter lists fit, runaways do not
DEFAULT_MAX_LINE: Final = 1 << 20

_LINE_CACHE_SIZE: Final = 4096  # distinct wanted lines remembered (cleared when full) ...
_LINE_CACHE_MAX_LINE: Final = 2048  # ... each at most this long: the cache stays under ~8 MiB
_NO_LABELS: Final[Mapping[str, str]] = MappingProxyType({})
_NAME_RE: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
# What follows the label block (or the name): a value and an optional timestamp.
_TAIL_RE: Final = re.compile(rb"[ \t]+([^ \t\n]+)(?:[ \t]+([^ \t\n]+))?[ \t\r]*\Z")
# Quoted values use the "unrolled loop" form "[^"]*(?:\\.[^"]*)*" so a run of plain
# characters is one regex step and a "}" or "," inside a value is just a character.
# Canonical label pairs (no blanks), each followed by a comma or the end: what every client
# library writes.  Matches tile the block exactly iff their lengths add up (checked in code).
_FAST_PAIRS_RE: Final = re.compile(
    r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"\\\n]*(?:\\.[^"\\\n]*)*)"(?:,|\Z)', re.ASCII
)
# The general form, with blanks allowed around names, "=" and commas.
_PAIR: Final = r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*'
_PAIRS_RE: Final = re.compile(_PAIR, re.ASCII)
_LABELS_OK_RE: Final = re.compile(r"(?:" + _PAIR + r",)*(?:" + _PAIR + r")?[ \t]*\Z", re.ASCII)
_ESCAPE_RE: Final = re.compile(r"\\(.)")
_ESCAPES: Final = {"\\": "\\", '"': '"', "n": "\n"}
# Every sample line of the full-parse path: name, then the rest of the line.
_ANY_LINE_RE: Final = re.compile(rb"^[ \t]*([a-zA-Z_:][a-zA-Z0-9_:]*)([^\n]*)", re.MULTILINE)


class ExpositionError(ValueError):
    """The exposition text is malformed or exceeds a bound; the message says where."""


class Sample(NamedTuple):
    """One series of a family: its labels, value and optional timestamp (ms since the epoch).

    Samples are shared between parses (a repeated line is parsed once), hence read-only labels.
    """

    labels: Mapping[str, str]
    value: float
    timestamp_ms: int | None


class MetricFamilies(dict[str, list[Sample]]):
    """Samples by metric name (as exposed, e.g. ``foo_total``), in page order, wanted names only."""

    __slots__ = ()

    def family(self, name: str) -> list[Sample] | None:
        """Samples of ``name``, or of ``name_total`` when a counter is exposed with the suffix."""
        found = self.get(name)
        if found is None and not name.endswith("_total"):
            found = self.get(name + "_total")
        return found


@runtime_checkable
class FamilyConsumer(Protocol):
    """Extractors that name the families they read; sources then skip every other line."""

    def wanted_families(self) -> frozenset[str]: ...


def with_total_aliases(names: Iterable[str]) -> frozenset[str]:
    """``names`` plus ``name_total`` for each, so a counter matches under either exposition."""
    out: set[str] = set()
    for n in names:
        out.add(n)
        if not n.endswith("_total"):
            out.add(n + "_total")
    return frozenset(out)


_Trie = dict[str, "_Trie"]


def _trie_pattern(names: Iterable[str]) -> str:
    """A regex alternation with common prefixes factored out, so a non-matching line fails fast."""
    trie: _Trie = {}
    for name in names:
        node = trie
        for ch in name:
            node = node.setdefault(ch, {})
        node[""] = {}  # end of a name

    def emit(node: _Trie) -> str:
        branches = [re.escape(ch) + emit(sub) for ch, sub in sorted(node.items()) if ch]
        if not branches:
            return ""
        optional = "" in node
        if len(branches) == 1 and not optional:
            return branches[0]
        return "(?:" + "|".join(branches) + ")" + ("?" if optional else "")

    return emit(trie)


class ExpositionParser:
    """Parses Prometheus text exposition (format 0.0.4) into ``MetricFamilies``.

    With ``wanted`` names, one compiled regex (a prefix trie of the names, anchored at line
    starts) finds the wanted sample lines inside the C regex engine; every other line,
    comment, histogram bucket or garbage is skipped without being parsed or decoded.  Only
    matched lines are decoded (UTF-8) and their labels parsed, escapes included.  With
    ``wanted=None`` every sample line is parsed (slower; for extractors that do not say
    what they read).

    Comments (HELP/TYPE) are ignored, so a family without them parses the same; values of
    any type are taken as they are; duplicate series are kept in page order.  Malformed
    *wanted* lines and exceeded bounds raise ``ExpositionError``.  A parser keeps a small
    cache of the wanted lines it parsed, keyed by the raw line; one parser may serve every
    endpoint of a source (one event loop, no locking needed).
    """

    __slots__ = ("_cache", "_first", "_lines", "max_bytes", "max_label_value", "max_line", "wanted")

    def __init__(
        self,
        wanted: Iterable[str] | None,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_label_value: int = DEFAULT_MAX_LABEL_VALUE,
        max_line: int = DEFAULT_MAX_LINE,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_label_value = max_label_value
        self.max_line = max_line
        self._cache: dict[bytes, tuple[str, Sample]] = {}
        if wanted is None:
            self.wanted: frozenset[str] | None = None
            self._lines: re.Pattern[bytes] | None = None
            self._first: re.Pattern[bytes] | None = None
            return
        names = frozenset(wanted)
        for n in names:
            if not _NAME_RE.match(n):
                raise ValueError(f"invalid metric name {n!r}")
        self.wanted = names
        if names:
            alt = _trie_pattern(names).encode()
            # "\n" as the literal prefix lets the regex engine jump from line to line.
            self._lines = re.compile(rb"\n[ \t]*(" + alt + rb")(?=[{ \t])([^\n]*)")
            self._first = re.compile(rb"[ \t]*(" + alt + rb")(?=[{ \t])([^\n]*)")
        else:
            self._lines = self._first = None

    def parse(self, data: bytes | bytearray) -> MetricFamilies:
        if len(data) > self.max_bytes:
            raise ExpositionError(f"exposition is {len(data)} bytes, more than the limit of {self.max_bytes}")
        out = MetricFamilies()
        if self.wanted is None:
            for m in _ANY_LINE_RE.finditer(data):
                name, sample = self._line(data, m.start(), m.group(1), m.group(2))
                samples = out.get(name)
                if samples is None:
                    out[name] = [sample]
                else:
                    samples.append(sample)
            return out
        if self._lines is None or self._first is None:
            return out
        cache = self._cache
        m0 = self._first.match(data)
        for m in self._lines.finditer(data) if m0 is None else chain((m0,), self._lines.finditer(data)):
            # Most wanted lines repeat from scrape to scrape (and across endpoints): the
            # cache keyed by the raw line skips decoding and label parsing for them.
            line = m.group(0)
            entry = cache.get(line)
            if entry is None:
                pos = m.start() + (m is not m0)
                entry = self._line(data, pos, m.group(1), m.group(2))
                if len(line) <= _LINE_CACHE_MAX_LINE:
                    if len(cache) >= _LINE_CACHE_SIZE:
                        cache.clear()
                    cache[line] = entry
            name, sample = entry
            samples = out.get(name)
            if samples is None:
                out[name] = [sample]
            else:
                samples.append(sample)
        return out

    def _line(self, data: bytes | bytearray, pos: int, raw_name: bytes, rest: bytes) -> tuple[str, Sample]:
        """Parse one sample line (``rest`` is what follows the name) into its family name and sample."""
        if len(rest) > self.max_line:
            raise self._error(data, pos, f"line longer than {self.max_line} bytes")
        raw_labels = b""
        if rest[:1] == b"{" or rest.lstrip(b" \t")[:1] == b"{":
            # Values and timestamps never contain "}", so the last one closes the label block;
            # the block itself is validated when its pairs are parsed.
            start = rest.index(b"{") + 1
            end = rest.rfind(b"}")
            if end < start:
                raise self._error(data, pos, "unterminated label set")
            raw_labels = rest[start:end]
            rest = rest[end + 1 :]
        m = _TAIL_RE.match(rest)
        if m is None:
            raise self._error(data, pos, "malformed sample line")
        raw_value, raw_ts = m.groups()
        if b"_" in raw_value:
            raise self._error(data, pos, f"invalid value {raw_value[:40]!r}")
        try:
            value = float(raw_value)
        except ValueError:
            raise self._error(data, pos, f"invalid value {raw_value[:40]!r}") from None
        ts: int | None = None
        if raw_ts is not None:
            try:
                if b"_" in raw_ts:
                    raise ValueError  # noqa: TRY301 - one error path for both checks
                ts = int(raw_ts)
            except ValueError:
                raise self._error(data, pos, f"invalid timestamp {raw_ts[:40]!r}") from None
        labels = MappingProxyType(self._labels(data, pos, raw_labels)) if raw_labels else _NO_LABELS
        return raw_name.decode("ascii"), Sample(labels, value, ts)

    def _labels(self, data: bytes | bytearray, pos: int, raw: bytes) -> dict[str, str]:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self._error(data, pos, "label values are not valid UTF-8") from None
        # Fast path, all in C: canonical pairs straight into a dict, then check that the
        # matches tiled the whole block (no blanks, garbage or duplicate names in between).
        pairs: list[tuple[str, str]] = _FAST_PAIRS_RE.findall(text)
        labels = dict(pairs)
        n = len(pairs)
        tiled = (
            4 * n - (0 if text.endswith(",") else 1) + sum(map(len, labels)) + sum(map(len, labels.values()))
        )
        if len(labels) != n or tiled != len(text):
            labels = self._labels_slow(data, pos, text)
        if len(text) > self.max_label_value:
            for k, v in labels.items():
                if len(v) > self.max_label_value:
                    raise self._error(
                        data, pos, f"label {k!r} value longer than {self.max_label_value} characters"
                    )
        if "\\" in text:
            labels = {k: _unescape(v, lambda msg: self._error(data, pos, msg)) for k, v in labels.items()}
        return labels

    def _labels_slow(self, data: bytes | bytearray, pos: int, text: str) -> dict[str, str]:
        if not _LABELS_OK_RE.match(text):
            raise self._error(data, pos, "malformed label set")
        labels: dict[str, str] = {}
        for k, v in _PAIRS_RE.findall(text):
            if k in labels:
                raise self._error(data, pos, f"duplicate label {k!r}")
            labels[k] = v
        return labels

    @staticmethod
    def _error(data: bytes | bytearray, pos: int, msg: str) -> ExpositionError:
        line = data.count(b"\n", 0, pos) + 1
        return ExpositionError(f"line {line}: {msg}")


def _unescape(v: str, error: _ErrorFactory) -> str:
    def sub(m: re.Match[str]) -> str:
        ch = m.group(1)
        try:
            return _ESCAPES[ch]
        except KeyError:
            raise error(f"invalid escape sequence '\\{ch}' in label value") from None

    return _ESCAPE_RE.sub(sub, v)


class _ErrorFactory(Protocol):
    def __call__(self, msg: str, /) -> ExpositionError: ...
